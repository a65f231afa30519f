"""What every part of the job lifecycle shares: the workspace, its stores, the settings, who to tell."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ..engines.base import Engine, RemoteJob
from ..machines.admin import MachineAdmin
from ..recording.tracking import TrackingSettings
from ..secrets import SecretStore
from ..usage.ledger import UsageRecord
from ..workspace import Workspace
from .job import Job
from .metrics import MetricWatch
from .store import JobStore


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    poll_interval: float = 2.0  # seconds between polls of a running job
    cancel_grace: float = 10.0  # seconds between TERM and KILL
    scratch_dir: Path | None = None  # the built-in machine's job base; None: the default
    give_up_after: float = 3600.0  # seconds of failing to reach a machine to start, stop or collect a job
    tracking: TrackingSettings = dataclasses.field(default_factory=TrackingSettings)
    # End a job before its MLflow run is recorded; the workspace's recorder (recording.py) records it after
    # and a face that reports the job waits for that (``await_recorded``): for faces that may exit when
    # the job ends (the CLI). Off (the server): the job ends once the recorder has recorded its run.
    record_in_background: bool = False


@dataclasses.dataclass
class JobContext:
    """One per JobService; its parts read ``settings`` from here, so a change applies to all of them."""

    workspace: Workspace
    settings: ServiceSettings
    store: JobStore
    secrets: SecretStore
    admin: MachineAdmin
    emit: Callable[[Job], None]
    usage: UsageRecord  # every ended attempt of every job (usage.py)
    #: Whose live metrics someone watches, and what was read of them (metrics.py).
    metrics: MetricWatch = dataclasses.field(default_factory=MetricWatch)

    def engine_of(self, job: Job) -> Engine:
        """The engine a job started with (its machine as it was at submit)."""
        return self.admin.engine(job.machine, job.machine_snapshot)


def remote_of(job: Job) -> RemoteJob:
    return RemoteJob(job.id, job.key, job.handle)
