"""`jupyter remote-compute` as a user types it, in real subprocesses on a real workspace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_runs
from mlflow.tracking import MlflowClient
from waiting import wait_for


@pytest.fixture
def cli(quickstart: Path, scratch_dir: Path, tracking_uri: str):  # type: ignore[no-untyped-def]
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir)}

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "jupyter_remote_compute.cli", *args],
            cwd=quickstart,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    run.env = env  # type: ignore[attr-defined]
    return run


def test_machines_list_shows_this_machine(cli) -> None:
    machines = json.loads(cli("machines", "list", "--json").stdout)
    assert machines[0]["name"] == "local" and machines[0]["builtin"]


def test_run_streams_the_log_and_brings_outputs_back(cli, quickstart: Path, tracking_uri: str) -> None:
    proc = cli(
        "run", "--machine", "local", "--send", "train.py", "--send", "data/*.csv",
        "--bring-back", "model.pkl", "--bring-back", "metrics.json", "--name", "from-cli",
        "--", "python", "train.py",
    )  # fmt: skip
    assert "trained on 40 rows" in proc.stdout
    # Done means recorded: the run is in the store (new with this job) when `run` returns, its id said.
    assert "succeeded" in proc.stderr and "MLflow run " in proc.stderr
    run_id = proc.stderr.split("MLflow run ", 1)[1].split()[0].rstrip(";")
    assert MlflowClient(tracking_uri).get_run(run_id).data.tags["mlflow.runName"] == "from-cli"
    assert (quickstart / "model.pkl").is_file()
    jobs = json.loads(cli("jobs", "list", "--json").stdout)
    assert [j["name"] for j in jobs] == ["from-cli"] and jobs[0]["state"] == "succeeded"
    shown = json.loads(cli("jobs", "show", jobs[0]["id"], "--json").stdout)
    assert set(shown["outputs"]) == {"model.pkl", "metrics.json"}
    assert "trained on 40 rows" in cli("jobs", "log", jobs[0]["id"]).stdout
    assert shown["mlflow_run_id"] == run_id


def test_a_failing_job_exits_non_zero_with_its_reason(cli) -> None:
    proc = cli("run", "--", "sh", "-c", "echo boom >&2; exit 4", check=False)
    assert proc.returncode == 1
    assert "exit code 4" in proc.stderr and "boom" in proc.stderr


def test_the_command_runs_in_the_machines_shell_and_says_so(cli) -> None:
    """One quoted argument is the shell's line as written; several words are quoted one by one, and the
    job shows its command as the shell ran it."""
    assert "one line for the machine's shell" in " ".join(cli("run", "--help").stdout.split())
    line = cli("run", "--", "echo one && echo two | tr a-z A-Z")
    assert line.stdout.split() == ["one", "TWO"], line.stdout
    words = cli("run", "--", "python", "-c", "print('a  b;')")
    assert "a  b;" in words.stdout
    jobs = json.loads(cli("jobs", "list", "--json").stdout)
    shown = {j["id"]: json.loads(cli("jobs", "show", j["id"], "--json").stdout)["spec"]["command"] for j in jobs}
    assert sorted(map(str, shown.values())) == sorted(
        ["echo one && echo two | tr a-z A-Z", str(["python", "-c", "print('a  b;')"])]
    )


def test_bad_input_is_a_clear_error(cli) -> None:
    proc = cli("run", "--send", "../elsewhere", "--", "true", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: send[0]:") and "Traceback" not in proc.stderr


def test_a_path_refused_from_a_folder_inside_the_workspace_names_the_workspace_s_folder(cli, quickstart) -> None:
    def run_in_data(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "jupyter_remote_compute.cli", "run", *args, "--", "true"],
            cwd=quickstart / "data", env=cli.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 1
        return proc.stderr

    note = f"paths are relative to the workspace's folder {quickstart.resolve()}, not to the current folder\n"
    assert (
        run_in_data("--send", "points.csv") == f"error: send[0]: 'points.csv' matches no file in the workspace; {note}"
    )
    assert run_in_data("--send", "../train.py") == (
        f"error: send[0]: '../train.py' leads out of the workspace ('..' is not allowed); {note}"
    )
    assert run_in_data("--bring-back", "/tmp/model.pkl") == (
        f"error: bring_back[0]: '/tmp/model.pkl' must be relative to the workspace, not absolute; {note}"
    )
    assert run_in_data("--requirements", "requirements.txt") == (
        f"error: environment.requirements: requirements.txt is not a file in the workspace; {note}"
    )
    assert json.loads(cli("jobs", "list", "--json").stdout) == []


def test_a_hand_written_address_with_a_control_character_is_refused_with_its_line(cli, quickstart) -> None:
    compute = quickstart / ".punica/compute.yaml"
    compute.write_text('machines:\n  box:\n    kind: agent\n    address: "lab\\e[31mgpu"\n')
    proc = cli("machines", "list", "--json", check=False)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"error: {compute}, line 4: machine 'box': address must not hold control characters or lone surrogates "
        "(it holds '\\x1b')\n"
    )


def test_secrets_are_read_from_stdin_and_listed_by_name(cli) -> None:
    cli("secrets", "set", "cli/token", stdin="tok-" + "x" * 20 + "\n")
    listed = cli("secrets", "list").stdout
    assert "cli/token" in listed and "tok-" not in listed
    cli("secrets", "delete", "cli/token")
    assert "cli/token" not in cli("secrets", "list").stdout


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    "started",
    [
        None,
        # A script's `jupyter remote-compute run … &` (or a runner that starts it so): the shell hands it
        # SIGINT ignored, and Python keeps an ignored SIGINT ignored unless told otherwise.
        _ignore_sigint,
    ],
    ids=["from-a-terminal", "with-sigint-ignored"],
)
def test_ctrl_c_detaches_and_the_job_keeps_running(cli, quickstart: Path, started) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_remote_compute.cli", "run", "--", "sh", "-c", "echo up; sleep 120"],
        cwd=quickstart,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=started,
    )
    try:
        jobs = wait_for(
            lambda: [j for j in json.loads(cli("jobs", "list", "--json").stdout) if j["state"] == "running"],
            timeout=60,
            message="the job to run",
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3
    assert "keeps running" in err and f"jobs cancel {jobs[0]['id']}" in err
    assert json.loads(cli("jobs", "show", jobs[0]["id"], "--json").stdout)["state"] == "running"
    # Running the same command again attaches instead of starting a second job.
    attach = cli("run", "--detach", "--", "sh", "-c", "echo up; sleep 120")
    assert f"attached to running job {jobs[0]['id']}" in attach.stderr
    cancelled = cli("jobs", "cancel", jobs[0]["id"])
    assert "cancelled" in cancelled.stdout


def test_check_says_what_builds_environments_there_and_prints_nothing_it_does_not_know(cli) -> None:
    """The built-in machine builds with its own uv where one is on PATH, else runs the product's in place."""
    from importlib.metadata import version

    facts = json.loads(cli("machines", "check", "local", "--json").stdout)
    product = f"uv {version('uv')}, jupyter-remote-compute's, run in place"
    said = f"uv {facts['uv']}, the machine's" if facts["uv"] else product
    assert facts["environments"] == said
    text = cli("machines", "check", "local").stdout
    assert f"environments: {said}\n" in text and "None" not in text


