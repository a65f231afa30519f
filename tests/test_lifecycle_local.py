"""The whole lifecycle on the built-in machine, with a real MLflow store and real processes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import job_runs
from mlflow.tracking import MlflowClient
from procs import group_members
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings, NotTrained
from jupyter_remote_compute.jobs.service import require_trained
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.store import JobStore

QUICKSTART_SPEC = {
    "machine": "local",
    "command": "python train.py",
    "send": ["train.py", "data/*.csv"],
    "bring_back": ["model.pkl", "metrics.json"],
    "name": "quickstart",
}


def test_quickstart_job_lands_verified_outputs_and_one_mlflow_run(quickstart, make_service, tracking_uri, scratch_dir):
    service = make_service(quickstart)
    result = service.submit(JobSpec.from_json(QUICKSTART_SPEC))
    assert not result.attached
    job = service.wait(result.job.id, timeout=120)

    assert job.state == "succeeded", job.reason
    require_trained(job)
    # Outputs are in the workspace, and their recorded digests are the files' own.
    for name in ("model.pkl", "metrics.json"):
        landed = quickstart / name
        assert landed.is_file()
        assert job.outputs[name]["sha256"] == hashlib.sha256(landed.read_bytes()).hexdigest()
    assert json.loads((quickstart / "metrics.json").read_text())["rows"] == 40
    # The job ran in its own scratch directory, not in the workspace.
    assert (scratch_dir / job.id / "work" / "train.py").is_file()

    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == job.mlflow_run_id
    assert run.info.status == "FINISHED"
    # What train.py logged on the far side, replayed here.
    assert run.data.params["rows"] == "40"
    assert "mse" in run.data.metrics
    history = MlflowClient(tracking_uri).get_metric_history(run.info.run_id, "residual")
    assert sorted(m.step for m in history) == list(range(40))
    assert run.data.tags["remote_compute.machine"] == "local"
    assert run.data.tags["remote_compute.engine"] == "local"
    assert run.data.tags["remote_compute.key"] == job.key
    assert run.data.tags["mlflow.runName"] == "quickstart"
    artifacts = {a.path for a in MlflowClient(tracking_uri).list_artifacts(run.info.run_id, "remote_compute")}
    assert {"remote_compute/log", "remote_compute/inputs.json"} <= artifacts
    outputs = {a.path for a in MlflowClient(tracking_uri).list_artifacts(run.info.run_id, "outputs")}
    assert outputs == {"outputs/model.pkl", "outputs/metrics.json"}


def test_same_work_attaches_to_the_running_job(workspace, make_service):
    (workspace / "wait.sh").write_text("while [ ! -f go ]; do sleep 0.05; done\n")
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "sh wait.sh", "send": ["wait.sh"]})
    first = service.submit(spec)
    service.advance(first.job.id)
    second = service.submit(spec)
    assert second.attached and second.job.id == first.job.id
    # --new starts another one regardless.
    third = service.submit(spec, new=True)
    assert not third.attached and third.job.id != first.job.id
    for job_id in (first.job.id, third.job.id):
        service.cancel(job_id)
    # Once the first has ended, the same spec is new work again.
    assert not service.submit(spec).attached


def test_editing_an_input_changes_the_key(workspace, make_service):
    (workspace / "data.txt").write_text("one")
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "cat data.txt", "send": ["data.txt"]})
    first = service.submit(spec).job
    (workspace / "data.txt").write_text("two")
    second = service.submit(spec)
    assert not second.attached and second.job.key != first.key


def test_nonzero_exit_fails_with_code_and_log_tail(workspace, make_service, tracking_uri):
    service = make_service(workspace)
    job = service.submit(JobSpec.from_json({"command": "echo preparing; echo 'bad input' >&2; exit 3"})).job
    job = service.wait(job.id, timeout=60)
    assert job.state == "failed"
    assert job.reason.startswith("exit code 3:")
    assert "bad input" in job.reason
    with pytest.raises(NotTrained) as info:
        require_trained(job)
    assert info.value.job_id == job.id and "exit code 3" in str(info.value)
    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"


CRASHING_SCRIPT = """\
import ctypes


