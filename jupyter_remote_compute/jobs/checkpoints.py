"""A running job's checkpoint folder, brought home while it runs: the newest complete set, verified.

A job that declares ``checkpoints: DIR`` finds the folder's path on its machine in
``REMOTE_COMPUTE_CHECKPOINT_DIR`` (``work/DIR``, made by the launcher). Every ``checkpoint_every``
seconds while it runs (the driver's poll is the clock; the look itself runs in this module's
threads, so neither the server's loop nor other jobs' polls wait for it), and once more when it
ends (collection), one look:

1. lists the folder (``farside/checkpoints.sh``): size and mtime of each file, leaving out the
   names a writer uses while a file is not whole yet (``.name``, ``*.tmp``, ``*.part``, ``*~``);
2. takes a file only once it is **complete**: listed with the same size and mtime at the previous
   look (written and closed, or renamed into place, at least a period ago). At the last look, the
   job has ended and every listed file is complete;
3. fetches, of those, only what is new or changed since the set at home (``fetch_checkpoints``:
   manifest.sh's one verified tar, without ``mlruns/``), and checks every file against the far
   side's sha256;
4. builds the new set beside the old one (unchanged files linked from it) and swaps the link
   ``.punica/checkpoints/<job id>`` to it in one rename: a reader sees the old set or the new one,
   never half of one. The set before it is kept one more look, for a reader still in it.

A job its machine warned it will be stopped soon (``RemoteStatus.warned``: Slurm's signal before its
time limit) is looked at every poll from then on, so its last complete set is as recent as can be.

A file the job deletes leaves the next set; a file it is rewriting keeps its last complete version.
A file rewritten in place (not through a rename) while it is fetched may come home torn, and comes
again once it changed: write checkpoints to a temporary name and rename them.

What this side knows between looks is kept in the job's folder (``checkpoints.json``); the job's
``checkpoint`` field says when the newest set landed, its files and bytes, and every byte fetched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import filelock

from ..engines.base import WORK_DIR, EngineError
from ..fsutil import SharedFileLock, atomic_write, private_dir, sha256_file
from ..schema.job import CheckpointSet
from ..schema.spec import DEFAULT_CHECKPOINT_EVERY
from .context import JobContext, remote_of
from .job import Job, utcnow
from .leases import Leases

log = logging.getLogger(__name__)

#: Looks at once, over every job of this process: each is one or two round trips and a copy.
LOOKS_AT_ONCE = 2
#: How long the look at a job's end waits for a periodic look still landing (seconds).
FINAL_WAIT = 600.0


def home_of(job: Job, punica: Path) -> Path:
    """Where a job's newest complete checkpoint set is seen: ``.punica/checkpoints/<job id>``."""
    return punica / "checkpoints" / job.id