def test_every_command_that_takes_json_prints_json(cli, quickstart: Path) -> None:
    def as_json(*args: str) -> object:
        proc = cli(*args, "--json")
        return json.loads(proc.stdout)

    assert as_json("machines", "show", "local")["name"] == "local"
    assert as_json("machines", "check", "local")["cpus"] >= 1
    added = as_json("machines", "add", "other", "--kind", "ssh", "--address", "example.invalid", "--disabled")
    assert added["name"] == "other" and added["enabled"] is False
    assert as_json("machines", "enable", "other")["enabled"] is True
    assert as_json("machines", "disable", "other")["enabled"] is False
    assert as_json("machines", "edit", "other", "--address", "example2.invalid")["address"] == "example2.invalid"
    assert as_json("machines", "remove", "other") == {"name": "other", "removed": True}
    assert "other" not in [m["name"] for m in as_json("machines", "list")]

    cli("run", "--detach", "--", "sleep", "60")
    job_id = as_json("jobs", "list")[0]["id"]
    assert as_json("jobs", "show", job_id)["id"] == job_id
    cancelled = as_json("jobs", "cancel", job_id)
    assert cancelled["id"] == job_id and cancelled["cancel_requested"]
    wait_for(lambda: as_json("jobs", "show", job_id)["state"] == "cancelled", timeout=60, message="the cancel")
    assert as_json("jobs", "delete", job_id) == {"id": job_id, "deleted": True}
    assert as_json("jobs", "list") == []
    listed = as_json("secrets", "list")
    assert isinstance(listed["secrets"], list) and "store" in listed
    # A log is text: the flag is not offered rather than silently ignored.
    assert cli("jobs", "log", job_id, "--json", check=False).returncode == 2


def test_run_refuses_resources_this_machine_cannot_give(cli) -> None:
    proc = cli("run", "--gpus", "1000", "--", "true", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: resources.gpus: 1000 asked") and "Traceback" not in proc.stderr
    assert json.loads(cli("jobs", "list", "--json").stdout) == []


def test_a_pool_is_made_listed_and_named_by_run_from_the_command_line(cli) -> None:
    made = json.loads(cli("machines", "pool", "here", "--machine", "local", "--json").stdout)
    assert made == {"name": "here", "machines": ["local"], "placement": "first"}
    assert json.loads(cli("machines", "pools", "--json").stdout) == [made]
    assert "pooled" in cli("run", "--machine", "here", "--", "echo pooled").stdout
    job = json.loads(cli("jobs", "list", "--json").stdout)[0]
    job = json.loads(cli("jobs", "show", job["id"], "--json").stdout)
    assert (job["state"], job["machine"], job["pool"]) == ("succeeded", "local", "here")
    assert job["placement"] == "placed on local: first with room"
    bad = cli("machines", "pool", "empty", check=False)
    assert bad.returncode != 0 and "machines: a pool needs at least one machine" in bad.stderr
    cli("machines", "pool", "here", "--remove")
    assert json.loads(cli("machines", "pools", "--json").stdout) == []


def test_on_a_hub_a_job_is_the_hubs_users_and_cancelled_by_them(cli, tracking_uri: str) -> None:
    """A hub's servers may all run as one OS user (jovyan in a container): the person is the hub's user,
    in the job, its MLflow run's Created by, and who cancelled it."""
    cli.env["JUPYTERHUB_USER"] = "grace"
    cli("run", "--detach", "--", "echo up; sleep 120")
    [job] = json.loads(cli("jobs", "list", "--json").stdout)

    def show() -> dict:
        return json.loads(cli("jobs", "show", job["id"], "--json").stdout)

    wait_for(lambda: show()["state"] == "running", timeout=90, message="the job to run")
    cli("jobs", "cancel", job["id"])
    ended = wait_for(lambda: (j := show())["state"] == "cancelled" and j, timeout=90, message="the job to end")
    assert ended["user"] == "grace" and ended["reason"] == "cancelled by grace", ended
    [run] = wait_for(lambda: job_runs(tracking_uri, job["id"]) or None, timeout=120, message="the job's MLflow run")
    assert run.data.tags["mlflow.user"] == "grace"
