"""A pipeline run as its record keeps it (``.punica/pipelines/<run id>.json``) and the API and the CLI show
it (``PipelineRun``, each node a ``NodeRun``, a sweep's ``Sweep``), what starting one answers, and a
problem of a pipeline document (``Problem``).

The record is read through the models (``PipelineRun.from_json``), so a record this code did not write
is refused by the setting at fault; a record from before a field was added reads with its default.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, with_config
from typing_extensions import NotRequired, TypedDict

from .base import STRICT, to_json, validate
from .job import utcnow

RunState = Literal["running", "succeeded", "failed", "cancelled"]
#: A node: waiting → running → succeeded | reused | failed | cancelled; or not_run when a need failed;
#: a sweep's trial may also be stopped_early (``pipelines/early_stop.py``).
NodeState = Literal["waiting", "running", "succeeded", "reused", "failed", "cancelled", "not_run", "stopped_early"]
NODE_STATES: tuple[NodeState, ...] = get_args(NodeState)

#: A run's fields the API does not show: which process drives it is bookkeeping between processes.
HIDDEN = ("driver",)

_Time = Annotated[str | None, Field(description="when (ISO 8601, UTC); null until then")]


@with_config(STRICT)
@dataclasses.dataclass
class NodeRun:
    """A node's state in a run, its job, why it is so and what it brought back."""

    state: Annotated[
        NodeState,
        Field(
            description="reused: unchanged since its job succeeded, outputs taken as they are; not_run: a node it "
            "needs did not succeed; stopped_early: a sweep's trial its early stopping ended"
        ),
    ] = "waiting"
    job_id: Annotated[str | None, Field(description="the node's job, once submitted")] = None
    reason: Annotated[str | None, Field(description="why the node is in its state")] = None
    outputs: Annotated[dict[str, Any], Field(description="workspace-relative path → sha256, size, path")] = (
        dataclasses.field(default_factory=dict)
    )
    started: _Time = None
    ended: _Time = None

    def to_json(self) -> dict[str, Any]:
        return to_json(NodeRun, self)


@with_config(STRICT)
class Sweep(TypedDict):
    """A sweep's run (run --sweep): its definition, and what its trials found so far. Its trials are the
    run's nodes, at most ``max_parallel`` at once."""

    name: str
    max_parallel: Annotated[int, Field(ge=1)]
    parameters: Annotated[
        dict[str, dict[str, str]], Field(description="node id → the trial's parameters, name → value")
    ]
    # absent in a sweep recorded before sweeps followed a metric
    metric: NotRequired[Annotated[str | None, Field(description="the MLflow metric the trials are judged by")]]
    goal: NotRequired[Literal["min", "max"] | None]
    early_stop: NotRequired[Literal["median"] | None]
    latest: NotRequired[
        Annotated[
            dict[str, Annotated[list[int | float], Field(min_length=2, max_length=2)]],
            Field(description="node id → [step, value]: the metric's last point each trial logged"),
        ]
    ]
    stopped: NotRequired[Annotated[dict[str, str], Field(description="node id → why early stopping stopped it")]]


@with_config(STRICT)
@dataclasses.dataclass
class PipelineRun:
    """A run of a pipeline (or a sweep): the document as it started, each node's state, the run's own."""

    id: str
    file: Annotated[str, Field(description="workspace-relative path of the .rcpipeline; empty for a sweep")]
    pipeline: Annotated[dict[str, Any], Field(description="the document as it was when the run started")]
    state: RunState = "running"
    reason: Annotated[str | None, Field(description="why the run ended so, once it has")] = None
    created: str = dataclasses.field(default_factory=utcnow)
    updated: str = dataclasses.field(default_factory=utcnow)
    cancel_requested: Annotated[str | None, Field(description="who asked to cancel it")] = None
    mlflow_run_id: Annotated[
        str | None, Field(description="its MLflow parent run; the nodes' job runs are its children")
    ] = None
    mlflow_experiment_id: Annotated[
        str | None, Field(description="the parent run's experiment (MLflow's run comparison needs it)")
    ] = None
    #: The driving process's identity (``jobs/liveness.py``): a run whose driver died is taken up again.
    driver: dict[str, Any] | None = None
    nodes: Annotated[dict[str, NodeRun], Field(description="node id → its state in this run")] = dataclasses.field(
        default_factory=dict
    )
    sweep: Sweep | None = None
    user: Annotated[
        str | None,
        Field(
            description="who started it (their login), the submitter of its nodes' jobs; null on a run recorded "
            "before runs kept it"
        ),
    ] = None

    @property
    def label(self) -> str:
        """What a person calls the run: its file, or the sweep's name."""
        return f"sweep {self.sweep['name']}" if self.sweep else self.file

    @property
    def active(self) -> bool:
        return self.state == "running"

    def to_json(self) -> dict[str, Any]:
        """The record as the state file keeps it."""
        return to_json(PipelineRun, self)

    def public_json(self) -> dict[str, Any]:
        """What the API and the CLI show: no driver bookkeeping."""
        return to_json(PipelineRun, self, exclude=set(HIDDEN))

    @classmethod
    def from_json(cls, data: Any) -> PipelineRun:
        return validate(cls, data)


@with_config(STRICT)
class PipelineRunStarted(TypedDict):
    """``POST /pipelines/runs``'s answer: the run, and whether a run of this file was already under way."""

    run: PipelineRun
    attached: Annotated[bool, Field(description="true: a run of this file was already under way")]


@with_config(STRICT)
class SweepStarted(TypedDict):
    """``POST /pipelines/sweeps``'s answer: the sweep's run, whether it was already under way, and warnings."""

    run: PipelineRun
    attached: Annotated[bool, Field(description="true: the same sweep was already under way")]
    warnings: Annotated[list[str], Field(description="e.g. a parameter the command never mentions")]


def run_started(run: PipelineRun, attached: bool) -> dict[str, Any]:
    """``PipelineRunStarted`` as the API writes it."""
    return to_json(PipelineRunStarted, {"run": run, "attached": attached}, exclude={"run": set(HIDDEN)})


def sweep_started(run: PipelineRun, attached: bool, warnings: list[str]) -> dict[str, Any]:
    """``SweepStarted`` as the API writes it."""
    answer = {"run": run, "attached": attached, "warnings": warnings}
    return to_json(SweepStarted, answer, exclude={"run": set(HIDDEN)})


@with_config(STRICT)
@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a pipeline, at a node (or the document when ``node`` is None)."""

    kind: Annotated[
        str,
        Field(
            description="cycle, missing_setting, invalid_setting, missing_input, outside_workspace, unknown_step; "
            "or a job's own check: invalid, secret_in_settings"
        ),
    ]
    message: str
    node: Annotated[str | None, Field(description="the node at fault; null for the whole pipeline")] = None
    field: Annotated[str | None, Field(description="the setting at fault, e.g. command or send")] = None

    def text(self) -> str:
        where = f"node {self.node}" if self.node else "pipeline"
        if self.field:
            where += f", {self.field}"
        return f"{where}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return to_json(Problem, self)
