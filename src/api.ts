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
  /**
   * Facts to act on, e.g. `host_key: {type, fingerprint}` with `can_trust` for an unknown SSH host.
   */
  details?: IErrorDetails;
}

export interface IErrorDetails {
  host_key?: { type: string; fingerprint: string };
  can_trust?: boolean;
  [key: string]: unknown;
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
    details?: IErrorDetails | null;
    fromServerExtension: boolean;
  }) {
    super(options.message);
    this.name = 'APIError';
    this.status = options.status;
    this.code = options.code;
    this.field = options.field ?? null;
    this.details = options.details ?? null;
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
   * What the server says one can do about the error (an unknown host key to trust), if anything.
   */
  readonly details: IErrorDetails | null;

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
        details: data.details ?? null,
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

/**
 * One setting a kind of machine takes (`kinds[].options` of `GET /machines`).
 */
export interface IKindOption {
  /**
   * The Python type name: `str`, `int`, `bool`, `float`.
   */
  type: string;
  description: string;
  required: boolean;
  /**
   * True when the option holds the *name* of a Secret Manager entry (e.g. `token_secret`):
   * the form asks for the secret itself and sends it as `token`.
   */
  secret_name: boolean;
}

/**
 * A kind of machine this installation can use.
 */
export interface IKind {
  kind: string;
  label: string;
  remote: boolean;
  options: Record<string, IKindOption>;
  /**
   * Present when the kind cannot be used here yet: what to install (e.g. the `skypilot` extra).
   */
  unavailable?: string;
}

export interface IMachineList {
  machines: IMachine[];
  /**
   * An opaque version (etag) of compute.yaml; a write sends it back to refuse stale edits.
   */
  version: string;
  kinds?: IKind[];
}

/**
 * What the form sends to add a machine (`POST /machines`).
 */
export interface IMachineInput {
  name: string;
  kind: string;
  address: string;
  options?: Record<string, unknown>;
  enabled?: boolean;
  /**
   * Stored in the Secret Manager by the server; compute.yaml keeps only its name.
   */
  token?: string;
  version?: string;
}

/**
 * What can change on an existing machine (`PATCH /machines/<name>`).
 */
export interface IMachinePatch {
  address?: string;
  options?: Record<string, unknown>;
  enabled?: boolean;
  token?: string;
  version?: string;
}

export interface ICheckResult {
  name: string;
  ok: boolean;
  facts: Record<string, unknown>;
}

export type JobState =
  | 'queued'
  | 'sending'
  | 'pending'
  | 'running'
  | 'collecting'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'lost';

export const ACTIVE_STATES: ReadonlySet<JobState> = new Set<JobState>([
  'queued',
  'sending',
  'pending',
  'running',
  'collecting'
]);

export const TERMINAL_STATES: ReadonlySet<JobState> = new Set<JobState>([
  'succeeded',
  'failed',
  'cancelled',
  'lost'
]);

export const ALL_STATES: readonly JobState[] = [
  'queued',
  'sending',
  'pending',
  'running',
  'collecting',
  'succeeded',
  'failed',
  'cancelled',
  'lost'
];

export function isActive(state: string): boolean {
  return ACTIVE_STATES.has(state as JobState);
}

export function isTerminal(state: string): boolean {
  return TERMINAL_STATES.has(state as JobState);
}

/**
 * What a job is asked to do (`JobSpec` in openapi.yaml).
 */
export interface IJobSpec {
  machine?: string;
  command: string | string[];
  send?: string[];
  bring_back?: string[];
  env?: Record<string, string>;
  /**
   * What the job asks of its machine (`resources` in openapi.yaml); memory as `32G`, `512M`.
   */
  resources?: IResources | null;
  timeout?: number | string | null;
  name?: string | null;
  key?: string | null;
  new?: boolean;
}

/**
 * Resources a job asks for; a field left out is not asked for.
 */
export interface IResources {
  gpus?: number | null;
  cpus?: number | null;
  memory?: string | null;
  nodes?: number | null;
  partition?: string | null;
}

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
  updated?: string | null;
  started: string | null;
  ended: string | null;
  kind?: string;
  spec?: IJobSpec;
  exit_code?: number | null;
  outputs?: Record<string, { sha256?: string; size?: number }>;
  inputs?: Record<string, number>;
  transfer?: Record<string, number>;
  mlflow_run_id?: string | null;
  log_size?: number;
  progress?: { done: number; total: number };
  [key: string]: unknown;
}

