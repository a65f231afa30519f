"""The executor of "Train on a Remote Machine": what a pipeline runner calls for one step of one run.

A pipeline run is short-lived and may be re-run at any time, so the step is
idempotent by content: the same settings over the same input files are the
same work (the lifecycle's idempotency key). A run attaches to the job already
doing that work, or — if that job has since finished, trained, and its outputs
are still in the workspace as it brought them back — takes its result without
training again. Only otherwise does it start a job.

It returns only a trained job (``require_trained``): outputs back and
verified. Anything else is ``NotTrained`` with the job's state and reason; a
job still running when the wait ends keeps running. The MLflow run is recorded
by a detached recorder once the job has ended (``recording/recorder.py``, exactly one
run per job), so the step neither imports MLflow nor waits for its store: the
result carries the run id when it is already known (a job taken as it was),
else None, and the job shows it once recorded (``jobs show``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidSettings, NotTrained
from ..jobs.spec import JobSpec, parse_duration
from ..workspace import Workspace

if TYPE_CHECKING:
    from ..jobs.job import Job
    from ..jobs.service import JobService

#: The settings a step takes; ``wait`` is the step's own, the rest make the job's spec.
SETTINGS = ("machine", "command", "send", "bring_back", "env", "timeout", "wait", "name", "resources", "environment")


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What the pipeline runner tells the step about this run."""

    workspace: Path | str  # the workspace folder (or a folder inside it)
    run_id: str | None = None  # the pipeline run, for the runner's own records
    on_log: Callable[[bytes], None] | None = None  # the job's log as it arrives, e.g. to the runner's console

    @classmethod
    def coerce(cls, context: StepContext | Mapping[str, Any]) -> StepContext:
        if isinstance(context, StepContext):
            return context
        if not isinstance(context, Mapping) or not context.get("workspace"):
            raise InvalidSettings("context: give the workspace path, e.g. {'workspace': '/path/to/project'}")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in context.items() if k in known})


@dataclasses.dataclass(frozen=True)
class StepResult:
    """A trained job: its outputs in the workspace, verified, and its MLflow run, recorded before it returns."""

    job_id: str
    state: str
    machine: str
    outputs: dict[str, dict[str, Any]]  # workspace-relative path -> {sha256, size, path}
    mlflow_run_id: str | None  # never None: a step returns only a trained job, and trained means recorded
    attached: bool  # the work was already under way (or done) when this run asked

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_setting_names(settings: Mapping[str, Any], known: tuple[str, ...] = SETTINGS) -> None:
    """Settings are an object of the step's own names; an unknown one is named with the ones it takes."""
    if not isinstance(settings, Mapping):
        raise InvalidSettings("settings: expected an object of settings")
    for name in settings:
        if name not in known:
            raise InvalidSettings(f"{name}: unknown setting; this step takes {', '.join(known)}", field=str(name))


def parse_settings(settings: Mapping[str, Any]) -> tuple[JobSpec, float | None]:
    """The job's spec and how long to wait; every error names the setting."""
    check_setting_names(settings)
    wait = parse_duration(settings.get("wait"), "wait")
    spec = JobSpec.from_json({k: v for k, v in settings.items() if k != "wait"})
    return spec, wait


def with_machine(settings: Mapping[str, Any]) -> Mapping[str, Any]:
    """A step's settings with a machine named: where they name none, the one a job naming none runs on
    (``job_machine``: the organization's default on a hub whose admin set one, else ``local``), as for
    ``run`` and ``POST /jobs``. The organization is asked only then, so a step that names one asks nobody."""
    if not isinstance(settings, Mapping) or settings.get("machine"):
        return settings
    from ..engines.organization.client import job_machine  # requests: not at the step's discovery

    return {**settings, "machine": job_machine(None)}


def run_step(settings: Mapping[str, Any], context: StepContext | Mapping[str, Any]) -> StepResult:
    """Submit (or attach to) the job, wait up to ``wait``, return it only once trained.

    Raises ``InvalidSettings`` (bad setting, ``field`` names it), ``PolicyDenied``,
    ``SecretInSettings``, or ``NotTrained`` (``state``: still running when the wait
    ended, failed with exit code and log tail, cancelled, lost, missing outputs).
    """
    spec, wait = parse_settings(with_machine(settings))
    return run_spec_in(context, spec, wait)


def run_spec_in(context: StepContext | Mapping[str, Any], spec: JobSpec, wait: float | None) -> StepResult:
    """``run_spec`` with a service of its own on the context's workspace (a step run outside the server)."""
    # The lifecycle (engines, MLflow) is imported here so discovering the step stays cheap.
    from ..jobs.service import JobService, ServiceSettings

    ctx = StepContext.coerce(context)
    root = Path(os.fspath(ctx.workspace))
    service = JobService(Workspace.find(root, fallback=root), ServiceSettings(record_in_background=True))
    try:
        return run_spec(service, spec, wait, on_log=ctx.on_log)
    finally:
        service.close()


def run_spec(
    service: JobService,
    spec: JobSpec,
    wait: float | None,
    *,
    on_log: Callable[[bytes], None] | None = None,
    on_job: Callable[[Job, bool], None] | None = None,
    stop: threading.Event | None = None,
    user: str | None = None,
) -> StepResult:
    """The step's rule on a given service: take the same work's trained result, else attach or submit
    and wait; return the job only once trained. ``on_job`` hears the job (and whether it was already
    there) as soon as it is known; ``stop`` ends the wait early (the job keeps running); ``user`` submits
    a new job (by default whoever runs this process)."""
    from ..jobs.service import require_trained

    previous = service.latest_same_work(spec)
    if previous is not None and previous.state == "succeeded" and not service.changed_outputs(previous):
        job, attached = previous, True
        if on_job is not None:
            on_job(job, attached)
        if not job.mlflow_run_id:
            job = service.wait(job.id, timeout=wait, stop=stop)  # its run is still being recorded
    else:
        submitted = service.submit(spec, user=user)
        job, attached = submitted.job, submitted.attached
        if on_job is not None:
            on_job(job, attached)
        job = service.wait(job.id, timeout=wait, on_log=on_log, stop=stop)
    require_trained(job)
    changed = service.changed_outputs(job)
    if changed:
        # Someone replaced an output between landing and now: what is there is not this job's.
        reason = "outputs changed in the workspace since they came back: " + ", ".join(changed)
        raise NotTrained(f"job {job.id}: {reason}", job_id=job.id, state=job.state, reason=reason)
    outputs = {
        rel: {"sha256": info["sha256"], "size": info["size"], "path": str(service.workspace.root / rel)}
        for rel, info in sorted(job.outputs.items())
    }
    return StepResult(job.id, job.state, job.machine, outputs, job.mlflow_run_id, attached)
