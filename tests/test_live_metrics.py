"""Live training metrics: what a running job logs to MLflow on its machine, seen before it ends.

Real jobs log with real MLflow into their far-side file store and then wait on a file the test
creates, so every point asserted here was read while the job still ran. The far side is the
built-in machine and a real sshd (sshd_fixture.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import jupyter_server_fixture
import pytest
import sshd_fixture
from waiting import wait_for

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.engines.base import RemoteJob
from jupyter_remote_compute.engines.local import LocalEngine
from jupyter_remote_compute.jobs.metrics import MetricWatch, parse_points
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
remote_server = jupyter_server_fixture.remote_server

# Logs four points, waits until the test says go, then logs a last one and ends. "acc/top 1" comes
# first: a poll that has seen the third loss point has then seen it too.
TRAIN = """\
import os, time
import mlflow
with mlflow.start_run():
    mlflow.log_metric("acc/top 1", 0.5, step=0)
    for step in range(3):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    print("logged", flush=True)
    while not os.path.exists("go"):
        time.sleep(0.05)
    mlflow.log_metric("loss", 0.125, step=3)
print("trained", flush=True)
"""


def _points(page, key="loss"):  # type: ignore[no-untyped-def]
    return [(p.step, p.value) for p in page.points if p.key == key]


def _watch_until(service, job_id: str, count: int):  # type: ignore[no-untyped-def]
    """Ask for the job's metrics (which marks it watched) and drive it until ``count`` loss points came."""

    def seen():  # type: ignore[no-untyped-def]
        service.advance(job_id)
        page, _ = service.read_metrics(job_id)
        return page if len(_points(page)) >= count else None

    return wait_for(seen, timeout=180, message=f"{count} loss points of job {job_id}", interval=0.1)


def _train_while_watched(service, machine: str, far_dir) -> None:  # type: ignore[no-untyped-def]
    spec = JobSpec.from_json({"machine": machine, "command": "python train.py", "send": ["train.py"]})
    job = service.submit(spec).job
    page = _watch_until(service, job.id, 3)
    # Seen while the job still runs: it waits for the go file this test has not made yet.
    assert service.get(job.id).state == "running"
    assert _points(page) == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert _points(page, "acc/top 1") == [(0, 0.5)]  # a key with a slash and a space
    assert all(p.timestamp > 1_600_000_000_000 for p in page.points)
    # Read incrementally: the cursor asks only for what came after it.
    again, active = service.read_metrics(job.id, page.cursor)
    assert active and again.points == [] and not again.reset

    (far_dir(service.get(job.id)) / "work" / "go").write_text("")
    done = service.wait(job.id, timeout=180)
    assert done.state == "succeeded", done.reason
    # The poll that saw the job end brought the point it logged last, and only that.
    last, active = service.read_metrics(job.id, page.cursor)
    assert not active and _points(last) == [(3, 0.125)]


def test_a_local_jobs_metrics_are_seen_while_it_runs(workspace, make_service):
    (workspace / "train.py").write_text(TRAIN)
    service = make_service(workspace)
    _train_while_watched(service, "local", lambda job: Path(job.handle["dir"]))


def test_an_ssh_jobs_metrics_are_seen_while_it_runs(workspace, make_service, ssh_agent_env):
    (workspace / "train.py").write_text(TRAIN)
    service = make_service(workspace)
    service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options())
    # Same machine: the far side's folder is reachable from here.
    _train_while_watched(service, "box", lambda job: Path(job.handle["dir"]))


def _store(root: Path, files: dict[str, bytes]) -> RemoteJob:
    """A job directory with an MLflow file store holding ``files`` (paths under mlruns/)."""
    root.mkdir(parents=True)
    (root / "exit_code").write_text("0\n")
    for rel, data in files.items():
        path = root / "mlruns" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return RemoteJob(root.name, "k", {"dir": str(root)})


def test_the_status_round_trip_brings_only_new_bytes_of_watched_jobs(tmp_path, scratch_dir):
    from jupyter_remote_compute.engines.base import EngineContext

    engine = LocalEngine("local", "", {}, EngineContext(lambda name: None, scratch_dir))
    watched = _store(tmp_path / "a", {"0/r1/metrics/loss": b"1 0.5 0\n2 0.25 1\n", "0/r1/params/p": b"x"})
    other = _store(tmp_path / "b", {"0/r2/metrics/loss": b"1 9 0\n"})

    # No one watches: the plain status, nothing of any store.
    statuses, found = engine.poll_watched([watched, other], {})
    assert found == {} and statuses["a"].state == "exited"
    # One job watched: only its run metrics, never a param, never the other job's.
    _, found = engine.poll_watched([watched, other], {"a": {}})
    assert found == {"a": {"0/r1/metrics/loss": (0, b"1 0.5 0\n2 0.25 1\n")}}
    # From an offset: only the bytes after it; a file that did not grow is not sent at all.
    _, found = engine.poll_watched([watched, other], {"a": {"0/r1/metrics/loss": 8}})
    assert found == {"a": {"0/r1/metrics/loss": (8, b"2 0.25 1\n")}}
    _, found = engine.poll_watched([watched], {"a": {"0/r1/metrics/loss": 17}})
    assert found == {}