class Checkpoints:
    """The periodic looks of one process's running jobs, and the last look at a job's end."""

    def __init__(self, ctx: JobContext, leases: Leases) -> None:
        self.ctx = ctx
        self.leases = leases
        self._pool: ThreadPoolExecutor | None = None
        self._guard = threading.Lock()
        self._looking: set[str] = set()
        self._last: dict[str, float] = {}  # job id -> when this process last started a look (monotonic)
        self._warned: set[str] = set()  # jobs their machine warned it will stop soon: looked at every poll

    def warned(self, job_id: str) -> None:
        """The job's machine warned it will be stopped soon (Slurm's signal before its time limit): from
        now on its checkpoint folder is looked at every poll, so the last complete set is the newest
        there can be when it stops, wherever it stops (a retry starts from it)."""
        with self._guard:
            if job_id not in self._warned:
                self._warned.add(job_id)
                self._last.pop(job_id, None)  # the first look now
                log.info("job %s: its machine warned it will be stopped soon: checkpoints looked at every poll", job_id)

    def tick(self, job: Job) -> None:
        """A running job's look, handed to this module's threads when one is due; returns at once."""
        if not job.spec.checkpoints or job.state != "running":
            return
        now = time.monotonic()
        with self._guard:
            every = 0.0 if job.id in self._warned else job.spec.checkpoint_every or DEFAULT_CHECKPOINT_EVERY
            if job.id in self._looking or now - self._last.get(job.id, -every) < every:
                return
            self._looking.add(job.id)
            self._last[job.id] = now
            if self._pool is None:
                self._pool = ThreadPoolExecutor(LOOKS_AT_ONCE, thread_name_prefix="checkpoints")
        self._pool.submit(self._periodic, job.id)

    def close(self) -> None:
        """Let the looks under way finish (each lands whole or not at all); start no more."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _periodic(self, job_id: str) -> None:
        try:
            self.look(self.ctx.store.get(job_id), final=False)
        except (EngineError, OSError) as e:  # the next look tries again
            log.warning("job %s: checkpoints could not come home: %s", job_id, e)
        except Exception:
            log.exception("job %s: checkpoints could not come home", job_id)
        finally:
            with self._guard:
                self._looking.discard(job_id)

    def final(self, job: Job) -> None:
        """The last look, when the job has ended: every file listed is complete. Errors are logged:
        the job's outcome is its command's, and the last complete set stays."""
        if not job.spec.checkpoints:
            return
        with self._guard:
            self._last.pop(job.id, None)
            self._warned.discard(job.id)
        try:
            self.look(job, final=True)
        except filelock.Timeout:
            log.warning("job %s: a checkpoint look held its lock too long: the last set stays", job.id)
        except (EngineError, OSError) as e:
            log.warning("job %s: the last checkpoints could not come home: %s", job.id, e)

    def look(self, job: Job, *, final: bool) -> CheckpointSet | None:
        """One look (the module's steps 1-4) under the job's checkpoint lock; the new set, or None
        when nothing changed (or another process is looking)."""
        folder = job.spec.checkpoints
        if not folder:
            return None
        jobdir = self.ctx.workspace.job_dir(job.id)
        private_dir(jobdir)
        lock = SharedFileLock(jobdir / "checkpoints.lock", timeout=FINAL_WAIT if final else 0.0)
        try:
            lock.acquire()
        except filelock.Timeout:
            if final:
                raise
            return None  # another process is looking now
        try:
            job = self.ctx.store.get(job.id)  # its checkpoint field as the last look left it
            if not final and job.state != "running":
                return None  # ended meanwhile: the last look is collection's
            return self._look(job, folder, jobdir, final)
        finally:
            lock.release()

    def _look(self, job: Job, folder: str, jobdir: Path, final: bool) -> CheckpointSet | None:
        engine = self.ctx.engine_of(job)
        remote = remote_of(job)
        state_path = jobdir / "checkpoints.json"
        state = _read_state(state_path)
        seen: dict[str, list[int]] = state.get("seen", {})
        landed: dict[str, dict[str, Any]] = state.get("landed", {})
        listing = {rel: list(stat) for rel, stat in engine.list_checkpoints(remote, folder).items()}
        complete = {rel: stat for rel, stat in listing.items() if final or seen.get(rel) == stat}
        wanted = sorted(
            rel
            for rel, stat in complete.items()
            if rel not in landed or [landed[rel]["size"], landed[rel]["mtime"]] != stat
        )
        # The new set: what is complete, else the last complete version of a file being rewritten.
        members = {rel: complete[rel] for rel in complete} | {
            rel: [landed[rel]["size"], landed[rel]["mtime"]] for rel in listing if rel in landed and rel not in complete
        }
        changed = bool(wanted) or set(members) != set(landed)
        if not changed:
            _write_state(state_path, {**state, "seen": listing})
            return None
        punica = self.ctx.workspace.punica_dir
        home = home_of(job, punica)
        sets = punica / "checkpoints" / ".sets"
        private_dir(sets)
        previous = int(state.get("set", 0))  # the set ``landed`` describes: unchanged files link from it
        number = previous + 1
        while (sets / f"{job.id}.{number}").exists():  # a look that swapped, then died before its record
            number += 1
        building = sets / f"{job.id}.{number}.part"
        incoming = jobdir / "checkpoints-incoming"
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(incoming, ignore_errors=True)
        try:
            fetched = self._fetch(engine, remote, folder, wanted, incoming)
            private_dir(building)
            current = sets / f"{job.id}.{previous}" if previous else None
            entries: dict[str, dict[str, Any]] = {}
            for rel, (size, mtime) in members.items():
                target = building / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                if rel in fetched:
                    os.replace(incoming / WORK_DIR / folder / rel, target)
                    entries[rel] = {"size": size, "mtime": mtime, "sha256": fetched[rel]}
                else:
                    _link_or_copy(current / rel if current else None, target)
                    entries[rel] = landed[rel]
            done = sets / f"{job.id}.{number}"
            os.rename(building, done)
            link = home.with_name(f".{job.id}.{uuid.uuid4().hex}")
            os.symlink(os.path.relpath(done, home.parent), link)
            os.replace(link, home)  # the swap: the old set or the new one, never half
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
            shutil.rmtree(building, ignore_errors=True)
        for old in sets.glob(f"{job.id}.*"):  # the set before is kept one more look, for a reader still in it
            kept = old.name.rpartition(".")
            if kept[0] == job.id and kept[2].isdigit() and int(kept[2]) not in (number, previous):
                shutil.rmtree(old, ignore_errors=True)
        summary = CheckpointSet(
            at=utcnow(),
            files=len(entries),
            bytes=sum(int(e["size"]) for e in entries.values()),
            fetched_bytes=int((job.checkpoint or {}).get("fetched_bytes", 0))
            + sum(int(entries[rel]["size"]) for rel in fetched),
        )
        _write_state(state_path, {"seen": listing, "landed": entries, "set": number})
        self.leases.update(job.id, checkpoint=summary)
        return summary

    def _fetch(self, engine: Any, remote: Any, folder: str, wanted: list[str], incoming: Path) -> dict[str, str]:
        """The wanted files into ``incoming``, each checked against the far side's sha256: path -> digest."""
        if not wanted:
            return {}
        private_dir(incoming)
        paths = [f"{folder}/{rel}" for rel in wanted]
        result = engine.fetch_checkpoints(remote, paths, incoming)
        digests: dict[str, str] = {}
        for rel, path in zip(wanted, paths, strict=True):
            far = result.digests.get(path)
            here = incoming / WORK_DIR / path
            if far is None or not here.is_file():
                # Gone between the listing and the fetch (a rotation deleting old checkpoints): not this set's.
                raise EngineError(f"checkpoint {path} went away while it was fetched; the next look takes the set")
            if (result.received.get(path) or sha256_file(here)) != far:
                raise EngineError(f"checkpoint {path} was damaged in transit (sha256 differs); fetched again next look")
            digests[rel] = far
        return digests


def _link_or_copy(source: Path | None, target: Path) -> None:
    if source is None:
        raise OSError(f"the checkpoint set at home lost {target.name}")
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _read_state(path: Path) -> dict[str, Any]:
    with contextlib.suppress(FileNotFoundError, ValueError):
        data = json.loads(path.read_bytes())
        if isinstance(data, dict):
            return data
    return {}


def _write_state(path: Path, state: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(state, separators=(",", ":")).encode())
