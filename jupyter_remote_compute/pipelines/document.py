"""The pipeline document (``*.rcpipeline``): parsing, validating and writing it.

A pipeline is JSON, written with a stable key order so a change reads well in a diff::

    {
      "version": 1,
      "nodes": [
        {"id": "prepare", "step": "train-on-remote-machine", "settings": {...}, "position": {"x": 0, "y": 0}}
      ],
      "edges": [{"from": "prepare", "to": "train"}]
    }

An edge from A to B means B needs what A brings back: A's declared outputs become B's inputs.
Parsing never drops what it does not understand (an unknown step id stays a node, reported by
``validate``); a file that is not JSON is an error naming its line, and nothing here writes it.
"""

from __future__ import annotations

import dataclasses
import glob
import json
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ConfigFileError, RemoteComputeError
from ..schema.pipeline import Problem

VERSION = 1
SUFFIX = ".rcpipeline"
_GLOB_CHARS = set("*?[")


class PipelineInvalid(RemoteComputeError):
    """The pipeline cannot run as drawn; ``problems`` says where (node and field) and what."""

    code = "pipeline_invalid"
    status = 422

    def __init__(self, problems: Sequence[Problem], source: str = "the pipeline") -> None:
        self.problems = list(problems)
        lines = "; ".join(p.text() for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s): {lines}")

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "details": {"problems": [p.to_json() for p in self.problems]}}


@dataclasses.dataclass(frozen=True)
class Node:
    id: str
    step: str
    settings: dict[str, Any]
    position: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "step": self.step, "settings": _sorted(self.settings), "position": self.position}


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str
    target: str

    def to_json(self) -> dict[str, str]:
        return {"from": self.source, "to": self.target}


@dataclasses.dataclass(frozen=True)
class Pipeline:
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    version: int = VERSION

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def upstream(self, node_id: str) -> list[str]:
        """The nodes this one needs directly, in document order."""
        return [e.source for e in self.edges if e.target == node_id]

    def ancestors(self, node_id: str) -> set[str]:
        seen: set[str] = set()
        todo = self.upstream(node_id)
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.upstream(current))
        return seen

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "nodes": [n.to_json() for n in self.nodes],
            "edges": [e.to_json() for e in self.edges],
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "the pipeline") -> Pipeline:
        """The document's shape; every error names the node and field. Step ids are not checked here."""
        if not isinstance(data, Mapping):
            raise ConfigFileError(f"{source}: expected a JSON object with version, nodes and edges")
        version = data.get("version", VERSION)
        if version != VERSION:
            raise ConfigFileError(f"{source}: version: {version!r} is not a version this product reads ({VERSION})")
        raw_nodes = data.get("nodes", [])
        raw_edges = data.get("edges", [])
        if not isinstance(raw_nodes, list):
            raise ConfigFileError(f"{source}: nodes: expected a list of nodes")
        if not isinstance(raw_edges, list):
            raise ConfigFileError(f"{source}: edges: expected a list of {{from, to}} objects")
        nodes: list[Node] = []
        for i, raw in enumerate(raw_nodes):
            where = f"{source}: nodes[{i}]"
            if not isinstance(raw, Mapping):
                raise ConfigFileError(f"{where}: expected an object with id, step, settings and position")
            node_id, step = raw.get("id"), raw.get("step")
            if not isinstance(node_id, str) or not node_id.strip():
                raise ConfigFileError(f"{where}.id: give the node a non-empty id")
            if any(n.id == node_id for n in nodes):
                raise ConfigFileError(f"{where}.id: {node_id!r} is used by another node; ids must be unique")
            if not isinstance(step, str) or not step:
                raise ConfigFileError(f"{where} ({node_id}).step: give the id of a step, e.g. train-on-remote-machine")
            settings = raw.get("settings", {})
            if not isinstance(settings, Mapping):
                raise ConfigFileError(f"{where} ({node_id}).settings: expected an object of settings")
            position = raw.get("position", {"x": 0, "y": 0})
            if not isinstance(position, Mapping) or not all(
                isinstance(position.get(k), (int, float)) for k in ("x", "y")
            ):
                raise ConfigFileError(f'{where} ({node_id}).position: expected {{"x": number, "y": number}}')
            nodes.append(Node(node_id, step, dict(settings), {"x": position["x"], "y": position["y"]}))
        ids = {n.id for n in nodes}
        edges: list[Edge] = []
        for i, raw in enumerate(raw_edges):
            where = f"{source}: edges[{i}]"
            if not isinstance(raw, Mapping) or not all(isinstance(raw.get(k), str) for k in ("from", "to")):
                raise ConfigFileError(f'{where}: expected {{"from": node id, "to": node id}}')
            for end in ("from", "to"):
                if raw[end] not in ids:
                    raise ConfigFileError(f"{where}.{end}: no node has the id {raw[end]!r}")
            edge = Edge(raw["from"], raw["to"])
            if edge not in edges:
                edges.append(edge)
        return cls(tuple(nodes), tuple(edges), version)


def _sorted(value: Any) -> Any:
    """Settings with their keys sorted at every depth, so the same pipeline is always the same text."""
    if isinstance(value, Mapping):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def parse_pipeline(text: str, source: str = "the pipeline") -> Pipeline:
    """A pipeline from its text; a file that is not JSON gives an error naming its line and column."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigFileError(
            f"{source}: line {e.lineno} column {e.colno}: {e.msg}; fix the file (it was left as it is)"
        ) from None
    return Pipeline.from_json(data, source)


def load_pipeline(path: Path) -> Pipeline:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: no such pipeline file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"{path}: cannot be read: {e}") from None
    return parse_pipeline(text, str(path))


def dump_pipeline(pipeline: Pipeline) -> str:
    """The document's text: two-space indents, keys in a fixed order, a newline at the end."""
    return json.dumps(pipeline.to_json(), indent=2, ensure_ascii=False) + "\n"


