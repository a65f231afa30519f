"""Pipeline steps this package offers: "Train on a Remote Machine", "Run a notebook on a remote machine".

A pipeline tool finds them through the entry point group ``punica.mlops.steps``
(each entry point names a step description) or at ``GET /remote-compute/steps``.
A description holds the step's id, label, icon, a JSON Schema of its settings
and ``executor``: ``"module:function"``, called as ``run_step(settings, context)``.

Importing this module only reads JSON; the executor loads the lifecycle when it runs.
"""

from __future__ import annotations

import copy
import json
from importlib.resources import files
from typing import Any

from .executor import StepContext, StepResult, parse_settings, run_step
from .notebook import run_notebook_step


def _load(name: str) -> dict[str, Any]:
    return json.loads(files(__name__).joinpath(name).read_text(encoding="utf-8"))


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


def describe_steps(machines: list[str] | None = None) -> list[dict[str, Any]]:
    """Every step description; with ``machines``, the machine setting becomes a choice among them."""
    descriptions = [copy.deepcopy(TRAIN_ON_REMOTE_MACHINE), copy.deepcopy(RUN_NOTEBOOK_ON_REMOTE_MACHINE)]
    for description in descriptions if machines is not None else ():
        machine = description["settings"]["properties"]["machine"]
        machine["enum"] = list(machines)
        if machine.get("default") not in machines:
            # A default outside the enum would make the designer's empty form invalid.
            machine.pop("default", None)
    return descriptions
