/**
 * The Compute panel's model: machines and jobs as the server reports them, kept current by
 * the server's job events (each event patches one job) and, as a fallback only, by a slow
 * backoff poll. Components subscribe to `changed` (or `jobChanged`) and render.
 */
import { Event } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  APIError,
  checkMachine,
  getJob,
  ICheckResult,
  IJob,
  IKind,
  IMachine,
  isActive,
  isTerminal,
  JobState,
  listJobs,
  listMachines
} from './api';

/**
 * The user settings the front end reads (schema/plugin.json).
 */
export interface IComputeSettings {
  logLinesKept: number;
  fallbackPollInterval: number;
  mlflowUiUrl: string;
}

export const DEFAULT_SETTINGS: IComputeSettings = {
  logLinesKept: 5000,
  fallbackPollInterval: 10000,
  mlflowUiUrl: ''
};

/**
 * The schema id of the server's job events (jupyter_remote_compute/events/job.yaml).
 */
export const JOB_EVENT_SCHEMA =
  'https://events.jupyter.org/jupyter_remote_compute/job';

/**
 * The result of the last "check" of a machine, kept for this session.
 */
export interface ICheckRecord {
  ok: boolean;
  /**
   * When the check ended (ISO 8601).
   */
  at: string;
  /**
   * The machine's facts on success, the reason on failure.
   */
  facts: Record<string, unknown>;
  message: string;
}

/**
 * Turn anything thrown into an APIError.
 */
export function asAPIError(error: unknown): APIError {
  return error instanceof APIError
    ? error
    : new APIError({
        status: 0,
        code: 'client-error',
        message: error instanceof Error ? error.message : String(error),
        fromServerExtension: false
      });
}

function byNewest(a: IJob, b: IJob): number {
  const ka = `${a.created ?? ''} ${a.id}`;
  const kb = `${b.created ?? ''} ${b.id}`;
  return ka < kb ? 1 : ka > kb ? -1 : 0;
}

export class ComputeModel implements IDisposable {
  constructor(options: ComputeModel.IOptions = {}) {
    this._settings = { ...DEFAULT_SETTINGS };
    this._poll = new Poll({
      auto: false,
      factory: () => this._fetch(),
      frequency: {
        interval: this._settings.fallbackPollInterval,
        backoff: true,
        max: 5 * 60 * 1000
      },
      name: 'jupyter-remote-compute:model',
      // The events keep the model current; the poll only runs while someone looks.
      standby: () => !this._active || 'when-hidden'
    });
    if (options.events) {
      this._events = options.events;
      this._events.stream.connect(this._onEvent, this);
    }
  }

  /**
   * Emitted whenever machines, jobs, loading state, error or settings change.
   */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /**
   * Emitted with a job whenever it changes (state, log size, outputs, …).
   */
  get jobChanged(): ISignal<this, IJob> {
    return this._jobChanged;
  }

  /**
   * Emitted once per job when the model sees it go from an active to a terminal state.
   */
  get jobEnded(): ISignal<this, IJob> {
    return this._jobEnded;
  }

  /**
   * Emitted the first time the server extension is found not answering.
   */
  get serverMissing(): ISignal<this, APIError> {
    return this._serverMissing;
  }

  get machines(): readonly IMachine[] {
    return this._machines;
  }

  get kinds(): readonly IKind[] {
    return this._kinds;
  }

  /**
   * compute.yaml's version as of the last GET /machines.
   */
  get version(): string {
    return this._version;
  }

  /**
   * Every job, newest first.
   */
  get jobs(): readonly IJob[] {
    return this._jobs;
  }

  job(id: string): IJob | undefined {
    return this._byId.get(id);
  }

  machine(name: string): IMachine | undefined {
    return this._machines.find(m => m.name === name);
  }

  lastCheck(name: string): ICheckRecord | undefined {
    return this._checks.get(name);
  }

