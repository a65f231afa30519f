/**
 * A node on the canvas: its step, machine, state in the latest run (with the reason when it
 * failed, "reused" when its outputs were taken as they were) and the problems found before a run.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { Handle, Node, NodeProps, Position } from '@xyflow/react';
import * as React from 'react';

import { IPipelineNodeRun, IPipelineProblem } from '../api';
import { RelativeTime, stateLabel } from '../components/common';

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
  /**
   * Its id is being edited (a double-click on the title, or F2 on the selected node).
   */
  renaming: boolean;
  /**
   * Start (true) or stop (false) editing its id, and when stopping whether the keyboard comes back
   * to the node (Enter, Escape) or stays where the person went (a click elsewhere); null when the
   * document cannot be changed.
   */
  setRenaming: ((on: boolean, refocus?: boolean) => void) | null;
  /**
   * Give it the id typed; what is wrong with that id, or null once it is renamed.
   */
  rename: (newId: string) => 'empty' | 'taken' | null;
};

function RenameBox(props: {
  nodeId: string;
  rename: StepCardData['rename'];
  done: (refocus: boolean) => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { nodeId, trans } = props;
  const [value, setValue] = React.useState(nodeId);
  const [problem, setProblem] = React.useState<string | null>(null);
  const input = React.useRef<HTMLInputElement>(null);
  // Set once Enter or Escape ended the edit: the blur that follows is not a second answer.
  const finished = React.useRef(false);
  const done = (refocus: boolean): void => {
    finished.current = true;
    props.done(refocus);
  };
  React.useEffect(() => {
    input.current?.focus();
    input.current?.select();
  }, []);
  const commit = (refocus: boolean): void => {
    const wrong = props.rename(value);
    if (wrong === null) {
      done(refocus);
    } else {
      setProblem(
        wrong === 'empty'
          ? trans.__('Give the node a non-empty id.')
          : trans.__('%1 is the id of another node.', value.trim())
      );
    }
  };
  return (
    <span className="jp-RemoteCompute-stepCard-rename">
      <input
        ref={input}
        className="jp-mod-styled nodrag"
        aria-label={trans.__('New id of %1', nodeId)}
        aria-invalid={problem !== null}
        value={value}
        onChange={event => {
          setValue(event.target.value);
          setProblem(null);
        }}
        onKeyDown={event => {
          // The canvas's own keys (Delete, Ctrl+Z) are not for this box.
          event.stopPropagation();
          if (event.key === 'Enter') {
            event.preventDefault();
            commit(true);
          } else if (event.key === 'Escape') {
            event.preventDefault();
            done(true);
          }
        }}
        onBlur={() => {
          if (!finished.current) {
            if (value.trim() === nodeId) {
              done(false);
            } else {
              commit(false);
            }
          }
        }}
      />
      {problem && (
        <span className="jp-RemoteCompute-stepCard-problem" role="alert">
          {problem}
        </span>
      )}
    </span>
  );
}

export type StepCardNode = Node<StepCardData, 'step'>;

export function StepCard(props: NodeProps<StepCardNode>): JSX.Element {
  const {
    nodeId,
    stepId,
    label,
    machine,
    run,
    problems,
    trans,
    showJob,
    renaming,
    setRenaming
  } = props.data;
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
        {renaming && setRenaming ? (
          <RenameBox
            nodeId={nodeId}
            rename={props.data.rename}
            done={refocus => setRenaming(false, refocus)}
            trans={trans}
          />
        ) : (
          <span
            className="jp-RemoteCompute-stepCard-id"
            title={setRenaming ? trans.__('Double-click or F2 to rename') : ''}
            onDoubleClick={event => {
              if (setRenaming) {
                event.stopPropagation();
                setRenaming(true);
              }
            }}
          >
            {nodeId}
          </span>
        )}
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
          {run.ended ? (
            <RelativeTime
              when={run.ended}
              trans={trans}
              format={ago => trans.__('last run %1', ago)}
            />
          ) : (
            trans.__('job %1', run.job_id ?? '')
          )}
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
