"""A job's log: read live from the machine or from the collected copy, secrets masked, and followed.

``follow`` is the one loop that drives a job to its end while streaming its log; the CLI
(``run``, ``jobs log -f``), the magic and ``JobService.wait`` all go through it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..engines.base import Engine, EngineError, ProgressCallback, RemoteJob
from ..environments import image_registry as registry
from ..errors import InvalidSettings, RemoteComputeError, SecretStoreUnavailable
from ..fsutil import private_open
from ..secrets import SecretStore, mask
from .context import JobContext, remote_of
from .job import Job
from .metrics import MetricsPage
from .transitions import TERMINAL_STATES

LOG_CHUNK = 1 << 20
MIN_LOG_READ = 64 << 10

WITHHELD_LOG = (
    b"[jupyter-remote-compute] This job's log is withheld: a secret it uses could not be read from the\n"
    b"Secret Manager to hide it. Read the log on the machine itself.\n"
)


@dataclasses.dataclass(frozen=True)
class LogChunk:
    data: bytes
    offset: int
    next_offset: int
    complete: bool  # the job has ended and this is the end of its log


def settled_length(masked: bytes, secrets: Sequence[str]) -> int:
    """How much of a masked log no later byte can change: it ends where a secret may be beginning."""
    raws = [s.encode() for s in secrets if len(s.encode()) >= 4]
    longest = max(map(len, raws), default=0)
    for start in range(max(0, len(masked) - longest + 1), len(masked)):
        tail = masked[start:]
        if any(raw.startswith(tail) for raw in raws):
            return start
    return len(masked)


def secret_env(secrets: SecretStore, job: Job) -> dict[str, str]:
    """The job's ``secret:NAME`` environment, read from the Secret Manager now."""
    values = {}
    for env_name, secret_name in job.spec.secret_refs().items():
        value = secrets.get(secret_name)
        if value is None:
            raise InvalidSettings(f"env.{env_name}: the secret {secret_name!r} is no longer in the Secret Manager")
        values[env_name] = value
    return values


def mask_values(secrets: SecretStore, job: Job) -> list[str] | None:
    """The values to hide in this job's log and records; None when one cannot be read (fail closed)."""
    if not job.spec.secret_refs() and not job.spec.registry_secret:
        return []
    try:
        return [*secret_env(secrets, job).values(), *registry.mask_values(secrets, job)]
    except (RemoteComputeError, SecretStoreUnavailable):
        return None


def fetch_masked_log(engine: Engine, remote: RemoteJob, dest: Path, secrets: Sequence[str] | None) -> Path:
    """The whole log, masked across chunk boundaries; withheld when a secret cannot be read to mask it."""
    tmp = dest.with_suffix(".part")
    if secrets is None:
        with private_open(tmp, "wb") as f:
            f.write(WITHHELD_LOG)
        os.replace(tmp, dest)
        return dest
    offset = 0
    pending = b""  # masked bytes that a secret continuing in the next chunk could still change
    try:
        with private_open(tmp, "wb") as f:
            while chunk := engine.read_log(remote, offset, LOG_CHUNK):
                offset += len(chunk)
                buffer = mask(pending + chunk, secrets)
                settled = settled_length(buffer, secrets)
                f.write(buffer[:settled])
                pending = buffer[settled:]
            f.write(mask(pending, secrets))
    except BaseException:
        tmp.unlink(missing_ok=True)  # a part of a log, on a disk that filled up, keeps it full
        raise
    os.replace(tmp, dest)
    return dest


