"""The built-in machine: this computer, treated exactly like a remote one.

Each job gets its own directory outside the workspace (inputs are copied
there), starts through the same far-side launcher as SSH, detached in its own
session and process group, so it outlives the server. Nothing leaves this
machine, so egress policy never stops it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..fsutil import sha256_file
from . import farside
from .base import (
    WORK_DIR,
    Engine,
    EngineError,
    Features,
    FetchResult,
    InputFile,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
    is_passing,
)
from .launcher import command_script, launch_input

COPY_CHUNK = 1 << 20


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
    features = Features(remote=False)

    def _dir(self, job: RemoteJob) -> Path:
        return Path(job.handle["dir"])

    def _far(
        self, name: str, *args: str, timeout: float = 60, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run one far-side script here, as a remote engine runs it there."""
        return subprocess.run(
            farside.argv(name, *args),
            capture_output=True,
            **({"stdin": subprocess.DEVNULL} if stdin is None else {"input": stdin}),
            timeout=timeout,
            env=_env_with_python(),
        )

    def check(self) -> dict[str, Any]:
        base = self.context.scratch_dir
        proc = self._far("facts", str(base))
        if proc.returncode != 0:
            raise EngineError(f"{self.name}: check failed: {proc.stderr.decode(errors='replace')[-500:]}")
        return farside.parse_facts(proc.stdout.decode(errors="replace"), 0.0).to_json()

    def prepare(self, job: RemoteJob) -> RemoteJob:
        base = self.context.scratch_dir
        jobdir = (base / job.job_id).resolve()
        args = farside.prepare_args(str(jobdir), job.job_id, job.key)  # a job id that is no plain name stops here
        try:
            (jobdir / WORK_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise EngineError(
                f"{self.name}: cannot create the job folder under {base} ({e.strerror}); "
                "set the scratch folder to a directory you may write",
                transient=is_passing(e),
            ) from None
        proc = self._far("prepare", *args)
        if proc.returncode != 0:
            raise EngineError(f"{self.name}: preparing job {job.job_id}: {proc.stderr.decode(errors='replace')[-500:]}")
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
            env=_env_with_python(),
        )
        if proc.returncode != 0:
            raise EngineError(
                f"could not start the job (launcher exit {proc.returncode}): {proc.stderr.decode()[-500:]}"
            )
        pid = int(proc.stdout.split()[-1])
        return RemoteJob(job.job_id, job.key, {**job.handle, "pid": pid})

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return self.poll_watched(jobs, {})[0]

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        if not jobs:
            return {}, {}
        dirs = [str(self._dir(job)) for job in jobs]
        stdin = farside.watch_input(jobs, watched) if watched else None
        proc = self._far("status", *farside.status_words(dirs, bool(watched)), stdin=stdin)
        if proc.returncode != 0:
            raise EngineError(f"{self.name}: poll failed: {proc.stderr.decode(errors='replace')[-500:]}")
        text, blob = farside.split_metrics(proc.stdout)
        return farside.parse_status(text, jobs, self.name), farside.parse_metrics(blob, jobs)

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        try:
            with open(self._dir(job) / "log", "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def cancel(self, job: RemoteJob, grace: float) -> None:
        if not job.handle.get("dir"):
            return
        proc = self._far("cancel", str(self._dir(job)), farside.cancel_ticks(grace), timeout=grace + 30)
        if proc.returncode != 0:
            raise EngineError(
                f"{self.name}: cancelling job {job.job_id}: {proc.stderr.decode(errors='replace')[-500:]}"
            )

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        manifest = f".fetch-{uuid.uuid4().hex}"
        # The same tar stream a remote machine sends, read under the same policy.
        with subprocess.Popen(
            farside.argv("manifest", str(self._dir(job)), manifest, *outputs),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # its python3 is then this interpreter, not a wrapper such as pyenv's shim (~0.3 s a start)
            env=_env_with_python(),
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            try:
                result = farside.receive_outputs(proc.stdout.read1, outputs, dest, manifest, self.name, progress)
            except (farside.NoManifest, farside.ArchiveCut):
                proc.wait(60)
                raise EngineError(
                    f"{self.name}: fetching outputs failed: {proc.stderr.read().decode(errors='replace')[-500:]}"
                ) from None
            finally:
                proc.stdout.close()
            err = proc.stderr.read()
            if proc.wait(60) != 0:
                raise EngineError(f"{self.name}: fetching outputs failed: {err.decode(errors='replace')[-500:]}")
        return result

    def cleanup(self, job: RemoteJob) -> None:
        if "dir" in job.handle:
            proc = self._far("cleanup", job.handle["dir"], job.job_id, timeout=300)
            if proc.returncode != 0:
                raise EngineError(
                    f"{self.name}: removing job {job.job_id}: {proc.stderr.decode(errors='replace')[-500:]}"
                )


def _env_with_python() -> dict[str, str]:
    """This process's environment with its interpreter's folder first on PATH, for every far-side script.

    So `python` in a job's command is the interpreter (and venv) this server runs in.
    """
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[:1] != [bindir]:
        path = bindir + os.pathsep + path
    return {**os.environ, "PATH": path}
