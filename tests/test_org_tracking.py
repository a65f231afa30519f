"""The organization's MLflow tracking server, on a real hub with a real ``mlflow server``.

rcadmin sets it from a terminal of his server (``tracking set``); rcbob's job on the organization's ssh
machine is then recorded there, not in his own store, and read back with MLflow's client against that
server; so is the parent run of his pipeline whose step runs there. A member may read it but not set it;
a URI with a user or password in it, or of another scheme, is refused naming the field, and nothing of
the refused value is kept or echoed.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd_fixture
import test_organization
from hub_fixture import ADMIN, ADMIN_USER, Hub, Server, loopback_session
from ports import free_port
from test_organization import _as_user, _service, _submitted
from waiting import wait_for

sshd_bed = sshd_fixture.sshd_bed
org = test_organization.org  # the hub the group shares (hub_fixture.shared_organization), emptied at the end
team_ssh = test_organization.team_ssh
NOT_HTTP = "uri: expected the http(s) URL of an MLflow tracking server"
PASSWORD = "tracking-pass-5d81c0a7e2"  # a tracking server's password as an admin might paste it: never kept


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """MLflow's own tracking server on loopback, its store and artifacts in a folder of the module's."""
    folder = tmp_path_factory.mktemp("tracking-server")
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
            "--artifacts-destination", str(folder / "artifacts"),
        ],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (folder / "server.log").read_text(errors="replace")[-3000:]
        try:
            return loopback_session().get(f"{uri}/health", timeout=2).status_code == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 120, f"mlflow server on {uri}", interval=0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()


def _tracking_file(state: Path) -> Path:
    return state / ".punica" / "tracking.json"


@pytest.fixture(scope="module")
def admin_set(org: tuple[Hub, Path], tracking_server: str) -> dict[str, Any]:
    """rcadmin sets the organization's tracking server from a terminal of his server."""
    hub, _ = org
    server = hub.start_server(ADMIN_USER)
    set_ = _as_user(server, "tracking", "set", tracking_server + "/", "--json")
    assert set_.returncode == 0, set_.stdout + set_.stderr
    return json.loads(set_.stdout)


def test_an_admin_sets_the_tracking_server_from_his_terminal(
    org: tuple[Hub, Path], tracking_server: str, admin_set: dict[str, Any]
) -> None:
    hub, state = org
    assert admin_set == {"uri": tracking_server, "set_by": ADMIN_USER}
    kept = _tracking_file(state)
    assert json.loads(kept.read_text()) == {"uri": tracking_server, "admin": ADMIN_USER}
    assert kept.stat().st_mode & 0o077 == 0
    shown = _as_user(hub.start_server(ADMIN_USER), "tracking", "show")
    assert shown.returncode == 0 and shown.stdout.strip() == f"{tracking_server} (set by {ADMIN_USER})", shown


# Logs a param, a tag and metrics to MLflow on the organization's machine, then writes its output.
TRAIN = """\
import sys
import mlflow
with mlflow.start_run():
    mlflow.log_param("lr", "0.01")
    mlflow.set_tag("dataset", "team-data")
    for step in range(3):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
open(sys.argv[1], "w").write("trained\\n")
"""

_READ_RUN = """
import json, sys
from mlflow import MlflowClient
client = MlflowClient(tracking_uri=sys.argv[1])
run = client.get_run(sys.argv[2])
steps = [(m.step, m.value) for m in client.get_metric_history(sys.argv[2], "loss")]
print(json.dumps({"status": run.info.status, "params": run.data.params, "tags": run.data.tags,
                  "metrics": run.data.metrics, "loss": sorted(steps)}))
"""

_RUNS_TAGGED = """
import json, sys
from mlflow import MlflowClient
client = MlflowClient(tracking_uri=sys.argv[1])
ids = [e.experiment_id for e in client.search_experiments()]
runs = client.search_runs(ids, filter_string=f"tags.`remote_compute.job_id` = '{sys.argv[2]}'")
print(json.dumps([r.info.run_id for r in runs]))
"""


