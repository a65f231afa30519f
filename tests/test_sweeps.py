"""Sweeps (``run --sweep``): a grid or random sample of parameters, each trial a real job on ``local``.

The CLI in a real subprocess as a person runs it; the trials' MLflow runs read back with MLflow's own
client, as a quality gate would: one parent run per sweep, each trial a child with its parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import sshd_fixture
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.pipelines.sweep import draw_trials, parse_axes, sweep_document

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

PY = sys.executable
TRAIN = """\
import argparse, json, sys, time
import mlflow

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
p.add_argument("--depth", type=int)
args = p.parse_args()
start = time.time()
with mlflow.start_run():
    mlflow.log_params({"lr": args.lr, "depth": args.depth})
    for step in range(3):
        mlflow.log_metric("loss", args.lr * args.depth / (step + 1), step=step)
with open(f"result-{args.lr}-{args.depth}.json", "w") as f:
    json.dump({"lr": args.lr, "depth": args.depth, "start": start, "end": time.time()}, f)
"""


def cli(workspace: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "jupyter_remote_compute.cli", "run", *args],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture
def cli_env(scratch_dir: Path, tracking_uri: str) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir)}


def listed_jobs(workspace: Path, env: dict[str, str]) -> list[dict]:  # type: ignore[type-arg]
    listed = subprocess.run(
        [PY, "-m", "jupyter_remote_compute.cli", "jobs", "list", "--json"],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(listed.stdout)


GRID = [
    "--machine", "local", "--send", "train.py", "--bring-back", "result-{lr}-{depth}.json",
    "--sweep", "lr=0.1,0.01,0.001", "--sweep", "depth=3,5", "--max-parallel", "2",
    "--", f"{PY} train.py --lr {{lr}} --depth {{depth}}",
]  # fmt: skip


def sweep_parent(tracking_uri: str) -> object:
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]

    def found() -> object:
        runs = client.search_runs(experiments, "tags.`remote_compute.sweep` = 'lr by depth'")
        return runs[0] if runs and runs[0].info.status == "FINISHED" else None

    return wait_for(found, timeout=120, message="the sweep's MLflow parent run")


def test_a_grid_runs_every_trial_under_one_parent_run_and_a_rerun_reuses_them(workspace, cli_env, tracking_uri):
    (workspace / "train.py").write_text(TRAIN)
    done = cli(workspace, *GRID, env=cli_env)
    assert done.returncode == 0, done.stderr
    results = [json.loads(p.read_text()) for p in sorted(workspace.glob("result-*.json"))]
    assert sorted((r["lr"], r["depth"]) for r in results) == sorted(
        (lr, depth) for lr in (0.1, 0.01, 0.001) for depth in (3, 5)
    )
    # --max-parallel 2: no moment had three trials running at once.
    moments = sorted([(r["start"], 1) for r in results] + [(r["end"], -1) for r in results])
    running, most = 0, 0
    for _, change in moments:
        running += change
        most = max(most, running)
    assert most <= 2, results
    assert "trial-1 (lr=0.1 depth=3): succeeded" in done.stderr, done.stderr

    parent = sweep_parent(tracking_uri)
    client = MlflowClient(tracking_uri)
    assert parent.info.run_name == "sweep lr by depth"  # type: ignore[attr-defined]
    children = client.search_runs(
        [parent.info.experiment_id],  # type: ignore[attr-defined]
        f"tags.mlflow.parentRunId = '{parent.info.run_id}'",  # type: ignore[attr-defined]
    )
    assert len(children) == 6
    for child in children:
        given = {
            k.rsplit(".", 1)[1]: v for k, v in child.data.tags.items() if k.startswith("remote_compute.sweep.param.")
        }
        assert float(child.data.params["lr"]) == float(given["lr"]) and child.data.params["depth"] == given["depth"]
        history = client.get_metric_history(child.info.run_id, "loss")
        assert [m.step for m in history] == [0, 1, 2]

    again = cli(workspace, *GRID, env=cli_env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count(": reused") == 6, again.stdout
    jobs = listed_jobs(workspace, cli_env)
    assert len(jobs) == 6  # nothing ran twice


def test_a_failing_trial_fails_the_sweep_naming_it_while_the_others_run(workspace, cli_env):
    command = f"{PY} -c \"import sys; sys.exit(3 if '{{x}}' == 'b' else 0)\""
    done = cli(workspace, "--sweep", "x=a,b,c", "--", command, env=cli_env)
    assert done.returncode == 1
    assert "2 of 3 trials succeeded; trial-2 (x=b) failed: exit code 3" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "lr="], "sweep[0]: lr has an empty value"),
        (["--sweep", "1lr=1,2"], "sweep[0]: '1lr=1,2': write NAME=V1,V2"),
        (["--sweep", "lr=1,2", "--sweep", "lr=3"], "sweep[1]: lr is swept twice"),
        (["--sweep", "lr=loguniform(1e-4,1e-1)"], "sweep: lr is a range, drawn only by a random sweep"),
        (["--sweep", "lr=loguniform(0,1)", "--sweep-random", "3"], "loguniform needs bounds above 0"),
        (["--sweep-random", "3"], "sweep: give at least one --sweep"),
        (["--sweep", "a=" + ",".join(map(str, range(1001)))], "1001 trials is more than 1000; add --yes"),
        (["--sweep", "a=1,2", "--bring-back", "model.pkl"], "trial-1 and trial-2 would both bring back model.pkl"),
        (["--sweep", "a=1,2", "--detach"], "--detach: a sweep is driven by this command"),
        (["--sweep", "a=1,2", "--retry", "2"], "retry: a sweep's trials do not take retry yet"),
        (["--sweep", "a=1,2", "--early-stop", "median"], "early_stop: name the metric the trials are judged by"),
    ],
)
def test_a_bad_sweep_is_refused_naming_what_to_change_and_nothing_runs(workspace, cli_env, args, message):
    done = cli(workspace, *args, "--", "echo {a}", env=cli_env)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert not (workspace / ".punica" / "pipelines").exists() or not any(
        (workspace / ".punica/pipelines").glob("*.json")
    )


def test_a_parameter_the_command_never_mentions_is_warned(workspace, cli_env):
    done = cli(workspace, "--sweep", "seed=1", "--sweep", "unused=2", "--", "echo $seed", env=cli_env)
    assert done.returncode == 0, done.stderr
    assert "the command never mentions {unused} or $unused" in done.stderr
    assert "mentions {seed}" not in done.stderr


def test_a_random_sweep_draws_the_same_trials_again() -> None:
    axes = parse_axes(["lr=loguniform(1e-4,1e-1)", "depth=int(2,8)", "opt=adam,sgd"])
    first = draw_trials(axes, 5)
    assert first == draw_trials(axes, 5) and len({tuple(t.values()) for t in first}) == 5
    for trial in first:
        assert 1e-4 <= float(trial["lr"]) <= 1e-1 and 2 <= int(trial["depth"]) <= 8 and trial["opt"] in ("adam", "sgd")
    with pytest.raises(InvalidSettings, match="the low bound must be below the high one"):
        parse_axes(["x=uniform(2,1)"])


def test_a_shell_value_is_quoted_and_the_shells_own_braces_are_left() -> None:
    settings = {"machine": "local", "command": "echo {msg} ${HOME} {other}", "env": {"A": "1"}}
    document, params = sweep_document(settings, [{"msg": "a b; rm -rf x"}])
    trial = document["nodes"][0]["settings"]
    assert trial["command"] == "echo 'a b; rm -rf x' ${HOME} {other}"
    assert trial["env"] == {"A": "1", "msg": "a b; rm -rf x"} and params == {"trial-1": {"msg": "a b; rm -rf x"}}


def test_a_notebook_sweep_gives_each_trial_its_typed_parameters(workspace, cli_env):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("epochs = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("open(f'epochs-{epochs}.txt', 'w').write(type(epochs).__name__)"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, workspace / "train.ipynb")
    done = subprocess.run(
        [PY, "-m", "jupyter_remote_compute.cli", "run", "--notebook", "train.ipynb", "--python", PY,
         "--bring-back", "epochs-{epochs}.txt", "--sweep", "epochs=2,4"],
        cwd=workspace, env=cli_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (workspace / "epochs-2.txt").read_text() == "int" and (workspace / "epochs-4.txt").read_text() == "int"
    assert (workspace / "train.trial-1.ipynb").exists() and (workspace / "train.trial-2.ipynb").exists()


DIVERGING = """\
import sys, time
import mlflow

