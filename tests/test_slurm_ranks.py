"""A job of several processes on the real Slurm bed (tests/slurm_fixture.py): every rank's place in
its environment, the log's lines prefixed by node and rank, one MLflow run (rank 0's); and the kinds
that run one process refusing such a job at submit, naming the field."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import slurm_fixture
import sshd_fixture
from conftest import job_runs
from far_python import far_python_bin, far_torch_bin
from slurm_fixture import SlurmBed, slurm_service
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
slurm_bed = slurm_fixture.slurm_bed

#: Each rank writes where it is to ranks_seen/<RANK>.json and logs one MLflow run with its rank.
RANK_SCRIPT = """\
import json, os, socket
import mlflow

names = ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NNODES", "MASTER_ADDR", "MASTER_PORT")
seen = {name: os.environ.get(name) for name in names}
seen["host"] = socket.gethostname()
os.makedirs("ranks_seen", exist_ok=True)
with open(f"ranks_seen/{seen['RANK']}.json", "w") as f:
    json.dump(seen, f)
with mlflow.start_run():
    mlflow.log_param("rank", seen["RANK"])
    mlflow.log_metric("world", int(seen["WORLD_SIZE"]))
print(f"hello from rank {seen['RANK']} of {seen['WORLD_SIZE']}")
"""

#: Each torchrun worker joins a gloo group and all-reduces its rank + 1: every one sees the sum.
ALL_REDUCE_SCRIPT = """\
import json, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
seen = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE")}
seen["sum"] = total.item()
os.makedirs("reduced", exist_ok=True)
with open(f"reduced/{dist.get_rank()}.json", "w") as f:
    json.dump(seen, f)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} reduced {total.item()}")
