"""A job outlives the server: SIGKILL a real `jupyter server` mid-job, start it again, the job completes once."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from waiting import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, root: Path, scratch: Path, tracking_uri: str, log: Path) -> None:
        self.root, self.scratch, self.tracking_uri, self.log = root, scratch, tracking_uri, log
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [
            sys.executable, "-m", "jupyter_server",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", "--ServerApp.allow_root=True", "--ServerApp.open_browser=False",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.jpserver_extensions=jupyter_remote_compute=True",
            f"--RemoteComputeApp.scratch_dir={self.scratch}",
            f"--RemoteComputeApp.mlflow_tracking_uri={self.tracking_uri}",
            "--RemoteComputeApp.mlflow_experiment=tests",
            "--RemoteComputeApp.poll_interval=0.2",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        wait_for(self._ready, timeout=60, interval=0.2, message="jupyter server to answer")

    def _ready(self) -> bool:
        assert self.proc and self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            self.request("GET", "machines")
            return True
        except (urllib.error.URLError, ConnectionError):
            return False

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/remote-compute/{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=30) as response:
            return json.loads(response.read() or b"null")

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


@pytest.fixture
def server(quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(quickstart, scratch_dir, tracking_uri, tmp_path / "server.log")
    yield srv
    srv.stop()


def test_job_survives_a_killed_server_and_is_collected_once(server: Server, quickstart: Path, tracking_uri: str):
    (quickstart / "slow_train.sh").write_text("echo waiting; while [ ! -f go ]; do sleep 0.05; done; python train.py\n")
    server.start()
    job = server.request(
        "POST",
        "jobs",
        {
            "command": "sh slow_train.sh",
            "send": ["slow_train.sh", "train.py", "data/points.csv"],
            "bring_back": ["model.pkl", "metrics.json"],
        },
    )["job"]
    wait_for(lambda: server.request("GET", f"jobs/{job['id']}")["state"] == "running", message="the job to run")
    pid = server.request("GET", f"jobs/{job['id']}")["handle"]["pid"]

    server.kill()
    os.kill(pid, 0)  # the job's process group outlived the server
    # Let the job finish while nobody watches it.
    workdir = Path(server.scratch) / job["id"] / "work"
    (workdir / "go").write_text("")
    wait_for(lambda: (Path(server.scratch) / job["id"] / "exit_code").exists(), timeout=60, message="the job to end")
    assert not (quickstart / "model.pkl").exists()

    server.start()  # reconciles: finds the exit code, collects, records
    done = wait_for(
        lambda: (j := server.request("GET", f"jobs/{job['id']}"))["state"] in ("succeeded", "failed", "lost") and j,
        timeout=90,
        message="the restarted server to collect the job",
    )
    assert done["state"] == "succeeded", done["reason"]
    assert (quickstart / "model.pkl").is_file()
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`remote_compute.job_id` = '{job['id']}'")
    assert len(runs) == 1
    assert runs[0].data.params["rows"] == "40"
    # A second restart finds nothing left to do and records nothing twice: count once it has caught up.
    server.stop()
    server.start()
    wait_for(
        lambda: server.log.read_text().count("reconciled") == 3, timeout=60, message="the third start to reconcile"
    )
    assert server.request("GET", f"jobs/{job['id']}")["mlflow_run_id"] == runs[0].info.run_id
    assert len(client.search_runs([experiment.experiment_id])) == 1
