"""A detached recorder makes exactly one run per job; the CLI reports the job once it has.

Real processes throughout: the CLI as a user runs it, the recorder it leaves behind, a real MLflow
sqlite store. The test bed's ``git`` (first on PATH, nowhere in the product) holds the recorder
just before it creates the run, so the test can kill things at that point without sleeping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICKSTART, job_runs
from recorders import OwnRecorder
from waiting import wait_for

from jupyter_remote_compute.jobs.recording import PROGRAM
from jupyter_remote_compute.jobs.store import JobStore
from jupyter_remote_compute.recording import recorder as record
from jupyter_remote_compute.recording.recorder import Call
from jupyter_remote_compute.recording.tracking import TrackingSettings
from jupyter_remote_compute.workspace import Workspace

# A model as small as MLflow logs one, registered with an alias.
REGISTERING_SCRIPT = """\
import mlflow


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input):
        return model_input


with mlflow.start_run():
    mlflow.pyfunc.log_model(name="echo", python_model=Echo(), registered_model_name="again", pip_requirements=[])
mlflow.MlflowClient().set_registered_model_alias("again", "champion", "1")
"""

# Test bed only: the recorder asks git for the commit just before it creates the job's run.
HOLDING_GIT = """\
#!/bin/sh
faults={faults}
if [ "${{1:-}} ${{3:-}}" = "-C rev-parse" ] && mv "$faults/arm" "$faults/claimed" 2>/dev/null; then
  echo "$PPID" > "$faults/held.tmp" && mv "$faults/held.tmp" "$faults/held"
  while [ ! -e "$faults/release" ] && kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done
