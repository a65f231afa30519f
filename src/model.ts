/**
 * The Compute panel's model: machines and jobs as the server reports them, kept current by
 * the server's job events (each event patches one job) and, only while the event socket is
 * down, by a slow backoff poll. Components subscribe to `changed` (or `jobChanged`) and render.
 */
import { Event } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ACTIVE_STATES,
  APIError,
  checkMachine,
  checkOrgMachine,
  getJob,
  ICheckResult,
  IJob,
  IJobList,
  IJobQuery,
  IKind,
  IMachine,
  IOrganization,
  isActive,
  isTerminal,
  JobState,
  listJobs,
  listMachines,
  listPools,
  IPool
} from './api';
import { IJobEvents } from './eventsocket';

/**
 * Jobs per page of the list (the server allows up to 1000).
 */
export const JOB_PAGE_SIZE = 100;

/**
 * What the job list shows: filtered on the server, so nothing hidden is downloaded.
 */
export interface IJobFilter {
  machine: string;
  /**
   * A state, `active` for every unfinished state, or empty for all.
   */
  state: string;
  /**
   * A part of the name, any case.
   */
  name: string;
}

const NO_FILTER: IJobFilter = { machine: '', state: '', name: '' };

/**
 * The user settings the front end reads (schema/plugin.json).
 */