/**
 * One page of `GET /remote-compute/jobs`: summaries (no spec, outputs, …; the
 * reason's first line), newest first.
 */
export interface IJobList {
  jobs: IJob[];
  /**
   * Pass as `cursor` (with the same filters) for the next page; null on the last one.
   */
  next_cursor: string | null;
}

/**
 * Which jobs a page lists; the server filters, so nothing hidden is downloaded.
 */
export interface IJobQuery {
  limit?: number;
  cursor?: string | null;
  machine?: string;
  /**
   * One state or several, comma-separated.
   */
  state?: string;
  /**
   * A part of the name, any case.
   */
  name?: string;
  since?: string;
  until?: string;
}

/**
 * What `POST /jobs/prune` removed.
 */
export interface IPruneResult {
  removed: string[];
  count: number;
  cleaned: number;
  left_on_machines: Record<string, string>;
  state_file_bytes: { before: number; after: number };
  dry_run: boolean;
}

export interface ISubmitResult {
  job: IJob;
  attached: boolean;
}

/**
 * A chunk of a job's log (`GET /jobs/<id>/log`).
 */
export interface ILogChunk {
  data: string;
  offset: number;
  next_offset: number;
  /**
   * The job has ended and this is the end of its log.
   */
  complete: boolean;
}

function jsonBody(method: string, body: unknown): RequestInit {
  return {
    method,
    body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' }
  };
}

const enc = encodeURIComponent;

/**
 * The machines this workspace may run on, the built-in "This machine" included.
 */
export function listMachines(
  settings?: ServerConnection.ISettings
): Promise<IMachineList> {
  return requestAPI<IMachineList>('machines', { method: 'GET' }, settings);
}

export function addMachine(
  input: IMachineInput,
  settings?: ServerConnection.ISettings
): Promise<IMachine> {
  return requestAPI<IMachine>('machines', jsonBody('POST', input), settings);
}

export function updateMachine(
  name: string,
  patch: IMachinePatch,
  settings?: ServerConnection.ISettings
): Promise<IMachine> {
  return requestAPI<IMachine>(
    `machines/${enc(name)}`,
    jsonBody('PATCH', patch),
    settings
  );
}

export async function removeMachine(
  name: string,
  version?: string,
  settings?: ServerConnection.ISettings
): Promise<void> {
  const query = version ? `?version=${enc(version)}` : '';
  await requestAPI<void>(
    `machines/${enc(name)}${query}`,
    { method: 'DELETE' },
    settings
  );
}

export function checkMachine(
  name: string,
  settings?: ServerConnection.ISettings
): Promise<ICheckResult> {
  return requestAPI<ICheckResult>(
    `machines/${enc(name)}/check`,
    { method: 'POST' },
    settings
  );
}

/**
 * Record the SSH host key the machine presents in known_hosts, only if its fingerprint is the one
 * the user saw (the server compares on the connection that records it).
 */
export function trustMachine(
  name: string,
  fingerprint: string,
  settings?: ServerConnection.ISettings
): Promise<{ name: string; fingerprint: string }> {
  return requestAPI<{ name: string; fingerprint: string }>(
    `machines/${enc(name)}/trust`,
    { method: 'POST', body: JSON.stringify({ fingerprint }) },
    settings
  );
}

/**
 * A page of jobs, newest first (an unchanged page is revalidated by ETag, not sent again).
 */
