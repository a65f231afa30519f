"""The ``slurm`` kind end to end on a real single-node cluster (tests/slurm_fixture.py), through the
service every face uses: submitted over the login node's sshd, placed by Slurm, collected and verified."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import slurm_fixture
import sshd_fixture
from conftest import job_runs
from slurm_fixture import SlurmBed
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.service import JobService, require_trained
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
slurm_bed = slurm_fixture.slurm_bed


@pytest.fixture
def cluster(
    make_service: Callable[..., JobService], quickstart: Path, slurm_bed: SlurmBed
) -> Iterator[tuple[JobService, SlurmBed]]:
    service = make_service(quickstart)
    service.machines.add("hpc", "slurm", "127.0.0.1", slurm_bed.machine_options())
    yield service, slurm_bed
    service.close()
    slurm_bed.cancel_all()


def submit(service: JobService, **spec: object) -> Job:
    return service.submit(JobSpec.from_json({"machine": "hpc", **spec})).job


def reach(service: JobService, job_id: str, check: Callable[[Job], bool], what: str, timeout: float = 60) -> Job:
    """Drive the job (as the server's poller would) until ``check`` holds."""

    def reached() -> Job | None:
        service.driver.poll_active()
        job = service.get(job_id)
        return job if check(job) else None

    return wait_for(reached, timeout, what, interval=0.3)


def test_quickstart_runs_through_slurm_and_its_outputs_and_run_land(
    cluster, quickstart: Path, tracking_uri: str
) -> None:
    service, bed = cluster
    job = submit(
        service,
        command="python train.py && echo node=$SLURMD_NODENAME world=$WORLD_SIZE rank=$NODE_RANK",
        send=["train.py", "data/*.csv"],
        bring_back=["model.pkl", "metrics.json"],
        # A training script with MLflow, scikit-learn and pandas beside it: well over 128M at import.
        resources={"cpus": 1, "memory": "512M"},
        timeout="10m",
    )
    job = service.wait(job.id, timeout=180)
    assert job.state == "succeeded", job.reason
    require_trained(job)
    slurm_id = job.handle["slurm_job_id"]
    assert slurm_id.isdigit()
    for output in ("model.pkl", "metrics.json"):
        assert job.outputs[output]["sha256"] == hashlib.sha256((quickstart / output).read_bytes()).hexdigest()
    log = service.read_log(job.id).data.decode()
    assert f"Slurm job {slurm_id} on {bed.node}" in log
    assert f"node={bed.node} world=1 rank=0" in log
    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].data.tags["remote_compute.engine"] == "slurm"
    # What Slurm was asked for is what the job said (scontrol still knows it: MinJobAge).
    shown = bed.run(["scontrol", "show", "job", slurm_id]).stdout
    assert "NumCPUs=1" in shown and "TimeLimit=00:10:00" in shown and f"Name=jrc-{job.id}" in shown


def test_secrets_reach_the_job_but_not_slurms_saved_environment(cluster, quickstart: Path) -> None:
    service, bed = cluster
    service.secrets.set("hpc/token", "s3cr3t-" + "q" * 24)
    job = submit(
        service,
        command='test "$TOKEN" = "s3cr3t-$(printf "q%.0s" $(seq 24))" && echo PLAIN=$PLAIN '
        '"defaults=$PYTHONFAULTHANDLER,$MLFLOW_DISABLE_TELEMETRY"',
        env={"TOKEN": "secret:hpc/token", "PLAIN": "visible"},
    )
    job = service.wait(job.id, timeout=120)
    assert job.state == "succeeded", job.reason
    # The batch script sets the job environment's defaults as the launcher does (launcher.JOB_ENV_SH).
    assert "PLAIN=visible defaults=1,true" in service.read_log(job.id).data.decode()
    slurm_id = job.handle["slurm_job_id"]
    saved = bed.run(["scontrol", "show", "job", "--details", slurm_id]).stdout
    assert "s3cr3t" not in saved
    job_dir = Path(bed.far_path(job.handle["dir"].removeprefix(str(bed.user_home) + "/")))
    assert not (job_dir / "secrets.env").exists()  # batch.sh removed it as it started


def test_pending_behind_a_job_holding_every_cpu_with_its_reason_then_running(cluster) -> None:
    service, bed = cluster
    hog = submit(service, command="sleep 300", resources={"cpus": bed.cpus}, name="hog")  # cancelled below
    hog = reach(service, hog.id, lambda j: j.state == "running", "the first job to run")
    waiter = submit(service, command="echo second ran", resources={"cpus": bed.cpus}, name="waiter")
    waiter = reach(
        service,
        waiter.id,
        lambda j: j.state == "pending" and j.reason != "waiting for the scheduler",
        "the second to wait with a reason",
    )
    assert "resources" in waiter.reason.lower() or "priority" in waiter.reason.lower(), waiter.reason
    assert [j.id for j in service.list_jobs(state="pending")] == [waiter.id]
    # Someone following it (the CLI, the magic, a step) hears why it waits, once per reason.
    heard: list[Job] = []
    still = service.wait(waiter.id, timeout=2, on_wait=heard.append)
    assert still.state == "pending" and [(j.state, j.reason) for j in heard] == [("pending", waiter.reason)]
    service.cancel(hog.id)
    hog = reach(service, hog.id, lambda j: j.state == "cancelled", "the first job to be cancelled")
    waiter = service.wait(waiter.id, timeout=120)
    assert waiter.state == "succeeded", waiter.reason
    assert "second ran" in service.read_log(waiter.id).data.decode()


