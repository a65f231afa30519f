/**
 * The pipeline's canvas: the palette of steps, the graph (@xyflow/react), the selected node's
 * settings, the problems found before a run, and Run / Cancel / Undo / Redo.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  Background,
  BaseEdge,
  Connection,
  Controls,
  Edge,
  EdgeChange,
  EdgeLabelRenderer,
  EdgeProps,
  getBezierPath,
  NodeChange,
  OnSelectionChangeParams,
  ReactFlow,
  ReactFlowProvider,
  applyEdgeChanges,
  applyNodeChanges,
  useNodesInitialized,
  useReactFlow,
  useUpdateNodeInternals
} from '@xyflow/react';
import * as React from 'react';

import { IStep } from '../api';
import { stateLabel, useSignal } from '../components/common';
import { declaredOutputs } from './document';
import { PickFiles } from '../filePicker';
import { PipelineModel } from './model';
import { StepCard, StepCardNode } from './StepCard';
import { SettingsForm } from './SettingsForm';
import { nameAndRun } from './run';

/**
 * The drag-and-drop type of a step dragged from the palette; the data is the step's id.
 */
const STEP_MIME = 'application/x-remote-compute-step';
const NODE_TYPES = { step: StepCard };

/**
 * An edge and the files it carries; the label is drawn above the cards, so a card never hides it.
 */
function FilesEdge(props: EdgeProps): JSX.Element {
  const [path, labelX, labelY] = getBezierPath(props);
  return (
    <>
      <BaseEdge
        id={props.id}
        path={path}
        markerEnd={props.markerEnd}
        style={props.style}
      />
      {props.label && (
        <EdgeLabelRenderer>
          <div
            // Above the cards, it takes the pointer there too (so it reads as on top), and
            // dragging on it does not pan.
            className="jp-RemoteCompute-edgeLabel nodrag nopan"
            style={{
              pointerEvents: 'all',
              transform: `translate(-50%, -50%) translate(${labelX}px, ${labelY}px)`
            }}
          >
            {props.label}
          </div>
        </EdgeLabelRenderer>
      )}
    </>
  );
}
const EDGE_TYPES = { files: FilesEdge };

export interface IPipelineCanvasProps {
  model: PipelineModel;
  trans: TranslationBundle;
  showJob: (jobId: string) => void;
  /**
   * Pick workspace files in the settings form; null when there is no file browser to pick from.
   */
  pickFiles: PickFiles | null;
}

export function PipelineCanvas(props: IPipelineCanvasProps): JSX.Element {
  return (
    <ReactFlowProvider>
      <CanvasBody {...props} />
    </ReactFlowProvider>
  );
}

function edgeId(from: string, to: string): string {
  return `${from}->${to}`;
}

