"""Recording a finished job's MLflow run in a process of its own, after the job has ended.

A face that exits once its job ends (the CLI) should not wait ~2 s for MLflow to import and open
its store. With ``ServiceSettings.record_in_background`` the collector ends the job first and leaves
the run to a detached recorder: ``python -m jupyter_remote_compute.jobs.record <job id>``, in a
session of its own, so killing the face (Ctrl-C, SIGKILL) does not kill it.

Exactly one run per job, always:

- before the job ends, a to-do file ``.punica/recording/<job id>.json`` is written (the record
  without its secret values), so no process can die between "ended" and "someone will record";
- a recorder holds an exclusive ``flock`` on that file while it works; the kernel drops it when the
  recorder dies, however it dies, so "nobody holds it" means "nobody is recording";
- every ``submit`` and every poll pass (the server's, the CLI's) starts a recorder for each to-do
  nobody holds; two that race both find the run by its job tag under the store's lock (tracking.py);
- the recorder writes the run id (or why it could not record) onto the job, then removes the to-do.

Done means recorded: a face that reports a job's end (``run``, ``jobs wait``, ``%remote_train``, a
pipeline step) waits for that recorder (``await_recorded``) instead of recording itself, so there is
one recording path for every face and killing the face still leaves the run to be recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import NotFound
from ..fsutil import atomic_write
from ..secrets import mask
from ..tracking import JobRecord, TrackingSettings, record_job, warm_up, without_far_records
from ..workspace import Workspace
from .context import JobContext
from .logs import mask_values
from .store import Job, JobStore, utcnow

log = logging.getLogger(__name__)

PENDING_DIR = "recording"
#: A to-do whose recorder died this many times (it cannot even start, say) is given up, with a reason.
MAX_ATTEMPTS = 5


def pending_dir(workspace: Workspace) -> Path:
    return workspace.punica_dir / PENDING_DIR


def pending_file(workspace: Workspace, job_id: str) -> Path:
    return pending_dir(workspace) / f"{job_id}.json"


def queue(workspace: Workspace, record: JobRecord, cleanup: Path | None) -> None:
    """Leave the to-do for ``record`` (no secret values in it); ``cleanup`` goes once it is recorded."""
    data = {"record": record.to_json(with_secrets=False), "cleanup": str(cleanup) if cleanup else None}
    atomic_write(pending_file(workspace, record.job_id), json.dumps(data).encode())


def start(
    workspace: Workspace, settings: TrackingSettings, job_id: str, secrets: Sequence[str] | None, *, warm: bool = False
) -> None:
    """Start a detached recorder for the job's to-do; the request (secret values to hide included)
    travels on its standard input, never in argv or a file. ``secrets`` None: one could not be read,
    so the far side's records are withheld.

    ``warm``: started while the job still runs, by the face that waits for it (``prewarm``)."""
    if not warm and _warm_alive(workspace, job_id):
        return  # a warm recorder waits for this job already: a second import of MLflow would only slow it
    request = {
        "workspace": str(workspace.root),
        "settings": {**dataclasses.asdict(settings), "isolated": False},
        "mask_values": None if secrets is None else list(secrets),
    }
    pending_dir(workspace).mkdir(parents=True, exist_ok=True)
    log_file = pending_dir(workspace) / f"{job_id}{'.warm' if warm else ''}.log"
    marker = -1
    if warm:
        # Locked here and handed over, so it is held from before the child exists until it exits.
        marker = os.open(_warm_marker(workspace, job_id), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(marker)
            return  # one waits for this job already (an earlier wait on it, from this face or another)
    with open(log_file, "ab") as errors, contextlib.ExitStack() as closing:
        if warm:
            closing.callback(os.close, marker)
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_remote_compute.jobs.record",
                job_id,
                *([f"--warm={marker}:{os.getpid()}"] if warm else []),
            ],
            pass_fds=(marker,) if warm else (),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,  # outlives the face: a Ctrl-C or a kill of its group does not reach it
            close_fds=True,
            # A local MLflow store that this recorder creates puts the default experiment's artifacts
            # under the working directory: the workspace, as the user's own `mlflow` run there would.
            cwd=workspace.root,
        )
    assert child.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        child.stdin.write(json.dumps(request).encode())
        child.stdin.close()
    # Reaped when it ends (a long-running server must not collect zombies); a face that exits first
    # leaves it to init.
    threading.Thread(target=child.wait, name=f"recorder-{job_id}", daemon=True).start()


def unclaimed(workspace: Workspace) -> list[str]:
    """Job ids whose to-do no live recorder holds (cheap: one listing of a folder that is usually empty)."""
    try:
        names = [e.name for e in os.scandir(pending_dir(workspace)) if e.name.endswith(".json")]
    except FileNotFoundError:
        return []
    free = []
    for name in names:
        try:
            fd = os.open(pending_dir(workspace) / name, os.O_RDONLY)
        except FileNotFoundError:
            continue  # recorded meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a recorder is at work
        finally:
            os.close(fd)  # releases the probe's lock too
        free.append(name.removesuffix(".json"))
    return free


def resume(ctx: JobContext) -> None:
    """Start a recorder for every to-do nobody records (its recorder died, or never started)."""
    for job_id in unclaimed(ctx.workspace):
        try:
            job = ctx.store.get(job_id)
        except NotFound:
            secrets = []  # the recorder only tidies up after a deleted job
        else:
            if job.active:
                # Still being collected: its collector starts the recorder once the job has ended (and a
                # collection that is retried writes a fresh to-do over this one).
                continue
            secrets = mask_values(ctx.secrets, job)
        start(ctx.workspace, ctx.settings.tracking, job_id, secrets)


#: A to-do with no recorder seen at work on it this long after one was started gets another
#: (the first could not start, or a probe took its claim); the attempt count still bounds them.
START_GRACE = 20.0
WAIT_STEP = 0.02  # seconds between looks at a to-do while no recorder has claimed it yet


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
    """While a face waits for a job, a recorder that imports MLflow and opens the store meanwhile
    (the bulk of recording a small job), then records the job the moment it has ended. It goes with
    the face if the job has not ended by then: the collector's own recorder is the one that stays."""
    start(ctx.workspace, ctx.settings.tracking, job.id, mask_values(ctx.secrets, job), warm=True)