def deep_in_training():
    ctypes.string_at(0)  # reads address 0: what a broken native extension does


deep_in_training()
"""


def test_a_crash_in_native_code_leaves_its_python_stack_in_the_log(workspace, make_service, monkeypatch):
    """The launcher's defaults: Python's fault handler on, MLflow's telemetry off; a job's env wins."""
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    (workspace / "crash.py").write_text(CRASHING_SCRIPT)
    service = make_service(workspace)
    crash = JobSpec.from_json({"command": "python crash.py", "send": ["crash.py"]})
    job = service.wait(service.submit(crash).job.id, 60)
    assert job.state == "failed" and job.exit_code == 128 + signal.SIGSEGV, (job.exit_code, job.reason)
    log = service.read_log(job.id).data.decode()
    assert "Fatal Python error: Segmentation fault" in log and "deep_in_training" in log, log

    show = 'echo "fault=$PYTHONFAULTHANDLER telemetry_off=$MLFLOW_DISABLE_TELEMETRY"'
    defaults = service.wait(service.submit(JobSpec.from_json({"command": show})).job.id, 60)
    assert "fault=1 telemetry_off=true" in service.read_log(defaults.id).data.decode()
    env = {"PYTHONFAULTHANDLER": "", "MLFLOW_DISABLE_TELEMETRY": "false"}
    chosen = service.wait(service.submit(JobSpec.from_json({"command": show, "env": env})).job.id, 60)
    assert "fault= telemetry_off=false" in service.read_log(chosen.id).data.decode()


def test_missing_output_fails_and_nothing_partial_lands(workspace, make_service):
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "echo hi > a.txt", "bring_back": ["a.txt", "b.txt"]})
    job = service.wait(service.submit(spec).job.id, timeout=60)
    assert job.state == "failed"
    assert job.reason == "missing outputs: b.txt"
    assert not (workspace / "a.txt").exists()  # a.txt was fine, but the job is not trained: nothing lands


def test_output_directory_comes_back_whole(workspace, make_service):
    service = make_service(workspace)
    spec = JobSpec.from_json(
        {"command": "mkdir -p out/sub && echo 1 > out/a && echo 2 > out/sub/b", "bring_back": ["out"]}
    )
    job = service.wait(service.submit(spec).job.id, timeout=60)
    assert job.state == "succeeded", job.reason
    assert (workspace / "out/a").read_text() == "1\n"
    assert (workspace / "out/sub/b").read_text() == "2\n"
    assert set(job.outputs) == {"out/a", "out/sub/b"}


def test_cancel_kills_the_whole_process_group(workspace, make_service, tracking_uri):
    service = make_service(workspace, cancel_grace=1.0)
    # The job starts children that ignore nothing special: a background sleep and a subshell.
    spec = JobSpec.from_json({"command": "sleep 300 & (sleep 300) & echo started; wait"})
    job = service.submit(spec).job
    service.advance(job.id)
    wait_for(lambda: b"started" in service.read_log(job.id).data, message="the job to print 'started'")
    pgid = service.get(job.id).handle["pid"]
    assert len(group_members(pgid)) >= 3
    job = service.cancel(job.id, by="tester")
    assert job.state == "cancelled"
    assert job.reason == "cancelled by tester"
    assert group_members(pgid) == []
    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"


def test_a_term_ignoring_job_is_killed_after_the_grace_period(workspace, make_service):
    service = make_service(workspace, cancel_grace=0.5)
    job = service.submit(JobSpec.from_json({"command": "trap '' TERM; echo ready; while :; do sleep 0.1; done"})).job
    service.advance(job.id)
    wait_for(lambda: b"ready" in service.read_log(job.id).data, message="the job to start")
    pgid = service.get(job.id).handle["pid"]
    assert service.cancel(job.id).state == "cancelled"
    assert group_members(pgid) == []


def test_timeout_stops_the_job_and_says_so(workspace, make_service):
    service = make_service(workspace, cancel_grace=0.5)
    job = service.submit(JobSpec.from_json({"command": "sleep 60", "timeout": "1s"})).job
    job = service.wait(job.id, timeout=30)
    assert job.state == "failed"
    assert job.reason == "timed out after 1s"


def test_a_vanished_process_makes_the_job_lost(workspace, make_service):
    service = make_service(workspace)
    job = service.submit(JobSpec.from_json({"command": "echo up; sleep 300"})).job
    service.advance(job.id)
    wait_for(lambda: b"up" in service.read_log(job.id).data, message="the job to start")
    pgid = service.get(job.id).handle["pid"]
    # Killing the whole group with SIGKILL leaves no exit code behind, as a machine crash would.
    os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: not group_members(pgid), message="the group to die")
    job = service.wait(job.id, timeout=30)
    assert job.state == "lost"
    assert job.reason.startswith("lost: the process vanished on local")


def test_a_poll_that_read_the_job_before_another_process_cancelled_it_says_who_cancelled_it(workspace, make_service):
    """The CLI cancels in its own process: it records the request, then stops the process. A server's poll
    that read the job before the request and asks the machine after the stop sees it gone as cancelled."""
    from jupyter_remote_compute.jobs.context import remote_of

    service = make_service(workspace, cancel_grace=0.5)
    job = service.submit(JobSpec.from_json({"command": "echo up; sleep 300"})).job
    service.advance(job.id)
    wait_for(lambda: b"up" in service.read_log(job.id).data, message="the job to start")
    read_before = service.get(job.id)
    # The other process's cancel: the request recorded, the process stopped, nothing moved yet.
    with service.store.transaction() as jobs:
        jobs[job.id].cancel_requested = "grace"
    service.ctx.engine_of(read_before).cancel(remote_of(read_before), 0.5)
    service.driver._watch(read_before)  # this process's poll, with the job as it read it
    job = service.wait(job.id, timeout=30)
    assert (job.state, job.reason) == ("cancelled", "cancelled by grace")


def test_a_job_cancelled_by_another_process_while_it_is_sent_never_starts_and_says_who(workspace, make_service):
    """The request lands in the store while this process sends the job's files: the job is not started,
    and its reason names who asked (the store's, not the job as this process read it before)."""
    service = make_service(workspace)
    (workspace / "data.txt").write_text("x\n")
    job = service.submit(JobSpec.from_json({"command": "touch started", "send": ["data.txt"]})).job

    def another_process_cancels(done: int, total: int) -> None:
        with service.store.transaction() as jobs:
            jobs[job.id].cancel_requested = "grace"

    service.advance(job.id, progress=another_process_cancels)
    job = service.wait(job.id, timeout=30)
    assert (job.state, job.reason) == ("cancelled", "cancelled by grace before it started")
    assert not (workspace / "started").exists() and job.handle.get("pid") is None


def test_log_reads_from_an_offset(workspace, make_service):
    service = make_service(workspace)
    job = service.wait(service.submit(JobSpec.from_json({"command": "seq 1 2000"})).job.id, timeout=60)
    whole = service.read_log(job.id, 0).data
    assert whole.decode().split() == [str(i) for i in range(1, 2001)]
    part = service.read_log(job.id, 100, 50)
    assert part.data == whole[100:150]
    assert part.next_offset == 150


def test_secret_reference_reaches_the_job_but_no_file(workspace, make_service, tracking_uri, tmp_path, scratch_dir):
    service = make_service(workspace)
    value = "s3cr3t-Value-" + os.urandom(8).hex()
    service.secrets.set("test/api", value)
    (workspace / "check.sh").write_text('case "$API_KEY" in s3cr3t-Value-*) echo match ;; esac\necho "key=$API_KEY"\n')
    spec = JobSpec.from_json({"command": "sh check.sh", "send": ["check.sh"], "env": {"API_KEY": "secret:test/api"}})
    job = service.wait(service.submit(spec).job.id, timeout=60)
    assert job.state == "succeeded", job.reason
    log = service.read_log(job.id).data
    assert b"match" in log  # the job saw the value...
    assert value.encode() not in log  # ...and the log shows it masked
    assert b"key=" + b"*" * len(value) in log
    # Nowhere on this side: the workspace (state file, collected log), the MLflow store. The far side's own
    # raw log (the scratch dir) holds what the command itself printed, as it would on any machine.
    needle = value.encode()
    for path in tmp_path.rglob("*"):
        if path.is_file() and scratch_dir not in path.parents:
            assert needle not in path.read_bytes(), path


def test_delete_removes_a_finished_job_and_its_scratch(workspace, make_service, scratch_dir):
    service = make_service(workspace)
    job = service.wait(service.submit(JobSpec.from_json({"command": "true"})).job.id, timeout=60)
    assert (scratch_dir / job.id).is_dir()
    service.delete(job.id)
    assert job.id not in service.store.jobs()
    assert not (scratch_dir / job.id).exists()


def test_a_disabled_or_unknown_machine_is_refused(workspace, make_service):
    service = make_service(workspace)
    with pytest.raises(Exception) as info:
        service.submit(JobSpec.from_json({"machine": "nowhere", "command": "true"}))
    assert "nowhere" in str(info.value)


@pytest.mark.parametrize(
    "send",
    ["../outside.txt", "/etc/passwd", "data/../../x", "~/x", ".punica/jobs.json"],
)
def test_send_paths_must_stay_in_the_workspace(workspace, make_service, send):
    with pytest.raises(InvalidSettings) as info:
        JobSpec.from_json({"command": "true", "send": [send]})
    assert info.value.field == "send[0]"


def test_a_symlink_out_of_the_workspace_is_refused(workspace, make_service, tmp_path):
    (tmp_path / "secret.txt").write_text("x")
    (workspace / "link.txt").symlink_to(tmp_path / "secret.txt")
    service = make_service(workspace)
    with pytest.raises(InvalidSettings) as info:
        service.submit(JobSpec.from_json({"command": "true", "send": ["link.txt"]}))
    assert "leads out of the workspace" in info.value.message
    assert service.store.jobs() == {}


def test_digest_cache_skips_rehashing_unchanged_inputs(workspace, make_service, monkeypatch):
    from jupyter_remote_compute.transfer import manifest

    (workspace / "big.bin").write_bytes(os.urandom(1 << 20))
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "true", "send": ["big.bin"]})
    first = service.submit(spec).job
    calls = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda p: calls.append(p) or real(p))
    # A new service (as another process would be) reads the cache from disk.
    again = make_service(workspace).submit(spec)
    assert again.attached and again.job.id == first.id
    assert calls == []


