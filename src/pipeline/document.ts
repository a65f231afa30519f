/**
 * The `*.rcpipeline` document as the canvas holds it: parsed from the file's text, written back in
 * the server's own layout (jupyter_remote_compute/pipelines/document.py: two-space indents, keys in
 * a fixed order, settings sorted), so a save by the canvas and one by the CLI read the same in a diff.
 */

export const PIPELINE_VERSION = 1;
export const PIPELINE_EXTENSION = '.rcpipeline';

export interface IPosition {
  x: number;
  y: number;
}

export interface IPipelineNode {
  id: string;
  /**
   * The id of the step it runs (`GET /remote-compute/steps`); an unknown one is kept as it is.
   */
  step: string;
  settings: Record<string, unknown>;
  position: IPosition;
}

/**
 * `from` → `to`: `to` needs what `from` brings back.
 */
export interface IPipelineEdge {
  from: string;
  to: string;
}

export interface IPipelineDocument {
  version: number;
  nodes: IPipelineNode[];
  edges: IPipelineEdge[];
}

export function emptyPipeline(): IPipelineDocument {
  return { version: PIPELINE_VERSION, nodes: [], edges: [] };
}

/**
 * A file's text that is not a pipeline this canvas can draw; the file is then shown, never written.
 */
export class PipelineFormatError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PipelineFormatError';
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The document in `text`; an empty file is a new, empty pipeline. Every error names the field.
 */
export function parsePipeline(text: string): IPipelineDocument {
  if (!text.trim()) {
    return emptyPipeline();
  }
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new PipelineFormatError(
      `not JSON (${error instanceof Error ? error.message : String(error)}); fix the file in a text editor`
    );
  }
  if (!isObject(data)) {
    throw new PipelineFormatError(
      'expected a JSON object with version, nodes and edges'
    );
  }
  const version = data.version ?? PIPELINE_VERSION;
  if (version !== PIPELINE_VERSION) {
    throw new PipelineFormatError(
      `version: ${JSON.stringify(version)} is not a version this canvas reads (${PIPELINE_VERSION})`
    );
  }
  const rawNodes = data.nodes ?? [];
  const rawEdges = data.edges ?? [];
  if (!Array.isArray(rawNodes)) {
    throw new PipelineFormatError('nodes: expected a list of nodes');
  }
  if (!Array.isArray(rawEdges)) {
    throw new PipelineFormatError('edges: expected a list of {from, to}');
  }
  const nodes: IPipelineNode[] = rawNodes.map((raw, i) => {
    if (
      !isObject(raw) ||
      typeof raw.id !== 'string' ||
      !raw.id ||
      typeof raw.step !== 'string'
    ) {
      throw new PipelineFormatError(
        `nodes[${i}]: expected an object with a non-empty id and a step`
      );
    }
    const position = isObject(raw.position) ? raw.position : {};
    return {
      id: raw.id,
      step: raw.step,
      settings: isObject(raw.settings) ? { ...raw.settings } : {},
      position: {
        x: typeof position.x === 'number' ? position.x : 0,
        y: typeof position.y === 'number' ? position.y : 0
      }
    };
  });
  const ids = new Set(nodes.map(n => n.id));
  if (ids.size !== nodes.length) {
    throw new PipelineFormatError('nodes: two nodes share an id');
  }
  const edges: IPipelineEdge[] = rawEdges.map((raw, i) => {
    if (
      !isObject(raw) ||
      !ids.has(raw.from as string) ||
      !ids.has(raw.to as string)
    ) {
      throw new PipelineFormatError(
        `edges[${i}]: expected {"from": node id, "to": node id} of nodes in the file`
      );
    }
    return { from: raw.from as string, to: raw.to as string };
  });
  return { version: PIPELINE_VERSION, nodes, edges };
}

function sortedKeys(value: unknown): unknown {
  if (Array.isArray(value)) {
    return value.map(sortedKeys);
  }
  if (isObject(value)) {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      if (value[key] !== undefined) {
        out[key] = sortedKeys(value[key]);
      }
    }
    return out;
  }
  return value;
}

/**
 * The document's text, as the server writes it.
 */
export function serializePipeline(document: IPipelineDocument): string {
  const ordered = {
    version: document.version,
    nodes: document.nodes.map(n => ({
      id: n.id,
      step: n.step,
      settings: sortedKeys(n.settings),
      position: { x: Math.round(n.position.x), y: Math.round(n.position.y) }
    })),
    edges: document.edges.map(e => ({ from: e.from, to: e.to }))
  };
  return JSON.stringify(ordered, null, 2) + '\n';
}

/**
 * A short, unused node id made from the step's first word: `train`, `train-2`, …
 */
export function newNodeId(document: IPipelineDocument, stepId: string): string {
  const base = (stepId.split('-')[0] || 'step').toLowerCase();
  const taken = new Set(document.nodes.map(n => n.id));
  if (!taken.has(base)) {
    return base;
  }
  let i = 2;
  while (taken.has(`${base}-${i}`)) {
    i++;
  }
  return `${base}-${i}`;
}

/**
 * What a node says it brings back (its `bring_back` setting): what an edge from it carries.
 */
export function declaredOutputs(node: IPipelineNode): string[] {
  const value = node.settings.bring_back;
  return Array.isArray(value)
    ? value.filter((v): v is string => typeof v === 'string')
    : [];
}
