"""Pipeline steps this package offers: "Train on a Remote Machine", "Run a Notebook on a Remote Machine".

A pipeline tool finds them through the entry point group ``punica.mlops.steps``
(each entry point names a step description) or at ``GET /remote-compute/steps``.
A description holds the step's id, label, icon, a JSON Schema of its settings
and ``executor``: ``"module:function"``, called as ``run_step(settings, context)``.

Importing this module only reads JSON; the executor loads the lifecycle when it runs.
"""

from __future__ import annotations

import copy
import json
import logging
from importlib.resources import files
from typing import Any

from .executor import StepContext, StepResult, parse_settings, run_step
from .notebook import run_notebook_step


def _load(name: str) -> dict[str, Any]:
    return json.loads(files(__name__).joinpath(name).read_text(encoding="utf-8"))


STEP_GROUP = "punica.mlops.steps"
log = logging.getLogger(__name__)

TRAIN_ON_REMOTE_MACHINE: dict[str, Any] = _load("train_on_remote_machine.json")
RUN_NOTEBOOK_ON_REMOTE_MACHINE: dict[str, Any] = _load("run_notebook_on_remote_machine.json")

__all__ = [
    "RUN_NOTEBOOK_ON_REMOTE_MACHINE",
    "TRAIN_ON_REMOTE_MACHINE",
    "StepContext",
    "StepResult",
    "describe_steps",
    "parse_settings",
    "run_notebook_step",
    "run_step",
]


def other_steps() -> list[dict[str, Any]]:
    """The steps other installed packages offer under the entry point group, each a description with an
    id, a label and a settings schema; one that cannot be loaded is left out (and logged), never the rest."""
    from importlib.metadata import entry_points

    found = []
    for entry_point in entry_points(group=STEP_GROUP):
        if entry_point.value.startswith(__name__ + ":"):
            continue  # ours, already described without reading metadata
        try:
            step = entry_point.load()
        except Exception as e:  # another package's broken step must not hide the others
            log.warning("step %s could not be loaded: %s", entry_point.name, e)
            continue
        described = isinstance(step, dict) and all(isinstance(step.get(k), str) for k in ("id", "label"))
        if described and isinstance(step.get("settings"), dict):
            found.append(copy.deepcopy(step))
    return found


def describe_steps(machines: list[str] | None = None, *, installed: bool = False) -> list[dict[str, Any]]:
    """Every step description; with ``machines``, the machine setting of ours becomes a choice among them;
    with ``installed``, other packages' steps (entry point group ``punica.mlops.steps``) follow ours."""
    descriptions = [copy.deepcopy(TRAIN_ON_REMOTE_MACHINE), copy.deepcopy(RUN_NOTEBOOK_ON_REMOTE_MACHINE)]
    for description in descriptions if machines is not None else ():
        machine = description["settings"]["properties"]["machine"]
        machine["enum"] = list(machines)
        if machine.get("default") not in machines:
            # A default outside the enum would make the designer's empty form invalid.
            machine.pop("default", None)
    if installed:
        ours = {d["id"] for d in descriptions}
        descriptions += [d for d in other_steps() if d["id"] not in ours]
    return descriptions
