/**
 * A node on the canvas: its step, machine, state in the latest run (with the reason when it
 * failed, "reused" when its outputs were taken as they were) and the problems found before a run.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Handle, Node, NodeProps, Position } from '@xyflow/react';
import * as React from 'react';

import { IPipelineNodeRun, IPipelineProblem } from '../api';
import { stateLabel } from '../components/common';
import { relativeTime } from '../format';

export type StepCardData = {
  nodeId: string;
  stepId: string;
  /**
   * The step's label; undefined when no installed package offers the step.
   */
  label?: string;
  machine: string;
  run?: IPipelineNodeRun;
  problems: IPipelineProblem[];
  trans: TranslationBundle;
  /**
   * Open the node's job (its detail and log) in the Compute panel.
   */
  showJob: (jobId: string) => void;
};

export type StepCardNode = Node<StepCardData, 'step'>;

export function StepCard(props: NodeProps<StepCardNode>): JSX.Element {
  const { nodeId, stepId, label, machine, run, problems, trans, showJob } =
    props.data;
  const state = run?.state;
  const unknown = label === undefined;
  const className = [
    'jp-RemoteCompute-stepCard',
    state ? `jp-mod-${state}` : '',
    problems.length > 0 ? 'jp-mod-problem' : '',
    props.selected ? 'jp-mod-selected' : ''
  ]
    .filter(Boolean)
    .join(' ');
  return (
    <div
      className={className}
      role="group"
      aria-label={trans.__('Node %1', nodeId)}
      data-node-id={nodeId}
      data-state={state ?? ''}
    >
      <Handle
        type="target"
        position={Position.Left}
        aria-label={trans.__('Inputs of %1', nodeId)}
      />
      <div className="jp-RemoteCompute-stepCard-title">
        <span className="jp-RemoteCompute-stepCard-id">{nodeId}</span>
        {state && (
          <span className="jp-RemoteCompute-state" data-state={state}>
            {stateLabel(state, trans)}
          </span>
        )}
      </div>
      <div className="jp-RemoteCompute-stepCard-step">
        {unknown ? trans.__('Unknown step %1', stepId) : label}
      </div>
      <div className="jp-RemoteCompute-stepCard-machine">
        {trans.__('on %1', machine || trans.__('(no machine)'))}
      </div>
      {run && (run.ended || run.job_id) && (
        <div className="jp-RemoteCompute-stepCard-last">
          {run.ended
            ? trans.__('last run %1', relativeTime(run.ended, trans))
            : trans.__('job %1', run.job_id ?? '')}
          {run.job_id && (
            <button
              type="button"
              className="jp-RemoteCompute-linkButton nodrag"
              aria-label={trans.__('Show the log of %1', nodeId)}
              onClick={() => showJob(run.job_id!)}
            >
              {trans.__('log')}
            </button>
          )}
        </div>
      )}
      {run?.reason &&
        (state === 'failed' ||
          state === 'not_run' ||
          state === 'cancelled') && (
          <div className="jp-RemoteCompute-stepCard-reason" role="note">
            {run.reason}
          </div>
        )}
      {state === 'reused' && (
        <div className="jp-RemoteCompute-stepCard-reason jp-mod-info">
          {trans.__('unchanged: outputs of its last job reused')}
        </div>
      )}
      {problems.map((p, i) => (
        <div key={i} className="jp-RemoteCompute-stepCard-problem" role="alert">
          {p.field ? `${p.field}: ` : ''}
          {p.message}
        </div>
      ))}
      <Handle
        type="source"
        position={Position.Right}
        aria-label={trans.__('Outputs of %1', nodeId)}
      />
    </div>
  );
}