dist.destroy_process_group()
"""


@pytest.fixture
def cluster(
    make_service: Callable[..., JobService], quickstart: Path, slurm_bed: SlurmBed
) -> Iterator[tuple[JobService, SlurmBed]]:
    (quickstart / "ranks.py").write_text(RANK_SCRIPT)
    (quickstart / "reduce.py").write_text(ALL_REDUCE_SCRIPT)
    with slurm_service(make_service, quickstart, slurm_bed, "hpc") as service:
        yield service, slurm_bed


def test_two_plain_processes_on_one_node_know_their_ranks_and_record_one_run(
    cluster, quickstart: Path, tracking_uri: str
) -> None:
    service, bed = cluster
    spec = {
        "machine": "hpc",
        "command": "python ranks.py",
        "send": ["ranks.py"],
        "bring_back": ["ranks_seen"],
        "resources": {"nodes": 1, "processes_per_node": 2, "launcher": "plain"},
        "timeout": "10m",
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=180)
    assert job.state == "succeeded", job.reason
    seen = {int(p.stem): json.loads(p.read_text()) for p in (quickstart / "ranks_seen").glob("*.json")}
    assert sorted(seen) == [0, 1]
    ports = {s["MASTER_PORT"] for s in seen.values()}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, env in seen.items():
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank), env
        assert (env["NODE_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NNODES"]) == ("0", "2", "2", "1")
        assert env["MASTER_ADDR"] == "127.0.0.1", env  # the node's NodeAddr in the bed's slurm.conf
    log = service.read_log(job.id).data.decode()
    for rank in (0, 1):
        assert f"[{bed.node} rank {rank}] hello from rank {rank} of 2\n" in log, log
    # Every line the command wrote carries its rank; the batch script's own lines do not.
    command_lines = [line for line in log.splitlines() if "hello from" in line]
    assert len(command_lines) == 2 and all(line.startswith(f"[{bed.node} rank ") for line in command_lines)
    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].data.params["rank"] == "0", [r.data.params for r in runs]
    assert runs[0].data.metrics["world"] == 2


def test_a_failing_rank_fails_the_job_with_its_code(cluster) -> None:
    service, bed = cluster
    spec = {
        "machine": "hpc",
        "command": 'if [ "$RANK" = 1 ]; then echo rank one fails; exit 5; fi; sleep 60',
        "resources": {"processes_per_node": 2, "launcher": "plain"},
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    # srun ends the other rank at once (--kill-on-bad-exit) rather than letting it sleep on.
    assert job.state == "failed" and job.exit_code == 5, (job.state, job.exit_code, job.reason)
    assert f"[{bed.node} rank 1] rank one fails" in service.read_log(job.id).data.decode()


def test_cpus_or_gpus_that_do_not_share_among_the_processes_are_refused(cluster) -> None:
    service, _ = cluster
    with pytest.raises(InvalidSettings) as e:
        service.submit(
            JobSpec.from_json({"machine": "hpc", "command": "true", "resources": {"cpus": 3, "processes_per_node": 2}})
        )
    assert e.value.field == "resources.cpus" and "multiple of 2" in str(e.value)
    with pytest.raises(InvalidSettings) as e:
        service.submit(
            JobSpec.from_json({"machine": "hpc", "command": "true", "resources": {"gpus": 3, "processes_per_node": 2}})
        )
    assert e.value.field == "resources.gpus" and "multiple or a divisor of 2" in str(e.value)


def test_torchrun_starts_the_nodes_processes_which_all_reduce(cluster, quickstart: Path) -> None:
    service, bed = cluster
    # torch on the node's PATH, as a cluster's module or conda would put it (torchrun runs before the job's
    # own environment would be made ready).
    path = f"{far_torch_bin()}:{far_python_bin()}:/usr/local/bin:/usr/bin:/bin"
    spec = {
        "machine": "hpc",
        "command": "python reduce.py",
        "send": ["reduce.py"],
        "bring_back": ["reduced"],
        "env": {"PATH": path},
        # torch takes some 300 MB a process at import: over the bed's default per CPU.
        "resources": {"processes_per_node": 2, "launcher": "torchrun", "memory": "3G"},
        "timeout": "10m",
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=240)
    log = service.read_log(job.id).data.decode()
    assert job.state == "succeeded", (job.reason, log)
    seen = {int(p.stem): json.loads(p.read_text()) for p in (quickstart / "reduced").glob("*.json")}
    assert sorted(seen) == [0, 1]
    for rank, env in seen.items():
        assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "0", "2")
        assert env["sum"] == 3.0  # 1 + 2
    for rank in (0, 1):
        assert f"[{bed.node} rank {rank}] rank {rank} of 2 reduced 3.0\n" in log, log
    assert f"[{bed.node}] [{bed.node} rank" not in log  # a worker's line is prefixed once, not again by torchrun's


def test_torchrun_missing_on_the_nodes_fails_the_job_saying_so(cluster) -> None:
    service, bed = cluster
    spec = {
        "machine": "hpc",
        "command": "python -c 'print(1)'",
        "env": {"PATH": "/usr/bin:/bin"},  # no torch there
        "resources": {"processes_per_node": 2, "launcher": "torchrun"},
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    assert job.state == "failed" and job.exit_code == 127, (job.state, job.exit_code, job.reason)
    assert f"[{bed.node}] jupyter-remote-compute: torchrun is not on PATH on {bed.node}" in (
        service.read_log(job.id).data.decode()
    )


def test_cancelling_a_job_of_several_processes_stops_every_one(cluster) -> None:
    service, bed = cluster
    # A sleep of its own length, so no other session's job on this machine is taken for one of ours.
    sleep = f"sleep 300.{uuid.uuid4().int % 10**6:06d}"
    spec = {"machine": "hpc", "command": f"echo started; {sleep}", "resources": {"processes_per_node": 2}}
    job = service.submit(JobSpec.from_json(spec)).job

    def both_started() -> bool:
        service.driver.poll_active()
        return service.read_log(job.id).data.decode().count("] started") == 2

    wait_for(both_started, 60, "both processes to start", interval=0.3)
    service.cancel(job.id)
    ended = service.wait(job.id, timeout=60)
    assert ended.state == "cancelled", ended.reason
    # Nothing of the job is left: neither its sleeps nor the scripts that ran them (their paths name the job).
    for pattern in (sleep, job.id):
        left = subprocess.run(["pgrep", "-u", bed.user, "-f", pattern], capture_output=True, text=True)
        assert left.stdout.strip() == "", (pattern, left.stdout)
