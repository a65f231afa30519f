/**
 * The one clock of the front end's relative times ("3 min ago") and running durations. Every
 * view reads the time from it, and it ticks once a second while something shows a time, so
 * what is shown follows the time as it passes instead of keeping the moment a view was drawn.
 */

/**
 * Milliseconds between ticks: the finest a shown time changes ("12s" of a running job).
 */
export const TICK = 1000;

export class Clock {
  constructor(interval = TICK) {
    this._interval = interval;
  }

  /**
   * The time of the last tick (every listener shows the same moment), or the time itself while
   * nobody listens.
   */
  get now(): number {
    return this._timer === null ? Date.now() : this._now;
  }

  /**
   * Call `listener` on every tick until the returned function is called; the clock ticks only
   * while it has listeners. The shape React's `useSyncExternalStore` takes.
   */
  subscribe = (listener: () => void): (() => void) => {
    this._listeners.add(listener);
    if (this._timer === null) {
      this._now = Date.now();
      this._timer = window.setInterval(this._tick, this._interval);
      // A hidden tab's timers are slowed down: catch up as soon as it shows again.
      document.addEventListener('visibilitychange', this._tick);
    }
    return () => {
      this._listeners.delete(listener);
      if (this._listeners.size === 0 && this._timer !== null) {
        window.clearInterval(this._timer);
        this._timer = null;
        document.removeEventListener('visibilitychange', this._tick);
      }
    };
  };

  private _tick = (): void => {
    this._now = Date.now();
    for (const listener of [...this._listeners]) {
      listener();
    }
  };

  private _interval: number;
  private _listeners = new Set<() => void>();
  private _now = 0;
  private _timer: number | null = null;
}

/**
 * The clock every view shares.
 */
export const clock = new Clock();