export function listJobs(
  query: IJobQuery = {},
  settings?: ServerConnection.ISettings
): Promise<IJobList> {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== '') {
      params.set(key, String(value));
    }
  }
  const search = params.toString();
  // 'no-cache' (not the default 'no-store' with its cache buster): the browser revalidates
  // with If-None-Match, and an unchanged page comes back as a 304.
  return requestAPI<IJobList>(
    search ? `jobs?${search}` : 'jobs',
    { method: 'GET', cache: 'no-cache' },
    settings
  );
}

/**
 * Forget finished jobs that ended more than `olderThan` ago (e.g. `90d`); never an active one.
 */
export function pruneJobs(
  olderThan: string,
  options: { state?: string[]; dryRun?: boolean } = {},
  settings?: ServerConnection.ISettings
): Promise<IPruneResult> {
  return requestAPI<IPruneResult>(
    'jobs/prune',
    jsonBody('POST', {
      older_than: olderThan,
      ...(options.state ? { state: options.state } : {}),
      dry_run: options.dryRun ?? false
    }),
    settings
  );
}

export function getJob(
  id: string,
  settings?: ServerConnection.ISettings
): Promise<IJob> {
  return requestAPI<IJob>(`jobs/${enc(id)}`, { method: 'GET' }, settings);
}

export function submitJob(
  spec: IJobSpec,
  settings?: ServerConnection.ISettings
): Promise<ISubmitResult> {
  return requestAPI<ISubmitResult>('jobs', jsonBody('POST', spec), settings);
}

export function cancelJob(
  id: string,
  settings?: ServerConnection.ISettings
): Promise<IJob> {
  return requestAPI<IJob>(
    `jobs/${enc(id)}/cancel`,
    { method: 'POST' },
    settings
  );
}

export async function deleteJob(
  id: string,
  settings?: ServerConnection.ISettings
): Promise<void> {
  await requestAPI<void>(`jobs/${enc(id)}`, { method: 'DELETE' }, settings);
}

/**
 * Part of a job's log from a byte offset. With `wait` (seconds, at most 30) the server holds the
 * answer until bytes past `offset` exist or the job ends: a follower needs no timer.
 */
export function readLog(
  id: string,
  offset: number,
  limit?: number,
  settings?: ServerConnection.ISettings,
  wait?: number
): Promise<ILogChunk> {
  const query =
    `offset=${offset}` +
    (limit ? `&limit=${limit}` : '') +
    (wait ? `&wait=${wait}` : '');
  return requestAPI<ILogChunk>(
    `jobs/${enc(id)}/log?${query}`,
    { method: 'GET' },
    settings
  );
}

/**
 * Where new secrets go (GET /secrets `store`).
 */
export interface ISecretStore {
  kind: 'keyring' | 'file';
  /**
   * For people: "the system keyring (Secret Service)", "a private file (PATH)".
   */
  where: string;
  /**
   * To show beside secrets: a backend the user named that does not encrypt, or the private file.
   */
  note: string | null;
  usable: boolean;
  /**
   * Why new secrets cannot be stored, and what to do.
   */
  problem: string | null;
}

/**
 * One secret's name and where it lives; never its value.
 */
export interface ISecretEntry {
  name: string;
  source: 'deployment-env' | 'deployment-dir' | 'keyring' | 'file';
  where: string;
  /**
   * Provided by the deployment: not changeable here.
   */
  read_only: boolean;
  problem: string | null;
}

export interface ISecrets {
  store: ISecretStore;
  secrets: ISecretEntry[];
}

/**
 * Where secrets live: the store new ones go to, and every secret's place.
 */
export function getSecrets(
  settings?: ServerConnection.ISettings
): Promise<ISecrets> {
  return requestAPI<ISecrets>('secrets', { method: 'GET' }, settings);
}

/**
 * Store or replace one secret of the user's store. The value goes to the server once and is never
 * sent back.
 */
export function setSecret(
  name: string,
  value: string,
  settings?: ServerConnection.ISettings
): Promise<{ name: string; where: string }> {
  return requestAPI<{ name: string; where: string }>(
    `secrets/${enc(name)}`,
    jsonBody('PUT', { value }),
    settings
  );
}

