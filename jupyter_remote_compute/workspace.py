"""Where a workspace is and where its files live.

The workspace is the nearest directory upward holding ``.punica/`` (as git
finds ``.git``), else the given fallback (the server's root dir) or the
current directory. Every entry point resolves it the same way, so the
server, a kernel, the CLI and a pipeline runner see the same machines and jobs.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .fsutil import tighten

PUNICA_DIR = ".punica"


def find_workspace(start: Path | str | None = None, fallback: Path | str | None = None) -> Path:
    here = Path(start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / PUNICA_DIR).is_dir():
            return candidate
    return Path(fallback).resolve() if fallback else here


def relative_to_note(root: Path) -> str:
    """What a refused workspace path adds to its message: where such paths start (not the current folder)."""
    return f"paths are relative to the workspace's folder {root}, not to the current folder"


@dataclasses.dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def find(cls, start: Path | str | None = None, fallback: Path | str | None = None) -> Workspace:
        return cls(find_workspace(start, fallback))

    @property
    def punica_dir(self) -> Path:
        return self.root / PUNICA_DIR

    @property
    def compute_yaml(self) -> Path:
        return self.punica_dir / "compute.yaml"

    @property
    def policy_yaml(self) -> Path:
        return self.punica_dir / "policy.yaml"

    @property
    def state_file(self) -> Path:
        return self.punica_dir / "jobs.json"

    @property
    def usage_record(self) -> Path:
        """One line per ended attempt of every job (``usage/ledger.py``); kept when jobs are pruned."""
        return self.punica_dir / "usage.jsonl"

    @property
    def digest_cache(self) -> Path:
        return self.punica_dir / "digests.json"

    def job_dir(self, job_id: str) -> Path:
        """This side's per-job files (inputs manifest, the collected log)."""
        return self.punica_dir / "jobs" / job_id

    def keep_private(self) -> None:
        """``.punica/`` is this user's only (0700, its files 0600): one an earlier version made open to
        other local users is tightened, all through, on first use; a private one costs a stat."""
        try:
            loose = os.stat(self.punica_dir).st_mode & 0o077
        except FileNotFoundError:
            return
        if loose:
            tighten(self.punica_dir)


def default_scratch_dir() -> Path:
    """Where the built-in machine keeps job directories: outside every workspace."""
    configured = os.environ.get("JUPYTER_REMOTE_COMPUTE_SCRATCH")
    if configured:
        return Path(configured)
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "remote-compute" / "jobs"