def _mlflow(hub: Hub, server: Server, script: str, *argv: str) -> Any:
    """``script`` with MLflow's client (the hub's environment's) as the server's user, in their home."""
    home = pwd.getpwnam(server.user).pw_dir
    read = subprocess.run(
        [str(hub.build.python), "-c", script, *argv],
        env=server.environment, user=server.user, group=server.user, cwd=home,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    return json.loads(read.stdout)


def test_a_members_job_on_the_organizations_machine_is_recorded_on_its_tracking_server(
    org: tuple[Hub, Path], team_ssh: str, tracking_server: str, admin_set: dict[str, Any]
) -> None:
    hub, _ = org
    server = hub.start_server("rcbob")
    bob = pwd.getpwnam("rcbob")
    home = Path(bob.pw_dir)
    tag = uuid.uuid4().hex[:8]
    script, output = f"train-{tag}.py", f"model-{tag}.txt"
    (home / script).write_text(TRAIN)
    os.chown(home / script, bob.pw_uid, bob.pw_gid)
    # What the panel reads through his server: the organization's tracking server, as any member may.
    answer = loopback_session().get(
        f"{server.url}remote-compute/organization/tracking",
        headers={"Authorization": f"token {server.token}"},
        timeout=30,
    )
    assert answer.status_code == 200 and answer.json() == admin_set, answer.text
    ran = _as_user(
        server, "run", "--machine", team_ssh, "--send", script, "--bring-back", output, "--", "python", script, output,
        timeout=300,
    )  # fmt: skip
    job_id = _submitted(ran)
    shown = _as_user(server, "jobs", "show", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert job["state"] == "succeeded" and job["machine"] == f"org:{team_ssh}", job
    assert job["tracking_uri"] == tracking_server and job["mlflow_run_id"], job
    assert (home / output).read_text() == "trained\n"
    run = _mlflow(hub, server, _READ_RUN, tracking_server, job["mlflow_run_id"])
    assert run["status"] == "FINISHED" and run["params"]["lr"] == "0.01", run
    assert run["tags"]["dataset"] == "team-data" and run["tags"]["remote_compute.job_id"] == job_id, run
    assert run["tags"]["remote_compute.machine"] == f"org:{team_ssh}" and run["tags"]["mlflow.user"] == "rcbob", run
    assert run["loss"] == [[0, 1.0], [1, 0.5], [2, pytest.approx(1 / 3)]], run
    # Not in his own store: the run is the organization's server's only.
    own = home / "mlflow.db"
    if own.exists():
        assert _mlflow(hub, server, _RUNS_TAGGED, f"sqlite:///{own}", job_id) == []


def test_a_member_reads_the_tracking_server_but_may_not_set_or_clear_it(
    org: tuple[Hub, Path], admin_set: dict[str, Any]
) -> None:
    hub, state = org
    server = hub.start_server("rcalice")
    shown = _as_user(server, "tracking", "show", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout) == admin_set, shown.stderr
    before = _tracking_file(state).read_text()
    for argv in (("tracking", "set", "http://127.0.0.1:1"), ("tracking", "clear")):
        refused = _as_user(server, *argv)
        assert refused.returncode != 0, refused.stdout
        said = refused.stderr.strip()
        assert (
            said
            == f"error: rcalice may not set the organization's tracking server: ask a hub admin for the {ADMIN} scope"
        )
    assert _tracking_file(state).read_text() == before


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        (f"http://admin:{PASSWORD}@127.0.0.1:5000", "uri: no user or password in the URL"),
        (f"https://{PASSWORD}@mlflow.lab", "uri: no user or password in the URL"),
        ("file:///srv/mlruns", NOT_HTTP),
        ("sqlite:///srv/mlflow.db", NOT_HTTP),
        ("databricks", NOT_HTTP),
    ],
)
def test_a_uri_with_credentials_or_of_another_scheme_is_refused_naming_the_field(
    org: tuple[Hub, Path], admin_set: dict[str, Any], uri: str, says: str
) -> None:
    hub, state = org
    before = _tracking_file(state).read_text()
    refused = _service(hub, "PUT", "api/tracking", hub.user_token(ADMIN_USER), json={"uri": uri})
    assert refused.status_code == 400, refused.text
    error = refused.json()
    assert error["field"] == "uri" and error["message"].startswith(says), error
    ran = _as_user(hub.start_server(ADMIN_USER), "tracking", "set", uri)
    assert ran.returncode != 0 and ran.stderr.startswith(f"error: {says}"), ran.stderr
    assert PASSWORD not in refused.text + ran.stdout + ran.stderr
    assert _tracking_file(state).read_text() == before
    assert PASSWORD not in hub.log.read_text(errors="replace")  # the hub's log holds the service's


