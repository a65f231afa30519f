"""A live ``jupyter server`` on a throw-away workspace, fuzzed by schemathesis: shared by the test and the benchmark.

``FuzzTarget`` starts ``python -m jupyter_server`` with this extension on 127.0.0.1 and a random
token, wrapped in ``loopback_only.py`` so that no machine the fuzzer adds can be reached outside
this host, with HOME, the workspace, the scratch folder, MLflow and the keyring all in one
temporary folder. ``fuzz`` runs the schemathesis CLI against it and returns what it counted.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ports import free_port

import jupyter_remote_compute

HERE = Path(__file__).resolve().parent
SPEC = Path(jupyter_remote_compute.__file__).parent / "openapi.yaml"
QUICKSTART = HERE.parent / "examples" / "quickstart"
#: What the fuzz run asserts (issue 16): no 5xx, every response as documented, invalid input refused.
CHECKS = ("not_a_server_error", "response_schema_conformance", "status_code_conformance", "negative_data_rejection")


class FuzzTarget:
    """One server process under fuzzing; ``stop`` ends it and every job it started (its own session)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "workspace"
        shutil.copytree(QUICKSTART, self.root, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "jobs*"))
        self.home = base / "home"
        self.home.mkdir()
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = base / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "JPY_"))}
        package_root = str(Path(jupyter_remote_compute.__file__).parent.parent)
        env.update(
            # Not the user's ~/.ssh (known_hosts, config) nor their keyring: all of it in the throw-away folder.
            HOME=str(self.home),
            XDG_DATA_HOME=str(self.home / "data"),
            PYTHON_KEYRING_BACKEND="keyrings.alt.file.PlaintextKeyring",
            JUPYTER_CONFIG_DIR=str(self.base / "config"),
            JUPYTER_DATA_DIR=str(self.base / "jdata"),
            JUPYTER_RUNTIME_DIR=str(self.base / "runtime"),
            JUPYTER_REMOTE_COMPUTE_SCRATCH=str(self.base / "scratch"),
            # loopback_only.py guards this process's sockets, not a child ssh client's: made-up machines use paramiko.
            JUPYTER_REMOTE_COMPUTE_SSH_TRANSPORT="paramiko",
            PYTHONPATH=os.pathsep.join([package_root, env.get("PYTHONPATH", "")]),
        )
        return env

    def start(self, timeout: float = 60.0) -> None:
        args = [
            sys.executable, str(HERE / "loopback_only.py"), "-m", "jupyter_server",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", "--ServerApp.allow_root=True", "--ServerApp.open_browser=False",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.jpserver_extensions=jupyter_remote_compute=True",
            f"--RemoteComputeApp.scratch_dir={self.base / 'scratch'}",
            f"--RemoteComputeApp.mlflow_tracking_uri=sqlite:///{self.base / 'mlflow.db'}",
            "--RemoteComputeApp.mlflow_experiment=fuzz",
            "--RemoteComputeApp.secrets_store=file",
            f"--RemoteComputeApp.secrets_file={self.base / 'secrets.json'}",
            "--RemoteComputeApp.poll_interval=0.5",
        ]  # fmt: skip
        (self.base / "scratch").mkdir(exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=self.env(), start_new_session=True
            )
        from waiting import wait_for

        wait_for(self._ready, timeout=timeout, interval=0.2, message="the fuzzed jupyter server to answer")

    def _ready(self) -> bool:
        assert self.proc and self.proc.poll() is None, self.log.read_text()[-3000:]
        request = urllib.request.Request(
            f"{self.url}/remote-compute/machines", headers={"Authorization": f"token {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@dataclass(frozen=True)
class FuzzResult:
    returncode: int
    cases: int  # test cases schemathesis generated and sent
    failures: int  # unique failures it reported
    output: str


def fuzz(target: FuzzTarget, *, seed: int, max_examples: int, report_dir: Path, timeout: float = 900) -> FuzzResult:
    """Run schemathesis (every phase, every operation, ``max_examples`` per operation) against ``target``.

    A run past ``timeout`` seconds is stopped and counts as failed (returncode -1, no cases counted).
    """
    return run_schemathesis(
        SPEC, target.url, target.token, "schemathesis_hooks",
        seed=seed, max_examples=max_examples, report_dir=report_dir, timeout=timeout,
    )  # fmt: skip


def run_schemathesis(
    spec: Path,
    url: str,
    token: str,
    hooks: str,
    *,
    seed: int,
    max_examples: int,
    report_dir: Path,
    timeout: float = 900,
    checks: tuple[str, ...] = CHECKS,
    options: Sequence[str] = (),
) -> FuzzResult:
    """The schemathesis CLI on ``spec`` against ``url`` with ``Authorization: token TOKEN``, its hooks
    the module ``hooks`` of this folder, and any other ``options`` of its; a run past ``timeout``
    seconds is failed (returncode -1)."""
    args = [
        sys.executable, "-m", "schemathesis.cli", "run", str(spec),
        "--url", url,
        "-H", f"Authorization: token {token}",
        "--checks", ",".join(checks),
        "--seed", str(seed),
        "--max-examples", str(max_examples),
        "--workers", "1",
        "--request-timeout", "30",
        "--generation-database", "none",
        "--suppress-health-check", "all",
        "--report", "ndjson",
        "--report-dir", str(report_dir),
        "--no-color",
        *options,
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": hooks}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, cwd=report_dir)
    except subprocess.TimeoutExpired as e:
        partial = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return FuzzResult(-1, 0, 0, partial + f"\nstopped: schemathesis ran past {timeout:.0f} s")
    output = proc.stdout + proc.stderr
    return FuzzResult(proc.returncode, _count(output, "generated"), _count(output, "unique failures?"), output)


def _count(output: str, what: str) -> int:
    """A number of the summary (``Test cases: 1234 generated, 1234 passed`` / ``... 2 unique failures``)."""
    found = re.findall(rf"(\d+) {what}", output)
    return int(found[-1]) if found else 0


def dump(result: FuzzResult) -> str:
    return json.dumps({"cases": result.cases, "failures": result.failures, "returncode": result.returncode})
