"""A job outlives the server: SIGKILL a real `jupyter server` mid-job, start it again, the job completes once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from server_process import Server
from waiting import wait_for


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