x = float(sys.argv[1])
with mlflow.start_run():
    for step in range(4):
        mlflow.log_metric("loss", x, step=step)
    while x > 5:  # the diverging trial would run on: only early stopping ends it
        time.sleep(0.1)
"""


def test_median_stopping_stops_the_trial_behind_the_others_and_the_sweep_succeeds(workspace, cli_env):
    (workspace / "train.py").write_text(DIVERGING)
    done = cli(
        workspace, "--send", "train.py", "--sweep", "x=1,2,9", "--sweep-metric", "loss", "--early-stop", "median",
        "--", f"{PY} train.py {{x}}", env=cli_env,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = {line.split(":", 1)[0].strip(): line for line in done.stdout.splitlines()}
    assert lines["trial-3 (x=9)"].startswith("  trial-3 (x=9): stopped_early, loss 9 at step 3 (job "), done.stdout
    assert lines["trial-3 (x=9)"].endswith(
        "stopped early: loss 9 at step 3 is worse than the median 1.5 of the 2 other trials at that step"
    )
    assert lines["trial-1 (x=1)"].startswith("  trial-1 (x=1): succeeded, loss 1 at step 3 (best) (job ")
    assert "sweep x: succeeded — 1 of 3 trials stopped early" in done.stdout
    jobs = listed_jobs(workspace, cli_env)
    states = sorted((j["state"], j.get("reason") or "") for j in jobs)
    assert states[0] == ("cancelled", "cancelled by early stopping"), states


def test_median_verdicts_judge_at_a_step_the_others_reached_with_the_goal_given() -> None:
    from jupyter_remote_compute.pipelines.early_stop import Objective, median_verdict

    loss = Objective.parse("loss")
    histories = {"a": {0: 1.0, 1: 1.0}, "b": {0: 2.0, 1: 2.0}, "c": {0: 9.0, 1: 9.0, 7: 0.1}}
    # c's step 7 has no company: it is judged at step 1, the latest step two others logged.
    assert median_verdict(loss, histories, "c") == (
        "stopped early: loss 9 at step 1 is worse than the median 1.5 of the 2 other trials at that step"
    )
    assert median_verdict(loss, histories, "a") is None
    assert median_verdict(loss, {"a": {0: 5.0}, "b": {0: 1.0}, "c": {0: 1.0}}, "a") is None  # never at the first
    accuracy = Objective.parse("accuracy:max")
    assert median_verdict(accuracy, histories, "a") is not None and median_verdict(accuracy, histories, "c") is None
    assert accuracy.best({"a": 0.5, "b": 0.9}) == "b" and loss.best({"a": 0.5, "b": 0.9}) == "a"
    with pytest.raises(InvalidSettings, match="sweep_metric: 'loss:low': the goal after ':' is min or max"):
        Objective.parse("loss:low")


@pytest.fixture
def server(quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from server_process import Server

    srv = Server(quickstart, scratch_dir, tracking_uri, tmp_path / "server.log")
    yield srv
    srv.stop()


def test_the_rest_api_runs_a_sweep_follows_its_metric_and_cancels_it_whole(server, quickstart: Path, tracking_uri):
    from server_process import ApiError

    server.start()
    (quickstart / "steps.py").write_text(DIVERGING)
    job = {"machine": "local", "command": f"{PY} steps.py {{x}}", "send": ["steps.py"]}
    with pytest.raises(ApiError) as refused:
        server.request("POST", "pipelines/sweeps", {"job": job, "parameters": {"x": [1]}, "trials": 3})
    assert refused.value.status == 400 and refused.value.body["field"] == "trials", refused.value.body
    with pytest.raises(ApiError) as refused:
        server.request("POST", "pipelines/sweeps", {"job": job, "parameters": {"x": []}})
    assert refused.value.status == 400 and refused.value.body["field"] == "parameters.x", refused.value.body
    with pytest.raises(ApiError) as refused:
        server.request("POST", "pipelines/sweeps", {"job": job, "parameters": {"x": [1]}, "early_stop": "median"})
    assert refused.value.body["field"] == "early_stop"

    started = server.request("POST", "pipelines/sweeps", {"job": job, "parameters": {"x": [1, 2]}, "metric": "loss"})
    assert started["attached"] is False and started["warnings"] == []
    run = started["run"]
    assert run["sweep"]["parameters"] == {"trial-1": {"x": "1"}, "trial-2": {"x": "2"}}
    ended = wait_for(
        lambda: (r := server.request("GET", f"pipelines/runs/{run['id']}"))["state"] != "running" and r,
        timeout=120,
        message="the sweep to end",
    )
    assert ended["state"] == "succeeded" and ended["sweep"]["latest"] == {"trial-1": [3, 1.0], "trial-2": [3, 2.0]}
    # Its parent run, and the experiment MLflow's run comparison of the trials needs.
    recorded = wait_for(
        lambda: (r := server.request("GET", f"pipelines/runs/{run['id']}"))["mlflow_experiment_id"] and r,
        timeout=120,
        message="the sweep's parent run",
    )
    parent = MlflowClient(tracking_uri).get_run(recorded["mlflow_run_id"])
    assert parent.info.experiment_id == recorded["mlflow_experiment_id"] and parent.info.run_name == "sweep x"

    # A trial that runs on until stopped: cancelling the sweep cancels it, and the trial not yet started.
    again = server.request(
        "POST", "pipelines/sweeps", {"job": job, "parameters": {"x": [9, 8]}, "max_parallel": 1, "metric": "loss"}
    )["run"]
    wait_for(
        lambda: server.request("GET", f"pipelines/runs/{again['id']}")["sweep"].get("latest", {}).get("trial-1"),
        timeout=120,
        message="the first trial's points",
    )
    server.request("POST", f"pipelines/runs/{again['id']}/cancel")
    cancelled = wait_for(
        lambda: (r := server.request("GET", f"pipelines/runs/{again['id']}"))["state"] != "running" and r,
        timeout=120,
        message="the sweep to end cancelled",
    )
    assert cancelled["state"] == "cancelled"
    assert [n["state"] for n in cancelled["nodes"].values()] == ["cancelled", "cancelled"]
    assert not cancelled["nodes"]["trial-2"].get("job_id")  # never started


def test_a_grid_over_a_pool_spreads_its_trials_and_a_rerun_reuses_all_six(
    workspace: Path, make_service, ssh_agent_env, tracking_uri
) -> None:
    """Two ssh machines of one job each in a pool: six trials wait in its line and go where there is room."""
    from pool_bed import add_pair, remove_b_folder

    from jupyter_remote_compute.pipelines.runner import PipelineRunner
    from jupyter_remote_compute.pipelines.sweep import plan

    service = make_service(workspace)
    add_pair(service, ssh_agent_env, max_jobs=1)
    settings = {
        "machine": "pair",
        "command": "echo {lr} {depth} > out-{lr}-{depth}.txt",
        "bring_back": ["out-{lr}-{depth}.txt"],
        "name": "grid",
    }
    axes = parse_axes(["lr=0.1,0.01,0.001", "depth=3,5"])
    runner = PipelineRunner(service)
    try:
        run, attached = runner.start_sweep(plan(settings, axes, max_parallel=6))
        ended = runner.drive(run.id)
        assert not attached and ended.state == "succeeded", ended.reason
        assert (workspace / "out-0.01-5.txt").read_text() == "0.01 5\n"
        jobs = [service.get(node.job_id) for node in ended.nodes.values() if node.job_id]
        assert len(jobs) == 6 and {j.machine for j in jobs} == {"a", "b"} and all(j.pool == "pair" for j in jobs)

        parent = wait_for(lambda: runner.get(run.id).mlflow_run_id, timeout=120, message="the parent run")
        children = MlflowClient(tracking_uri).search_runs(
            [runner.get(run.id).mlflow_experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
        )
        assert len(children) == 6

        again, _ = runner.start_sweep(plan(settings, axes, max_parallel=6))
        assert [n.state for n in runner.drive(again.id).nodes.values()] == ["reused"] * 6
    finally:
        runner.close()
        remove_b_folder(ssh_agent_env)
