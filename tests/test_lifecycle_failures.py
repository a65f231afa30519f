"""What happens when things go wrong mid-job: crashes, unreachable machines, hostile far sides, secrets."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest
from conftest import job_runs
from mlflow.tracking import MlflowClient
from waiting import wait_for

from jupyter_remote_compute.engines.base import EngineError, FetchResult
from jupyter_remote_compute.engines.local import LocalEngine
from jupyter_remote_compute.errors import NotFound
from jupyter_remote_compute.jobs import collect, leases, logs
from jupyter_remote_compute.jobs.spec import JobSpec

DEAD_PROCESS = {"host": os.uname().nodename, "pid": 2**22 + 7, "start": "0"}


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs, no handler catches it."""


def test_a_crash_between_start_and_recording_it_does_not_start_the_command_twice(
    workspace, make_service, monkeypatch, tmp_path
):
    counter = tmp_path / "starts"
    service = make_service(workspace)
    job = service.submit(JobSpec.from_json({"command": f"echo started >> {counter}; sleep 30"})).job
    real_start = LocalEngine.start

    def start_then_die(self, job, launch):  # type: ignore[no-untyped-def]
        real_start(self, job, launch)
        raise Crash

    monkeypatch.setattr(LocalEngine, "start", start_then_die)
    with pytest.raises(Crash):
        service.advance(job.id)
    monkeypatch.setattr(LocalEngine, "start", real_start)
    with service.store.transaction() as jobs:  # the process that held the lease is gone
        jobs[job.id].lease = dict(DEAD_PROCESS)
    assert service.advance(job.id).state == "running"
    wait_for(counter.exists, message="the command to start")
    assert counter.read_text() == "started\n"
    service.cancel(job.id)
    assert counter.read_text() == "started\n"


def test_a_machine_unreachable_during_collection_ends_the_job_after_the_grace(workspace, make_service, monkeypatch):
    service = make_service(workspace)
    service.settings = dataclasses.replace(service.settings, give_up_after=0.3)
    job = service.submit(JobSpec.from_json({"command": "echo hi > out.txt", "bring_back": ["out.txt"]})).job

    def unreachable(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise EngineError("connection refused", transient=True)

    monkeypatch.setattr(LocalEngine, "fetch", unreachable)
    job = service.wait(job.id, timeout=30)
    assert job.state == "lost"
    assert "could not collect from local" in job.reason and "connection refused" in job.reason
    service.delete(job.id)  # a job that ended can be removed


def test_an_output_that_cannot_land_fails_the_job_and_nothing_partial_lands(workspace, make_service):
    (workspace / "b.txt").mkdir()  # a folder where the job's second output would go
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "echo a > a.txt; echo b > b.txt", "bring_back": ["a.txt", "b.txt"]})
    job = service.wait(service.submit(spec).job.id, timeout=60)
    assert job.state == "failed"
    assert job.reason == "output b.txt cannot land: a folder of that name is in the workspace"
    assert not (workspace / "a.txt").exists()


def test_an_output_path_that_climbs_out_is_refused(tmp_path):
    incoming = tmp_path / "incoming"
    (incoming / "work/out").mkdir(parents=True)
    result = FetchResult(digests={"out/a": "0" * 64, "out/../../evil": "0" * 64})
    verified, problem = collect._verify(incoming, ["out"], result)
    assert verified == {} and "not allowed" in problem


@pytest.fixture
def secret_value(make_service, workspace):  # type: ignore[no-untyped-def]
    value = "tok-" + os.urandom(12).hex()
    make_service(workspace).secrets.set("failures/token", value)
    return value