function CanvasBody(props: IPipelineCanvasProps): JSX.Element {
  const { model, trans, showJob } = props;
  useSignal(model.changed);
  const flow = useReactFlow();
  const wrapper = React.useRef<HTMLDivElement>(null);
  const [selected, setSelected] = React.useState<string | null>(null);
  // A node just added and selected here, until React Flow reports it selected too.
  const justAdded = React.useRef<string | null>(null);
  const [renaming, setRenaming] = React.useState<string | null>(null);
  const body = React.useRef<HTMLDivElement>(null);
  const [nodes, setNodes] = React.useState<StepCardNode[]>([]);
  const [edges, setEdges] = React.useState<Edge[]>([]);
  const doc = model.document;
  const run = model.run;
  // Until its file is read, a drop would be drawn and then replaced by what the file holds (and would
  // have the view fitted to it): the canvas takes no edit before.
  const readOnly = model.formatError !== null || !model.loaded;

  // Fit the view to the file's nodes once they are drawn; later additions keep the view still, and
  // an empty file's view never moves (a step dropped on it stays where it was dropped, and so does
  // the next).
  const initialized = useNodesInitialized();
  const fitted = React.useRef(false);
  React.useEffect(() => {
    if (fitted.current || !model.loaded) {
      return;
    }
    if (doc.nodes.length === 0) {
      fitted.current = true;
    } else if (initialized && nodes.length > 0) {
      fitted.current = true;
      void flow.fitView({ maxZoom: 1 });
    }
  }, [model.loaded, doc.nodes.length, initialized, nodes.length, flow]);

  // The graph as React Flow draws it, from the document; selection and sizes stay React Flow's.
  React.useEffect(() => {
    setNodes(previous => {
      const before = new Map(previous.map(n => [n.id, n]));
      return doc.nodes.map(node => {
        const step = model.steps.get(node.step);
        const machine = node.settings.machine;
        return {
          ...(before.get(node.id) ?? {}),
          id: node.id,
          type: 'step' as const,
          position: node.position,
          selected: node.id === selected || before.get(node.id)?.selected,
          data: {
            nodeId: node.id,
            stepId: node.step,
            label: step?.label,
            machine:
              typeof machine === 'string'
                ? machine
                : (defaultMachine(step) ?? ''),
            run: run?.nodes[node.id],
            problems: model.problems.filter(p => p.node === node.id),
            trans,
            showJob,
            renaming: renaming === node.id,
            setRenaming: readOnly
              ? null
              : (on: boolean, refocus = false) => {
                  // The canvas takes the keyboard back, so F2 and Delete go on working on the
                  // selection (a node, which React Flow would pan to, is not focused).
                  if (!on && refocus) {
                    body.current?.focus();
                  }
                  setRenaming(on ? node.id : null);
                },
            rename: (newId: string) => {
              const wrong = model.renameNode(node.id, newId);
              if (wrong === null && selected === node.id) {
                setSelected(newId.trim());
              }
              return wrong;
            }
          }
        };
      });
    });
    setEdges(previous => {
      const before = new Map(previous.map(e => [e.id, e]));
      return doc.edges.map(edge => {
        const id = edgeId(edge.from, edge.to);
        const source = doc.nodes.find(n => n.id === edge.from);
        const files = source ? declaredOutputs(source) : [];
        return {
          ...(before.get(id) ?? {}),
          id,
          type: 'files',
          source: edge.from,
          target: edge.to,
          label: files.join(', '),
          ariaLabel: trans.__('%1 to %2', edge.from, edge.to)
        };
      });
    });
  }, [
    doc,
    run,
    model.problems,
    model.steps,
    selected,
    renaming,
    readOnly,
    trans,
    showJob
  ]);

  // React Flow forgets a node's handles when it is given the node without its measured size (as the
  // rebuild above can give it, from a state the size has not reached yet) and measures them again
  // only when the node resizes: until then no edge can be drawn from it. Measured again at once.
  const updateNodeInternals = useUpdateNodeInternals();
  React.useEffect(() => {
    const lost = nodes
      .filter(
        n => n.measured && !flow.getInternalNode(n.id)?.internals.handleBounds
      )
      .map(n => n.id);
    if (lost.length > 0) {
      updateNodeInternals(lost);
    }
  }, [nodes, flow, updateNodeInternals]);

  const onNodesChange = React.useCallback(
    (changes: NodeChange<StepCardNode>[]) =>
      setNodes(ns =>
        applyNodeChanges(
          changes.filter(c => c.type !== 'remove'),
          ns
        )
      ),
    []
  );
  const onEdgesChange = React.useCallback(
    (changes: EdgeChange[]) =>
      setEdges(es =>
        applyEdgeChanges(
          changes.filter(c => c.type !== 'remove'),
          es
        )
      ),
    []
  );
  const onSelectionChange = React.useCallback(
    (params: OnSelectionChangeParams) => {
      const ids = params.nodes.map(n => n.id);
      const dropped = justAdded.current;
      if (dropped !== null) {
        // React Flow first lets go of what was selected before a drop (an empty or an older
        // selection), then reports the dropped node, at times with the node that was selected
        // before it still beside it: the dropped node alone is the selection then.
        if (!ids.includes(dropped)) {
          return;
        }
        justAdded.current = null;
        if (ids.length > 1) {
          setNodes(ns => ns.map(n => ({ ...n, selected: n.id === dropped })));
        }
        setSelected(dropped);
        return;
      }
      setSelected(ids.length === 1 ? ids[0] : null);
    },
    []
  );

  const addStep = (stepId: string, position: { x: number; y: number }) => {
    const id = model.addNode(stepId, position);
    if (id) {
      justAdded.current = id;
      setNodes(ns => ns.map(n => ({ ...n, selected: false })));
      setSelected(id);
    }
  };

  const onDrop = (event: React.DragEvent) => {
    const stepId = event.dataTransfer.getData(STEP_MIME);
    if (!stepId || readOnly) {
      return;
    }
    event.preventDefault();
    addStep(
      stepId,
      flow.screenToFlowPosition({ x: event.clientX, y: event.clientY })
    );
  };

  const onKeyDown = (event: React.KeyboardEvent) => {
    const target = event.target as HTMLElement;
    const typing = target.closest(
      'input, textarea, select, [contenteditable="true"]'
    );
    if (event.key === 'F2' && !typing && !readOnly && selected) {
      event.preventDefault();
      setRenaming(selected);
      return;
    }
    if (!(event.ctrlKey || event.metaKey) || typing) {
      return;
    }
    const key = event.key.toLowerCase();
    if (key === 'z' && !event.shiftKey) {
      model.undo();
    } else if ((key === 'z' && event.shiftKey) || key === 'y') {
      model.redo();
    } else {
      return;
    }
    event.preventDefault();
    event.stopPropagation();
  };

  const selectedNode = doc.nodes.find(n => n.id === selected);
  const running = run?.state === 'running';

  return (
    // Focusable, so a click anywhere on the canvas brings Ctrl+Z here.
    <div
      ref={body}
      className="jp-RemoteCompute-pipeline"
      onKeyDown={onKeyDown}
      tabIndex={-1}
    >
      <div
        className="jp-RemoteCompute-pipelineToolbar"
        role="toolbar"
        aria-label={trans.__('Pipeline')}
      >
        <button
          type="button"
          className="jp-mod-styled jp-mod-accept"
          disabled={readOnly || model.busy || running || doc.nodes.length === 0}
          onClick={() => void nameAndRun(model, trans)}
        >
          {trans.__('Run')}
        </button>
        <button
          type="button"
          className="jp-mod-styled jp-mod-warn"
          disabled={!running}
          onClick={() => void model.cancel()}
        >
          {trans.__('Cancel')}
        </button>
        <button
          type="button"
          className="jp-mod-styled"
          disabled={!model.canUndo}
          onClick={() => model.undo()}
          title={trans.__('Undo (Ctrl+Z)')}
        >
          {trans.__('Undo')}
        </button>
        <button
          type="button"
          className="jp-mod-styled"
          disabled={!model.canRedo}
          onClick={() => model.redo()}
          title={trans.__('Redo (Ctrl+Shift+Z)')}
        >
          {trans.__('Redo')}
        </button>
        <span className="jp-RemoteCompute-pipelineStatus" role="status">
          {run
            ? trans.__(
                'Run %1: %2',
                run.id,
                stateLabel(run.state, trans) +
                  (run.reason ? ` — ${run.reason}` : '')
              )
            : trans.__('Not run yet')}
        </span>
      </div>
      {model.formatError && (
        <div className="jp-RemoteCompute-pipelineError" role="alert">
          {trans.__(
            '%1 cannot be drawn: %2. The file is shown as it is and will not be written.',
            model.path,
            model.formatError
          )}
        </div>
      )}
      {model.runError && (
        <div className="jp-RemoteCompute-pipelineError" role="alert">
          {trans.__('Could not run: %1', model.runError)}
        </div>
      )}
      <div className="jp-RemoteCompute-pipelineBody">
        <Palette
          steps={model.steps}
          error={model.stepsError}
          disabled={readOnly}
          trans={trans}
          onAdd={stepId => {
            const box = wrapper.current?.getBoundingClientRect();
            const at = flow.screenToFlowPosition({
              x: (box?.left ?? 0) + 80 + 40 * (doc.nodes.length % 5),
              y: (box?.top ?? 0) + 60 + 90 * (doc.nodes.length % 5)
            });
            addStep(stepId, at);
          }}
        />
        <div
          className="jp-RemoteCompute-pipelineCanvas"
          ref={wrapper}
          onDragOver={event => {
            if (event.dataTransfer.types.includes(STEP_MIME)) {
              event.preventDefault();
              event.dataTransfer.dropEffect = 'copy';
            }
          }}
          onDrop={onDrop}
          aria-label={trans.__('Pipeline canvas')}
        >
          <ReactFlow<StepCardNode>
            nodes={nodes}
            edges={edges}
            nodeTypes={NODE_TYPES}
            edgeTypes={EDGE_TYPES}
            onNodesChange={onNodesChange}
            onEdgesChange={onEdgesChange}
            onSelectionChange={onSelectionChange}
            onConnect={(c: Connection) => model.connect(c.source, c.target)}
            onNodeDragStop={(_, __, dragged) =>
              model.moveNodes(
                dragged.map(n => ({ id: n.id, position: n.position }))
              )
            }
            onDelete={({ nodes: gone, edges: cut }) =>
              model.remove(
                gone.map(n => n.id),
                cut.map(e => ({ from: e.source, to: e.target }))
              )
            }
            deleteKeyCode={readOnly ? null : ['Backspace', 'Delete']}
            nodesDraggable={!readOnly}
            nodesConnectable={!readOnly}
            proOptions={{ hideAttribution: true }}
          >
            <Background />
            <Controls showInteractive={false} />
          </ReactFlow>
          {model.loaded && doc.nodes.length === 0 && !readOnly && (
            <div className="jp-RemoteCompute-pipelineHint" role="note">
              {trans.__(
                'Drag a step here from Steps, or double-click one, to add it. Connect a step to the next from its right edge to the next one’s left.'
              )}
            </div>
          )}
        </div>
        {selectedNode && (
          <SettingsForm
            node={selectedNode}
            step={model.steps.get(selectedNode.step)}
            problems={model.problems.filter(p => p.node === selectedNode.id)}
            readOnly={readOnly}
            pickFiles={props.pickFiles}
            trans={trans}
            onChange={settings => model.setSettings(selectedNode.id, settings)}
          />
        )}
      </div>
      <div
        className="jp-RemoteCompute-pipelineProblems"
        role="list"
        aria-label={trans.__('Problems')}
      >
        {model.problems.length === 0 ? (
          <span className="jp-RemoteCompute-pipelineOk">
            {doc.nodes.length > 0 && !readOnly && !model.problemsHeldBack
              ? trans.__('No problems found: it can run.')
              : ''}
          </span>
        ) : (
          model.problems.map((p, i) => (
            <div
              key={i}
              role="listitem"
              className={`jp-RemoteCompute-pipelineProblem jp-mod-${p.kind}`}
            >
              {(p.node ? `${p.node}` : trans.__('pipeline')) +
                (p.field ? `, ${p.field}` : '') +
                ': ' +
                p.message}
            </div>
          ))
        )}
      </div>
    </div>
  );
}

