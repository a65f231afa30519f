/**
 * A job's live metrics in its detail: one line chart per metric (step on x), updated as the
 * server reads new points from the job's far-side MLflow store.
 *
 * The follower long-polls `GET /jobs/<id>/metrics?since=<cursor>&wait=25`: the server holds each
 * request until new points exist, so nothing here runs on a timer (a failed request is retried
 * after a growing delay, the one exception). Asking is also what keeps the job watched.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';
import * as React from 'react';

import { IMetricPoint, readMetrics } from '../api';
import { asAPIError } from '../model';
import { LineChart } from './charts/LineChart';
import { useSignal } from './common';

/**
 * Seconds the server may hold one metrics request.
 */
export const METRICS_WAIT = 25;

export interface IMetricLine {
  run: string;
  key: string;
  points: IMetricPoint[];
}

export class MetricsFollower implements IDisposable {
  constructor(jobId: string) {
    this._jobId = jobId;
    void this._follow();
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /**
   * Every metric seen so far, in the order it first appeared.
   */
  get lines(): readonly IMetricLine[] {
    return [...this._lines.values()];
  }

  /**
   * The job ended: the lines are final.
   */
  get complete(): boolean {
    return this._complete;
  }

  get error(): string {
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
    this._retry?.();
    Signal.clearData(this);
  }

  private async _follow(): Promise<void> {
    let cursor = '';
    let failures = 0;
    while (!this._isDisposed && !this._complete) {
      let page;
      try {
        page = await readMetrics(this._jobId, cursor, METRICS_WAIT);
        failures = 0;
        this._error = '';
      } catch (error) {
        const apiError = asAPIError(error);
        if (
          this._isDisposed ||
          (apiError.status === 404 && apiError.fromServerExtension)
        ) {
          return;
        }
        failures++;
        this._error = apiError.message;
        this._changed.emit();
        await new Promise<void>(resolve => {
          const timer = window.setTimeout(
            resolve,
            Math.min(30000, 1000 * 2 ** failures)
          );
          this._retry = () => {
            window.clearTimeout(timer);
            resolve();
          };
        });
        this._retry = null;
        continue;
      }
      if (this._isDisposed) {
        return;
      }
      if (page.reset) {
        this._lines.clear();
      }
      for (const series of page.metrics) {
        const id = `${series.run}\u0000${series.key}`;
        const line = this._lines.get(id);
        this._lines.set(id, {
          run: series.run,
          key: series.key,
          points: line ? line.points.concat(series.points) : series.points
        });
      }
      cursor = page.cursor || cursor;
      this._complete = page.complete;
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _complete = false;
  private _error = '';
  private _isDisposed = false;
  private _jobId: string;
  private _lines = new Map<string, IMetricLine>();
  private _retry: (() => void) | null = null;
}

/**
 * The metrics section of a job's detail.
 */
export function JobMetrics(props: {
  follower: MetricsFollower;
  trans: TranslationBundle;
}): JSX.Element {
  const { follower, trans } = props;
  useSignal(follower.changed);
  const lines = follower.lines;
  // A run id beside the key only when several runs log metrics.
  const runs = new Set(lines.map(l => l.run));
  return (
    <section
      className="jp-RemoteCompute-jobMetrics"
      aria-label={trans.__('Live metrics')}
    >
      <h3 className="jp-RemoteCompute-sectionTitle">{trans.__('Metrics')}</h3>
      {lines.length === 0 ? (
        <p className="jp-RemoteCompute-muted">
          {follower.complete
            ? trans.__('The job logged no metrics while it ran.')
            : trans.__(
                'What the job logs to MLflow appears here while it runs.'
              )}
        </p>
      ) : (
        <div
          className="jp-RemoteCompute-metricCharts"
          style={{
            display: 'grid',
            gridTemplateColumns: 'repeat(auto-fill, minmax(260px, 1fr))',
            gap: '12px'
          }}
        >
          {lines.map(line => (
            <LineChart
              key={`${line.run}/${line.key}`}
              title={
                runs.size > 1
                  ? `${line.key} (${line.run.slice(0, 8)})`
                  : line.key
              }
              xLabel={trans.__('step')}
              points={line.points.map(p => ({ x: p.step, y: p.value }))}
            />
          ))}
        </div>
      )}
      {follower.error && (
        <p className="jp-RemoteCompute-muted">
          {trans.__(
            'Could not read the metrics: %1 (retrying)',
            follower.error
          )}
        </p>
      )}
    </section>
  );
}