  /**
   * The error of the last refresh, or null when it succeeded.
   */
  get error(): APIError | null {
    return this._error;
  }

  /**
   * True until the first refresh has finished (successfully or not).
   */
  get loading(): boolean {
    return this._loading;
  }

  get settings(): Readonly<IComputeSettings> {
    return this._settings;
  }

  /**
   * Whether someone is looking (the panel is visible); the poll stands by otherwise.
   */
  get active(): boolean {
    return this._active;
  }
  set active(value: boolean) {
    if (value === this._active) {
      return;
    }
    this._active = value;
    if (value) {
      void this.refresh();
    }
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /**
   * Apply user settings (unknown or invalid values keep the defaults).
   */
  configure(settings: Partial<IComputeSettings>): void {
    const next: IComputeSettings = { ...DEFAULT_SETTINGS };
    if (
      typeof settings.logLinesKept === 'number' &&
      settings.logLinesKept > 0
    ) {
      next.logLinesKept = Math.floor(settings.logLinesKept);
    }
    if (
      typeof settings.fallbackPollInterval === 'number' &&
      settings.fallbackPollInterval >= 1000
    ) {
      next.fallbackPollInterval = settings.fallbackPollInterval;
    }
    if (typeof settings.mlflowUiUrl === 'string') {
      next.mlflowUiUrl = settings.mlflowUiUrl.trim().replace(/\/+$/, '');
    }
    this._settings = next;
    this._poll.frequency = {
      ...this._poll.frequency,
      interval: next.fallbackPollInterval
    };
    this._changed.emit();
  }

  /**
   * Ask the server now, and start the fallback poll if it is not running yet.
   */
  async refresh(): Promise<void> {
    if (this._isDisposed) {
      return;
    }
    await this._poll.refresh();
    await this._poll.tick;
  }

  /**
   * Reach a machine and remember the outcome; rejects with an APIError when it fails.
   */
  async check(name: string): Promise<ICheckResult> {
    try {
      const result = await checkMachine(name);
      this._checks.set(name, {
        ok: true,
        at: new Date().toISOString(),
        facts: result.facts ?? {},
        message: ''
      });
      return result;
    } catch (error) {
      const apiError = asAPIError(error);
      this._checks.set(name, {
        ok: false,
        at: new Date().toISOString(),
        facts: {},
        message: apiError.message
      });
      throw apiError;
    } finally {
      this._changed.emit();
    }
  }

  /**
   * Forget what the model knows of a removed machine.
   */
  forgetMachine(name: string): void {
    this._checks.delete(name);
  }

  /**
   * Put a job the server just returned (submit, cancel, GET) into the model.
   */
  upsertJob(job: IJob): void {
    const previous = this._byId.get(job.id);
    const merged: IJob = previous ? { ...previous, ...job } : job;
    this._byId.set(job.id, merged);
    if (previous) {
      this._jobs = this._jobs.map(j => (j.id === job.id ? merged : j));
    } else {
      this._jobs = [merged, ...this._jobs].sort(byNewest);
    }
    this._noteTransition(previous?.state, merged);
    this._jobChanged.emit(merged);
    this._changed.emit();
  }

  removeJob(id: string): void {
    if (!this._byId.delete(id)) {
      return;
    }
    this._jobs = this._jobs.filter(j => j.id !== id);
    this._changed.emit();
  }

  /**
   * Fetch one job now (e.g. when its detail opens).
   */
  async reloadJob(id: string): Promise<IJob> {
    const job = await getJob(id);
    this.upsertJob(job);
    return job;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._events?.stream.disconnect(this._onEvent, this);
    this._poll.dispose();
    for (const timer of this._pending.values()) {
      window.clearTimeout(timer);
    }
    this._pending.clear();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    try {
      const [machines, jobs] = await Promise.all([listMachines(), listJobs()]);
      this._machines = machines.machines ?? [];
      this._kinds = machines.kinds ?? this._kinds;
      this._version = machines.version ?? '';
      const next = new Map<string, IJob>();
      for (const job of jobs.jobs ?? []) {
        next.set(job.id, job);
        const previous = this._byId.get(job.id);
        this._noteTransition(previous?.state, job);
        if (previous && previous.updated !== job.updated) {
          this._jobChanged.emit(job);
        }
      }
      this._byId = next;
      this._jobs = [...next.values()].sort(byNewest);
      this._error = null;
    } catch (error) {
      this._error = asAPIError(error);
      if (this._error.serverExtensionMissing && !this._missingReported) {
        this._missingReported = true;
        this._serverMissing.emit(this._error);
      }
      // Rejecting lets the poll back off while the server is not answering.
      throw this._error;
    } finally {
      this._loading = false;
      if (!this._isDisposed) {
        this._changed.emit();
      }
    }
  }

  private _noteTransition(previous: JobState | undefined, job: IJob): void {
    if (
      previous !== undefined &&
      isActive(previous) &&
      isTerminal(job.state) &&
      !this._ended.has(job.id)
    ) {
      this._ended.add(job.id);
      this._jobEnded.emit(job);
    }
  }

  private _onEvent(_: Event.IManager, emission: Event.Emission): void {
    if (emission.schema_id !== JOB_EVENT_SCHEMA || this._isDisposed) {
      return;
    }
    const id = emission.id;
    if (typeof id !== 'string') {
      return;
    }
    const known = this._byId.get(id);
    const state = emission.state as JobState;
    if (known) {
      // Patch what the event carries at once; the rest (outputs, run id) comes with a GET.
      const patched: IJob = {
        ...known,
        state: state ?? known.state,
        reason:
          emission.reason === undefined
            ? known.reason
            : (emission.reason as string | null),
        updated: (emission.updated as string | undefined) ?? known.updated,
        log_size:
          typeof emission.log_size === 'number'
            ? emission.log_size
            : known.log_size
      };
      this._byId.set(id, patched);
      this._jobs = this._jobs.map(j => (j.id === id ? patched : j));
      this._noteTransition(known.state, patched);
      this._jobChanged.emit(patched);
      this._changed.emit();
      if (known.state !== patched.state) {
        this._scheduleFetch(id);
      }
    } else {
      // A job this model has not seen (submitted elsewhere): fetch it whole.
      this._scheduleFetch(id);
    }
  }

  /**
   * Fetch one job soon, coalescing bursts of events about it.
   */
  private _scheduleFetch(id: string): void {
    if (this._pending.has(id)) {
      return;
    }
    const timer = window.setTimeout(() => {
      this._pending.delete(id);
      getJob(id)
        .then(job => {
          if (!this._isDisposed) {
            this.upsertJob(job);
          }
        })
        .catch(error => {
          const apiError = asAPIError(error);
          if (apiError.status === 404 && apiError.fromServerExtension) {
            this.removeJob(id);
          }
        });
    }, 200);
    this._pending.set(id, timer);
  }

  private _active = false;
  private _byId = new Map<string, IJob>();
  private _changed = new Signal<this, void>(this);
  private _checks = new Map<string, ICheckRecord>();
  private _ended = new Set<string>();
  private _error: APIError | null = null;
  private _events: Event.IManager | null = null;
  private _isDisposed = false;
  private _jobChanged = new Signal<this, IJob>(this);
  private _jobEnded = new Signal<this, IJob>(this);
  private _jobs: IJob[] = [];
  private _kinds: IKind[] = [];
  private _loading = true;
  private _machines: IMachine[] = [];
  private _missingReported = false;
  private _pending = new Map<string, number>();
  private _poll: Poll;
  private _serverMissing = new Signal<this, APIError>(this);
  private _settings: IComputeSettings;
  private _version = '';
}

export namespace ComputeModel {
  export interface IOptions {
    /**
     * The server's event bus; job events patch the model.
     */
    events?: Event.IManager;
  }
}