def test_inputs_are_copied_not_linked(workspace, make_service, scratch_dir):
    (workspace / "in.txt").write_text("original")
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "echo changed > in.txt", "send": ["in.txt"]})
    job = service.wait(service.submit(spec).job.id, timeout=60)
    assert job.state == "succeeded"
    assert (workspace / "in.txt").read_text() == "original"
    assert Path(scratch_dir / job.id / "work" / "in.txt").read_text() == "changed\n"


SWEEP = """
import mlflow
mlflow.set_experiment("far-side-sweep")
with mlflow.start_run(run_name="parent"):
    mlflow.log_param("kind", "sweep")
    with open("notes.txt", "w") as f:
        f.write("from the far side")
    mlflow.log_artifact("notes.txt", "extra")
    mlflow.set_tag("team", "vision")
    for lr in (0.1, 0.01):
        with mlflow.start_run(run_name=f"lr={lr}", nested=True):
            mlflow.log_param("lr", lr)
            mlflow.log_metric("loss", lr * 10, step=1)
"""


def test_nested_runs_are_replayed_as_children_with_artifacts_and_tags(workspace, make_service, tracking_uri):
    (workspace / "sweep.py").write_text(SWEEP)
    service = make_service(workspace)
    job = service.wait(
        service.submit(JobSpec.from_json({"command": "python sweep.py", "send": ["sweep.py"]})).job.id, timeout=120
    )
    assert job.state == "succeeded", job.reason
    client = MlflowClient(tracking_uri)
    run = client.get_run(job.mlflow_run_id)
    assert run.data.params == {"kind": "sweep"}
    assert run.data.tags["team"] == "vision"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "extra")] == ["extra/notes.txt"]
    experiment_id = run.info.experiment_id
    children = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    assert sorted(c.data.params["lr"] for c in children) == ["0.01", "0.1"]
    assert all(c.info.status == "FINISHED" for c in children)
    # Collecting again (as after a crash) finds every run instead of creating new ones.
    from jupyter_remote_compute.recording import tracking

    assert len(client.search_runs([experiment_id])) == 3
    record = tracking.JobRecord(
        job_id=job.id, key=job.key, name=job.name, machine="local", engine="local", state="succeeded", reason=None,
        command="python sweep.py", started=None, ended=time.time(), log_path=None, outputs={}, inputs_manifest=None,
        far_store=None,
    )  # fmt: skip
    assert tracking.record_job(workspace, tracking.TrackingSettings(tracking_uri, "tests"), record) == run.info.run_id
    assert len(client.search_runs([experiment_id])) == 3