function defaultMachine(step: IStep | undefined): string | undefined {
  const properties = step?.settings.properties as
    Record<string, { default?: unknown }> | undefined;
  const value = properties?.machine?.default;
  return typeof value === 'string' ? value : undefined;
}

function Palette(props: {
  steps: ReadonlyMap<string, IStep>;
  error: string | null;
  disabled: boolean;
  trans: TranslationBundle;
  onAdd: (stepId: string) => void;
}): JSX.Element {
  const { trans } = props;
  return (
    <div
      className="jp-RemoteCompute-pipelinePalette"
      role="list"
      aria-label={trans.__('Steps')}
    >
      <h3>{trans.__('Steps')}</h3>
      {props.error && (
        <p className="jp-RemoteCompute-errorDetail">
          {trans.__('Could not list the steps: %1', props.error)}
        </p>
      )}
      {[...props.steps.values()].map(step => (
        <div
          key={step.id}
          role="listitem"
          aria-label={step.label}
          className="jp-RemoteCompute-pipelineStep"
          title={step.description ?? ''}
          draggable={!props.disabled}
          tabIndex={0}
          onDragStart={event => {
            event.dataTransfer.setData(STEP_MIME, step.id);
            event.dataTransfer.effectAllowed = 'copy';
          }}
          onDoubleClick={() => !props.disabled && props.onAdd(step.id)}
          onKeyDown={event => {
            if (
              !props.disabled &&
              (event.key === 'Enter' || event.key === ' ')
            ) {
              event.preventDefault();
              props.onAdd(step.id);
            }
          }}
        >
          {step.label}
        </div>
      ))}
    </div>
  );
}
