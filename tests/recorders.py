"""A recorder of a test's own: for tests that hold, kill or idle out the MLflow recorder.

The recorder is one per user (``recording/recorder.py``), so every other test of a worker shares it. Faces
started with ``OwnRecorder.env`` keep its files under a temporary folder of their own and reach (and
start) only their own recorder; removing that folder ends the recorder within a second.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class OwnRecorder:
    def __init__(self) -> None:
        self.temporary = Path(tempfile.mkdtemp(prefix="jrc-rec-"))  # short: the socket's path is under it

    @property
    def env(self) -> dict[str, str]:
        return {"TMPDIR": str(self.temporary)}

    def file(self, suffix: str) -> Path:
        """The recorder's ``sock``, ``lock`` or ``log``, as a face with ``env`` finds it."""
        from jupyter_remote_compute.recording import (
            recorder as record,  # not at conftest's import: the keyring is chosen first
        )

        return self.temporary / f"jupyter-remote-compute-{os.getuid()}" / record.recorder_file(suffix).name

    def pid(self) -> int:
        """The recorder's pid, which it writes into its lock while it serves."""
        return int(self.file("lock").read_text().split()[0])

    def close(self) -> None:
        shutil.rmtree(self.temporary, ignore_errors=True)
