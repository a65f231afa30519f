"""Recording finished jobs' MLflow runs: one recorder process per user, the one path for every face.

The server, the CLI, ``%remote_train`` and a pipeline step all record through the same child program
(``PROGRAM`` of ``jobs/recording.py``, whose ``main`` serves with the lifecycle's store of jobs as the
``RecordedJobs`` here: recording imports nothing of the lifecycle) and the same protocol: one JSON request line on a
Unix socket only this user can open (``socket_path``), answered with one JSON line. MLflow is imported
there, never in a face: it costs ~200 MiB and most of the seconds that recording a small job takes
(importing it is ~4 s of CPU). The recorder is started on first use, in a session of its own (killing
a face, Ctrl-C or SIGKILL, does not kill it), and stays up ``RECORDER_IDLE`` seconds after its last
request, so the next job is recorded with MLflow already loaded and its store open.

One recorder serves every workspace of the user that this installation's faces use (its files are
named after the Python that runs it, so another environment's faces start their own). Every request
carries the face's workspace and environment: the recorder works in that workspace's folder with that
environment (an MLflow server's credentials, ``PATH``), as a recorder the face started itself would.

Requests (``settings``: the face's ``TrackingSettings`` with its store's URI resolved, so every face
of a workspace records where it means to, whoever started the recorder):

- ``{"op": "warm", "settings": …}``: load MLflow and open the store now; a face that waits for a job
  asks this while the job runs. Answered at once.
- ``{"op": "record", "job": <id>, "settings": …, "mask_values": [...] | null, "wait": bool}``: record
  the job's to-do; the values to hide travel in the request, never in argv or a file (null: a secret
  could not be read, so the far side's records are withheld). Without ``wait`` it is answered once
  queued; with it (the server, which ends a job once its run is recorded), with
  ``{"run_id": …, "problem": …}`` once recorded.
- ``{"op": "call", "call": <Call>, "args": {…}, "wait": bool}``: another MLflow record a face makes
  beside its jobs' runs (a pipeline's parent run), named by its ``Call``; the function that makes it
  is the recorder program's table's (``recording/calls.py``), given ``args``. (Protocol 2 named it by
  ``"target": "<module>:<function>"``; a call is never stored, and a face reaches only a recorder of
  its own protocol.)

Exactly one run per job, always:

- before the job ends (or, for the server, before its run is recorded), a to-do file
  ``.punica/recording/<job id>.json`` is written (the record without its secret values), so no
  process can die between "ended" and "someone will record";
- a recorder holds an exclusive ``flock`` on that file while it works; the kernel drops it when the
  recorder dies, however it dies, so "nobody holds it" means "nobody is recording";
- every ``submit`` and every poll pass (the server's, the CLI's) asks for each to-do nobody holds
  whose job has ended; two recorders that race (two of them can run when faces disagree on the
  temporary folder) both find the run by its job tag under the store's lock (recording/tracking.py);
- the recorder writes the run id (or why it could not record) onto the job, then removes the to-do.

Done means recorded: a face that reports a job's end (``run``, ``jobs wait``, ``%remote_train``, a
pipeline step) waits for that to-do to go (``await_recorded`` in ``jobs/recording.py``), and replaces a
recorder that died.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import hashlib
import json
import logging
import os
import queue as queues
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..fsutil import atomic_write, private_open, socket_folder
from ..secrets import mask
from ..workspace import Workspace
from .tracking import (
    JobRecord,
    TrackingSettings,
    close_stores,
    load_mlflow,
    record_job,
    tracking_uri,
    warm_up,
    without_far_records,
)

log = logging.getLogger(__name__)

PENDING_DIR = "recording"
#: A to-do whose recorder died this many times (it cannot even start, say) is given up, with a reason.
MAX_ATTEMPTS = 5
#: In the socket's and the lock's names: a recorder of another version never gets this one's requests.
#: 4: a job's record may carry its pool and placement.
#: 5: a to-do carries an attempt's record (``attempt``, ``ends``, ``attempts``) and earlier ones (``earlier``).
#: 6: a job's record may name the tracking server its run goes to (``tracking_uri``: the organization's).
PROTOCOL = 6
#: Seconds a recorder stays up after its last request (the environment variable overrides it).
RECORDER_IDLE = 600.0
IDLE_ENV = "JUPYTER_REMOTE_COMPUTE_RECORDER_IDLE"
#: Seconds a face waits for a recorder it started to take requests (it imports only the standard
#: library and this package before it listens; MLflow loads after).
START_TIMEOUT = 60.0
#: Seconds a recorder started while another is still closing waits for that one to be gone.
TAKE_OVER_WAIT = 15.0
RECORD_TIMEOUT = 1800.0  # artifacts up to artifact_size_cap are copied: generous, but never for ever
MAX_REQUEST = 1 << 24
WAIT_STEP = 0.02  # seconds between looks at a socket, or a to-do, that is not there yet


class RecordedJobs(Protocol):
    """Where the recorder process finds a job and leaves its run id: the lifecycle's store of jobs,
    handed to ``Recorder`` by the program's ``main`` (recording does not import the lifecycle)."""

    def exists(self, workspace: Workspace, job_id: str) -> bool:
        """The job is still there (one deleted before it was recorded has nothing to record it for)."""
        ...

    def finish(self, workspace: Workspace, job_id: str, run_id: str | None, problem: str | None) -> None:
        """Put the run id, or why there is none, on the job (gone meanwhile: nothing)."""
        ...


