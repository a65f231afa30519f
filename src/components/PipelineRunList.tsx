/**
 * The Compute panel's pipeline runs: each run's file, state, who started it and when, expandable
 * to its nodes, each with its state and its job (which opens the job's detail, as a job row does);
 * a sweep's run expands to its trials (SweepTrials).
 */
import { PathExt } from '@jupyterlab/coreutils';
import { TranslationBundle } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import * as React from 'react';

import { IJob, IPipelineRun } from '../api';
import { PipelineRuns } from '../pipelineRuns';
import { RelativeTime, stateLabel, useSignal } from './common';
import { SweepTrials } from './SweepTrials';

function NodeRows(props: {
  run: IPipelineRun;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { run, commands, trans } = props;
  const nodes = Object.entries(run.nodes);
  if (nodes.length === 0) {
    return (
      <p className="jp-RemoteCompute-empty">{trans.__('No node ran yet.')}</p>
    );
  }
  return (
    <ul
      className="jp-RemoteCompute-runNodes"
      aria-label={trans.__('Nodes of run %1', run.id)}
    >
      {nodes.map(([nodeId, node]) => {
        const jobId = node.job_id;
        const open = (): void =>
          void commands.execute('remote-compute:show-job', { id: jobId! });
        return (
          <li
            key={nodeId}
            className="jp-RemoteCompute-runNode"
            aria-label={trans.__('Node %1', nodeId)}
            data-state={node.state}
            title={node.reason ?? ''}
          >
            <span className="jp-RemoteCompute-runNodeName">{nodeId}</span>
            <span className="jp-RemoteCompute-state" data-state={node.state}>
              {stateLabel(node.state, trans)}
            </span>
            {jobId ? (
              <button
                type="button"
                className="jp-RemoteCompute-linkButton"
                aria-label={trans.__('Show job %1 of %2', jobId, nodeId)}
                onClick={open}
              >
                {jobId}
              </button>
            ) : (
              <span className="jp-RemoteCompute-itemDetail">
                {trans.__('no job')}
              </span>
            )}
          </li>
        );
      })}
    </ul>
  );
}

function RunRow(props: {
  run: IPipelineRun;
  jobOf: (id: string) => IJob | undefined;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element {
  const { run, jobOf, commands, trans } = props;
  const [expanded, setExpanded] = React.useState(false);
  const nodes = Object.values(run.nodes);
  const done = nodes.filter(n =>
    ['succeeded', 'reused', 'stopped_early'].includes(n.state)
  ).length;
  return (
    <li
      className="jp-RemoteCompute-run"
      aria-label={trans.__('Pipeline run %1', run.id)}
      data-run-id={run.id}
      data-state={run.state}
    >
      <button
        type="button"
        className="jp-RemoteCompute-runLine"
        aria-expanded={expanded}
        title={run.reason ? `${run.id}\n${run.reason}` : run.id}
        onClick={() => setExpanded(!expanded)}
      >
        <span
          className="jp-RemoteCompute-runToggle"
          data-expanded={expanded ? 'true' : 'false'}
          aria-hidden="true"
        />
        <span className="jp-RemoteCompute-jobName">
          {run.sweep
            ? trans.__('sweep %1', run.sweep.name)
            : PathExt.basename(run.file) || run.id}
        </span>
        <span className="jp-RemoteCompute-state" data-state={run.state}>
          {stateLabel(run.state, trans)}
        </span>
      </button>
      <div className="jp-RemoteCompute-itemDetail jp-RemoteCompute-runMeta">
        {run.sweep
          ? trans.__('%1 of %2 trials done', done, nodes.length)
          : trans.__('%1 of %2 nodes done', done, nodes.length)}
        {' · '}
        {run.user ? (
          <>
            <span className="jp-RemoteCompute-runUser">
              {trans.__('by %1', run.user)}
            </span>
            {' · '}
          </>
        ) : null}
        <RelativeTime when={run.created} trans={trans} />
        {run.reason && run.state !== 'succeeded' ? ` · ${run.reason}` : ''}
      </div>
      {expanded && run.sweep && (
        <SweepTrials
          run={run}
          jobOf={jobOf}
          commands={commands}
          trans={trans}
        />
      )}
      {expanded && !run.sweep && (
        <NodeRows run={run} commands={commands} trans={trans} />
      )}
    </li>
  );
}

/**
 * The section; it is left out while the workspace has no pipeline run.
 */
export function PipelineRunList(props: {
  runs: PipelineRuns;
  /**
   * A job of the panel's list, for a sweep's trials (machine, MLflow run).
   */
  jobOf: (id: string) => IJob | undefined;
  commands: CommandRegistry;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { runs, jobOf, commands, trans } = props;
  useSignal(runs.changed);
  if (runs.runs.length === 0 && !runs.error) {
    return null;
  }
  return (
    <section
      className="jp-RemoteCompute-runs"
      aria-labelledby="jp-RemoteCompute-runs-heading"
    >
      <div className="jp-RemoteCompute-sectionHeader">
        <h3
          id="jp-RemoteCompute-runs-heading"
          className="jp-RemoteCompute-sectionTitle"
        >
          {trans.__('Pipeline runs')}
        </h3>
      </div>
      {runs.error && (
        <p className="jp-RemoteCompute-errorDetail">
          {trans.__('Could not list the pipeline runs: %1', runs.error)}
        </p>
      )}
      <ul
        className="jp-RemoteCompute-runList"
        aria-label={trans.__('Pipeline runs')}
      >
        {runs.runs.map(run => (
          <RunRow
            key={run.id}
            run={run}
            jobOf={jobOf}
            commands={commands}
            trans={trans}
          />
        ))}
      </ul>
    </section>
  );
}
