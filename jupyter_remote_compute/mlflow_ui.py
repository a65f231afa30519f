"""MLflow's own UI for the workspace's runs, one click from a job: where it is, and the process behind it.

With a tracking server (``http(s)://`` tracking URI) the UI is that server's. With the workspace's
own store (sqlite or a folder) this server starts ``mlflow server`` for it: in the background, at a low
priority, when the server starts and the store exists (``prestart``), so "Open in MLflow" answers at
once; else on first use. Its paths live under the Jupyter route that proxies it
(``mlflow_ui_handlers.py``, behind Jupyter's authentication), and it stops with the server.

MLflow 3's server is told three things so that the proxy is the only way in: uvicorn's ``--uds`` (it
listens on a Unix socket in this user's 0700 socket folder, ``fsutil.socket_folder``: no port that
another local user could connect to), ``--static-prefix`` (every page, asset and API path lives under
the proxied route, so the browser never leaves Jupyter's origin) and ``--allowed-hosts`` naming only
the Host the proxy sends (its DNS-rebinding guard). Its background job runner (huey consumers for
MLflow's GenAI jobs) is switched off: a viewer needs none of it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.netutil import Resolver
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from .errors import RemoteComputeError
from .fsutil import private_open, socket_folder
from .recording.local_store import keep_store_private

log = logging.getLogger(__name__)

#: The Jupyter route (under the server's base URL) that proxies the UI.
ROUTE = "remote-compute/mlflow-ui"
#: Seconds MLflow's server may take to answer its health check (imports alone take 5-20 s on 2 busy cores).
START_TIMEOUT = 120.0
#: The Host the proxy sends, and the only one MLflow's DNS-rebinding guard lets in.
HOST = "localhost"
#: The niceness of a UI started in the background: the server's and the kernels' work comes first.
PRESTART_NICE = 10
#: Environment variables the MLflow process must not inherit: Jupyter's tokens and deployment secrets.
_WITHHELD_PREFIXES = ("REMOTE_COMPUTE_SECRET_", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "JUPYTER_TOKEN")


class MlflowUIUnavailable(RemoteComputeError):
    """MLflow's UI could not be started for this workspace."""

    status = 503
    code = "mlflow_ui_unavailable"


def is_tracking_server(uri: str) -> bool:
    """True for a tracking server the browser can open itself (``http://``, ``https://``)."""
    return uri.lower().startswith(("http://", "https://"))


def store_exists(uri: str) -> bool:
    """Whether a local tracking URI names a store that is there (a sqlite file, a folder store)."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).is_file()
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://")).is_dir()
    return "://" not in uri and Path(uri).is_dir()


_numbers = itertools.count(1)  # of the UIs this process starts: each its own socket


class _SocketResolver(Resolver):
    """Every host name resolves to the UI's Unix socket: how tornado's HTTP client reaches it."""

    def initialize(self, path: str) -> None:  # type: ignore[override]
        self.path = path

    async def resolve(self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC) -> list[Any]:
        return [(socket.AF_UNIX, self.path)]


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
        self.socket: Path | None = None
        self._client: SimpleAsyncHTTPClient | None = None
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

    def command(self, socket_path: Path, *, nice: int = 0) -> list[str]:
        # Through ``serve`` below: MLflow's server lives only as long as this server does.
        niced = ["nice", "-n", str(nice)] if nice and shutil.which("nice") else []
        return [
            *niced, self.python, "-m", "jupyter_remote_compute.mlflow_ui",
            "--backend-store-uri", self.tracking_uri,
            # uvicorn takes the socket over MLflow's host and port, which it then never opens.
            "--uvicorn-opts", f"--uds {socket_path}", "--workers", "1",
            "--static-prefix", self.prefix,
            "--allowed-hosts", HOST,
            # Runs keep their own artifact location; a viewer uploads nothing.
            "--no-serve-artifacts",
        ]  # fmt: skip

    def url(self, path: str) -> str:
        """The UI's address of a path under the server's (the client given by ``ensure_started`` reaches it)."""
        return f"http://{HOST}{path}"

    @property
    def has_store(self) -> bool:
        return self.external_url is None and store_exists(self.tracking_uri)

    async def prestart(self) -> None:
        """Start the UI in the background at a low priority, when the workspace has a store to show (a
        click then finds it answering); one that cannot start is said in the log, and a click tries again."""
        if not self.has_store:
            return
        try:
            await self.ensure_started(nice=PRESTART_NICE)
        except MlflowUIUnavailable as e:
            self.log.warning("remote-compute: MLflow's UI could not be started ahead of use: %s", e.message)

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_WITHHELD_PREFIXES)}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # a workspace's folder store is read as it is
        return env

    async def ensure_started(self, *, nice: int = 0) -> SimpleAsyncHTTPClient:
        """A client of the running UI (its socket), starting it first if needed; never blocks the IOLoop."""
        if self.external_url is not None:
            raise MlflowUIUnavailable(f"MLflow's UI is the tracking server's own: open {self.external_url}")
        async with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._client is not None:
                return self._client
            try:
                path = socket_folder() / f"mlflow-ui-{os.getpid()}-{next(_numbers)}.sock"
            except PermissionError as e:
                raise MlflowUIUnavailable(str(e)) from None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # left by a server of this pid that was killed
            began = time.monotonic()
            with private_open(self.log_path) as out:
                # Its own session: stopping it ends the uvicorn worker it starts as well.
                # Its standard input stays open here for as long as this process lives (``serve``).
                self._proc = subprocess.Popen(
                    self.command(path, nice=nice),
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
                "remote-compute: starting MLflow's UI (pid %d) on %s (log: %s)", self._proc.pid, path, self.log_path
            )
            self.socket = path
            self._client = SimpleAsyncHTTPClient(force_instance=True, resolver=_SocketResolver(path=str(path)))
            try:
                await self._wait_ready(self._client)
            except BaseException:
                await self.stop()
                raise
            keep_store_private(self.workspace, self.tracking_uri)  # MLflow may just have made it
            self.log.info("remote-compute: MLflow's UI is ready (%.1f s)", time.monotonic() - began)
            return self._client

    async def _wait_ready(self, client: AsyncHTTPClient) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        url = self.url(f"{self.prefix}/health")
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
        proc, self._proc = self._proc, None
        client, self._client = self._client, None
        if client is not None:
            client.close()
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
        if self.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)

    def stop_now(self) -> None:
        """At interpreter exit, when no loop runs any more: the same, without waiting."""
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)


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