class RecorderUnavailable(RuntimeError):
    """The workspace's recorder could not be started or reached, or it died before answering."""


def pending_dir(workspace: Workspace) -> Path:
    return workspace.punica_dir / PENDING_DIR


def pending_file(workspace: Workspace, job_id: str) -> Path:
    return pending_dir(workspace) / f"{job_id}.json"


def recorder_file(suffix: str) -> Path:
    """The recorder's own files, ``sock`` (where it listens), ``lock`` (held for its life, with its pid)
    and ``log``: in a folder only this user can open, named after the Python that runs the recorder,
    the package's own folder and the protocol, so a face never reaches a recorder of another environment
    or version (two checkouts on one Python, as a developer has, each get their own)."""
    where = os.fsencode(sys.executable) + b"\0" + os.fsencode(str(Path(__file__).resolve().parent.parent))
    digest = hashlib.sha256(where).hexdigest()[:16]
    return _private_folder() / f"recorder-{digest}.v{PROTOCOL}.{suffix}"


def socket_path() -> Path:
    return recorder_file("sock")


def _private_folder() -> Path:
    try:
        return socket_folder()
    except PermissionError as e:
        raise RecorderUnavailable(str(e)) from None


def queue(workspace: Workspace, record: JobRecord, cleanup: Path | None) -> None:
    """Leave the to-do for ``record`` (no secret values in it); ``cleanup`` goes once it is recorded.

    A to-do of the job's earlier attempt that no recorder took yet is carried into this one (``earlier``,
    recorded first into the same run), so an attempt's records are never written over before they are in
    the run; one of this attempt or a later one (a collection done again) is replaced."""
    path = pending_file(workspace, record.job_id)
    earlier: list[dict[str, Any]] = []
    cleanups = [str(cleanup)] if cleanup else []
    try:
        before = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        before = None
    if isinstance(before, dict) and isinstance(before.get("record"), dict):
        for old in [*before.get("earlier", []), before["record"]]:
            if old.get("attempt", 1) < record.attempt:
                earlier.append(old)
        old_cleanup = before.get("cleanup")
        for old_path in [old_cleanup] if isinstance(old_cleanup, str) else old_cleanup or []:
            if old_path not in cleanups:
                cleanups.append(old_path)
    data = {"record": record.to_json(with_secrets=False), "earlier": earlier, "cleanup": cleanups}
    atomic_write(path, json.dumps(data).encode())


def settings_json(workspace: Workspace, settings: TrackingSettings) -> dict[str, Any]:
    return {**dataclasses.asdict(settings), "tracking_uri": tracking_uri(workspace.root, settings)}


