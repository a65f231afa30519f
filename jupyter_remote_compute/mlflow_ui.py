"""MLflow's own UI for the workspace's runs, one click from a job: where it is, and the process behind it.

With a tracking server (``http(s)://`` tracking URI) the UI is that server's. With the workspace's
own store (sqlite or a folder) this server starts ``mlflow server`` for it on first use, on a free
loopback port, with its paths under the Jupyter route that proxies it
(``mlflow_ui_handlers.py``, behind Jupyter's authentication), and stops it with the server.

MLflow 3's server is told three things so that the proxy is the only way in: ``--host 127.0.0.1``
(nothing listens beyond loopback), ``--static-prefix`` (every page, asset and API path lives under
the proxied route, so the browser never leaves Jupyter's origin) and ``--allowed-hosts`` naming
only its own loopback address (its DNS-rebinding guard; the proxy sends that Host). Its background
job runner (huey consumers for MLflow's GenAI jobs) is switched off: a viewer needs none of it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .errors import RemoteComputeError

log = logging.getLogger(__name__)

#: The Jupyter route (under the server's base URL) that proxies the UI.
ROUTE = "remote-compute/mlflow-ui"
#: Seconds MLflow's server may take to answer its health check (imports alone take 5-20 s on 2 busy cores).
START_TIMEOUT = 120.0
#: Environment variables the MLflow process must not inherit: Jupyter's tokens and deployment secrets.
_WITHHELD_PREFIXES = ("REMOTE_COMPUTE_SECRET_", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "JUPYTER_TOKEN")


class MlflowUIUnavailable(RemoteComputeError):
    """MLflow's UI could not be started for this workspace."""

    status = 503
    code = "mlflow_ui_unavailable"


def is_tracking_server(uri: str) -> bool:
    """True for a tracking server the browser can open itself (``http://``, ``https://``)."""
    return uri.lower().startswith(("http://", "https://"))


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowUI:
    """The UI of one tracking URI: a link for a tracking server, else a process started on first use."""

    def __init__(
        self,
        tracking_uri: str,
        base_url: str,
        workspace: Path,
        log_path: Path,
        *,
        logger: logging.Logger | None = None,
        python: str = sys.executable,
    ) -> None:
        self.log = logger or log
        self.tracking_uri = tracking_uri
        self.workspace = workspace  # a relative store URI means what it means to the jobs' recorder
        self.prefix = "/" + (base_url.strip("/") + "/" + ROUTE).strip("/")
        self.log_path = log_path
        self.python = python
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = asyncio.Lock()
        self._atexit = False

    @property
    def external_url(self) -> str | None:
        """The tracking server's own address, or None when this server serves the UI."""
        return self.tracking_uri.rstrip("/") + "/" if is_tracking_server(self.tracking_uri) else None

    def describe(self) -> dict[str, object]:
        """Where the UI is, for the front end: ``url`` and whether this server proxies it."""
        external = self.external_url
        if external is not None:
            return {"url": external, "proxied": False, "running": True}
        running = self._proc is not None and self._proc.poll() is None
        return {"url": self.prefix + "/", "proxied": True, "running": running}

    def command(self, port: int) -> list[str]:
        # Through ``serve`` below: MLflow's server lives only as long as this server does.
        return [
            self.python, "-m", "jupyter_remote_compute.mlflow_ui",
            "--backend-store-uri", self.tracking_uri,
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--static-prefix", self.prefix,
            "--allowed-hosts", f"127.0.0.1:{port}",
            # Runs keep their own artifact location; a viewer uploads nothing.
            "--no-serve-artifacts",
        ]  # fmt: skip

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_WITHHELD_PREFIXES)}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # a workspace's folder store is read as it is
        return env

    async def ensure_started(self) -> int:
        """The port of a running UI, starting it first if needed; never blocks the IOLoop."""
        if self.external_url is not None:
            raise MlflowUIUnavailable(f"MLflow's UI is the tracking server's own: open {self.external_url}")
        async with self._lock:
            if self._proc is not None and self._proc.poll() is None and self.port is not None:
                return self.port
            port = _free_loopback_port()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as out:
                # Its own session: stopping it ends the uvicorn worker it starts as well.
                # Its standard input stays open here for as long as this process lives (``serve``).
                self._proc = subprocess.Popen(
                    self.command(port),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE,
                    env=self._environment(),
                    cwd=str(self.workspace),
                    start_new_session=True,
                )
            if not self._atexit:
                # A server that ends without its extensions' stop hook must not leave the UI behind.
                atexit.register(self.stop_now)
                self._atexit = True
            self.log.info(
                "remote-compute: starting MLflow's UI (pid %d) on 127.0.0.1:%d (log: %s)",
                self._proc.pid,
                port,
                self.log_path,
            )
            try:
                await self._wait_ready(port)
            except BaseException:
                await self.stop()
                raise
            self.port = port
            return port

    async def _wait_ready(self, port: int) -> None:
        client = AsyncHTTPClient()
        deadline = time.monotonic() + START_TIMEOUT
        url = f"http://127.0.0.1:{port}{self.prefix}/health"
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                raise MlflowUIUnavailable(
                    f"MLflow's UI exited while starting (code {proc.returncode if proc else '?'}); "
                    f"see {self.log_path}: {self._log_tail()}"
                )
            with contextlib.suppress(HTTPClientError, OSError):
                response = await client.fetch(HTTPRequest(url, request_timeout=5, connect_timeout=2))
                if response.code == 200:
                    return
            if time.monotonic() > deadline:
                raise MlflowUIUnavailable(
                    f"MLflow's UI did not answer within {START_TIMEOUT:.0f} s; see {self.log_path}"
                )
            await asyncio.sleep(0.25)  # polling a child's readiness, with the deadline above

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1][-300:] if lines else "no output"

    async def stop(self, timeout: float = 10.0) -> None:
        """End the UI's process group (it and its uvicorn worker); nothing is left listening."""
        proc, self._proc, self.port = self._proc, None, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # ``serve`` takes this as the end of its server and ends its group
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # waiting on the child's exit, with a deadline
        # The worker may outlive its parent: the whole group goes.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(timeout=5)

    def stop_now(self) -> None:
        """At interpreter exit, when no loop runs any more: the same, without waiting."""
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


#: Seconds MLflow's server is given to end after a TERM before its group is killed.
SERVE_GRACE = 10.0


def serve(argv: list[str]) -> int:
    """Run ``mlflow server ARGV`` in this process's group for as long as the process that started it lives.

    That process holds this one's standard input: its end means the Jupyter server is gone, however it
    ended (a SIGKILL included, where no stop hook or atexit runs), and then the whole group goes:
    MLflow's server and the uvicorn worker it starts.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # this process sends the group's TERM; it ends last
    child = subprocess.Popen([sys.executable, "-m", "mlflow", "server", *argv], stdin=subprocess.DEVNULL)

    def end_with_parent() -> None:
        sys.stdin.buffer.read()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(0, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=SERVE_GRACE)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=end_with_parent, name="end-with-parent", daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