/**
 * Delete one secret; refused (409 `secret_in_use`, `details.used_by`) while a machine or an
 * unfinished job needs it.
 */
export async function deleteSecret(
  name: string,
  settings?: ServerConnection.ISettings
): Promise<void> {
  await requestAPI<void>(
    `secrets/${enc(name)}`,
    { method: 'DELETE' },
    settings
  );
}

/**
 * One group's sums (GET /usage `rows`): the grouping values, then the figures.
 */
export interface IUsageRow {
  machine?: string;
  user?: string;
  month?: string;
  kind?: string;
  state?: string;
  attempts: number;
  jobs: number;
  /**
   * Attempts still under way, counted up to `generated`.
   */
  running: number;
  /**
   * Wall time.
   */
  job_hours: number;
  /**
   * Allocated: wall time × GPUs held.
   */
  gpu_hours: number;
  queue_hours: number;
  bytes_sent: number;
  bytes_fetched: number;
  /**
   * An estimate from the machines' `price_per_hour`; null where none is set.
   */
  cost_estimate: number | null;
  priced_hours: number;
  estimated_attempts: number;
}

export interface IUsage {
  group_by: string[];
  since: number | null;
  until: number | null;
  generated: number;
  rows: IUsageRow[];
  note: string;
}

export interface IUsageQuery {
  groupBy?: string[];
  since?: string;
  until?: string;
}

function usageSearch(query: IUsageQuery, format: 'json' | 'csv'): string {
  const params = new URLSearchParams();
  params.set('group_by', (query.groupBy ?? ['machine']).join(','));
  if (query.since) {
    params.set('since', query.since);
  }
  if (query.until) {
    params.set('until', query.until);
  }
  if (format === 'csv') {
    params.set('format', 'csv');
  }
  return params.toString();
}

/**
 * What jobs used, summed per group (job-hours, GPU-hours, queue time, bytes, cost estimates).
 */
export function getUsage(
  query: IUsageQuery = {},
  settings?: ServerConnection.ISettings
): Promise<IUsage> {
  return requestAPI<IUsage>(
    `usage?${usageSearch(query, 'json')}`,
    { method: 'GET' },
    settings
  );
}

/**
 * The address of the same sums as CSV (a plain GET the browser can download).
 */
export function usageCsvUrl(
  query: IUsageQuery = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): string {
  return (
    URLExt.join(settings.baseUrl, API_NAMESPACE, 'usage') +
    '?' +
    usageSearch(query, 'csv')
  );
}

/**
 * One point of a live metric (`GET /jobs/<id>/metrics`).
 */
export interface IMetricPoint {
  step: number;
  /**
   * null for NaN or an infinity.
   */
  value: number | null;
  /**
   * Milliseconds since the epoch.
   */
  timestamp: number;
}

export interface IMetricSeries {
  /**
   * The far-side MLflow run id.
   */
  run: string;
  key: string;
  points: IMetricPoint[];
}

/**
 * Live metrics past a cursor: what a running job logs to MLflow on its machine.
 */
export interface IMetricsPage {
  job_id: string;
  /**
   * Pass as `since` to get only later points.
   */
  cursor: string;
  /**
   * The `since` given belonged to another series (a restarted server): these are all points.
   */
  reset: boolean;
  watching: boolean;
  /**
   * The job has ended: no more points will come.
   */
  complete: boolean;
  metrics: IMetricSeries[];
}

/**
 * A job's live metrics after `since`; asking marks the job watched. With `wait` (seconds, at
 * most 30) the answer is held until new points arrive or the job ends.
 */
export function readMetrics(
  id: string,
  since: string,
  wait?: number,
  settings?: ServerConnection.ISettings
): Promise<IMetricsPage> {
  const query = new URLSearchParams();
  if (since) {
    query.set('since', since);
  }
  if (wait) {
    query.set('wait', String(wait));
  }
  const suffix = query.toString() ? `?${query.toString()}` : '';
  return requestAPI<IMetricsPage>(
    `jobs/${enc(id)}/metrics${suffix}`,
    { method: 'GET' },
    settings
  );
}