def _warm_marker(workspace: Workspace, job_id: str) -> Path:
    return pending_dir(workspace) / f"{job_id}.warm"


def _warm_alive(workspace: Workspace, job_id: str) -> bool:
    """Whether a warm recorder for the job is alive (it holds a lock on its marker until it exits)."""
    try:
        fd = os.open(_warm_marker(workspace, job_id), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _await_todo(workspace: Workspace, job_id: str, parent: int) -> bool:
    """In a warm recorder: whether the job's to-do is there and the job has ended (its end state is
    written after the to-do, with an empty run id: recording before it would be overwritten).
    False once the face that started it (``parent``) is gone, or the job ended with no to-do left
    (another recorder did it)."""
    path = pending_file(workspace, job_id)
    store = JobStore(workspace.state_file)
    looks = 0
    while os.getppid() == parent:
        looks += 1
        there = path.exists()
        if there or looks % 50 == 0:  # the state file is read about once a second while the job runs
            try:
                ended = not store.get(job_id).active
            except NotFound:
                return there  # deleted: record_pending tidies its to-do up
            if ended:
                return path.exists()
        time.sleep(WAIT_STEP)
    return False


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
    start(ctx.workspace, ctx.settings.tracking, job_id, secrets)


# -- the recorder process ----------------------------------------------------------------------
def _claim(path: Path) -> int | None:
    """An open descriptor of the to-do, locked for this process; None if it is gone or taken."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The to-do may have been recorded and removed between the open and the lock.
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    return fd


def _attempt(workspace: Workspace, job_id: str) -> int:
    """Count this attempt (one byte appended per try, so a crash mid-write loses nothing)."""
    counter = pending_dir(workspace) / f"{job_id}.attempts"
    with open(counter, "ab") as f:
        f.write(b".")
    return counter.stat().st_size


def _finish(workspace: Workspace, job_id: str, run_id: str | None, problem: str | None) -> None:
    store = JobStore(workspace.state_file)
    with store.transaction() as jobs:
        job = jobs.get(job_id)
        if job is None:
            return  # deleted meanwhile
        if run_id is not None:
            job.mlflow_run_id = run_id
        else:
            job.reason = ((job.reason or "") + f" (not recorded in MLflow: {problem})").strip()
        job.updated = utcnow()


def record_pending(workspace: Workspace, settings: TrackingSettings, job_id: str, secrets: Sequence[str] | None) -> int:
    """Record one to-do, if no other recorder holds it; 0 when done or not this process's to do.

    ``secrets`` None: a secret the job used could not be read, so the far side's records are withheld.
    """
    path = pending_file(workspace, job_id)
    fd = _claim(path)
    if fd is None:
        return 0
    try:
        todo = json.loads(os.read(fd, 1 << 24))
        record = dataclasses.replace(JobRecord.from_json(todo["record"]), mask_values=tuple(secrets or ()))
        if secrets is None:
            record = without_far_records(record)
        try:
            JobStore(workspace.state_file).get(job_id)
        except NotFound:
            run_id, problem = None, None  # deleted before it was recorded: nothing to record it for
        else:
            if _attempt(workspace, job_id) > MAX_ATTEMPTS:
                run_id, problem = None, f"gave up after {MAX_ATTEMPTS} attempts"
            else:
                try:
                    run_id, problem = record_job(workspace.root, settings, record), None
                except Exception as e:  # MLflow down must not lose the job: say so on it, as collection did
                    run_id, problem = None, mask(str(e).encode(), secrets or ()).decode(errors="replace")[:500]
            _finish(workspace, job_id, run_id, problem)
        if todo.get("cleanup"):
            shutil.rmtree(todo["cleanup"], ignore_errors=True)
        # A warm recorder's marker and log too: one that was killed leaves them behind.
        for leftover in (path, *(path.with_suffix(end) for end in (".attempts", ".log", ".warm", ".warm.log"))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    finally:
        os.close(fd)
    return 0


def _main(argv: Sequence[str]) -> int:
    job_id, *flags = argv
    request = json.loads(sys.stdin.buffer.read())
    settings = TrackingSettings(**request["settings"])
    workspace = Workspace(Path(request["workspace"]))
    warm = [f for f in flags if f.startswith("--warm=")]
    if not warm:
        return record_pending(workspace, settings, job_id, request["mask_values"])
    # The marker, locked for this process's whole life, and the face that started it.
    fd, parent = (int(part) for part in warm[0].removeprefix("--warm=").split(":"))
    marker = _warm_marker(workspace, job_id)
    try:
        warm_up(workspace.root, settings)
        if _await_todo(workspace, job_id, parent):
            record_pending(workspace, settings, job_id, request["mask_values"])
    finally:
        # Its log stays only if it says what went wrong (MLflow's INFO lines on making a store do not).
        for leftover in (marker, pending_dir(workspace) / f"{job_id}.warm.log"):
            with contextlib.suppress(FileNotFoundError):
                if leftover == marker or b"Traceback" not in leftover.read_bytes():
                    os.unlink(leftover)
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
