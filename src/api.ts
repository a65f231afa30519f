/**
 * A typed client for the server part's REST API under `/remote-compute/`.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * The URL namespace of the server extension.
 */
export const API_NAMESPACE = 'remote-compute';

/**
 * The name of the Python server extension (what `jupyter server extension enable` takes).
 */
export const SERVER_EXTENSION = 'jupyter_remote_compute';

/**
 * The JSON body the server sends with every 4xx/5xx answer.
 */
export interface IErrorBody {
  code: string;
  message: string;
  field?: string | null;
}

/**
 * A failed request: either the server answered with an error, or it did not answer at all.
 */
export class APIError extends Error {
  constructor(options: {
    status: number;
    code: string;
    message: string;
    field?: string | null;
    fromServerExtension: boolean;
  }) {
    super(options.message);
    this.name = 'APIError';
    this.status = options.status;
    this.code = options.code;
    this.field = options.field ?? null;
    this.fromServerExtension = options.fromServerExtension;
  }

  /**
   * The HTTP status; 0 when no answer arrived (network error).
   */
  readonly status: number;

  /**
   * A stable machine-readable code (`not-found`, `conflict`, … from the server;
   * `network-error` or `http-<status>` when the body was not the extension's JSON).
   */
  readonly code: string;

  /**
   * The setting the error is about (for mapping onto a form field), if any.
   */
  readonly field: string | null;

  /**
   * Whether the answer came from this extension's handlers (a JSON `{code, message}` body).
   */
  readonly fromServerExtension: boolean;

  /**
   * True when the server extension itself is not answering: no answer at all, or an
   * answer that did not come from its handlers (e.g. Jupyter Server's HTML 404 page when
   * `jupyter_remote_compute` is not enabled).
   */
  get serverExtensionMissing(): boolean {
    return (
      this.status === 0 || (!this.fromServerExtension && this.status === 404)
    );
  }
}

function isErrorBody(value: unknown): value is IErrorBody {
  if (typeof value !== 'object' || value === null) {
    return false;
  }
  const body = value as Record<string, unknown>;
  return typeof body.code === 'string' && typeof body.message === 'string';
}

/**
 * Call the server extension's REST API.
 *
 * @param endPoint - path under `remote-compute/`, e.g. `machines`
 * @param init - fetch options (method, body, headers)
 * @param settings - server connection settings (defaults to the page's)
 * @returns the parsed JSON body, or `undefined` for an empty answer
 * @throws {APIError} on a network error or any non-2xx answer
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint);

  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new APIError({
      status: 0,
      code: 'network-error',
      message: error instanceof Error ? error.message : String(error),
      fromServerExtension: false
    });
  }

  const text = await response.text();
  let data: unknown = undefined;
  let parsed = false;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
      parsed = true;
    } catch {
      // Not JSON: an HTML error page or a proxy's answer; handled below.
    }
  }

  if (!response.ok) {
    if (parsed && isErrorBody(data)) {
      throw new APIError({
        status: response.status,
        code: data.code,
        message: data.message,
        field: data.field ?? null,
        fromServerExtension: true
      });
    }
    const serverMessage =
      parsed && typeof data === 'object' && data !== null
        ? (data as Record<string, unknown>).message
        : undefined;
    throw new APIError({
      status: response.status,
      code: `http-${response.status}`,
      message:
        typeof serverMessage === 'string' && serverMessage
          ? serverMessage
          : `${response.status} ${response.statusText}`.trim(),
      fromServerExtension: false
    });
  }

  if (text.length > 0 && !parsed) {
    throw new APIError({
      status: response.status,
      code: 'invalid-response',
      message: `The answer to ${endPoint || '/'} was not JSON`,
      fromServerExtension: false
    });
  }
  return data as T;
}

// ------------------------------------------------------------------ shapes

/**
 * A machine a job can run on (`GET /remote-compute/machines`).
 */
export interface IMachine {
  name: string;
  kind: string;
  address: string;
  enabled: boolean;
  created: string | null;
  /**
   * True for the built-in "This machine" (kind `local`), which is never written to compute.yaml.
   */
  builtin: boolean;
  options: Record<string, unknown>;
}

export interface IMachineList {
  machines: IMachine[];
  /**
   * An opaque version (etag) of compute.yaml; a write sends it back to refuse stale edits.
   */
  version: string;
}

export type JobState =
  | 'queued'
  | 'sending'
  | 'running'
  | 'collecting'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'lost';

/**
 * A job (`GET /remote-compute/jobs`); the server may add more fields.
 */
export interface IJob {
  id: string;
  name: string;
  machine: string;
  state: JobState;
  reason: string | null;
  created: string | null;
  started: string | null;
  ended: string | null;
  [key: string]: unknown;
}

export interface IJobList {
  jobs: IJob[];
}

/**
 * The machines this workspace may run on, the built-in "This machine" included.
 */
export function listMachines(
  settings?: ServerConnection.ISettings
): Promise<IMachineList> {
  return requestAPI<IMachineList>('machines', { method: 'GET' }, settings);
}

/**
 * Every job of every machine.
 */
export function listJobs(
  settings?: ServerConnection.ISettings
): Promise<IJobList> {
  return requestAPI<IJobList>('jobs', { method: 'GET' }, settings);
}