def test_cancel_a_pending_and_a_running_job(cluster) -> None:
    service, bed = cluster
    running = submit(
        service, command="trap 'echo got TERM; exit 143' TERM; sleep 300 & wait", resources={"cpus": bed.cpus}
    )
    running = reach(service, running.id, lambda j: j.state == "running", "a job to run")
    pending = submit(service, command="echo never", resources={"cpus": bed.cpus})
    pending = reach(service, pending.id, lambda j: j.state == "pending", "a job to wait")
    for job in (pending, running):
        service.cancel(job.id)
        ended = reach(service, job.id, lambda j: j.state == "cancelled", f"job {job.id} to be cancelled")
        slurm_id = ended.handle["slurm_job_id"]
        state = bed.run(["squeue", "--noheader", "--states=all", f"--jobs={slurm_id}", "--format=%T"]).stdout.strip()
        assert state in ("CANCELLED", ""), state
    assert "never" not in service.read_log(pending.id).data.decode()


def test_a_nonzero_exit_is_the_commands_code(cluster) -> None:
    service, _ = cluster
    job = service.wait(submit(service, command="echo about to fail; exit 7").id, timeout=120)
    assert job.state == "failed" and job.exit_code == 7, (job.state, job.exit_code, job.reason)
    assert "about to fail" in (job.reason or "") or "7" in (job.reason or "")


def test_more_cpus_than_any_node_has_is_refused_at_submit(cluster) -> None:
    service, bed = cluster
    with pytest.raises(InvalidSettings) as e:
        submit(service, command="true", resources={"cpus": bed.cpus + 1})
    assert e.value.field == "resources.cpus"
    assert f"{bed.cpus + 1} asked" in str(e.value) and repr(bed.partition) in str(e.value)
    with pytest.raises(InvalidSettings) as e:
        submit(service, command="true", resources={"partition": "nosuch"})
    assert e.value.field == "resources.partition" and "debug" in str(e.value)
    assert service.list_jobs() == []


def test_check_reports_the_cluster(cluster) -> None:
    service, bed = cluster
    facts = service.admin.check("hpc")
    assert facts["slurm_version"].startswith(("2", "1"))
    (partition,) = [p for p in facts["partitions"] if p["name"] == bed.partition]
    assert partition["cpus_per_node"] == bed.cpus and partition["nodes"] == 1
    assert facts["cpus"] >= 1 and "os" in facts  # the login node's own facts, as every kind reports


def test_a_pending_job_is_picked_up_by_a_restarted_server(
    cluster, make_service: Callable[..., JobService], quickstart: Path
) -> None:
    service, bed = cluster
    hog = submit(service, command="sleep 60", resources={"cpus": bed.cpus})
    reach(service, hog.id, lambda j: j.state == "running", "the first job to run")
    waiter = submit(service, command="echo ran after the restart", resources={"cpus": bed.cpus})
    reach(service, waiter.id, lambda j: j.state == "pending", "the second to wait")
    service.close()  # this side goes away; Slurm keeps both jobs

    again = make_service(quickstart)  # a new server over the same workspace: only the state file links them
    assert again.get(waiter.id).state == "pending"
    again.cancel(hog.id)
    reach(again, hog.id, lambda j: j.state == "cancelled", "the first job to be cancelled")
    waiter = reach(again, waiter.id, lambda j: j.state == "succeeded", "the waiting job to run and succeed", 120)
    assert "ran after the restart" in again.read_log(waiter.id).data.decode()


def test_a_job_over_its_memory_limit_fails_saying_so(cluster) -> None:
    service, _ = cluster
    # The bed samples memory every second (jobacct_gather/linux) and OverMemoryKill ends the job.
    grab = "python3 -c 'import time; b = bytearray(300 * 1024 * 1024); time.sleep(60)'"
    job = submit(service, command=grab, resources={"memory": "64M"})
    job = service.wait(job.id, timeout=120)
    assert job.state == "failed", (job.state, job.reason)
    assert (job.reason or "").startswith("out of memory: the job exceeded its 64M limit"), job.reason


def test_slurms_queue_start_and_end_times_are_kept_on_the_job(cluster) -> None:
    service, _ = cluster
    before = time.time()
    job = submit(service, command="sleep 2")
    job = service.wait(job.id, timeout=120)
    assert job.state == "succeeded", job.reason
    times = job.times
    assert set(times) == {"queued_at", "started_at", "ended_at"}, times
    # Slurm's clock is this machine's, in whole seconds.
    assert before - 1 <= times["queued_at"] <= times["started_at"] <= times["ended_at"] <= time.time() + 1
    assert times["ended_at"] - times["started_at"] >= 2  # the job's own run, not our polling's
    assert service.get(job.id).to_json()["times"] == times  # stored in the state file, not only in memory
