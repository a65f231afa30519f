"""A job across two nodes of a real Slurm cluster on this machine, each node a network namespace with its
own address and hostname (tests/slurm_nodes.py): torchrun on both, two processes on each all-reducing over gloo;
one node going down ending the job, that node named; Slurm's warning before the time limit reaching both."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sshd_fixture
from far_python import far_python_bin, far_torch_bin
from filelock import FileLock
from required import require
from slurm_fixture import SlurmBed, slurm_installed, slurm_service, start_slurm_bed
from slurm_nodes import LOCK
from test_slurm_ranks import ALL_REDUCE_SCRIPT
from waiting import wait_for

from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed


@pytest.fixture(scope="module")
def two_nodes(sshd_bed: sshd_fixture.TestBed) -> Iterator[SlurmBed]:
    require(slurm_installed(), "Slurm (apt-get install slurmctld slurmd munge slurm-client)")
    require(os.geteuid() == 0, "root, for the nodes' network namespaces, munged and slurmd")
    with FileLock(LOCK, timeout=600):
        bed = start_slurm_bed(sshd_bed, node_count=2)
        try:
            yield bed
        finally:
            bed.stop()


@pytest.fixture
def cluster(
    make_service: Callable[..., JobService], quickstart: Path, two_nodes: SlurmBed
) -> Iterator[tuple[JobService, SlurmBed]]:
    (quickstart / "reduce.py").write_text(ALL_REDUCE_SCRIPT)
    with slurm_service(make_service, quickstart, two_nodes, "pair") as service:
        yield service, two_nodes


def test_torchrun_on_two_nodes_of_two_processes_each(cluster, quickstart: Path) -> None:
    service, bed = cluster
    assert len(bed.nodes) == 2
    path = f"{far_torch_bin()}:{far_python_bin()}:/usr/local/bin:/usr/bin:/bin"
    spec = {
        "machine": "pair",
        "command": "python reduce.py",
        "send": ["reduce.py"],
        "bring_back": ["reduced"],
        "env": {"PATH": path},
        "resources": {"nodes": 2, "processes_per_node": 2, "launcher": "torchrun", "memory": "3G"},
        "timeout": "10m",
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=300)
    log = service.read_log(job.id).data.decode()
    assert job.state == "succeeded", (job.reason, log)
    seen = {int(p.stem): json.loads(p.read_text()) for p in (quickstart / "reduced").glob("*.json")}
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, env in seen.items():
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(rank), "4", str(rank % 2)), env
        assert env["sum"] == 10.0  # 1 + 2 + 3 + 4
    # Each node's processes say so in the log: two ranks on each of the two nodes.
    lines = [line for line in log.splitlines() if " reduced 10.0" in line]
    by_node = {node: sorted(line.split(" rank ")[1].split("]")[0] for line in lines if line.startswith(f"[{node} "))
               for node in bed.nodes}  # fmt: skip
    assert sorted(len(ranks) for ranks in by_node.values()) == [2, 2], lines
    assert sorted(r for ranks in by_node.values() for r in ranks) == ["0", "1", "2", "3"]
    # Usage counts both nodes' hours: a record line saying two nodes, and twice the job's hours summed.
    (attempt,) = [a for a in service.usage_record.attempts() if a.job == job.id]
    assert (attempt.nodes, attempt.gpus) == (2, 0)
    (row,) = service.usage("machine")["rows"]
    # Each sum is rounded to 6 places on its own: twice a rounded value may be 1.5e-6 off the other.
    assert row["node_hours"] == pytest.approx(2 * row["job_hours"], abs=2e-6) and row["job_hours"] > 0


def test_a_node_going_down_ends_the_job_on_both_nodes_lost_naming_that_node(cluster) -> None:
    service, bed = cluster
    spec = {"machine": "pair", "command": "echo up; sleep 300", "resources": {"nodes": 2, "launcher": "plain"}}
    job = service.submit(JobSpec.from_json(spec)).job

    def both_up() -> bool:
        service.driver.poll_active()
        return service.read_log(job.id).data.decode().count("] up") == 2

    wait_for(both_up, 60, "a process on each node")
    second = bed.nodes[1]
    down = ["scontrol", "update", f"nodename={second}", "state=down", "reason=jrc test: node failure"]
    try:
        subprocess.run(down, check=True, capture_output=True, env=bed.env)
        ended = service.wait(job.id, timeout=120)
    finally:
        # The node comes back by itself once its slurmd answers (ReturnToService=2): wait for it.
        wait_for(lambda: set(bed.node_state().split()) <= {"idle", "mixed", "allocated"}, 60, "the node to be back")
    log = service.read_log(job.id).data.decode()
    # The batch script ran on the first node, where Slurm's own line says the job was cancelled; srun
    # names the node that failed.
    assert ended.state == "lost" and ended.reason.startswith(f"lost: its node {second} failed: *** JOB "), (
        ended.state,
        ended.reason,
        log,
    )


#: A rank that says it is up, and ends when warned of the time limit (its sleep ends of the signal too).
WARNED_RANK = "trap 'echo warned; exit 0' USR1; echo up; while :; do sleep 1; done"


def test_the_time_limits_warning_reaches_the_process_on_each_node(cluster) -> None:
    service, bed = cluster
    spec = {"machine": "pair", "command": WARNED_RANK, "resources": {"nodes": 2, "launcher": "plain"}}
    job = service.submit(JobSpec.from_json(spec)).job

    def both_up() -> bool:
        service.driver.poll_active()
        return service.read_log(job.id).data.decode().count("] up") == 2

    wait_for(both_up, 60, "a process on each node")
    slurm_id = service.get(job.id).handle["slurm_job_id"]
    bed.run(["scancel", "--signal=USR1", "--batch", slurm_id])  # what --signal=B:USR1@N sends before the limit
    ended = service.wait(job.id, timeout=60)
    log = service.read_log(job.id).data.decode()
    assert ended.state == "succeeded", (ended.state, ended.reason, log)
    assert "time limit is near; the job will be stopped soon (sent USR1 to every process of the job)" in log, log
    assert sorted(line.split(" rank ")[0] for line in log.splitlines() if line.endswith("] warned")) == [
        f"[{node}" for node in bed.nodes
    ], log


#: torchrun on every node but the first never starts: as a node stuck before the rendezvous would be.
#: rank.sh has set the node's NODE_RANK (Slurm's, or an ssh host list's) before it runs torchrun.
STUCK_TORCHRUN = """\
#!/bin/sh
if [ "${{NODE_RANK:-0}}" != 0 ]; then exec sleep 300; fi
exec {torchrun} "$@"
"""


def stuck_torchrun(workspace: Path, machine: str) -> dict:
    """A job on ``machine`` of one torchrun process on each of two nodes, ``reduce.py``, with STUCK_TORCHRUN
    (``stuck/torchrun`` in the workspace, sent with the job) first on its PATH."""
    wrapper = workspace / "stuck" / "torchrun"
    wrapper.parent.mkdir()
    wrapper.write_text(STUCK_TORCHRUN.format(torchrun=far_torch_bin() / "torchrun"))
    wrapper.chmod(0o755)
    return {
        "machine": machine,
        "command": "python reduce.py",
        "send": ["reduce.py", "stuck"],
        # "stuck" is found from the job's work folder, where rank.sh runs on every node.
        "env": {"PATH": f"stuck:{far_torch_bin()}:{far_python_bin()}:/usr/local/bin:/usr/bin:/bin"},
        "resources": {"nodes": 2, "processes_per_node": 1, "launcher": "torchrun"},
        "timeout": "10m",
    }


def test_a_rendezvous_a_node_never_joins_fails_in_the_machines_limit_naming_that_node(
    cluster, quickstart: Path
) -> None:
    service, bed = cluster
    service.machines.add("pair-10s", "slurm", "127.0.0.1", bed.machine_options(rendezvous_timeout=10))
    spec = stuck_torchrun(quickstart, "pair-10s")
    spec["resources"]["memory"] = "2G"
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=180)
    log = service.read_log(job.id).data.decode()
    first, second = bed.nodes
    assert (job.state, job.exit_code) == ("failed", 1), (job.state, job.exit_code, job.reason, log)  # torchrun's
    assert job.reason.startswith("exit code 1: jupyter-remote-compute: the rendezvous at "), job.reason
    assert f"did not complete within 10s: {second} never joined;" in job.reason, (job.reason, log)
    assert first not in job.reason.split("never joined")[0].split("10s:")[1], job.reason
    assert f"[{first}] torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError" in log, log
