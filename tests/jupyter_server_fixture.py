"""A second, real Jupyter Server on loopback: the far side of the jupyter engine's tests and benchmark.

``RemoteServer`` starts ``python -m jupyter_server`` on 127.0.0.1 with a random token and its own
root_dir, config, data, runtime and IPython directories (all under one temporary folder), with
this project's server extension (and JupyterLab's) switched off so it is a plain remote server.
It can be restarted on the same port with the same token and root_dir, as a real server would
be. The plain class is shared with ``benchmarks/bench_jupyter_transfer.py``; the pytest fixtures
are at the bottom.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

# Server extensions installed in this venv that a plain remote server does without.
_DISABLED_EXTENSIONS = ("jupyter_remote_compute", "jupyterlab", "jupyter_lsp", "notebook_shim", "notebook")


class RemoteServer:
    """One Jupyter Server process on 127.0.0.1; ``restart`` keeps port, token and root_dir."""

    def __init__(self, base: Path, *, token: str | None = None, allow_hidden: bool = False) -> None:
        self.base = base
        self.root_dir = base / "root"
        self.ipython_dir = base / "ipython"
        self.log_path = base / "server.log"
        self.token = token or secrets.token_hex(24)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.allow_hidden = allow_hidden
        self.proc: subprocess.Popen[bytes] | None = None
        for sub in ("root", "config", "data", "runtime", "ipython"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        config = {"ServerApp": {"jpserver_extensions": dict.fromkeys(_DISABLED_EXTENSIONS, False)}}
        (base / "config" / "jupyter_server_config.json").write_text(json.dumps(config))

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "JPY_"))}
        bindir = os.path.dirname(sys.executable)
        env.update(
            JUPYTER_CONFIG_DIR=str(self.base / "config"),
            JUPYTER_DATA_DIR=str(self.base / "data"),
            JUPYTER_RUNTIME_DIR=str(self.base / "runtime"),
            IPYTHONDIR=str(self.ipython_dir),
            # `python` in a job is this venv's interpreter (it has mlflow), as on a real server's host.
            PATH=bindir + os.pathsep + env.get("PATH", ""),
        )
        return env

    def start(self, timeout: float = 60.0) -> None:
        argv = [
            sys.executable,
            "-m",
            "jupyter_server",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.open_browser=False",
        ]
        if self.allow_hidden:
            argv.append("--ContentsManager.allow_hidden=True")
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                argv, cwd=self.root_dir, env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"jupyter server not ready after {timeout:.0f}s; see {self.log_path}")
            time.sleep(0.1)

    def ready(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", "/api/status", headers={"Authorization": f"token {self.token}"})
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Only the server's own process group: jobs it launched run in sessions of their own.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> RemoteServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def store_token(name: str, token: str) -> None:
    """Put the server's token in the Secret Manager (the test keyring) under ``name``."""
    from jupyter_remote_compute.secrets import SecretStore

    SecretStore().set(name, token)


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    """A plain remote Jupyter Server shared by a test module; its token is in the keyring as ``compute/remote``."""
    with RemoteServer(tmp_path_factory.mktemp("remote-jupyter")) as server:
        store_token("compute/remote", server.token)
        yield server


@pytest.fixture
def own_remote_server(tmp_path: Path) -> Iterator[RemoteServer]:
    """A remote server for one test only (one it may restart); token stored as ``compute/own``."""
    with RemoteServer(tmp_path / "own-remote") as server:
        store_token("compute/own", server.token)
        yield server
