"""The built-in machine: this computer, treated exactly like a remote one.

It is the shared far side (``shell.ShellEngine``) over a local shell (``transport.LocalTransport``):
each job gets its own folder in the scratch folder, outside the workspace, and starts through the
same launcher as SSH, detached in its own session and process group, so it outlives the server.
Only its inputs are its own: copied, not streamed through a cache. Nothing leaves this machine, so
egress policy never stops it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..fsutil import sha256_file
from .base import WORK_DIR, Features, InputFile, ProgressCallback, RemoteJob, SendStats
from .shell import ShellEngine
from .transport import LocalTransport, Transport

COPY_CHUNK = 1 << 20


def _copy_with_progress(src: Path, dst: Path, progress: ProgressCallback | None, done: int, total: int) -> int:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(COPY_CHUNK):
            fout.write(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return done


class LocalEngine(ShellEngine):
    """This computer through ``LocalTransport``: the shared far side and launcher, a plain copy for inputs."""

    kind = "local"
    label = "This machine"
    features = Features(remote=False, checkpoints=True)
    base_setting = "the server's scratch_dir"

    def make_transport(self) -> Transport:
        return LocalTransport(self.name)

    def default_base_dir(self) -> str:
        return str(self.context.scratch_dir.resolve())

    def jobs_expr(self) -> str:
        return self.base_expr()  # job folders sit in the scratch folder itself

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        work = Path(self.job_dir(job)) / WORK_DIR
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