def start(
    program: Sequence[str],
    workspace: Workspace,
    settings: TrackingSettings,
    job_id: str,
    secrets: Sequence[str] | None,
) -> None:
    """Have the workspace's recorder (``program``, started if none runs) record the job's to-do;
    returns once it is queued there. ``secrets`` None: one could not be read, so the far side's
    records are withheld. A recorder that cannot be reached is said in the log: the to-do stays for
    the next poll, submit or wait."""
    request = {"op": "record", "job": job_id, "settings": settings_json(workspace, settings), "wait": False}
    try:
        ask(program, workspace, {**request, "mask_values": None if secrets is None else list(secrets)})
    except RecorderUnavailable as e:
        log.warning("job %s: its MLflow run is not being recorded yet: %s", job_id, e)


def record_now(
    program: Sequence[str],
    workspace: Workspace,
    settings: TrackingSettings,
    job_id: str,
    secrets: Sequence[str] | None,
) -> tuple[str | None, str | None]:
    """Record the job's to-do in the workspace's recorder (``program``) and wait: (its run id, or why it
    is not recorded). RecorderUnavailable when no recorder could do it (the to-do stays)."""
    answer = ask(
        program,
        workspace,
        {
            "op": "record",
            "job": job_id,
            "settings": settings_json(workspace, settings),
            "mask_values": None if secrets is None else list(secrets),
            "wait": True,
        },
        timeout=RECORD_TIMEOUT,
    )
    return answer.get("run_id"), answer.get("problem")


def warm(program: Sequence[str], workspace: Workspace, settings: TrackingSettings) -> None:
    """Have the workspace's recorder (``program``) load MLflow and open the store now. Answered at once."""
    ask(program, workspace, {"op": "warm", "settings": settings_json(workspace, settings)})


def ask(
    program: Sequence[str], workspace: Workspace, request: Mapping[str, Any], timeout: float = START_TIMEOUT
) -> dict[str, Any]:
    """Send one request about the workspace to the user's recorder, starting one (``program``, the
    command line of the recorder's program) if none listens, and return its answer.

    A recorder that closes without answering (it was going idle, or it died) is replaced and asked
    again: a record request twice is harmless, the second finds the to-do gone or the run by its tag."""
    path = socket_path()
    # The socket is this user's only: the environment (secrets among it) goes no further than a
    # recorder of the user's own would have inherited.
    line = json.dumps({**request, "workspace": str(workspace.root), "environ": dict(os.environ)}).encode() + b"\n"
    started = False
    deadline = time.monotonic() + START_TIMEOUT
    for _ in range(3):
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.settimeout(START_TIMEOUT)
                conn.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                if not started:
                    _spawn(program)
                    started = True
                elif time.monotonic() > deadline:
                    raise RecorderUnavailable(f"the recorder did not start within {START_TIMEOUT:.0f} s") from None
                time.sleep(WAIT_STEP)
            except OSError as e:
                conn.close()
                raise RecorderUnavailable(f"cannot reach the recorder at {path}: {e}") from None
        try:
            conn.sendall(line)
            conn.settimeout(timeout)
            answer = _read_line(conn)
        except OSError:
            answer = b""
        finally:
            conn.close()
        if answer:
            return json.loads(answer)
        started, deadline = False, time.monotonic() + START_TIMEOUT
    raise RecorderUnavailable("the recorder closed without answering, three times")


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
        if len(data) > MAX_REQUEST:
            raise OSError("request too long")
    return data


def _spawn(program: Sequence[str]) -> None:
    log_file = recorder_file("log")
    with private_open(log_file) as errors:
        child = subprocess.Popen(
            list(program),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,  # outlives the face: a Ctrl-C or a kill of its group does not reach it
            close_fds=True,
            cwd=log_file.parent,  # each request's workspace is its working directory while it is worked
        )
    # Reaped when it ends (a long-running server must not collect zombies); a face that exits first
    # leaves it to init.
    threading.Thread(target=child.wait, name="recorder-reaper", daemon=True).start()


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


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def wait_unheld(workspace: Workspace, job_id: str, timeout: float = RECORD_TIMEOUT) -> None:
    """Return once no recorder works on the job's to-do. A collection cut short (its server killed)
    may have left one at work, reading the folder the next collection fetches into: that one waits."""
    path = pending_file(workspace, job_id)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                log.warning("job %s: a recorder still holds its to-do after %.0f s; collecting anyway", job_id, timeout)
                return
        finally:
            os.close(fd)
        time.sleep(0.1)