fi
exec {git} "$@"
"""


@pytest.fixture
def bed(
    quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path, own_recorder: OwnRecorder
) -> dict[str, Any]:
    faults, bin_dir = tmp_path / "faults", tmp_path / "bin"
    faults.mkdir()
    bin_dir.mkdir()
    git = bin_dir / "git"
    git.write_text(HOLDING_GIT.format(faults=faults, git=shutil.which("git") or "/bin/false"))
    git.chmod(0o755)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_EXPERIMENT_NAME": "tests",
        "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        **own_recorder.env,  # these tests hold and kill it: no other test's
    }
    return {"root": quickstart, "faults": faults, "env": env, "uri": tracking_uri, "recorder": own_recorder}


def _cli(bed: dict[str, Any], *args: str, **popen: Any) -> subprocess.Popen[str]:
    popen = {"cwd": bed["root"], "env": bed["env"], **popen}
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_remote_compute.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def _jobs(bed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # Through the store: the latest changes may still be in the journal beside jobs.json.
    return {job_id: job.to_json() for job_id, job in JobStore(bed["root"] / ".punica/jobs.json").jobs().items()}


def _recorded(bed: dict[str, Any], job_id: str) -> str | None:
    return _jobs(bed)[job_id]["mlflow_run_id"]


def _pending(bed: dict[str, Any]) -> list[str]:
    folder = bed["root"] / ".punica/recording"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _held_recorder(bed: dict[str, Any]) -> int:
    held = wait_for(lambda: (bed["faults"] / "held").exists(), timeout=120, message="the recorder to reach git")
    assert held
    pid = int((bed["faults"] / "held").read_text())
    assert PROGRAM[-1].encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


def test_the_cli_reports_the_job_once_its_detached_recorder_made_one_run(bed: dict[str, Any]) -> None:
    cli = _cli(bed, "run", "--bring-back", "model.pkl", "--send", "train.py", "--send", "data/*.csv",
               "--", "python", "train.py")  # fmt: skip
    _, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err
    (job_id,) = _jobs(bed)
    # Done means recorded: the id is on the job and in what the CLI said, the run readable at once.
    run_id = _recorded(bed, job_id)
    assert run_id and f"MLflow run {run_id}" in err and "succeeded" in err
    runs = job_runs(bed["uri"], job_id)
    assert [r.info.run_id for r in runs] == [run_id]
    # What the job logged and brought back reached the run; the to-do and the fetched copy are gone.
    assert runs[0].data.tags["remote_compute.replayed"] == "true"
    assert _pending(bed) == []
    assert not (bed["root"] / ".punica/jobs" / job_id / "incoming").exists()


def test_killing_the_cli_after_its_job_ended_still_records_one_run(bed: dict[str, Any]) -> None:
    (bed["faults"] / "arm").touch()
    cli = _cli(bed, "run", "--", "true", start_new_session=True)
    recorder = _held_recorder(bed)
    (job_id,) = _jobs(bed)
    assert _jobs(bed)[job_id]["state"] == "succeeded" and _recorded(bed, job_id) is None
    # What a terminal's Ctrl-C or a CI runner's cleanup does: the CLI's whole process group goes.
    with contextlib.suppress(ProcessLookupError):  # it may have exited already
        os.killpg(cli.pid, signal.SIGKILL)
    cli.communicate(timeout=30)
    assert Path(f"/proc/{recorder}").exists()
    (bed["faults"] / "release").touch()
    run_id = wait_for(lambda: _recorded(bed, job_id), timeout=120, message="the run id on the job")
    assert [r.info.run_id for r in job_runs(bed["uri"], job_id)] == [run_id]
    wait_for(lambda: _pending(bed) == [], timeout=30, message="the to-do to go")


def _orphan(bed: dict[str, Any]) -> str:
    """A finished job whose recorder was killed before it created the run: its to-do is left."""
    (bed["faults"] / "arm").touch()
    cli = _cli(bed, "run", "--", "true")
    recorder = _held_recorder(bed)
    (job_id,) = _jobs(bed)
    # The CLI waits for its recorder (and would replace a dead one): it goes first, as a killed terminal's.
    cli.kill()
    cli.communicate(timeout=60)
    os.kill(recorder, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{recorder}").exists(), timeout=30, message="the recorder to die")
    assert _recorded(bed, job_id) is None and job_runs(bed["uri"], job_id) == []
    assert f"{job_id}.json" in _pending(bed)
    return job_id


def test_a_recorder_that_died_is_replaced_by_the_next_submit(bed: dict[str, Any]) -> None:
    first_id = _orphan(bed)
    second = _cli(bed, "run", "--new", "--", "sh", "-c", "exit 0")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    second_id = next(i for i in _jobs(bed) if i != first_id)
    for job_id in (first_id, second_id):
        run_id = wait_for(lambda j=job_id: _recorded(bed, j), timeout=180, message=f"job {job_id}'s run id")
        assert [r.info.run_id for r in job_runs(bed["uri"], job_id)] == [run_id]
    wait_for(lambda: _pending(bed) == [], timeout=60, message="every to-do to go")


def test_recorders_racing_for_one_job_make_one_run(bed: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = _orphan(bed)
    for name, value in bed["env"].items():
        monkeypatch.setenv(name, value)
    # This process starts recorders itself: its own temporary folder too, not the one tempfile cached
    # at its first use (where another test's recorder may listen, or none ever will).
    monkeypatch.setattr(tempfile, "tempdir", str(bed["recorder"].temporary))
    # As a server's poll, a CLI's submit and a second server would, all at once.
    settings = TrackingSettings(tracking_uri=bed["uri"], experiment="tests")
    for _ in range(3):
        record.start(PROGRAM, Workspace(bed["root"]), settings, job_id, [])
    run_id = wait_for(lambda: _recorded(bed, job_id), timeout=180, message="the run id on the job")
    wait_for(lambda: _pending(bed) == [], timeout=60, message="the to-do to go")
    assert [r.info.run_id for r in job_runs(bed["uri"], job_id)] == [run_id]


def test_a_recorder_dying_while_the_cli_waits_is_replaced_and_the_cli_reports_the_run(bed: dict[str, Any]) -> None:
    (bed["faults"] / "arm").touch()
    cli = _cli(bed, "run", "--", "true")
    recorder = _held_recorder(bed)
    os.kill(recorder, signal.SIGKILL)
    _, err = cli.communicate(timeout=180)
    assert cli.returncode == 0, err
    (job_id,) = _jobs(bed)
    run_id = _recorded(bed, job_id)
    assert run_id and f"MLflow run {run_id}" in err
    assert [r.info.run_id for r in job_runs(bed["uri"], job_id)] == [run_id]


def _recorder_pid(bed: dict[str, Any]) -> int:
    return bed["recorder"].pid()


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet is not: the container's init may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _run_true(bed: dict[str, Any], cwd: Path | None = None, **env: str) -> str:
    cli = _cli(bed, "run", "--new", "--", "true", **({"cwd": cwd} if cwd else {}), env={**bed["env"], **env})
    _, err = cli.communicate(timeout=180)
    assert cli.returncode == 0, err
    return err


def test_one_recorder_stays_up_between_the_jobs_of_a_workspace_and_records_each(bed: dict[str, Any]) -> None:
    """The second job's run is recorded by the recorder the first started, MLflow already loaded there."""
    _run_true(bed)
    first = _recorder_pid(bed)
    _run_true(bed)
    assert _recorder_pid(bed) == first and _alive(first)
    assert PROGRAM[-1].encode() in Path(f"/proc/{first}/cmdline").read_bytes()
    jobs = _jobs(bed)
    assert len(jobs) == 2
    for job_id, job in jobs.items():
        assert job["mlflow_run_id"] and [r.info.run_id for r in job_runs(bed["uri"], job_id)] == [job["mlflow_run_id"]]
    # Its socket takes requests (the secret values to hide, the face's environment) from this user only,
    # in a folder only the user can open.
    sock = bed["recorder"].file("sock")
    assert stat.S_ISSOCK(sock.lstat().st_mode) and sock.lstat().st_mode & 0o077 == 0
    assert sock.parent.stat().st_mode & 0o777 == 0o700


