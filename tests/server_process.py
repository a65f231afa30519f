"""A real `jupyter server` process with this extension on a workspace: start, SIGKILL, start again.

Shared by the restart and fault tests. The server listens on 127.0.0.1 with a random token; its
output goes to a log file the tests read (the "reconciled" line says a start has caught up).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ports import free_port
from waiting import wait_for


class ApiError(Exception):
    """An error answer of the REST API: its status and its JSON body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body}")
        self.status, self.body = status, body


class Server:
    """One `jupyter server` on ``root``; ``start`` again after ``kill`` keeps port and token."""

    def __init__(
        self,
        root: Path,
        scratch: Path,
        tracking_uri: str,
        log: Path,
        *,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        python: str = sys.executable,
    ) -> None:
        self.root, self.scratch, self.tracking_uri, self.log = root, scratch, tracking_uri, log
        self.env, self.extra_args, self.python = env, extra_args, python
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        args = [
            self.python, "-m", "jupyter_server",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", "--ServerApp.allow_root=True", "--ServerApp.open_browser=False",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.jpserver_extensions=jupyter_remote_compute=True",
            f"--RemoteComputeApp.scratch_dir={self.scratch}",
            f"--RemoteComputeApp.mlflow_tracking_uri={self.tracking_uri}",
            "--RemoteComputeApp.mlflow_experiment=tests",
            "--RemoteComputeApp.poll_interval=0.2",
            # MLflow's UI only where a test asks for it: each one costs seconds of CPU.
            "--RemoteComputeApp.mlflow_ui_prestart=False",
            *self.extra_args,
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=self.env)
        self.starts += 1
        wait_for(self._ready, timeout=180, interval=0.1, message="jupyter server to answer")

    def _ready(self) -> bool:
        assert self.proc and self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            self.request("GET", "machines")
            return True
        except (urllib.error.URLError, ConnectionError):
            return False

    def reconciled(self) -> bool:
        """Whether this start's first pass over the jobs has ended (the server says so once per start)."""
        return self.log.read_text(errors="replace").count("reconciled") >= self.starts

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        """A call of this product's API: ``path`` is relative to ``/remote-compute/``."""
        return self.request_at(method, f"/remote-compute/{path}", body)

    def request_at(self, method: str, path: str, body: dict | None = None) -> Any:
        """A call of any route of the server (another extension's, too): ``path`` from the server's root."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"token {self.token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, json.loads(e.read() or b"{}")) from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
            # A job's change heard by a worker thread while the loop closes is dropped, not a traceback.
            said = self.log.read_text(errors="replace") if self.log.exists() else ""
            assert "job listener failed" not in said, said[said.index("job listener failed") :][:2000]


def open_files(pid: int) -> set[str]:
    """The paths a process has open now (from /proc), empty once it is gone."""
    found = set()
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in entries:
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found
