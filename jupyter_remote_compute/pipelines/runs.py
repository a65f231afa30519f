"""A pipeline run's record: ``.punica/pipelines/<run id>.json``, each change under the run's lock file.

The record keeps the document as it was when the run started, each node's state, job, reason and
outputs, the driving process's identity (so a run whose driver died is taken up again), and for a
sweep its definition and what its trials found: a ``PipelineRun`` (``schema/pipeline.py``, one schema for
the file, the API and the CLI's JSON), read through its model.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import NotFound, RemoteComputeError
from ..fsutil import SharedFileLock, atomic_write, private_dir
from ..jobs.job import utcnow
from ..schema.pipeline import NodeRun, PipelineRun

__all__ = ["LOCK_TIMEOUT", "NODE_DONE", "NODE_FINE", "NodeRun", "PipelineRun", "RunStore"]

log = logging.getLogger(__name__)

#: A node: waiting → running → succeeded | reused | failed | cancelled; or not_run when a need failed;
#: a sweep's trial may also be stopped_early (``early_stop.py``).
NODE_DONE = ("succeeded", "reused", "failed", "cancelled", "not_run", "stopped_early")
#: How a node may end and its run still succeed.
NODE_FINE = ("succeeded", "reused", "stopped_early")
LOCK_TIMEOUT = 30.0


class RunStore:
    """Pipeline runs, one JSON file each under ``.punica/pipelines/``; every change under its lock file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, run_id: str) -> Path:
        if not run_id.replace("-", "").isalnum():
            raise NotFound(f"no pipeline run {run_id!r}")
        return self.folder / f"{run_id}.json"

    def _lock(self, run_id: str) -> SharedFileLock:
        private_dir(self.folder)
        return SharedFileLock(self.folder / f".{run_id}.lock", LOCK_TIMEOUT)

    def parent_id_path(self, run_id: str) -> Path:
        """Where the recorder leaves the id of the run's MLflow parent run once it has made it."""
        return self.folder / f"{run_id}.mlflow-run"

    def get(self, run_id: str) -> PipelineRun:
        path = self.path(run_id)
        try:
            run = PipelineRun.from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise NotFound(f"no pipeline run {run_id!r}") from None
        except (ValueError, RemoteComputeError) as e:  # not JSON, or not a run's record
            raise RemoteComputeError(f"{path}: the run's record cannot be read ({e})") from None
        if run.mlflow_run_id is None:
            with contextlib.suppress(FileNotFoundError):
                # "<parent run id>" or "<parent run id> <experiment id>" (recording/parent_run.py)
                recorded = self.parent_id_path(run_id).read_text(encoding="utf-8").split()
                run.mlflow_run_id = recorded[0] if recorded else None
                run.mlflow_experiment_id = recorded[1] if len(recorded) > 1 else None
        return run

    def put(self, run: PipelineRun) -> None:
        with self._lock(run.id):
            self._write(run)

    def _write(self, run: PipelineRun) -> None:
        run.updated = utcnow()
        atomic_write(self.path(run.id), (json.dumps(run.to_json(), indent=1) + "\n").encode())

    def change(self, run_id: str, fn: Callable[[PipelineRun], None]) -> PipelineRun:
        """Read, change and write one run under its lock, so two writers never lose each other's change."""
        with self._lock(run_id):
            run = self.get(run_id)
            fn(run)
            self._write(run)
            return run

    def runs(self) -> list[PipelineRun]:
        """Every readable run, newest first."""
        out = []
        for path in sorted(self.folder.glob("*.json"), reverse=True):
            try:
                out.append(self.get(path.stem))
            except RemoteComputeError as e:
                log.warning("%s", e)
        return out
