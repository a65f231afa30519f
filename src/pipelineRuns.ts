/**
 * The workspace's latest pipeline runs, as the Compute panel lists them: read once
 * (`GET /remote-compute/pipelines/runs`), then patched from the `pipeline_run` events on the
 * panel's event socket, and read again when the socket comes back.
 */
import { Event } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IPipelineRun, listPipelineRuns } from './api';
import { IJobEvents } from './eventsocket';

/**
 * The schema id of the server's pipeline run events (jupyter_remote_compute/pipelines/run_event.yaml).
 */
export const PIPELINE_EVENT_SCHEMA =
  'https://events.jupyter.org/jupyter_remote_compute/pipeline_run';

/**
 * How many runs the panel lists (newest first); older ones stay in their files' history.
 */
export const RUNS_LISTED = 10;

/**
 * `run` with what one `pipeline_run` event says of it (the run's state, who started it, and each
 * node's state, job and reason); `known` is what was known of it before, if anything.
 */
export function applyRunEvent(
  known: IPipelineRun | null,
  emission: Event.Emission
): IPipelineRun {
  const nodes = (emission.nodes ?? {}) as IPipelineRun['nodes'];
  const merged: IPipelineRun['nodes'] = { ...(known?.nodes ?? {}) };
  for (const [nodeId, node] of Object.entries(nodes)) {
    merged[nodeId] = { ...(known?.nodes[nodeId] ?? {}), ...node };
  }
  const updated = (emission.updated as string | undefined) ?? '';
  return {
    ...(known ?? {
      id: emission.id as string,
      file: (emission.file as string | undefined) ?? '',
      pipeline: {},
      created: updated,
      cancel_requested: null,
      mlflow_run_id: null,
      mlflow_experiment_id: null
    }),
    state: emission.state as IPipelineRun['state'],
    reason: (emission.reason as string | null | undefined) ?? null,
    updated: updated || known?.updated || '',
    user: (emission.user as string | null | undefined) ?? known?.user ?? null,
    nodes: merged,
    sweep:
      (emission.sweep as IPipelineRun['sweep'] | undefined) ??
      known?.sweep ??
      null
  };
}

export class PipelineRuns implements IDisposable {
  constructor(options: PipelineRuns.IOptions) {
    this._events = options.events;
    this._events?.stream.connect(this._onEvent, this);
    this._events?.connectionChanged?.connect(this._onConnection, this);
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /**
   * The latest runs, newest first.
   */
  get runs(): readonly IPipelineRun[] {
    return this._runs;
  }

  /**
   * Why the runs could not be read, if the last read failed.
   */
  get error(): string | null {
    return this._error;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    Signal.clearData(this);
  }

  async refresh(): Promise<void> {
    try {
      const { runs } = await listPipelineRuns();
      this._runs = runs.slice(0, RUNS_LISTED);
      this._error = null;
    } catch (error) {
      this._error = error instanceof Error ? error.message : String(error);
    }
    if (!this._isDisposed) {
      this._changed.emit();
    }
  }

  private _onConnection(_: unknown, connected: boolean): void {
    if (connected) {
      void this.refresh();
    }
  }

  private _onEvent(_: unknown, emission: Event.Emission): void {
    if (emission.schema_id !== PIPELINE_EVENT_SCHEMA || this._isDisposed) {
      return;
    }
    const id = emission.id as string;
    const at = this._runs.findIndex(r => r.id === id);
    const run = applyRunEvent(at >= 0 ? this._runs[at] : null, emission);
    this._runs =
      at >= 0
        ? this._runs.map((r, i) => (i === at ? run : r))
        : [run, ...this._runs].slice(0, RUNS_LISTED);
    this._changed.emit();
  }

  private _changed = new Signal<this, void>(this);
  private _error: string | null = null;
  private _events: IJobEvents | null;
  private _isDisposed = false;
  private _runs: IPipelineRun[] = [];
}

export namespace PipelineRuns {
  export interface IOptions {
    events: IJobEvents | null;
  }
}
