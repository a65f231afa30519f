"""A job's MLflow run, as the lifecycle has it recorded: the recorder's program, and the faces' waits.

The recorder process and its protocol are ``recording/recorder.py``'s; this module is its ``main``
(``PROGRAM``, the one command line that starts it), which serves with the lifecycle's store of jobs,
so the process can check a job is still there and put its run id on it, while recording imports
nothing of the lifecycle. The rest is what a face does with the recorder for a job: ask for its to-do
(``start``, ``record_now``), hand over to-dos nobody records (``resume``), warm the recorder while
the job runs (``prewarm``), and wait until the run is recorded (``await_recorded``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import NotFound
from ..recording import recorder
from ..recording.calls import CALLS
from ..recording.recorder import WAIT_STEP, Recorder, RecorderUnavailable, pending_file, recorder_idle, unclaimed
from ..workspace import Workspace
from .context import JobContext
from .job import Job, utcnow
from .logs import mask_values
from .store import JobStore

log = logging.getLogger(__name__)

#: The recorder's command line: this module's ``main``, in the Python the face runs (the recorder's
#: files are named after it, so each environment's faces reach their own).
PROGRAM = (sys.executable, "-m", "jupyter_remote_compute.jobs.recording")
#: A to-do with no recorder seen at work on it this long after it was asked for is asked for again
#: (the recorder could not start, or a probe took its claim); the attempt count still bounds them.
START_GRACE = 20.0


def start(ctx: JobContext, job_id: str, secrets: Sequence[str] | None) -> None:
    """Have the workspace's recorder record the job's to-do; returns once it is queued (``recorder.start``)."""
    recorder.start(PROGRAM, ctx.workspace, ctx.settings.tracking, job_id, secrets)


def record_now(ctx: JobContext, job_id: str, secrets: Sequence[str] | None) -> tuple[str | None, str | None]:
    """Record the job's to-do and wait: (its run id, or why not); RecorderUnavailable when no recorder could."""
    return recorder.record_now(PROGRAM, ctx.workspace, ctx.settings.tracking, job_id, secrets)


def resume(ctx: JobContext) -> None:
    """Ask for every to-do nobody records (its recorder died, or never started) whose job has ended."""
    for job_id in unclaimed(ctx.workspace):
        try:
            job = ctx.store.get(job_id)
        except NotFound:
            secrets = []  # the recorder only tidies up after a deleted job
        else:
            if job.active:
                # Still being collected, or an attempt that a retry followed: its collector asks
                # once the job has ended (the next collection's to-do carries this one's records).
                continue
            secrets = mask_values(ctx.secrets, job)
        start(ctx, job_id, secrets)


def await_recorded(ctx: JobContext, job_id: str) -> None:
    """Return once the job's to-do is recorded (its run id, or why not, is on the job).

    Never takes the to-do's lock while a recorder may be about to claim it (that would turn the
    recorder away): it waits for a claim to show (the recorder counts its attempt once it holds the
    lock), then blocks on a shared lock, which the kernel grants when the recorder lets go. A recorder
    that died, or never showed, is replaced, as ``resume`` would."""
    path = pending_file(ctx.workspace, job_id)
    counter = path.with_suffix(".attempts")
    seen = 0  # a count already there: a recorder holds it now, or one died (the shared lock tells which)
    started = time.monotonic()
    while True:
        if not path.exists():
            return
        attempts = _size(counter)
        if attempts == seen:
            if time.monotonic() - started > START_GRACE:
                _restart(ctx, job_id)
                started = time.monotonic()
            time.sleep(WAIT_STEP)
            continue
        seen = attempts
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # granted once the recorder holding it is done or dead
        finally:
            os.close(fd)
        if path.exists():  # it died before it was done
            _restart(ctx, job_id)
            started = time.monotonic()


def prewarm(ctx: JobContext, job: Job) -> None:
    """While a face waits for a job, have the workspace's recorder load MLflow and open the store (the
    bulk of recording a small job), so the run is recorded the moment the job has ended."""
    try:
        recorder.warm(PROGRAM, ctx.workspace, ctx.settings.tracking)
    except RecorderUnavailable as e:
        log.warning("job %s: could not start the MLflow recorder ahead of its end: %s", job.id, e)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _restart(ctx: JobContext, job_id: str) -> None:
    try:
        job = ctx.store.get(job_id)
    except NotFound:
        secrets: Sequence[str] | None = []
    else:
        secrets = mask_values(ctx.secrets, job)
    start(ctx, job_id, secrets)


class StoredJobs:
    """The recorder process's ``RecordedJobs``: each workspace's state file, through its ``JobStore``."""

    def exists(self, workspace: Workspace, job_id: str) -> bool:
        try:
            JobStore(workspace.state_file).get(job_id)
        except NotFound:
            return False
        return True

    def finish(self, workspace: Workspace, job_id: str, run_id: str | None, problem: str | None) -> None:
        with JobStore(workspace.state_file).transaction() as jobs:
            job = jobs.get(job_id)
            if job is None:
                return  # deleted meanwhile
            if run_id is not None:
                job.mlflow_run_id = run_id
            else:
                job.reason = ((job.reason or "") + f" (not recorded in MLflow: {problem})").strip()
            job.updated = utcnow()


def main(argv: Sequence[str]) -> int:
    if argv:
        raise SystemExit(f"usage: {' '.join(PROGRAM[1:])} (it serves every workspace)")
    return Recorder(recorder_idle(), StoredJobs(), CALLS).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