_PARENT_OF = """
import json, sys
from mlflow import MlflowClient
client = MlflowClient(tracking_uri=sys.argv[1])
ids = [e.experiment_id for e in client.search_experiments()]
runs = client.search_runs(ids, filter_string=f"tags.`remote_compute.pipeline_run_id` = '{sys.argv[2]}'")
child = client.get_run(sys.argv[3]).data.tags.get("mlflow.parentRunId") if runs else None
print(json.dumps({"parents": [r.info.run_id for r in runs], "child_parent": child}))
"""


def test_a_pipeline_on_the_organizations_machine_has_its_parent_run_on_the_tracking_server(
    org: tuple[Hub, Path], team_ssh: str, tracking_server: str, admin_set: dict[str, Any]
) -> None:
    """rcbob's pipeline whose step runs on the organization's machine: the step's run and the pipeline's
    parent run both on the organization's tracking server, the one the other's child; none in his store."""
    hub, _ = org
    server = hub.start_server("rcbob")
    bob = pwd.getpwnam("rcbob")
    word = uuid.uuid4().hex[:8]
    step = {"command": f"echo step {word}", "machine": team_ssh}
    document = {"version": 1, "edges": [], "nodes": [{"id": "train", "step": "train-on-remote-machine",
                "settings": step, "position": {"x": 0, "y": 0}}]}  # fmt: skip
    pipeline = Path(bob.pw_dir) / f"team-{word}.rcpipeline"
    pipeline.write_text(json.dumps(document))
    os.chown(pipeline, bob.pw_uid, bob.pw_gid)
    piped = _as_user(server, "pipeline", "run", pipeline.name, "--json", timeout=300)
    assert piped.returncode == 0, piped.stdout + piped.stderr
    run = json.loads(piped.stdout)
    job = json.loads(_as_user(server, "jobs", "show", run["nodes"]["train"]["job_id"], "--json").stdout)
    assert job["state"] == "succeeded" and job["tracking_uri"] == tracking_server and job["mlflow_run_id"], job

    def parent() -> dict[str, Any] | None:  # recorded after the run ends, by his recorder
        found = _mlflow(hub, server, _PARENT_OF, tracking_server, run["id"], job["mlflow_run_id"])
        return found if found["parents"] else None

    found = wait_for(parent, 120, f"pipeline run {run['id']}'s parent run on the organization's tracking server")
    assert found["child_parent"] == found["parents"][0], found
    own = Path(bob.pw_dir) / "mlflow.db"
    if own.exists():
        mine = _mlflow(hub, server, _PARENT_OF, f"sqlite:///{own}", run["id"], job["mlflow_run_id"])
        assert mine["parents"] == [], mine


def test_cleared_the_members_runs_go_to_their_own_store_again(
    org: tuple[Hub, Path], team_ssh: str, tracking_server: str, admin_set: dict[str, Any]
) -> None:
    hub, state = org
    admin = hub.start_server(ADMIN_USER)
    cleared = _as_user(admin, "tracking", "clear", "--json")
    assert cleared.returncode == 0 and json.loads(cleared.stdout) == {"uri": None, "set_by": None}, cleared.stderr
    assert not _tracking_file(state).exists()
    try:
        server = hub.start_server("rcbob")
        job_id = _submitted(_as_user(server, "run", "--machine", team_ssh, "--", "echo", "own store", timeout=300))
        job = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
        assert job["state"] == "succeeded" and "tracking_uri" not in job and job["mlflow_run_id"], job
        home = pwd.getpwnam("rcbob").pw_dir
        assert _mlflow(hub, server, _RUNS_TAGGED, f"sqlite:///{home}/mlflow.db", job_id) == [job["mlflow_run_id"]]
        assert _mlflow(hub, server, _RUNS_TAGGED, tracking_server, job_id) == []
    finally:
        assert _as_user(admin, "tracking", "set", tracking_server).returncode == 0