def _attempt(workspace: Workspace, job_id: str) -> int:
    """Count this attempt (one byte appended per try, so a crash mid-write loses nothing)."""
    counter = pending_dir(workspace) / f"{job_id}.attempts"
    with private_open(counter) as f:
        f.write(b".")
    return counter.stat().st_size


def record_pending(
    workspace: Workspace,
    settings: TrackingSettings,
    job_id: str,
    secrets: Sequence[str] | None,
    jobs: RecordedJobs,
) -> tuple[str | None, str | None] | None:
    """Record one to-do, if no other recorder holds it: (its run id, or why not); None when it was not
    this process's to do (gone, or another recorder holds it).

    ``secrets`` None: a secret the job used could not be read, so the far side's records are withheld.
    """
    path = pending_file(workspace, job_id)
    fd = _claim(path)
    if fd is None:
        return None
    try:
        todo = json.loads(os.read(fd, MAX_REQUEST))
        records = []
        for raw in [*todo.get("earlier", []), todo["record"]]:  # an attempt's earlier attempts first
            record = dataclasses.replace(JobRecord.from_json(raw), mask_values=tuple(secrets or ()))
            records.append(without_far_records(record) if secrets is None else record)
        run_id: str | None
        problem: str | None
        if not jobs.exists(workspace, job_id):
            run_id, problem = None, None  # deleted before it was recorded: nothing to record it for
        else:
            if _attempt(workspace, job_id) > MAX_ATTEMPTS:
                run_id, problem = None, f"gave up after {MAX_ATTEMPTS} attempts"
            else:
                try:
                    for record in records:
                        run_id, problem = record_job(workspace.root, settings, record), None
                except Exception as e:  # MLflow down must not lose the job: say so on it, as collection did
                    run_id, problem = None, mask(str(e).encode(), secrets or ()).decode(errors="replace")[:500]
                    if not records[-1].ends:
                        return run_id, problem  # the to-do stays: the job's end carries it into its run
            jobs.finish(workspace, job_id, run_id, problem)
        # A collection of the job that came after (its collector died meanwhile) wrote a fresh to-do
        # and fetched into the same folder: those are that to-do's now.
        if _same_file(fd, path):
            cleanup = todo.get("cleanup")
            for done in [cleanup] if isinstance(cleanup, str) else cleanup or []:  # one path: an older to-do
                shutil.rmtree(done, ignore_errors=True)
            for leftover in (path, path.with_suffix(".attempts")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
    finally:
        os.close(fd)
    return run_id, problem


class Call(str, enum.Enum):
    """A record a face asks the recorder to make beside its jobs' runs (a ``call`` request's ``call``)."""

    PIPELINE_PARENT_RUN = "pipeline_parent_run"


#: The function that makes each call's record, given the request's ``args`` (``recording/calls.py``).
CallTable = Mapping[Call, Callable[[Mapping[str, Any]], Any]]


def call_of(request: Mapping[str, Any]) -> Call:
    """The call a ``call`` request names; anything the recorder does not know is refused."""
    try:
        return Call(request.get("call"))
    except ValueError:
        raise ValueError(f"not a recording call: {request.get('call')!r}") from None


class Recorder:
    """The user's recorder process: takes requests on its socket, works them one at a time."""

    def __init__(self, idle: float, jobs: RecordedJobs, calls: CallTable) -> None:
        self.idle = idle
        self.jobs = jobs
        self.calls = calls
        self.work: queues.Queue[tuple[dict[str, Any], socket.socket | None]] = queues.Queue()
        self.busy = 0  # requests taken and not yet done
        self.last = time.monotonic()
        self.guard = threading.Lock()

    def serve(self) -> int:
        lock_file, log_file = recorder_file("lock"), recorder_file("log")
        folder = lock_file.parent
        lock = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _lock_within(lock, TAKE_OVER_WAIT):
                return 0  # another recorder serves this user
            os.ftruncate(lock, 0)
            os.write(lock, f"{os.getpid()}\n".encode())  # who serves it, for a person (or a test) to see
            path = socket_path()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a recorder that died left it
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            umask = os.umask(0o077)  # the socket is this user's only, from the moment it exists
            try:
                listener.bind(str(path))
            finally:
                os.umask(umask)  # what it records (MLflow's artifacts) gets the user's own permissions
            listener.listen(64)
            listener.settimeout(1.0)
            mine = os.stat(path).st_ino
            threading.Thread(target=self._work, name="recorder", daemon=True).start()
            try:
                self._accept(listener, folder)
            finally:
                listener.close()
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == mine:
                        os.unlink(path)
                # Its log stays only if it says what went wrong (MLflow's INFO lines on making a store do not).
                with contextlib.suppress(FileNotFoundError):
                    if b"Traceback" not in log_file.read_bytes():
                        os.unlink(log_file)
        finally:
            os.close(lock)  # only now may the next recorder listen
        return 0

    def _accept(self, listener: socket.socket, folder: Path) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                with self.guard:
                    idle = self.busy == 0 and time.monotonic() - self.last > self.idle
                if idle or not folder.is_dir():  # idle, or its folder is gone
                    return
                continue
            with self.guard:
                self.busy += 1
                self.last = time.monotonic()
            try:
                conn.settimeout(30.0)
                request = json.loads(_read_line(conn) or b"null")
                if (
                    not isinstance(request, dict)
                    or request.get("op") not in ("warm", "record", "call")
                    or not isinstance(request.get("workspace"), str)
                    or not isinstance(request.get("environ"), dict)
                ):
                    raise ValueError("not a recorder request")
            except (OSError, ValueError) as e:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"problem": f"bad request: {e}"}).encode() + b"\n")
                conn.close()
                self._done()
                continue
            if request.get("wait"):
                self.work.put((request, conn))
            else:
                self.work.put((request, None))
                with contextlib.suppress(OSError):
                    conn.sendall(b'{"queued": true}\n')
                conn.close()

    def _done(self) -> None:
        with self.guard:
            self.busy -= 1
            self.last = time.monotonic()

    def _work(self) -> None:
        load_mlflow()  # at once: the first request is most often on its way (a job about to end)
        while True:
            request, conn = self.work.get()
            try:
                answer = self._handle(request)
            except Exception as e:  # said to the face that waits, and in the recorder's log
                log.exception("recorder: %s failed", request.get("op"))
                answer = {"problem": mask(str(e).encode(), request.get("mask_values") or ()).decode()[:500]}
            finally:
                with contextlib.suppress(Exception):  # closing can only fail on a store already gone
                    close_stores()
                self._done()
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps(answer).encode() + b"\n")
                conn.close()

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        # As a recorder the face started itself: its environment, and its workspace as the working
        # directory (a local store MLflow creates puts its default experiment's artifacts there, as the
        # user's own `mlflow` run in the workspace would). One request at a time, so this is safe.
        os.environ.clear()
        os.environ.update(request["environ"])
        workspace = Workspace(Path(request["workspace"]))
        with contextlib.suppress(OSError):
            os.chdir(workspace.root)
        if request["op"] == "call":
            return {"result": self.calls[call_of(request)](request.get("args") or {})}
        settings = TrackingSettings(**request["settings"])
        if request["op"] == "warm":
            warm_up(workspace.root, settings)
            return {}
        done = record_pending(workspace, settings, str(request["job"]), request.get("mask_values"), self.jobs)
        if done is None:
            return {"run_id": None, "problem": None, "taken": True}
        return {"run_id": done[0], "problem": done[1]}


def _lock_within(fd: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def recorder_idle() -> float:
    try:
        return float(os.environ.get(IDLE_ENV) or RECORDER_IDLE)
    except ValueError:
        return RECORDER_IDLE
