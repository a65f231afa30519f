/**
 * One job in the main area: its spec (env names only, never values), state, outputs with
 * links that open them, the MLflow run, Cancel / Delete / Run Again, and a live log that
 * follows the server's byte offsets.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Button, ReactWidget } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import { Panel } from '@lumino/widgets';
import * as React from 'react';

import { IJob, isActive, isTerminal, readLog } from '../api';
import { computeIcon } from '../icons';
import { LogView } from '../logview';
import { LogFilterWidget } from './LogFilter';
import { asAPIError, ComputeModel } from '../model';
import { JobDuration, RelativeTime, StateBadge, useSignal } from './common';
import {
  Attempts,
  formatPlacement,
  MlflowRun,
  Muted,
  Outputs,
  SpecFacts,
  Webhooks
} from './JobFacts';
import { JobMetrics, MetricsFollower } from './JobMetrics';

const LOG_CHUNK = 1 << 20;
/**
 * Seconds the server may hold a log read until new bytes exist (its long poll).
 */
const LOG_WAIT = 25;

function JobInfo(props: {
  model: ComputeModel;
  trans: TranslationBundle;
  commands: CommandRegistry;
  jobId: string;
  error: string | null;
  metrics: MetricsFollower;
}): JSX.Element {
  const { model, trans, commands, jobId } = props;
  useSignal(model.changed);
  const job: IJob | undefined = model.job(jobId);
  if (!job) {
    return (
      <div className="jp-RemoteCompute-jobInfo">
        <p className="jp-RemoteCompute-muted">
          {props.error ?? trans.__('Loading job %1…', jobId)}
        </p>
      </div>
    );
  }
  const spec = job.spec;
  const whole = model.isWhole(job.id);
  const runId = job.mlflow_run_id;
  const openRun = (): void =>
    void commands.execute('remote-compute:open-mlflow', { id: job.id });
  const placement = formatPlacement(job, trans);

  return (
    <section
      className="jp-RemoteCompute-jobInfo"
      aria-label={trans.__('Job %1', job.name || job.id)}
    >
      <div className="jp-RemoteCompute-jobHeader">
        <h2 className="jp-RemoteCompute-formTitle" title={job.id}>
          {job.name || job.id}
        </h2>
        <StateBadge job={job} trans={trans} />
      </div>
      <div className="jp-RemoteCompute-jobActions">
        {isActive(job.state) && (
          <Button
            type="button"
            className="jp-mod-warn"
            onClick={() =>
              void commands.execute('remote-compute:cancel-job', { id: job.id })
            }
          >
            {trans.__('Cancel')}
          </Button>
        )}
        <Button
          type="button"
          onClick={() =>
            void commands.execute('remote-compute:run-again', { id: job.id })
          }
        >
          {trans.__('Run Again')}
        </Button>
        {runId && (
          <Button type="button" onClick={openRun}>
            {trans.__('Open in MLflow')}
          </Button>
        )}
        {isTerminal(job.state) && (
          <Button
            type="button"
            minimal
            onClick={() =>
              void commands.execute('remote-compute:delete-job', { id: job.id })
            }
          >
            {trans.__('Delete')}
          </Button>
        )}
      </div>
      {job.reason && (
        <div
          className="jp-RemoteCompute-reason"
          data-state={job.state}
          role={
            job.state === 'failed' || job.state === 'lost' ? 'alert' : undefined
          }
        >
          {job.reason}
        </div>
      )}
      {job.notices && job.notices.length > 0 && (
        <ul
          className="jp-RemoteCompute-notices"
          aria-label={trans.__("The organization's notices")}
        >
          {job.notices.map(notice => (
            <li key={notice}>{notice}</li>
          ))}
        </ul>
      )}
      {job.progress && job.state === 'sending' && job.progress.total > 0 && (
        <progress
          className="jp-RemoteCompute-progress"
          value={job.progress.done}
          max={job.progress.total}
          aria-label={trans.__('Files sent')}
        />
      )}
      <dl className="jp-RemoteCompute-facts">
        <dt>{trans.__('Machine')}</dt>
        <dd>
          {job.machine}
          {job.kind ? ` (${job.kind})` : ''}
        </dd>
        <dt>{trans.__('Job id')}</dt>
        <dd>
          <code>{job.id}</code>
        </dd>
        <dt>{trans.__('Created')}</dt>
        <dd>
          <RelativeTime when={job.created} trans={trans} />
        </dd>
        <dt>{trans.__('Started')}</dt>
        <dd>
          {job.started ? (
            <RelativeTime when={job.started} trans={trans} />
          ) : (
            trans.__('not yet')
          )}
        </dd>
        {job.ended && (
          <>
            <dt>{trans.__('Ended')}</dt>
            <dd>
              <RelativeTime when={job.ended} trans={trans} />
            </dd>
          </>
        )}
        <dt>{trans.__('Duration')}</dt>
        <dd>
          <JobDuration job={job} />
        </dd>
        {typeof job.exit_code === 'number' && (
          <>
            <dt>{trans.__('Exit code')}</dt>
            <dd>{job.exit_code}</dd>
          </>
        )}
        <Attempts job={job} trans={trans} />
        <Webhooks job={job} trans={trans} />
        {spec ? (
          <SpecFacts job={job} spec={spec} trans={trans} />
        ) : (
          <>
            <dt>{trans.__('Command')}</dt>
            <dd>
              <Muted text={trans.__('reading…')} />
            </dd>
          </>
        )}
        {placement && (
          <>
            <dt>{trans.__('Placed on')}</dt>
            <dd>{placement}</dd>
          </>
        )}
        {job.pool && (
          <>
            <dt>{trans.__('Pool')}</dt>
            <dd>
              {job.placement
                ? `${job.pool}: ${job.placement}`
                : trans.__('%1: waiting for a machine with room', job.pool)}
            </dd>
          </>
        )}
        <dt>{trans.__('Outputs')}</dt>
        <dd>
          <Outputs job={job} whole={whole} commands={commands} trans={trans} />
        </dd>
        <dt>{trans.__('MLflow run')}</dt>
        <dd>
          <MlflowRun job={job} open={openRun} trans={trans} />
        </dd>
      </dl>
      <JobMetrics follower={props.metrics} trans={trans} />
      <h3 className="jp-RemoteCompute-sectionTitle">{trans.__('Log')}</h3>
    </section>
  );
}