def test_the_recorder_goes_once_idle_and_the_next_job_starts_another(bed: dict[str, Any]) -> None:
    _run_true(bed, JUPYTER_REMOTE_COMPUTE_RECORDER_IDLE="1")
    first = _recorder_pid(bed)
    wait_for(lambda: not _alive(first), timeout=60, message="the idle recorder to go")
    assert not bed["recorder"].file("sock").exists()
    _run_true(bed, JUPYTER_REMOTE_COMPUTE_RECORDER_IDLE="1")
    assert _recorder_pid(bed) != first
    assert all(job["mlflow_run_id"] for job in _jobs(bed).values())


def test_one_recorder_serves_every_workspace_each_in_its_faces_environment(bed: dict[str, Any], tmp_path: Path) -> None:
    """A second workspace (one too deep for a Unix socket beside it, too) is recorded by the recorder the
    first started, MLflow loaded once; its face's environment is what the recording sees: here, a PATH
    whose git holds the recorder, which the face that started the recorder did not have."""
    plain_env = {**bed["env"], "PATH": os.environ["PATH"]}
    cli = _cli(bed, "run", "--new", "--", "true", env=plain_env)
    _, err = cli.communicate(timeout=180)
    assert cli.returncode == 0, err
    first = _recorder_pid(bed)
    deep = tmp_path / ("deep-" * 20) / "workspace"
    shutil.copytree(QUICKSTART, deep, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "jobs*"))
    assert len(str(deep / ".punica/recorder.sock")) > 108  # what a Unix socket's path can hold
    (bed["faults"] / "arm").touch()
    cli = _cli(bed, "run", "--new", "--", "true", cwd=deep)
    assert _held_recorder(bed) == first  # the faults' git, found on the second face's PATH
    (bed["faults"] / "release").touch()
    _, err = cli.communicate(timeout=180)
    assert cli.returncode == 0, err
    assert _recorder_pid(bed) == first and _alive(first)
    for root in (bed["root"], deep):
        (job_id,) = JobStore(root / ".punica/jobs.json").jobs()
        run_id = JobStore(root / ".punica/jobs.json").get(job_id).mlflow_run_id
        assert run_id and [r.info.run_id for r in job_runs(bed["uri"], job_id)] == [run_id]