def test_a_secret_split_across_log_chunks_is_still_masked(workspace, make_service, secret_value, monkeypatch):
    monkeypatch.setattr(logs, "LOG_CHUNK", 4096)
    service = make_service(workspace)
    # The secret starts 10 bytes before a chunk boundary; then the job fails, so its log tail is the reason.
    script = "printf '%4086s' '' ; printf '%s\\n' \"$TOKEN\"; exit 2\n"
    (workspace / "leak.sh").write_text(script)
    spec = JobSpec.from_json({"command": "sh leak.sh", "send": ["leak.sh"], "env": {"TOKEN": "secret:failures/token"}})
    job = service.wait(service.submit(spec).job.id, timeout=60)
    assert job.state == "failed"
    collected = (workspace / ".punica/jobs" / job.id / "log").read_bytes()
    assert secret_value.encode() not in collected and b"*" * len(secret_value) in collected
    assert secret_value not in job.reason
    assert secret_value.encode() not in (workspace / ".punica/jobs.json").read_bytes()
    assert secret_value.encode() not in (workspace / ".punica/jobs.json.journal").read_bytes()


def test_a_live_log_read_in_small_pieces_never_shows_a_secret(workspace, make_service, secret_value):
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": 'echo "key=$TOKEN"; sleep 30', "env": {"TOKEN": "secret:failures/token"}})
    job = service.submit(spec).job
    service.advance(job.id)
    wait_for(lambda: service.read_log(job.id, 0).data.startswith(b"key="), message="the log line")
    seen = b""
    offset = 0
    while chunk := service.read_log(job.id, offset, limit=4).data:
        seen += chunk
        offset += len(chunk)
    assert seen == b"key=" + b"*" * len(secret_value) + b"\n"
    service.cancel(job.id)


def test_when_a_secret_cannot_be_read_to_mask_the_log_the_log_is_withheld(
    workspace, make_service, secret_value, tracking_uri, scratch_dir
):
    service = make_service(workspace)
    (workspace / "job.sh").write_text('echo "key=$TOKEN"; while [ ! -f go ]; do sleep 0.05; done\n')
    spec = JobSpec.from_json({"command": "sh job.sh", "send": ["job.sh"], "env": {"TOKEN": "secret:failures/token"}})
    job = service.submit(spec).job
    service.advance(job.id)
    wait_for(lambda: b"key=" in service.read_log(job.id).data, message="the job to print")
    service.secrets.delete("failures/token")  # rotated away while the job ran
    Path(service.get(job.id).handle["dir"], "work", "go").write_text("")
    job = service.wait(job.id, timeout=60)
    assert job.state == "succeeded"
    collected = (workspace / ".punica/jobs" / job.id / "log").read_bytes()
    assert collected == logs.WITHHELD_LOG
    client = MlflowClient(tracking_uri)
    log_artifact = client.download_artifacts(job.mlflow_run_id, "remote_compute/log")
    assert secret_value.encode() not in Path(log_artifact).read_bytes()


def test_a_secret_the_job_logs_to_mlflow_is_hidden_in_the_local_run(
    workspace, make_service, secret_value, tracking_uri, scratch_dir
):
    (workspace / "log_it.py").write_text(
        "import os, mlflow\nwith mlflow.start_run():\n    mlflow.log_param('api', os.environ['TOKEN'])\n"
        "    mlflow.set_tag('who', 'uses ' + os.environ['TOKEN'])\n"
    )
    service = make_service(workspace)
    spec = JobSpec.from_json(
        {"command": "python log_it.py", "send": ["log_it.py"], "env": {"TOKEN": "secret:failures/token"}}
    )
    job = service.wait(service.submit(spec).job.id, timeout=120)
    assert job.state == "succeeded", job.reason
    run = MlflowClient(tracking_uri).get_run(job.mlflow_run_id)
    assert run.data.params["api"] == "*" * len(secret_value)
    assert secret_value not in run.data.tags["who"]


def test_a_cancelled_job_is_not_attached_to(workspace, make_service):
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "sleep 30"})
    first = service.submit(spec).job
    with service.store.transaction() as jobs:  # cancel asked, not yet carried out
        jobs[first.id].cancel_requested = "user"
    second = service.submit(spec)
    assert not second.attached and second.job.id != first.id