/**
 * The job detail as a main-area widget: the info above, the live log below.
 */
export class JobDetailWidget extends Panel {
  constructor(options: JobDetailWidget.IOptions) {
    super();
    this._options = options;
    const { model, trans, jobId } = options;
    this.addClass('jp-RemoteCompute-jobDetail');
    this.title.icon = computeIcon;
    this.title.closable = true;
    this.title.label = trans.__('Job %1', jobId);
    this._metrics = new MetricsFollower(jobId);

    this._info = ReactWidget.create(
      <JobInfo
        model={model}
        trans={trans}
        commands={options.commands}
        jobId={jobId}
        error={null}
        metrics={this._metrics}
      />
    );
    this._info.addClass('jp-RemoteCompute-jobInfoWidget');
    this._log = new LogView({
      trans,
      maxLines: model.settings.logLinesKept,
      label: trans.__('Log of job %1', jobId)
    });
    this.addWidget(this._info);
    this.addWidget(new LogFilterWidget(this._log, trans));
    this.addWidget(this._log);
    model.changed.connect(this._onModelChanged, this);
    model.jobChanged.connect(this._onJobChanged, this);
    this._onModelChanged();
    // The list holds summaries: the whole job (spec, outputs, transfer) comes with a GET.
    if (!model.job(jobId)?.spec) {
      model.reloadJob(jobId).catch(error => {
        this._setInfoError(asAPIError(error).message);
      });
    }
    void this._followLog();
  }