# -- validation --------------------------------------------------------------------------------------
def order(pipeline: Pipeline) -> tuple[list[str], list[str]]:
    """Nodes in dependency order (Kahn), and those left on or behind a cycle."""
    needs = {n.id: set(pipeline.upstream(n.id)) for n in pipeline.nodes}
    done: list[str] = []
    ready = [n.id for n in pipeline.nodes if not needs[n.id]]
    while ready:
        current = ready.pop(0)
        done.append(current)
        for n in pipeline.nodes:
            if current in needs[n.id]:
                needs[n.id].discard(current)
                if not needs[n.id] and n.id not in done and n.id not in ready:
                    ready.append(n.id)
    return done, [n.id for n in pipeline.nodes if n.id not in done]


def declared_outputs(node: Node) -> list[str]:
    """What a node brings back: its ``bring_back`` setting, plus a notebook step's executed notebook."""
    from .notebook import NOTEBOOK_STEP, executed_path

    outputs = [str(p) for p in node.settings.get("bring_back") or [] if isinstance(p, str)]
    if node.step == NOTEBOOK_STEP and isinstance(node.settings.get("notebook"), str):
        outputs.append(executed_path(node.settings))
    return outputs


def declared_inputs(node: Node) -> list[str]:
    from .notebook import NOTEBOOK_STEP

    inputs = [str(p) for p in node.settings.get("send") or [] if isinstance(p, str)]
    if node.step == NOTEBOOK_STEP and isinstance(node.settings.get("notebook"), str):
        inputs.insert(0, node.settings["notebook"])
    return inputs


def _outside(pattern: str) -> bool:
    """An absolute path or one that climbs out: never looked up, so validation is no oracle for files
    outside the workspace (anyone who may read the workspace may validate)."""
    path = PurePosixPath(pattern)
    return path.is_absolute() or ".." in path.parts


def _in_workspace(root: Path, pattern: str) -> bool:
    if _GLOB_CHARS & set(pattern):
        return bool(glob.glob(pattern, root_dir=root, recursive=True))
    return (root / pattern).exists()


def _provides(output: str, wanted: str) -> bool:
    """An output provides an input that names it, a file under it, or a glob it matches."""
    if output == wanted or wanted.startswith(output.rstrip("/") + "/"):
        return True
    return bool(_GLOB_CHARS & set(wanted)) and bool(glob.fnmatch.fnmatch(output, wanted))  # type: ignore[attr-defined]


def validate(pipeline: Pipeline, steps: Mapping[str, Mapping[str, Any]], workspace: Path) -> list[Problem]:
    """Everything wrong before a run: unknown steps, settings against each step's JSON Schema, cycles,
    and inputs that no upstream step brings back and no workspace file provides."""
    import jsonschema

    problems: list[Problem] = []
    for node in pipeline.nodes:
        step = steps.get(node.step)
        if step is None:
            known = ", ".join(sorted(steps)) or "none"
            problems.append(
                Problem(
                    "unknown_step",
                    f"unknown step id {node.step!r}: no installed package offers it (installed: {known}); "
                    "install the package that provides it or pick another step",
                    node.id,
                    "step",
                )
            )
            continue
        schema = step.get("settings") or {}
        for name in schema.get("required", []):
            if name not in node.settings:
                title = schema.get("properties", {}).get(name, {}).get("title", name)
                problems.append(Problem("missing_setting", f"{title} is required; fill it in", node.id, name))
        validator = jsonschema.Draft202012Validator(schema)
        for error in sorted(validator.iter_errors(node.settings), key=lambda e: list(e.path)):
            if error.validator == "required":
                continue  # reported above, with the setting's title
            field = ".".join(str(p) for p in error.path) or None
            problems.append(Problem("invalid_setting", error.message, node.id, field))
    _, cyclic = order(pipeline)
    if cyclic:
        problems.append(
            Problem(
                "cycle",
                "these nodes need each other in a cycle: " + " → ".join(cyclic) + "; remove an edge between them",
                cyclic[0],
            )
        )
    by_id = {n.id: n for n in pipeline.nodes}
    for node in pipeline.nodes:
        upstream = pipeline.ancestors(node.id)
        for i, wanted in enumerate(declared_inputs(node)):
            if any(_provides(out, wanted) for up in upstream for out in declared_outputs(by_id[up])):
                continue
            field = (
                "notebook"
                if node.step.startswith("run-notebook") and i == 0 and "notebook" in node.settings
                else "send"
            )
            if _outside(wanted):
                problems.append(
                    Problem(
                        "outside_workspace",
                        f"{wanted!r} is outside the workspace: a step sends workspace files; give a path inside it",
                        node.id,
                        field,
                    )
                )
                continue
            if _in_workspace(workspace, wanted):
                continue
            makers = [
                n.id
                for n in pipeline.nodes
                if n.id != node.id and any(_provides(o, wanted) for o in declared_outputs(n))
            ]
            hint = f"connect {makers[0]} → {node.id}" if makers else "add the file or a step that brings it back"
            problems.append(
                Problem(
                    "missing_input",
                    f"{wanted!r}: no upstream step brings it back and no workspace file is there; {hint}",
                    node.id,
                    field,
                )
            )
    return problems
