"""A real server and real pull agents, each its own process on loopback, the agents as another user.

The agent is the ``agent.pyz`` the server serves, run by Debian's ``python3`` as the ssh test
user (``sshd_fixture.ensure_user``) when we are root, with the far-side virtualenv (MLflow) first
on its PATH, and its token on stdin. Nothing of this side's Python environment reaches it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from far_python import far_python_bin
from server_process import Server
from sshd_fixture import ensure_user
from waiting import wait_for

AGENT_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


class AgentProcess:
    """One agent process: ``kill`` (SIGKILL) and ``start`` again on the same state folder."""

    def __init__(self, bed: AgentBed, machine: str, token: str, state: Path, extra: tuple[str, ...]) -> None:
        self.bed, self.machine, self.token, self.state, self.extra = bed, machine, token, state, extra
        self.log = bed.shared / f"agent-{machine}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_from = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> AgentProcess:
        args = [
            AGENT_PYTHON, str(self.bed.pyz(self.token)),
            "--server", self.bed.url, "--machine", self.machine, "--token-stdin", "--state-dir", str(self.state),
            *self.extra,
        ]  # fmt: skip
        env = {"PATH": f"{self.bed.far_bin}:/usr/bin:/bin", "HOME": str(self.bed.home), "LANG": "C.UTF-8"}
        # The log is appended to across restarts: only what this process writes says it connected.
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/", **self.bed.as_user
            )
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.token.encode() + b"\n")
        self.proc.stdin.close()
        return self

    def connected(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
        with open(self.log, "rb") as log:
            log.seek(self._log_from)
            return b"connected to" in log.read()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)


class AgentBed:
    """The server on a workspace, and agents for its agent machines."""

    def __init__(self, server: Server, shared: Path) -> None:
        self.server = server
        self.shared = shared
        self.user, _ = ensure_user()
        entry = pwd.getpwnam(self.user)
        self.as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []} if os.geteuid() == 0 else {}
        self.uid = entry.pw_uid if os.geteuid() == 0 else os.geteuid()
        self.home = shared / "home"
        self.home.mkdir(exist_ok=True)
        os.chown(self.home, self.uid, -1)
        self.agents: list[AgentProcess] = []
        # Looked up once: checking it imports MLflow, which would slow every agent (re)start on a busy machine.
        self.far_bin = far_python_bin()
        self._pyz: Path | None = None
        self.tokens: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def add_machine(self, name: str) -> str:
        """Add an agent machine through the REST API; its token, as the answer shows it once."""
        answer = self.server.request("POST", "machines", {"name": name, "kind": "agent", "address": f"{name}.lab"})
        self.tokens[name] = answer["agent_token"]
        return answer["agent_token"]

    def pyz(self, token: str) -> Path:
        """agent.pyz as the far machine gets it: downloaded from the server with its agent's token (not
        the bed's first machine's, which a test of the module may have rotated or revoked since)."""
        if self._pyz is None:
            req = urllib.request.Request(
                f"{self.url}/remote-compute/agent/agent.pyz", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(req, timeout=60) as response:
                data = response.read()
            self._pyz = self.shared / "agent.pyz"
            self._pyz.write_bytes(data)
            os.chmod(self._pyz, 0o644)
        return self._pyz

    def start_agent(self, machine: str, *extra: str, state: Path | None = None) -> AgentProcess:
        if state is None:
            state = self.shared / f"state-{machine}"
        state.mkdir(exist_ok=True)
        os.chown(state, self.uid, -1)
        agent = AgentProcess(self, machine, self.tokens[machine], state, extra).start()
        self.agents.append(agent)
        wait_for(agent.connected, timeout=60, message=f"the agent of {machine} to connect")
        return agent

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()


@contextlib.contextmanager
def running_bed(workspace: Path, scratch: Path, tracking_uri: str, log: Path, lease: float = 30) -> Iterator[AgentBed]:
    """A server on ``workspace`` that lets in only authenticated requests (agents bring their own token).

    The agents' lease outlasts a stall of a busy test machine (heartbeats come every second).
    """
    server = Server(
        workspace,
        scratch,
        tracking_uri,
        log,
        extra_args=(f"--RemoteComputeApp.agent_lease={lease}", "--ServerApp.allow_unauthenticated_access=False"),
    )
    server.start()
    # The agents' user reaches its files here (the test's own tmp_path is private to root).
    shared = Path(tempfile.mkdtemp(prefix="jrc-agent-"))
    os.chmod(shared, 0o755)
    bed = AgentBed(server, shared)
    try:
        yield bed
    finally:
        bed.stop()
        server.stop()
        # Shown by pytest only when the test failed.
        for agent_log in sorted(shared.glob("agent-*.log")):
            print(f"--- {agent_log.name}\n{agent_log.read_text(errors='replace')[-4000:]}")
        print(f"--- server.log\n{server.log.read_text(errors='replace')[-6000:]}")
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def agent_bed(quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path) -> Iterator[AgentBed]:
    """A server on the quickstart workspace, with no agent machine yet."""
    with running_bed(quickstart, scratch_dir, tracking_uri, tmp_path / "server.log") as bed:
        yield bed


@pytest.fixture(scope="module")
def module_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentBed]:
    """One server for a whole test module (starting one is the slow part), on a copy of the quickstart."""
    from conftest import QUICKSTART

    base = tmp_path_factory.mktemp("agents")
    workspace = base / "quickstart"
    shutil.copytree(QUICKSTART, workspace, ignore=shutil.ignore_patterns("mlflow.db", "model.pkl", "metrics.json"))
    (base / "scratch").mkdir()
    tracking = f"sqlite:///{base / 'mlflow.db'}"
    # The store exists before the first job ends, so no test waits on MLflow creating its tables.
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking).search_experiments()
    # A lease long enough for an agent to start again on a busy test machine, short enough to wait out.
    with running_bed(workspace, base / "scratch", tracking, base / "server.log", lease=30) as bed:
        yield bed
