"""The built-in machine: this computer, treated exactly like a remote one.

Each job gets its own directory outside the workspace (inputs are copied
there), starts through the same far-side launcher as SSH, detached in its own
session and process group, so it outlives the server. Nothing leaves this
machine, so egress policy never stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..fsutil import sha256_file
from .base import (
    TRACKING_DIR,
    WORK_DIR,
    Engine,
    EngineError,
    FetchResult,
    InputFile,
    LaunchSpec,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from .launcher import LAUNCH_SH, RUN_SH, command_script, launch_input

COPY_CHUNK = 1 << 20


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[2] the process group.
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def _copy_with_progress(src: Path, dst: Path, progress: ProgressCallback | None, done: int, total: int) -> int:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(COPY_CHUNK):
            fout.write(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return done


class LocalEngine(Engine):
    kind = "local"
    label = "This machine"
    remote = False

    def _dir(self, job: RemoteJob) -> Path:
        return Path(job.handle["dir"])

    def check(self) -> dict[str, Any]:
        base = self.context.scratch_dir
        base.mkdir(parents=True, exist_ok=True)
        usage = shutil.disk_usage(base)
        return {
            "os": platform.system(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "gpus": [],
            "disk_free_bytes": usage.free,
            "rtt_ms": 0.0,
        }

    def prepare(self, job: RemoteJob) -> RemoteJob:
        jobdir = (self.context.scratch_dir / job.job_id).resolve()
        (jobdir / WORK_DIR).mkdir(parents=True, exist_ok=True)
        (jobdir / "launch.sh").write_text(LAUNCH_SH)
        (jobdir / "run.sh").write_text(RUN_SH)
        (jobdir / "job.json").write_text(json.dumps({"job_id": job.job_id, "key": job.key}) + "\n")
        return RemoteJob(job.job_id, job.key, {**job.handle, "dir": str(jobdir)})

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        work = self._dir(job) / WORK_DIR
        stats = SendStats()
        total = sum(f.size for f in files)
        done = 0
        for f in files:
            dst = work / f.relpath
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists() and dst.stat().st_size == f.size and sha256_file(dst) == f.sha256:
                stats.files_reused += 1
                done += f.size
                continue
            done = _copy_with_progress(f.source, dst, progress, done, total)
            os.chmod(dst, f.mode)
            stats.files_sent += 1
            stats.bytes_sent += f.size
        return stats

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        jobdir = self._dir(job)
        (jobdir / "command.sh").write_text(command_script(launch.command))
        # The launcher detaches the command (setsid) and exits at once; we wait for it, not for the job.
        proc = subprocess.run(
            ["sh", str(jobdir / "launch.sh"), str(jobdir)],
            input=launch_input(launch.env, launch.secret_env),
            capture_output=True,
            timeout=60,
            env={**os.environ, "PATH": _path_with_python()},
        )
        if proc.returncode != 0:
            raise EngineError(
                f"could not start the job (launcher exit {proc.returncode}): {proc.stderr.decode()[-500:]}"
            )
        pid = int(proc.stdout.split()[-1])
        return RemoteJob(job.job_id, job.key, {**job.handle, "pid": pid})

    def _status(self, job: RemoteJob) -> RemoteStatus:
        jobdir = self._dir(job)
        log_size = (jobdir / "log").stat().st_size if (jobdir / "log").exists() else 0
        code = _read_exit_code(jobdir)
        if code is not None:
            return RemoteStatus("exited", exit_code=code, log_size=log_size)
        pid = job.handle.get("pid")
        if pid and group_members(pid):
            return RemoteStatus("running", log_size=log_size)
        # It may have finished between the two reads.
        code = _read_exit_code(jobdir)
        if code is not None:
            return RemoteStatus("exited", exit_code=code, log_size=log_size)
        return RemoteStatus("gone", log_size=log_size, detail=f"process group {pid} is gone without an exit code")

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return {job.job_id: self._status(job) for job in jobs}

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        try:
            with open(self._dir(job) / "log", "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def cancel(self, job: RemoteJob, grace: float) -> None:
        pgid = job.handle.get("pid")
        if not pgid:
            return
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_members(pgid):
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        survivors = group_members(pgid)
        if survivors:
            raise EngineError(f"processes {survivors} of job {job.job_id} survived SIGKILL")

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        jobdir = self._dir(job)
        result = FetchResult()
        work = (jobdir / WORK_DIR).resolve()
        for output in outputs:
            src = work / output
            real = src.resolve()
            if not src.exists() or not (real == work or work in real.parents):
                result.missing.append(output)
                continue
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
            for path in files:
                rel = path.relative_to(work).as_posix()
                target = dest / WORK_DIR / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                # The far side's digest, taken before the copy, as a remote engine would report it.
                result.digests[rel] = sha256_file(path)
                shutil.copyfile(path, target)
        tracking = jobdir / TRACKING_DIR
        if tracking.is_dir():
            shutil.copytree(tracking, dest / TRACKING_DIR, dirs_exist_ok=True, symlinks=True)
        return result

    def cleanup(self, job: RemoteJob) -> None:
        if "dir" in job.handle:
            shutil.rmtree(job.handle["dir"], ignore_errors=True)


def _read_exit_code(jobdir: Path) -> int | None:
    try:
        return int((jobdir / "exit_code").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _path_with_python() -> str:
    # So `python` in a job's command is the interpreter (and venv) this server runs in.
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    return path if path.split(os.pathsep)[:1] == [bindir] else bindir + os.pathsep + path