  get jobId(): string {
    return this._options.jobId;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._options.model.changed.disconnect(this._onModelChanged, this);
    this._options.model.jobChanged.disconnect(this._onJobChanged, this);
    this._metrics.dispose();
    this._wake();
    super.dispose();
  }

  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }

  private _setInfoError(message: string): void {
    const { model, trans, commands, jobId } = this._options;
    this._info.dispose();
    this._info = ReactWidget.create(
      <JobInfo
        model={model}
        trans={trans}
        commands={commands}
        jobId={jobId}
        error={message}
        metrics={this._metrics}
      />
    );
    this._info.addClass('jp-RemoteCompute-jobInfoWidget');
    this.insertWidget(0, this._info);
  }

  private _onModelChanged(): void {
    const { model, trans, jobId } = this._options;
    const job = model.job(jobId);
    if (job) {
      this.title.label = trans.__('Job: %1', job.name || jobId);
      this.title.caption = `${job.name} (${jobId}) — ${job.state}`;
    }
    if (this._log.maxLines !== model.settings.logLinesKept) {
      this._log.maxLines = model.settings.logLinesKept;
    }
  }

  private _onJobChanged(_: ComputeModel, job: IJob): void {
    if (job.id === this._options.jobId) {
      this._wake();
    }
  }

  /**
   * Resolve the pending wait of the log follower (an event said the job changed).
   */
  private _wake = (): void => {
    const resolve = this._resolveWait;
    this._resolveWait = null;
    resolve?.();
  };

  private _wait(ms: number): Promise<void> {
    return new Promise(resolve => {
      const timer = window.setTimeout(() => {
        this._resolveWait = null;
        resolve();
      }, ms);
      this._resolveWait = () => {
        window.clearTimeout(timer);
        resolve();
      };
    });
  }

  /**
   * Read the log from byte offsets until the server says it is complete. Each read is held by
   * the server until new bytes exist (`wait`), so the next one goes out as soon as an answer
   * comes and none on a timer; only a failed read is retried after a growing delay (which a job
   * event cuts short).
   */
  private async _followLog(): Promise<void> {
    const { trans, jobId, model } = this._options;
    let offset = 0;
    let failures = 0;
    this._log.note = trans.__('Waiting for output…');
    while (!this.isDisposed) {
      let chunk;
      try {
        chunk = await readLog(jobId, offset, LOG_CHUNK, undefined, LOG_WAIT);
        failures = 0;
      } catch (error) {
        if (this.isDisposed) {
          return;
        }
        const apiError = asAPIError(error);
        if (apiError.status === 404 && apiError.fromServerExtension) {
          this._log.note = trans.__('This job no longer exists.');
          return;
        }
        failures++;
        this._log.note = trans.__(
          'Could not read the log: %1 (retrying)',
          apiError.message
        );
        await this._wait(Math.min(30000, 1000 * 2 ** failures));
        continue;
      }
      if (this.isDisposed) {
        return;
      }
      if (chunk.next_offset > offset && chunk.data) {
        this._log.append(chunk.data);
      }
      offset = Math.max(offset, chunk.next_offset);
      if (chunk.complete) {
        this._log.note =
          this._log.lineCount === 0
            ? trans.__('The log is empty.')
            : trans.__('Log complete.');
        return;
      }
      const job = model.job(jobId);
      this._log.note =
        job && isActive(job.state)
          ? trans.__('Following the log…')
          : trans.__('Waiting for output…');
    }
  }

  private _info: ReactWidget;
  private _log: LogView;
  private _metrics: MetricsFollower;
  private _options: JobDetailWidget.IOptions;
  private _resolveWait: (() => void) | null = null;
}

export namespace JobDetailWidget {
  export interface IOptions {
    model: ComputeModel;
    trans: TranslationBundle;
    commands: CommandRegistry;
    jobId: string;
  }
}
