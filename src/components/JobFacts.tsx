/**
 * A job's facts as its detail lists them: what its spec asks for (command, files, environment,
 * variables by name only, resources, timeout), its outputs and its MLflow run.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { IJob, IResources, IStoredJobSpec, isTerminal } from '../api';
import { formatDuration, formatSize, shellLine } from '../format';

function List(props: { items: string[]; empty: string }): JSX.Element {
  if (props.items.length === 0) {
    return <Muted text={props.empty} />;
  }
  return (
    <ul className="jp-RemoteCompute-plainList">
      {props.items.map(item => (
        <li key={item}>
          <code>{item}</code>
        </li>
      ))}
    </ul>
  );
}

/**
 * "4h00m" for 14400 (seconds) or the spec's own words ("4h"): a timeout as a person reads it.
 */
export function formatTimeout(timeout: number | string): string {
  const seconds = typeof timeout === 'number' ? timeout : Number(timeout);
  return Number.isFinite(seconds)
    ? formatDuration(seconds * 1000)
    : String(timeout);
}

/**
 * "2 GPUs · 8 CPUs · 32G memory · 1 node · partition gpu": what the job asked of its machine.
 */
export function formatResources(
  resources: IResources | null | undefined,
  trans: TranslationBundle
): string {
  if (!resources) {
    return '';
  }
  const parts: string[] = [];
  const count = (n: number | null | undefined, one: string, many: string) => {
    if (typeof n === 'number') {
      parts.push(trans._n(one, many, n, n));
    }
  };
  count(resources.gpus, '%1 GPU', '%1 GPUs');
  count(resources.cpus, '%1 CPU', '%1 CPUs');
  if (resources.memory) {
    parts.push(trans.__('%1 memory', resources.memory));
  }
  count(resources.nodes, '%1 node', '%1 nodes');
  count(
    resources.processes_per_node,
    '%1 process per node',
    '%1 processes per node'
  );
  if (resources.launcher) {
    parts.push(trans.__('started by %1', resources.launcher));
  }
  if (resources.partition) {
    parts.push(trans.__('partition %1', resources.partition));
  }
  return parts.join(' · ');
}

/**
 * What the job got, as far as its machine's record says: a Slurm job, a SkyPilot cluster.
 */
export function formatPlacement(job: IJob, trans: TranslationBundle): string {
  const handle = (job.handle ?? {}) as Record<string, unknown>;
  const parts: string[] = [];
  if (handle.slurm_job_id) {
    parts.push(trans.__('Slurm job %1', String(handle.slurm_job_id)));
  }
  if (job.kind === 'skypilot' && typeof handle.cluster === 'string') {
    parts.push(trans.__('SkyPilot cluster %1', handle.cluster));
  }
  return parts.join(' · ');
}

/**
 * What a job's environment holds, by the New Job form's labels (`Environment` in openapi.yaml,
 * and the registry credentials its image is pulled with); none: the machine's default.
 */
export function environmentLines(
  spec: IStoredJobSpec,
  trans: TranslationBundle
): { label: string; value?: string }[] {
  const env = spec.environment ?? {};
  const lines: { label: string; value?: string }[] = [];
  if (env.requirements) {
    lines.push({
      label: trans.__('Requirements file'),
      value: env.requirements
    });
  }
  if (env.packages && env.packages.length > 0) {
    lines.push({ label: trans.__('Packages'), value: env.packages.join(', ') });
  }
  if (env.python) {
    lines.push({ label: trans.__('Python version'), value: env.python });
  }
  if (env.same_as_here) {
    lines.push({
      label: trans.__('The same packages as this server’s Python')
    });
  }
  if (env.image) {
    lines.push({ label: trans.__('Image'), value: env.image });
    if (env.runtime && env.runtime !== 'auto') {
      lines.push({ label: trans.__('Container runtime'), value: env.runtime });
    }
  }
  if (spec.registry_secret) {
    lines.push({
      label: trans.__('Registry credentials'),
      value: spec.registry_secret
    });
  }
  return lines;
}

/**
 * Whether a job that ended will not get an MLflow run: the recorder said why on its reason.
 */