export interface IComputeSettings {
  logLinesKept: number;
  /**
   * Milliseconds between fallback polls while the event socket is down; 0: never poll.
   */
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

function sortKey(job: IJob): string {
  return `${job.created ?? ''} ${job.id}`;
}

function byNewest(a: IJob, b: IJob): number {
  const ka = sortKey(a);
  const kb = sortKey(b);
  return ka < kb ? 1 : ka > kb ? -1 : 0;
}

function queryOf(filter: IJobFilter): IJobQuery {
  return {
    limit: JOB_PAGE_SIZE,
    machine: filter.machine,
    state:
      filter.state === 'active'
        ? [...ACTIVE_STATES]
        : filter.state
          ? [filter.state as JobState]
          : undefined,
    name: filter.name.trim()
  };
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
      // The events keep the model current: the poll runs only while someone looks and the
      // event socket is down (or its state is unknown), and never when switched off.
      standby: () =>
        !this._active ||
        this._settings.fallbackPollInterval === 0 ||
        this._events?.connected === true ||
        'when-hidden'
    });
    if (options.events) {
      this._events = options.events;
      this._events.stream.connect(this._onEvent, this);
      this._events.connectionChanged?.connect(this._onConnection, this);
    }
  }

  /**
   * Whether the server's events arrive now (false also when the source cannot tell).
   */
  get eventsConnected(): boolean {
    return this._events?.connected === true;
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
   * Emitted once per attempt when the model sees a job go back to the queue as its next attempt
   * (its retry policy retried it; its reason says why, and on which machine it runs next).
   */
  get jobRetried(): ISignal<this, IJob> {
    return this._jobRetried;
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

  /**
   * The workspace's pools of machines (compute.yaml's `pools:`).
   */
  get pools(): readonly IPool[] {
    return this._pools;
  }

  get kinds(): readonly IKind[] {
    return this._kinds;
  }

  /**
   * The hub organization's default machine (`org:NAME`), where its admin set one: not among the
   * machines, but what a job runs on when it names none, as `local` is elsewhere.
   */
  get defaultMachine(): string | null {
    return this._defaultMachine;
  }

  /**
   * compute.yaml's version as of the last GET /machines.
   */
  /**
   * What the hub's organization service says of this user; null outside a hub or where it runs none.
   */
  get organization(): IOrganization | null {
    return this._organization;
  }

  /**
   * Whether this user may change the organization's machines, quotas, and see every user's jobs
   * and usage (the service's admin scope).
   */
  get isOrgAdmin(): boolean {
    return this._organization?.admin === true;
  }

  get version(): string {
    return this._version;
  }

  /**
   * The jobs loaded so far that match the filter, newest first (more pages: `loadMore`).
   */
  get jobs(): readonly IJob[] {
    return this._jobs;
  }

  /**
   * Whether older jobs matching the filter are still on the server.
   */
  get hasMore(): boolean {
    return this._nextCursor !== null;
  }

  get filter(): Readonly<IJobFilter> {
    return this._filter;
  }

  /**
   * Show other jobs: the list starts again from the server's first page for the new filter.
   */
  setFilter(filter: Partial<IJobFilter>): Promise<void> {
    const next = { ...this._filter, ...filter };
    if (
      next.machine === this._filter.machine &&
      next.state === this._filter.state &&
      next.name === this._filter.name
    ) {
      return Promise.resolve();
    }
    this._filter = next;
    return this._loadFirstPage().catch(error => {
      this._error = asAPIError(error);
      this._changed.emit();
    });
  }

  /**
   * Fetch the next page of the list (as the user scrolls); one request at a time.
   */
  loadMore(): Promise<void> {
    if (this._nextCursor === null || this._isDisposed) {
      return Promise.resolve();
    }
    if (!this._more) {
      const generation = this._listGeneration;
      this._more = listJobs({
        ...queryOf(this._filter),
        cursor: this._nextCursor
      })
        .then(page => {
          if (generation !== this._listGeneration || this._isDisposed) {
            return;
          }
          this._nextCursor = page.next_cursor ?? null;
          this._jobs = this._jobs.concat(
            this._remember(page.jobs ?? []).filter(j => !this._listed.has(j.id))
          );
          this._syncListed();
          this._changed.emit();
        })
        .catch(error => {
          this._error = asAPIError(error);
          this._changed.emit();
        })
        .finally(() => {
          this._more = null;
        });
    }
    return this._more;
  }

  job(id: string): IJob | undefined {
    return this._byId.get(id);
  }

  /**
   * Whether the model holds the whole job as it is now (spec, outputs, MLflow run): not for a
   * summary from the list, nor, after an event or a page said the job changed, until the job is
   * read again (what was read of its outputs and run is older than its state until then).
   */
  isWhole(id: string): boolean {
    return !!this._byId.get(id)?.spec && !this._outdated.has(id);
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
      (settings.fallbackPollInterval >= 1000 ||
        settings.fallbackPollInterval === 0)
    ) {
      next.fallbackPollInterval = settings.fallbackPollInterval;
    }
    if (typeof settings.mlflowUiUrl === 'string') {
      next.mlflowUiUrl = settings.mlflowUiUrl.trim().replace(/\/+$/, '');
    }
    this._settings = next;
    this._poll.frequency = {
      ...this._poll.frequency,
      interval:
        next.fallbackPollInterval || DEFAULT_SETTINGS.fallbackPollInterval
    };
    this._changed.emit();
  }

  /**
   * Ask the server now, and start the fallback poll if it is not running yet (it stands by
   * while the event socket is up).
   */
  async refresh(): Promise<void> {
    if (this._isDisposed) {
      return;
    }
    void this._poll.start();
    await this._fetch();
  }

  /**
   * Reach a machine and remember the outcome. A machine that could not be reached is an answer
   * (`ok` false, with the reason); a check that failed otherwise rejects with an APIError.
   */
  /**
   * Check a machine (the organization's one through its service), and keep the answer for the panel.
   */
  async check(name: string, organization = false): Promise<ICheckResult> {
    try {
      const result = await (organization
        ? checkOrgMachine(name)
        : checkMachine(name));
      this._checks.set(name, {
        ok: result.ok,
        at: new Date().toISOString(),
        facts: result.facts ?? {},
        message: result.ok ? '' : (result.reason ?? '')
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
    if (!this._pending.has(job.id)) {
      this._outdated.delete(job.id);
    }
    this._place(merged);
    this._noteTransition(previous?.state, merged);
    this._jobChanged.emit(merged);
    this._changed.emit();
  }

  removeJob(id: string): void {
    this._outdated.delete(id);
    if (!this._byId.delete(id)) {
      return;
    }
    if (this._listed.delete(id)) {
      this._jobs = this._jobs.filter(j => j.id !== id);
    }
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
    this._events?.connectionChanged?.disconnect(this._onConnection, this);
    this._poll.dispose();
    for (const timer of this._pending.values()) {
      window.clearTimeout(timer);
    }
    this._pending.clear();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    try {
      const [machines, pools] = await Promise.all([
        listMachines(),
        // Pools are offered where machines are; a server that cannot list them offers none.
        listPools().catch(() => ({ pools: [] as IPool[] })),
        this._loadFirstPage()
      ]);
      this._machines = machines.machines ?? [];
      this._pools = pools.pools ?? [];
      this._kinds = machines.kinds ?? this._kinds;
      this._version = machines.version ?? '';
      this._defaultMachine = machines.organization?.default ?? null;
      this._organization = machines.organization ?? null;
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

  /**
   * The first page of the list. While only it is loaded it replaces the list; once the user
   * paged further, its jobs are merged in, so the list never jumps back to the top.
   */
  private async _loadFirstPage(): Promise<void> {
    const generation = this._filterGeneration();
    const page: IJobList = await listJobs(queryOf(this._filter));
    if (generation !== this._listGeneration || this._isDisposed) {
      return;
    }
    const jobs = this._remember(page.jobs ?? []);
    if (
      this._pagedFilter !== this._filterKey() ||
      this._jobs.length <= JOB_PAGE_SIZE
    ) {
      this._pagedFilter = this._filterKey();
      this._jobs = jobs;
      this._nextCursor = page.next_cursor ?? null;
      this._syncListed();
    } else {
      for (const job of jobs) {
        this._place(job);
      }
    }
    this._changed.emit();
  }

  private _filterKey(): string {
    return JSON.stringify(this._filter);
  }

  /**
   * A new filter makes answers to the old one stale; the same filter keeps its generation.
   */
  private _filterGeneration(): number {
    if (this._generationFilter !== this._filterKey()) {
      this._generationFilter = this._filterKey();
      this._listGeneration += 1;
    }
    return this._listGeneration;
  }

  /**
   * Keep what the model knows of listed jobs: a summary replaces a whole job only when the job
   * changed (then the whole job is fetched again for whoever shows it).
   */
  private _remember(jobs: IJob[]): IJob[] {
    return jobs.map(job => {
      const previous = this._byId.get(job.id);
      if (previous && previous.updated === job.updated) {
        return previous;
      }
      const merged = previous ? { ...previous, ...job } : job;
      this._byId.set(job.id, merged);
      this._noteTransition(previous?.state, merged);
      if (previous) {
        if (previous.spec) {
          this._scheduleFetch(job.id);
        }
        this._jobChanged.emit(merged);
      }
      return merged;
    });
  }

  private _syncListed(): void {
    this._listed = new Set(this._jobs.map(j => j.id));
  }

  private _matches(job: IJob): boolean {
    const { machine, state, name } = this._filter;
    if (machine && job.machine !== machine) {
      return false;
    }
    if (
      state &&
      (state === 'active' ? !isActive(job.state) : job.state !== state)
    ) {
      return false;
    }
    const part = name.trim().toLowerCase();
    return !part || (job.name ?? '').toLowerCase().includes(part);
  }

  /**
   * Put a changed or new job where it belongs in the list, or take it out when it no longer
   * matches the filter. A job older than the last loaded page waits for that page.
   */
  private _place(job: IJob): void {
    const listed = this._listed.has(job.id);
    const oldest = this._jobs[this._jobs.length - 1];
    const inRange =
      this._nextCursor === null || !oldest || sortKey(job) >= sortKey(oldest);
    if (this._matches(job) && (listed || inRange)) {
      this._jobs = listed
        ? this._jobs.map(j => (j.id === job.id ? job : j))
        : [job, ...this._jobs].sort(byNewest);
      this._listed.add(job.id);
    } else if (listed) {
      this._jobs = this._jobs.filter(j => j.id !== job.id);
      this._listed.delete(job.id);
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
    // Only a retry puts a job that left the queue back in it.
    const retry = `${job.id}\n${job.reason ?? ''}`;
    if (
      previous !== undefined &&
      previous !== 'queued' &&
      isActive(previous) &&
      job.state === 'queued' &&
      !this._retried.has(retry)
    ) {
      this._retried.add(retry);
      this._jobRetried.emit(job);
    }
  }

  /**
   * The event socket came back: ask once for what changed while it was down.
   */
  private _onConnection(_: unknown, connected: boolean): void {
    if (connected && this._active && !this._loading) {
      void this._fetch().catch(() => undefined);
    }
    this._changed.emit();
  }

  private _onEvent(_: unknown, emission: Event.Emission): void {
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
      // A new state brings outputs or a run; an ended job changes when its MLflow run is recorded.
      if (
        known.state !== patched.state ||
        (isTerminal(patched.state) && known.updated !== patched.updated)
      ) {
        this._scheduleFetch(id);
      }
      this._place(patched);
      this._noteTransition(known.state, patched);
      this._jobChanged.emit(patched);
      this._changed.emit();
    } else {
      // A job this model has not seen (submitted elsewhere): fetch it whole.
      this._scheduleFetch(id);
    }
  }

  /**
   * Fetch one job soon, coalescing bursts of events about it; until it is read, what the model
   * holds of it is not the whole job (`isWhole`).
   */
  private _scheduleFetch(id: string): void {
    this._outdated.add(id);
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
          } else if (this._outdated.delete(id)) {
            // What was read before stands; the next change reads the job again.
            this._changed.emit();
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
  private _filter: IJobFilter = { ...NO_FILTER };
  private _generationFilter = '';
  private _events: IJobEvents | null = null;
  private _defaultMachine: string | null = null;
  private _isDisposed = false;
  private _jobChanged = new Signal<this, IJob>(this);
  private _jobEnded = new Signal<this, IJob>(this);
  private _jobRetried = new Signal<this, IJob>(this);
  private _jobs: IJob[] = [];
  private _kinds: IKind[] = [];
  private _listed = new Set<string>();
  private _listGeneration = 0;
  private _loading = true;
  private _machines: IMachine[] = [];
  private _pools: IPool[] = [];
  private _missingReported = false;
  private _more: Promise<void> | null = null;
  private _nextCursor: string | null = null;
  private _organization: IOrganization | null = null;
  private _outdated = new Set<string>();
  private _pagedFilter = '';
  private _pending = new Map<string, number>();
  private _poll: Poll;
  private _retried = new Set<string>();
  private _serverMissing = new Signal<this, APIError>(this);
  private _settings: IComputeSettings;
  private _version = '';
}

export namespace ComputeModel {
  export interface IOptions {
    /**
     * The server's event bus; job events patch the model, and while its socket is up the
     * fallback poll stands by.
     */
    events?: IJobEvents;
  }
}
