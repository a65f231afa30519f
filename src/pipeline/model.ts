/**
 * One open pipeline: its document (bound to the DocumentRegistry's text model, so it is saved
 * through the Contents API like any file), an undo history, the problems the server finds in it
 * as drawn, and its latest run, followed live on the server's event bus.
 */
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { Event } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import {
  APIError,
  cancelPipelineRun,
  getPipelineRun,
  IPipelineProblem,
  IPipelineRun,
  IStep,
  listMachines,
  listPipelineRuns,
  listSteps,
  startPipelineRun,
  validatePipeline
} from '../api';
import { IJobEvents } from '../eventsocket';
import { applyRunEvent, PIPELINE_EVENT_SCHEMA } from '../pipelineRuns';
import {
  emptyPipeline,
  IPipelineDocument,
  IPipelineNode,
  IPosition,
  newNodeId,
  parsePipeline,
  PipelineFormatError,
  serializePipeline
} from './document';

const HISTORY_LIMIT = 200;
const VALIDATE_DELAY = 300;
/**
 * Milliseconds between reads of a running run while the event socket is down.
 */
export const RUN_POLL_INTERVAL = 3000;

export class PipelineModel implements IDisposable {
  constructor(options: PipelineModel.IOptions) {
    this._context = options.context;
    this._events = options.events ?? null;
    this._context.model.contentChanged.connect(this._onContent, this);
    this._events?.stream.connect(this._onEvent, this);
    this._events?.connectionChanged?.connect(this._onConnection, this);
    // Whatever changes the run (its start, an event, a read) decides whether to poll it.
    this._changed.connect(this._schedulePoll, this);
    void this._context.ready.then(() => {
      this._onContent();
      void this._loadSteps();
      void this._loadLastRun();
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get document(): IPipelineDocument {
    return this._document;
  }

  /**
   * Why the file cannot be drawn, if it cannot; the canvas is then read-only and never writes it.
   */
  get formatError(): string | null {
    return this._formatError;
  }

  get path(): string {
    return this._context.path;
  }

  /**
   * Whether the file has been read (an empty canvas before is not an empty file).
   */
  get loaded(): boolean {
    return this._text !== null;
  }

  /**
   * Some problems are kept back (`problems`) until their node's settings are given or a run is asked.
   */
  get problemsHeldBack(): boolean {
    return this.problems.length < this._problems.length;
  }

  /**
   * Give the file another name in its folder (its runs are listed by it).
   */
  rename(name: string): Promise<void> {
    return this._context.rename(name);
  }

  get steps(): ReadonlyMap<string, IStep> {
    return this._steps;
  }

  get stepsError(): string | null {
    return this._stepsError;
  }

  /**
   * The problems a person is shown: those of a node added here only once one of its settings was
   * given (on the field given; on the node, once any was) or a run was asked for, so a node just
   * dropped is not red for the settings nobody could have filled in yet.
   */
  get problems(): readonly IPipelineProblem[] {
    if (this._runAsked || this._fresh.size === 0) {
      return this._problems;
    }
    return this._problems.filter(p => {
      const touched = p.node === null ? undefined : this._fresh.get(p.node);
      if (touched === undefined) {
        return true;
      }
      return p.field ? touched.has(p.field.split(/[.[]/)[0]) : touched.size > 0;
    });
  }

  /**
   * The latest run of this file (this session's or an earlier one), if any.
   */
  get run(): IPipelineRun | null {
    return this._run;
  }

  get runError(): string | null {
    return this._runError;
  }

  get busy(): boolean {
    return this._busy;
  }

  get canUndo(): boolean {
    return this._undo.length > 0;
  }

  get canRedo(): boolean {
    return this._redo.length > 0;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    window.clearTimeout(this._validateTimer);
    window.clearTimeout(this._pollTimer);
    Signal.clearData(this);
  }

  // -- editing ----------------------------------------------------------------------------------

  addNode(stepId: string, position: IPosition): string | null {
    let id: string | null = null;
    this._edit(doc => {
      id = newNodeId(doc, stepId);
      doc.nodes.push({ id, step: stepId, settings: {}, position });
    });
    if (id !== null) {
      this._fresh.set(id, new Set());
    }
    return id;
  }

  moveNodes(moved: { id: string; position: IPosition }[]): void {
    const changed = moved.filter(m => {
      const node = this._node(m.id);
      return (
        node &&
        (Math.round(node.position.x) !== Math.round(m.position.x) ||
          Math.round(node.position.y) !== Math.round(m.position.y))
      );
    });
    if (changed.length === 0) {
      return;
    }
    this._edit(doc => {
      for (const m of changed) {
        const node = doc.nodes.find(n => n.id === m.id);
        if (node) {
          node.position = { ...m.position };
        }
      }
    });
  }

  /**
   * Remove nodes (with their edges) and edges, as one step of the history.
   */
  remove(nodeIds: string[], edges: { from: string; to: string }[]): void {
    if (nodeIds.length === 0 && edges.length === 0) {
      return;
    }
    const gone = new Set(nodeIds);
    this._edit(doc => {
      doc.nodes = doc.nodes.filter(n => !gone.has(n.id));
      doc.edges = doc.edges.filter(
        e =>
          !gone.has(e.from) &&
          !gone.has(e.to) &&
          !edges.some(r => r.from === e.from && r.to === e.to)
      );
    });
  }

  connect(from: string, to: string): void {
    if (
      from === to ||
      this._document.edges.some(e => e.from === from && e.to === to)
    ) {
      return;
    }
    this._edit(doc => {
      doc.edges.push({ from, to });
    });
  }

  /**
   * Give a node another id (its edges follow), as one step of the history; what is wrong with
   * the new id (`empty`, or `taken` by another node), else null.
   */
  renameNode(nodeId: string, newId: string): 'empty' | 'taken' | null {
    const id = newId.trim();
    if (!id) {
      return 'empty';
    }
    if (id !== nodeId && this._node(id)) {
      return 'taken';
    }
    if (id === nodeId || !this._node(nodeId)) {
      return null;
    }
    const touched = this._fresh.get(nodeId);
    if (touched) {
      this._fresh.delete(nodeId);
      this._fresh.set(id, touched);
    }
    this._edit(doc => {
      for (const node of doc.nodes) {
        if (node.id === nodeId) {
          node.id = id;
        }
      }
      for (const edge of doc.edges) {
        edge.from = edge.from === nodeId ? id : edge.from;
        edge.to = edge.to === nodeId ? id : edge.to;
      }
    });
    return null;
  }

  setSettings(nodeId: string, settings: Record<string, unknown>): void {
    const node = this._node(nodeId);
    if (!node) {
      return;
    }
    const before = serializePipeline({ ...emptyPipeline(), nodes: [node] });
    const after = serializePipeline({
      ...emptyPipeline(),
      nodes: [{ ...node, settings }]
    });
    if (before === after) {
      return; // the form filled nothing new (its defaults, a re-render)
    }
    const touched = this._fresh.get(nodeId);
    for (const key of new Set([
      ...Object.keys(node.settings),
      ...Object.keys(settings)
    ])) {
      if (
        JSON.stringify(node.settings[key]) !== JSON.stringify(settings[key])
      ) {
        touched?.add(key);
      }
    }
    this._edit(doc => {
      const target = doc.nodes.find(n => n.id === nodeId);
      if (target) {
        target.settings = { ...settings };
      }
    });
  }

  undo(): void {
    const previous = this._undo.pop();
    if (previous !== undefined) {
      this._redo.push(serializePipeline(this._document));
      this._write(previous);
    }
  }

  redo(): void {
    const next = this._redo.pop();
    if (next !== undefined) {
      this._undo.push(serializePipeline(this._document));
      this._write(next);
    }
  }

  // -- running ----------------------------------------------------------------------------------

  /**
   * Save the document, then ask the server to run the file; its nodes then follow the run's events.
   */
  async start(): Promise<void> {
    if (this._formatError || this._busy) {
      return;
    }
    this._busy = true;
    this._runAsked = true; // every problem is shown from now on
    this._runError = null;
    this._changed.emit();
    try {
      await this._context.save();
      const { run } = await startPipelineRun(this.path);
      // The run's first events may arrive before this answer: keep whichever is newer.
      const heard = this._run?.id === run.id ? this._run : null;
      if (!heard || heard.updated < run.updated) {
        this._run = run;
      }
    } catch (error) {
      if (error instanceof APIError && error.code === 'pipeline_invalid') {
        this._problems =
          (error.details?.problems as IPipelineProblem[] | undefined) ?? [];
      }
      this._runError = error instanceof Error ? error.message : String(error);
    } finally {
      this._busy = false;
      this._changed.emit();
    }
  }

  async cancel(): Promise<void> {
    const run = this._run;
    if (!run || run.state !== 'running') {
      return;
    }
    try {
      this._run = await cancelPipelineRun(run.id);
      this._runError = null;
    } catch (error) {
      this._runError = error instanceof Error ? error.message : String(error);
    }
    this._changed.emit();
  }

  // -- private ----------------------------------------------------------------------------------

  private _node(id: string): IPipelineNode | undefined {
    return this._document.nodes.find(n => n.id === id);
  }

  private _edit(change: (doc: IPipelineDocument) => void): void {
    // Not before the file is read: the read would replace the edit.
    if (this._formatError || this._text === null) {
      return;
    }
    const before = serializePipeline(this._document);
    const doc = structuredClone(this._document);
    change(doc);
    const after = serializePipeline(doc);
    if (after === before) {
      return;
    }
    this._undo.push(before);
    if (this._undo.length > HISTORY_LIMIT) {
      this._undo.shift();
    }
    this._redo = [];
    this._write(after);
  }

  /**
   * Put `text` in the document's model (it then marks the widget dirty, and a save writes it).
   */
  private _write(text: string): void {
    this._text = text;
    this._document = parsePipeline(text);
    this._context.model.fromString(text);
    this._scheduleValidate();
    this._changed.emit();
  }

  /**
   * The text model changed: a load, a revert, or our own write.
   */
  private _onContent(): void {
    const text = this._context.model.toString();
    if (text === this._text) {
      return;
    }
    this._text = text;
    try {
      this._document = parsePipeline(text);
      this._formatError = null;
    } catch (error) {
      this._document = emptyPipeline();
      this._formatError =
        error instanceof PipelineFormatError ? error.message : String(error);
    }
    this._scheduleValidate();
    this._changed.emit();
  }

  private async _loadSteps(): Promise<void> {
    try {
      const [steps, { machines, organization }] = await Promise.all([
        listSteps(),
        listMachines()
      ]);
      const names = machines.filter(m => m.enabled !== false).map(m => m.name);
      const fallback = organization?.default ?? null;
      this._steps = new Map(
        steps.map(step => [step.id, withMachineChoice(step, names, fallback)])
      );
      this._stepsError = null;
    } catch (error) {
      this._stepsError = error instanceof Error ? error.message : String(error);
    }
    this._changed.emit();
  }

  private async _loadLastRun(): Promise<void> {
    try {
      const { runs } = await listPipelineRuns();
      // Newest first: the first of this file is its last run.
      const mine = runs.find(r => r.file === this.path);
      if (mine && !this._run) {
        this._run = mine;
        this._changed.emit();
      }
    } catch {
      // No run to show; the canvas still draws.
    }
  }

  private _scheduleValidate(): void {
    window.clearTimeout(this._validateTimer);
    if (this._formatError) {
      this._problems = [];
      return;
    }
    this._validateTimer = window.setTimeout(
      () => void this._validate(),
      VALIDATE_DELAY
    );
  }

  private async _validate(): Promise<void> {
    const text = this._text;
    if (text === null) {
      return;
    }
    try {
      const problems = await validatePipeline(this.path, this._document);
      if (text === this._text && !this._isDisposed) {
        this._problems = problems;
        this._changed.emit();
      }
    } catch (error) {
      if (text === this._text && !this._isDisposed) {
        this._problems = [
          {
            kind: 'invalid',
            node: null,
            field: null,
            message: error instanceof Error ? error.message : String(error)
          }
        ];
        this._changed.emit();
      }
    }
  }

  /**
   * The event socket came back: what the run did meanwhile is read once.
   */
  private _onConnection(_: unknown, connected: boolean): void {
    if (connected && this._run?.state === 'running') {
      this._reload(this._run.id);
    }
    this._schedulePoll();
  }

  /**
   * While the run is running and no event can say how it goes (the socket is down, or the event
   * source cannot tell), read it every few seconds; once the socket is back, stop.
   */
  private _schedulePoll(): void {
    const wanted =
      !this._isDisposed &&
      this._run?.state === 'running' &&
      this._events?.connected !== true;
    if (!wanted) {
      window.clearTimeout(this._pollTimer);
      this._pollTimer = 0;
      return;
    }
    if (this._pollTimer) {
      return; // one read is already due
    }
    this._pollTimer = window.setTimeout(() => {
      this._pollTimer = 0;
      void this._poll();
    }, RUN_POLL_INTERVAL);
  }

  private async _poll(): Promise<void> {
    const id = this._run?.id;
    if (!id || this._events?.connected === true) {
      return;
    }
    try {
      const run = await getPipelineRun(id);
      if (this._run?.id === run.id && !this._isDisposed) {
        this._run = run;
        this._changed.emit();
      }
    } catch {
      // The server may be the thing that is down: try again at the next interval.
    }
    this._schedulePoll();
  }

  /**
   * Read the run's record (what the events do not carry: when each node ended).
   */
  private _reload(id: string): void {
    void getPipelineRun(id)
      .then(run => {
        if (this._run?.id === run.id && !this._isDisposed) {
          this._run = run;
          this._changed.emit();
        }
      })
      .catch(() => undefined);
  }

  private _onEvent(_: unknown, emission: Event.Emission): void {
    if (
      emission.schema_id !== PIPELINE_EVENT_SCHEMA ||
      this._isDisposed ||
      emission.file !== this.path
    ) {
      return;
    }
    const id = emission.id as string;
    this._run = applyRunEvent(
      this._run?.id === id ? this._run : null,
      emission
    );
    this._changed.emit();
    if (this._run.state !== 'running') {
      this._reload(id);
    }
  }

  private _busy = false;
  private _changed = new Signal<this, void>(this);
  private _context: DocumentRegistry.Context;
  private _document: IPipelineDocument = emptyPipeline();
  private _events: IJobEvents | null;
  private _formatError: string | null = null;
  // Nodes added here, each with the settings given since: their problems wait for those.
  private _fresh = new Map<string, Set<string>>();
  private _isDisposed = false;
  private _pollTimer = 0;
  private _problems: IPipelineProblem[] = [];
  private _redo: string[] = [];
  private _run: IPipelineRun | null = null;
  private _runAsked = false;
  private _runError: string | null = null;
  private _steps = new Map<string, IStep>();
  private _stepsError: string | null = null;
  private _text: string | null = null;
  private _undo: string[] = [];
  private _validateTimer = 0;
}

/**
 * A step whose `machine` setting is free text becomes a choice among the workspace's machines.
 * On a hub whose organization has a default machine (`org:NAME`, never listed among them), a node
 * naming none runs there, as a job naming none does: the choice shows it as the default.
 */
function withMachineChoice(
  step: IStep,
  machines: string[],
  organizationDefault: string | null
): IStep {
  const properties = step.settings.properties as
    Record<string, Record<string, unknown>> | undefined;
  const machine = properties?.machine;
  if (!machine || machine.type !== 'string' || machine.enum) {
    return step;
  }
  const choice = organizationDefault
    ? {
        ...machine,
        enum: [organizationDefault, ...machines],
        default: organizationDefault
      }
    : { ...machine, enum: machines };
  return {
    ...step,
    settings: {
      ...step.settings,
      properties: { ...properties, machine: choice }
    }
  };
}

export namespace PipelineModel {
  export interface IOptions {
    context: DocumentRegistry.Context;
    events?: IJobEvents | null;
  }
}
