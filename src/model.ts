/**
 * The Compute panel's model: machines and jobs as the server reports them, refreshed on
 * server events and by a fallback poll. Components subscribe to `changed` and render.
 */
import { Event } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { APIError, IJob, IMachine, listJobs, listMachines } from './api';

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
 * Only events whose schema id mentions the extension trigger a refresh.
 */
const EVENT_SCHEMA_MARKER = 'remote-compute';

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

  get machines(): readonly IMachine[] {
    return this._machines;
  }

  get jobs(): readonly IJob[] {
    return this._jobs;
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
      next.logLinesKept = settings.logLinesKept;
    }
    if (
      typeof settings.fallbackPollInterval === 'number' &&
      settings.fallbackPollInterval >= 1000
    ) {
      next.fallbackPollInterval = settings.fallbackPollInterval;
    }
    if (typeof settings.mlflowUiUrl === 'string') {
      next.mlflowUiUrl = settings.mlflowUiUrl.trim();
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
    // A refresh on a poll that never ran also starts it: the next ticks follow the frequency.
    this._started = true;
    await this._poll.refresh();
    await this._poll.tick;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._events?.stream.disconnect(this._onEvent, this);
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    try {
      const [machines, jobs] = await Promise.all([listMachines(), listJobs()]);
      this._machines = machines.machines ?? [];
      this._jobs = jobs.jobs ?? [];
      this._error = null;
    } catch (error) {
      this._error =
        error instanceof APIError
          ? error
          : new APIError({
              status: 0,
              code: 'client-error',
              message: error instanceof Error ? error.message : String(error),
              fromServerExtension: false
            });
      // Rejecting lets the poll back off while the server is not answering.
      throw this._error;
    } finally {
      this._loading = false;
      if (!this._isDisposed) {
        this._changed.emit();
      }
    }
  }

  private _onEvent(_: Event.IManager, emission: Event.Emission): void {
    if (emission.schema_id.includes(EVENT_SCHEMA_MARKER) && this._started) {
      void this._poll.refresh();
    }
  }

  private _active = false;
  private _changed = new Signal<this, void>(this);
  private _error: APIError | null = null;
  private _events: Event.IManager | null = null;
  private _isDisposed = false;
  private _jobs: IJob[] = [];
  private _loading = true;
  private _machines: IMachine[] = [];
  private _poll: Poll;
  private _settings: IComputeSettings;
  private _started = false;
}

export namespace ComputeModel {
  export interface IOptions {
    /**
     * The server's event bus; job and machine events trigger a refresh.
     */
    events?: Event.IManager;
  }
}