def test_a_lease_from_another_host_is_taken_over_only_once_it_went_stale(workspace, make_service):
    """A pod that came back under a new name must not leave its jobs stuck; a live one keeps them."""
    import time

    service = make_service(workspace)
    job = service.submit(JobSpec.from_json({"command": "echo hi"})).job
    elsewhere = {"host": "another-pod", "pid": 1, "start": "1"}
    with service.store.transaction() as jobs:
        jobs[job.id].lease = {**elsewhere, "renewed": time.time()}
    assert service.advance(job.id).state == "queued"  # its holder renewed it just now
    with service.store.transaction() as jobs:
        jobs[job.id].lease = {**elsewhere, "renewed": time.time() - 3600}
    assert service.wait(job.id, timeout=60).state == "succeeded"


def test_a_long_send_keeps_renewing_its_lease(workspace, make_service, monkeypatch):
    monkeypatch.setattr(leases, "LEASE_RENEW_EVERY", 0.0)
    (workspace / "big.bin").write_bytes(os.urandom(8 << 20))
    service = make_service(workspace)
    job = service.submit(JobSpec.from_json({"command": "true", "send": ["big.bin"]})).job
    renewals = []
    real_renewer = service.leases.renewer

    def spying_renewer(job_id, then=None):  # type: ignore[no-untyped-def]
        inner = real_renewer(job_id, then)

        def renew(done: int, total: int) -> None:
            inner(done, total)
            renewals.append(service.store.get(job_id).lease["renewed"])

        return renew

    monkeypatch.setattr(service.leases, "renewer", spying_renewer)
    assert service.wait(job.id, timeout=60).state == "succeeded"
    assert len(renewals) >= 8 and renewals == sorted(renewals) and renewals[-1] > renewals[0]


def test_far_side_records_are_withheld_when_a_secret_cannot_be_read_to_mask_them(
    workspace, make_service, secret_value, tracking_uri, scratch_dir
):
    """A job logged its secret as an MLflow param; the secret is gone before collection: nothing the
    far side logged is replayed, so the value reaches neither the run nor the store (fail closed)."""
    service = make_service(workspace)
    script = (
        "import os, pathlib, time, mlflow\n"
        "mlflow.log_param('token', os.environ['TOKEN'])\n"
        "mlflow.log_metric('loss', 0.5)\n"
        "while not pathlib.Path('go').exists():\n"
        "    time.sleep(0.05)\n"
    )
    (workspace / "leak.py").write_text(script)
    spec = JobSpec.from_json(
        {"command": "python leak.py", "send": ["leak.py"], "env": {"TOKEN": "secret:failures/token"}}
    )
    job = service.submit(spec).job
    service.advance(job.id)  # sent and started
    far = Path(scratch_dir)  # the local machine's job folders
    wait_for(lambda: list(far.rglob("params/token")), 120, "the job to log its param on the far side")
    service.secrets.delete("failures/token")  # gone behind the service's back: it cannot be read to mask
    for go in far.rglob("leak.py"):
        (go.parent / "go").touch()
    job = service.wait(job.id, timeout=120)
    (run,) = job_runs(tracking_uri, job.id)
    assert "token" not in run.data.params and "loss" not in run.data.metrics
    assert "withheld" in run.data.tags["remote_compute.reason"]
    assert secret_value not in repr(run.data)
    store = Path(tracking_uri.removeprefix("sqlite:///"))
    assert secret_value.encode() not in store.read_bytes()


def test_a_job_removed_from_the_state_file_while_collected_is_let_go_quietly(
    workspace, make_service, monkeypatch, caplog
):
    # Another process deleted the state file (or the workspace) while this one was fetching.
    service = make_service(workspace)
    job = service.submit(JobSpec.from_json({"command": "echo hi > out.txt", "bring_back": ["out.txt"]})).job
    real_fetch = LocalEngine.fetch

    def fetch_then_forget(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = real_fetch(self, *args, **kwargs)
        with service.store.transaction() as jobs:
            del jobs[job.id]
        return result

    monkeypatch.setattr(LocalEngine, "fetch", fetch_then_forget)

    def gone() -> bool:
        try:
            service.advance(job.id)
        except NotFound:
            return True
        return False

    wait_for(gone, message="the job to be fetched and forgotten")
    assert job.id not in service.store.jobs()  # not written back by the driver that held it
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