def test_the_run_carries_the_workspace_git_commit(workspace, make_service, tracking_uri):
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    (workspace / "f.txt").write_text("x")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "m"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    service = make_service(workspace)
    job = service.wait(service.submit(JobSpec.from_json({"command": "true"})).job.id, timeout=60)
    run = MlflowClient(tracking_uri).get_run(job.mlflow_run_id)
    assert run.data.tags["mlflow.source.git.commit"] == head
    assert run.data.tags["mlflow.user"]


def test_the_experiment_follows_mlflows_own_variable(monkeypatch):
    from jupyter_remote_compute.recording.tracking import TrackingSettings

    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    assert TrackingSettings().experiment is None  # MLflow's default experiment, as a local run
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-runs")
    assert TrackingSettings().experiment == "team-runs"


ISOLATED_RUN = """
import json, sys
from pathlib import Path
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.recording.tracking import TrackingSettings
from jupyter_remote_compute.workspace import Workspace

root, scratch, uri = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
settings = ServiceSettings(
    poll_interval=0.2, scratch_dir=scratch, tracking=TrackingSettings(uri, "tests")
)
service = JobService(Workspace(root), settings)
spec = {"command": "python train.py", "send": ["train.py", "data/*.csv"], "bring_back": ["model.pkl"]}
job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
print(json.dumps({"state": job.state, "run": job.mlflow_run_id, "mlflow_loaded": "mlflow" in sys.modules}))
"""


def test_a_server_records_in_a_child_and_never_loads_mlflow_itself(quickstart, scratch_dir, tracking_uri):
    """MLflow and its store cost a process ~200 MiB: a long-lived server hands each run to a child."""
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", ISOLATED_RUN, str(quickstart), str(scratch_dir), tracking_uri],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["state"] == "succeeded" and result["mlflow_loaded"] is False
    [run] = job_runs(tracking_uri, _only_job(quickstart))
    assert run.info.run_id == result["run"] and run.data.params["rows"] == "40"


def _only_job(workspace: Path) -> str:
    [job_id] = JobStore(workspace / ".punica/jobs.json").jobs()
    return job_id