function notRecorded(job: IJob): boolean {
  return (job.reason ?? '').includes('not recorded in MLflow');
}

export function Muted(props: { text: string; title?: string }): JSX.Element {
  return (
    <span className="jp-RemoteCompute-muted" title={props.title}>
      {props.text}
    </span>
  );
}

function EnvironmentFacts(props: {
  spec: IStoredJobSpec;
  trans: TranslationBundle;
}): JSX.Element {
  const { spec, trans } = props;
  const lines = environmentLines(spec, trans);
  if (lines.length === 0) {
    return <Muted text={trans.__("the machine's default")} />;
  }
  return (
    <ul className="jp-RemoteCompute-plainList">
      {lines.map(({ label, value }) => (
        <li key={label}>
          {value === undefined ? (
            label
          ) : (
            <>
              {trans.__('%1:', label)} <code>{value}</code>
            </>
          )}
        </li>
      ))}
    </ul>
  );
}

/**
 * The files the job names, then how many files (its environment's included) went, and their size.
 */
function FilesSent(props: {
  job: IJob;
  trans: TranslationBundle;
}): JSX.Element {
  const { job, trans } = props;
  const named = job.spec?.send ?? [];
  const files = job.inputs?.files;
  const counted = typeof files === 'number' && files > 0;
  if (named.length === 0 && !counted) {
    return <Muted text={trans.__('none')} />;
  }
  return (
    <>
      {named.length > 0 && <List items={named} empty="" />}
      {counted && (
        <div className="jp-RemoteCompute-muted">
          {trans._n(
            '%1 file, %2',
            '%1 files, %2',
            files,
            formatSize(job.inputs?.bytes ?? 0)
          )}
        </div>
      )}
    </>
  );
}