def test_a_half_written_line_waits_for_its_end(tmp_path):
    watch = MetricWatch()
    watch.watch("j")
    watch.absorb({"j": {"0/r/metrics/loss": (0, b"1 0.5 0\n2 0.2")}})
    page = watch.read("j", None)
    assert [(p.step, p.value) for p in page.points] == [(0, 0.5)]
    # The next read starts at the unfinished line, so it is parsed whole.
    assert watch.watched(["j"]) == {"j": {"0/r/metrics/loss": 8}}
    watch.absorb({"j": {"0/r/metrics/loss": (8, b"2 0.25 1\n3 nan 2\n")}})
    later = watch.read("j", page.cursor)
    assert [(p.step, p.value) for p in later.points] == [(1, 0.25), (2, None)]  # NaN has no JSON form
    # An answer to an older question (bytes from an offset already passed) is not counted twice.
    watch.absorb({"j": {"0/r/metrics/loss": (0, b"1 0.5 0\n")}})
    assert watch.read("j", later.cursor).points == []
    # A cursor of another series (a restarted server) is answered from the start.
    assert watch.read("j", "feedface.2").reset
    assert parse_points("0/models/m/metrics", b"1 1 1\n") == ([], 6)


def test_watching_ends_when_no_one_asks(tmp_path):
    now = [0.0]
    watch = MetricWatch(clock=lambda: now[0])
    watch.watch("j", seconds=60)
    assert "j" in watch.watched(["j", "k"]) and "k" not in watch.watched(["j", "k"])
    now[0] = 61.0
    assert watch.watched(["j"]) == {}


def test_status_without_metrics_reads_no_stdin(tmp_path):
    # Run by hand or by an older caller, the plain status never waits on its standard input.
    job = _store(tmp_path / "a", {"0/r/metrics/loss": b"1 1 0\n"})
    argv = farside.argv("status", job.handle["dir"])
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        out = proc.stdout.read()  # ends when the script does, its stdin still open
        proc.wait(timeout=30)
        assert proc.stdin is not None
        proc.stdin.close()
    assert out == b"0 exited 0\n"


def test_a_jupyter_machines_poll_brings_watched_metrics(remote_server, tmp_path):
    from jupyter_remote_compute.engines.base import EngineContext, LaunchSpec
    from jupyter_remote_compute.engines.jupyter import JupyterEngine

    context = EngineContext(get_secret=lambda name: remote_server.token, scratch_dir=tmp_path)
    engine = JupyterEngine("far", remote_server.url, {"token_secret": "compute/remote"}, context)
    # Written as MLflow's file store writes a point, then the job waits: it is still running when polled.
    command = (
        "mkdir -p ../mlruns/0/r1/metrics && printf '5 0.75 0\\n' > ../mlruns/0/r1/metrics/loss; "
        "while [ ! -f go ]; do sleep 0.05; done"
    )
    try:
        job = engine.prepare(RemoteJob("live-metrics", "k", {}))
        job = engine.start(job, LaunchSpec(command, {}, {}))

        def brought():  # type: ignore[no-untyped-def]
            statuses, found = engine.poll_watched([job], {job.job_id: {}})
            return (statuses, found) if found else None

        statuses, found = wait_for(brought, 60, message="the metric through the kernel")
        assert statuses[job.job_id].state == "running"
        assert found == {job.job_id: {"0/r1/metrics/loss": (0, b"5 0.75 0\n")}}
        # Past what was read nothing comes, and an unwatched poll brings no metrics at all.
        assert engine.poll_watched([job], {job.job_id: {"0/r1/metrics/loss": 9}})[1] == {}
        assert engine.poll_watched([job], {})[1] == {}
        (Path(job.handle["abs_dir"]) / "work" / "go").write_text("")
        wait_for(lambda: engine.poll([job])[job.job_id].state == "exited", 60, message="exit")
        engine.cleanup(job)
    finally:
        engine.close()