def test_the_recorder_runs_only_the_calls_it_knows(bed: dict[str, Any]) -> None:
    workspace = Workspace(bed["root"])
    marker = bed["root"] / "called"
    for request in (
        {"op": "call", "call": "os:system", "args": {"cmd": f"touch {marker}"}, "wait": True},
        {"op": "call", "target": "os:system", "args": {"cmd": f"touch {marker}"}, "wait": True},
    ):
        refused = record.ask(PROGRAM, workspace, request)
        assert "not a recording call" in refused["problem"]
    assert not marker.exists()
    # A call is reached by its name: the recorder runs its table's function with the request's args.
    request = {"op": "call", "call": Call.PIPELINE_PARENT_RUN.value, "args": {}, "wait": True}
    answer = record.ask(PROGRAM, workspace, request)
    assert "not a recording call" not in answer["problem"] and "uri" in answer["problem"]


def test_a_workspace_made_again_at_the_same_path_has_its_runs_recorded(bed: dict[str, Any], tmp_path: Path) -> None:
    """The recorder lives on between workspaces: a workspace deleted and made again where it was (a
    fresh clone, a test's folder) gets a new ``mlflow.db``, which the recorder must open, not the
    deleted one its connections still held."""
    from jupyter_remote_compute.recording.tracking import close_stores

    root = tmp_path / "again"
    env = {name: value for name, value in bed["env"].items() if name != "MLFLOW_TRACKING_URI"}
    env["PATH"] = os.environ["PATH"]
    first = None
    for _ in range(3):
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(QUICKSTART, root, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "jobs*"))
        cli = _cli(bed, "run", "--new", "--", "true", cwd=root, env=env)
        _, err = cli.communicate(timeout=180)
        assert cli.returncode == 0, err
        first = first or _recorder_pid(bed)
        assert _recorder_pid(bed) == first
        (job_id,) = JobStore(root / ".punica/jobs.json").jobs()
        run_id = JobStore(root / ".punica/jobs.json").get(job_id).mlflow_run_id
        close_stores()  # this test's own reads hold connections too
        uri = f"sqlite:///{root / 'mlflow.db'}"  # the workspace's own store: no MLFLOW_TRACKING_URI
        assert run_id and [r.info.run_id for r in job_runs(uri, job_id)] == [run_id], err


def test_a_model_registered_again_in_a_workspace_made_again_at_the_same_path_is_registered_there(
    bed: dict[str, Any], tmp_path: Path
) -> None:
    """The model registry keeps database connections of its own: the deleted store's registered model
    must not stand in for the new store's (the recorder's replay failed "Registered Model … not found")."""
    import mlflow

    from jupyter_remote_compute.recording.tracking import close_stores

    root = tmp_path / "again"
    env = {name: value for name, value in bed["env"].items() if name != "MLFLOW_TRACKING_URI"}
    env["PATH"] = os.environ["PATH"]
    for _ in range(2):
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(QUICKSTART, root, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "jobs*"))
        (root / "register.py").write_text(REGISTERING_SCRIPT)
        cli = _cli(bed, "run", "--new", "--send", "register.py", "--", "python", "register.py", cwd=root, env=env)
        out, err = cli.communicate(timeout=180)
        assert cli.returncode == 0, (out, err)
        (job_id,) = JobStore(root / ".punica/jobs.json").jobs()
        job = JobStore(root / ".punica/jobs.json").get(job_id)
        close_stores()  # this test's own reads hold connections too
        client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
        assert job.mlflow_run_id, job.reason
        (version,) = client.search_model_versions("name = 'again'")
        assert version.run_id == job.mlflow_run_id
        assert client.get_model_version_by_alias("again", "champion").version == version.version
    close_stores()