export function Outputs(props: {
  job: IJob;
  whole: boolean;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { job, whole, commands, trans } = props;
  const outputs = Object.entries(job.outputs ?? {});
  if (outputs.length === 0) {
    if (!isTerminal(job.state)) {
      return <Muted text={trans.__('when the job ends')} />;
    }
    // Ended, but what the model holds was read before: the outputs come with the job's next read.
    return <Muted text={whole ? trans.__('none') : trans.__('reading…')} />;
  }
  return (
    <ul className="jp-RemoteCompute-plainList">
      {outputs.map(([path, info]) => (
        <li key={path}>
          <a
            href="#"
            className="jp-RemoteCompute-link"
            title={info.sha256 ? `sha256 ${info.sha256}` : path}
            onClick={e => {
              e.preventDefault();
              void commands.execute('docmanager:open', { path });
            }}
          >
            {path}
          </a>{' '}
          <span className="jp-RemoteCompute-muted">
            {formatSize(info.size)}
          </span>
        </li>
      ))}
    </ul>
  );
}

export function MlflowRun(props: {
  job: IJob;
  open: () => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { job, open, trans } = props;
  const runId = job.mlflow_run_id;
  if (runId) {
    return (
      <a
        href="#"
        className="jp-RemoteCompute-link"
        title={
          job.tracking_uri
            ? trans.__('Open run %1 in MLflow at %2', runId, job.tracking_uri)
            : trans.__('Open run %1 in MLflow', runId)
        }
        onClick={e => {
          e.preventDefault();
          open();
        }}
      >
        <code>{runId}</code>
        {job.tracking_uri && (
          <span className="jp-RemoteCompute-itemDetail">
            {' · ' + trans.__('on %1', job.tracking_uri)}
          </span>
        )}
      </a>
    );
  }
  if (!isTerminal(job.state)) {
    return <Muted text={trans.__('when the job ends')} />;
  }
  if (notRecorded(job)) {
    return <Muted text={trans.__('none')} title={job.reason ?? undefined} />;
  }
  // Every job that ends is recorded; a recorder of its own may put the run on it a moment later.
  return (
    <Muted
      text={trans.__('recording…')}
      title={trans.__(
        'The MLflow run is being recorded; it shows here once it is.'
      )}
    />
  );
}

/**
 * A retried job's attempts: where each ran, how it ended and why, and the work it lost (the time
 * since its newest checkpoint at home, which the next attempt does again); then the one under way.
 */
export function Attempts(props: {
  job: IJob;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { job, trans } = props;
  const attempts = job.attempts ?? [];
  if (attempts.length === 0) {
    return null;
  }
  const underWay = !isTerminal(job.state);
  return (
    <>
      <dt>{trans.__('Attempts')}</dt>
      <dd>
        <ol className="jp-RemoteCompute-attempts">
          {attempts.map((attempt, i) => (
            <li key={i} data-end={attempt.end}>
              {trans.__('%1: %2', attempt.machine, attempt.end)}
              {typeof attempt.lost_s === 'number' &&
                ' · ' +
                  trans.__(
                    '%1 of work lost',
                    formatDuration(attempt.lost_s * 1000)
                  )}
              {attempt.reason && attempt.end !== 'succeeded' && (
                <>
                  {' '}
                  <Muted text={attempt.reason.split('\n')[0]} />
                </>
              )}
            </li>
          ))}
          {underWay && (
            <li data-end="">
              {trans.__('%1: %2 now', job.machine, job.state)}
            </li>
          )}
        </ol>
      </dd>
    </>
  );
}

/**
 * How the last notice to each of the job's webhooks went (its own and its machine's): landed, or why
 * not. URLs as the server keeps them: no query, no credentials.
 */
export function Webhooks(props: {
  job: IJob;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { job, trans } = props;
  const deliveries = job.deliveries ?? [];
  if (deliveries.length === 0) {
    return null;
  }
  return (
    <>
      <dt>{trans.__('Webhooks')}</dt>
      <dd>
        <ul
          className="jp-RemoteCompute-plainList"
          aria-label={trans.__('Webhooks')}
        >
          {deliveries.map(d => (
            <li
              key={`${d.source} ${d.url}`}
              data-landed={d.error === null ? 'true' : 'false'}
              title={trans.__('told at %1', d.at)}
            >
              {d.source === 'machine'
                ? trans.__('%1 (the machine’s)', d.url)
                : d.url}
              {': '}
              {d.error === null
                ? trans.__('told %1, HTTP %2', d.state, String(d.status))
                : trans.__('telling %1 failed: %2', d.state, d.error)}
            </li>
          ))}
        </ul>
      </dd>
    </>
  );
}

/**
 * What the job was asked to do: its command, files, environment, variables, resources, timeout.
 */
export function SpecFacts(props: {
  job: IJob;
  spec: IStoredJobSpec;
  trans: TranslationBundle;
}): JSX.Element {
  const { job, spec, trans } = props;
  const command = shellLine(spec.command);
  const envNames = Object.keys(spec.env ?? {});
  const resources = formatResources(spec.resources, trans);
  return (
    <>
      <dt>{trans.__('Command')}</dt>
      <dd>
        <code className="jp-RemoteCompute-codeBlock">{command}</code>
      </dd>
      <dt>{trans.__('Files sent')}</dt>
      <dd>
        <FilesSent job={job} trans={trans} />
      </dd>
      <dt>{trans.__('Bring back')}</dt>
      <dd>
        <List items={spec.bring_back ?? []} empty={trans.__('none')} />
      </dd>
      <dt>{trans.__('Environment')}</dt>
      <dd>
        <EnvironmentFacts spec={spec} trans={trans} />
      </dd>
      <dt>{trans.__('Variables')}</dt>
      <dd>
        {envNames.length > 0 ? (
          <span title={trans.__('Names only; values are never shown.')}>
            {envNames.join(', ')}
          </span>
        ) : (
          <Muted text={trans.__('none')} />
        )}
      </dd>
      <dt>{trans.__('Resources')}</dt>
      <dd>
        {resources || <Muted text={trans.__("the machine's defaults")} />}
      </dd>
      {spec.timeout !== undefined && spec.timeout !== null && (
        <>
          <dt>{trans.__('Timeout')}</dt>
          <dd title={trans.__('%1 seconds', String(spec.timeout))}>
            {formatTimeout(spec.timeout)}
          </dd>
        </>
      )}
    </>
  );
}
