"""An Elyra pipeline (its parsed ``Pipeline`` of generic operations) as this product's pipeline document.

Elyra names a node's file relative to the server's root and its dependencies and outputs relative to
that file's folder; here each becomes workspace-relative. A notebook node is a "Run a notebook" step, a
Python or R script a "Train on a Remote Machine" step whose command runs the script in its own folder,
as Elyra's local runtime does. An edge is each parent an operation names; env vars become ``env``.
"""

from __future__ import annotations

import posixpath
import shlex
from pathlib import Path
from typing import Any

from ..errors import InvalidSettings
from ..pipelines.document import VERSION
from ..pipelines.notebook import NOTEBOOK_STEP

SCRIPT_STEP = "train-on-remote-machine"
#: How a script node's file is run on the machine, by suffix.
INTERPRETERS = {".py": "python3", ".r": "Rscript"}


def _relative(root: Path, workspace: Path, path: str, where: str) -> str:
    """``path`` (relative to Elyra's root) as a workspace-relative POSIX path; outside it is refused."""
    try:
        return (root / path).resolve().relative_to(workspace.resolve()).as_posix()
    except ValueError:
        raise InvalidSettings(f"{where}: {path} is not inside the workspace {workspace}", field=where) from None


def _env(operation: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in operation.env_vars or []:
        name, value = getattr(item, "env_var", None), getattr(item, "value", None)
        if name and value is not None:
            env[str(name)] = str(value)
    return env


def to_document(pipeline: Any, machine: str, root: Path, workspace: Path) -> dict[str, Any]:
    """The pipeline document of Elyra's ``pipeline`` with every node on ``machine``."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, str]] = []
    for i, (op_id, op) in enumerate(pipeline.operations.items()):
        where = f"node {op.name!r}"
        if not getattr(op, "is_generic", False):
            raise InvalidSettings(
                f"{where}: only notebook and script nodes run on Remote Compute, not {op.classifier}", field=where
            )
        file = _relative(root, workspace, op.filename, f"{where}.filename")
        folder = posixpath.dirname(file)

        def here(path: str, *, field: str, base: str = posixpath.dirname(op.filename)) -> str:
            return _relative(root, workspace, posixpath.join(base, path), field)

        send = [here(p, field=f"{where}.dependencies") for p in op.dependencies or []]
        outputs = [here(p, field=f"{where}.outputs") for p in op.outputs or []]
        settings: dict[str, Any] = {"machine": machine, "name": op.name, "send": send, "bring_back": outputs}
        env = _env(op)
        if env:
            settings["env"] = env
        suffix = Path(file).suffix.lower()
        if suffix == ".ipynb":
            step = NOTEBOOK_STEP
            settings["notebook"] = file
        elif suffix in INTERPRETERS:
            step = SCRIPT_STEP
            settings["send"] = [file, *send]
            run = f"{INTERPRETERS[suffix]} {shlex.quote(posixpath.basename(file))}"
            settings["command"] = f"cd {shlex.quote(folder)} && {run}" if folder else run
        else:
            raise InvalidSettings(
                f"{where}.filename: {file} is neither a notebook nor a Python or R script", field=where
            )
        nodes.append({"id": op_id, "step": step, "settings": settings, "position": {"x": 0, "y": 160 * i}})
        edges.extend({"from": parent, "to": op_id} for parent in op.parent_operation_ids or [])
    return {"version": VERSION, "nodes": nodes, "edges": edges}
