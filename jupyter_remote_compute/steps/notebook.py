"""The executor of "Run a Notebook on a Remote Machine": the notebook's job, by the same rule as training.

Same settings over the same files (the notebook included) are the same work: a run attaches to the
job doing it, or takes its result when it succeeded and its outputs are still as it brought them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .executor import StepContext, StepResult, run_spec_in, with_machine


def run_notebook_step(settings: Mapping[str, Any], context: StepContext | Mapping[str, Any]) -> StepResult:
    """Execute the notebook on its machine; the result's outputs hold the executed notebook.

    Raises as ``run_step`` does; a failing cell is ``NotTrained`` with that cell's number and error.
    """
    from ..pipelines.notebook import notebook_spec

    spec, wait = notebook_spec(with_machine(settings))
    return run_spec_in(context, spec, wait)