def read_log(ctx: JobContext, job_id: str, offset: int = 0, limit: int = LOG_CHUNK) -> LogChunk:
    """Part of a job's log from a byte offset, whole lines where possible, secrets masked."""
    job = ctx.store.get(job_id)
    local = ctx.workspace.job_dir(job_id) / "log"
    if job.state in TERMINAL_STATES:
        if not local.exists():
            return LogChunk(b"", offset, offset, True)
        with open(local, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
        return LogChunk(data, offset, offset + len(data), len(data) < limit)
    if job.waiting:  # in its pool's queue: no machine has a log of it yet
        return LogChunk(b"", offset, offset, False)
    engine = ctx.engine_of(job)
    remote = remote_of(job)
    if not engine.is_prepared(remote):
        return LogChunk(b"", offset, offset, False)
    secrets = mask_values(ctx.secrets, job)
    if secrets is None:
        raise SecretStoreUnavailable(
            f"the log of job {job_id} is withheld: a secret it uses cannot be read from the Secret Manager "
            "to hide it in the log"
        )
    # Read from a little before the offset, so a secret the last read stopped inside is seen whole.
    back = min(offset, max((len(s.encode()) for s in secrets), default=0))
    limit = max(limit, MIN_LOG_READ)
    try:
        window = engine.read_log(remote, offset - back, limit + back)
    except EngineError:
        return LogChunk(b"", offset, offset, False)
    # Return only what no later byte can change: a secret starting near the end comes next time, whole.
    masked = mask(window, secrets)
    data = masked[back : max(back, settled_length(masked, secrets))]
    return LogChunk(data, offset, offset + len(data), False)


FIRST_LOOK = 0.05  # seconds before following looks at a job again the first time; doubles up to the interval


def waiting_line(job: Job) -> str:
    """What a person following a job reads when it starts or stops waiting for its machine's scheduler,
    or for a machine of its pool."""
    if job.waiting:
        return f"job {job.id} is queued in pool {job.pool}: {job.reason or 'waiting for a machine'}\n"
    if job.state == "pending":
        return f"job {job.id} is pending on {job.machine}: {job.reason or 'waiting'}\n"
    if job.state == "queued" and job.attempts and job.reason:  # a next attempt (jobs/retries.py)
        return f"job {job.id} is queued on {job.machine}: {job.reason}\n"
    placed = f" ({job.placement})" if job.placement else ""  # a pool's job: where it went, and why
    return f"job {job.id} is {job.state} on {job.machine}{placed}\n"


def follow(
    advance: Callable[..., Job],
    read: Callable[[str, int], LogChunk],
    job_id: str,
    *,
    interval: float,
    timeout: float | None = None,
    on_log: Callable[[bytes], None] | None = None,
    progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    on_wait: Callable[[Job], None] | None = None,
    read_metrics: Callable[[str, str | None], tuple[MetricsPage, bool]] | None = None,
    on_metrics: Callable[[MetricsPage], None] | None = None,
) -> Job:
    """Drive the job until it ends, ``timeout`` passes or ``stop`` is set; hand its new log to ``on_log``.

    ``on_wait`` hears when the job starts or stops waiting for someone else (``pending``, with its
    reason, and the ``running`` after it), so a person following it knows why nothing happens, and
    when an attempt ended and the next one is queued.
    ``on_metrics`` hears the live metrics each round brought (reading them marks the job watched,
    so the next poll brings what it logged to MLflow since).

    Returns the job in whatever state it reached: following that ends early does not stop the job.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    stop = stop or threading.Event()
    offset = 0
    cursor: str | None = None
    waiting: tuple[str, str | None] | None = None
    attempts = 0
    # Look again soon, then less often: a short job ends within a poll or two, not a whole interval later.
    delay = min(FIRST_LOOK, interval)
    while True:
        job = advance(job_id, progress=progress)
        if len(job.attempts) != attempts:
            # A next attempt (jobs/retries.py): its log starts afresh; the ended one's is kept beside it.
            attempts, offset = len(job.attempts), 0
            if on_wait is not None:
                on_wait(job)
        # Pending on its machine, or queued in its pool for a machine: said as it starts, changes and ends.
        held = job.state == "pending" or job.waiting
        if on_wait is not None and (held or waiting is not None):
            now = (job.state, job.reason)
            if now != waiting:
                on_wait(job)
            waiting = now if held else None
        while on_log is not None:
            chunk = read(job_id, offset)
            if chunk.data:
                on_log(chunk.data)
            offset = chunk.next_offset
            # Caught up: nothing new, the end of a finished log, or less than a full read came back.
            if not chunk.data or chunk.complete or len(chunk.data) < LOG_CHUNK // 2:
                break
        # Under the log: the metrics this round's poll brought (asking marks the job watched).
        if read_metrics is not None and on_metrics is not None:
            page, _ = read_metrics(job_id, cursor)
            cursor = page.cursor or cursor
            if page.points:
                on_metrics(page)
        if job.state in TERMINAL_STATES or stop.is_set():
            return job
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return job
        if stop.wait(delay if remaining is None else min(delay, remaining)):
            return job
        delay = min(delay * 2, interval)
