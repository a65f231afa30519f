"""A job across an ssh host list: two real sshd's, each in a network namespace of its own with its own address
and hostname (the two-node Slurm bed's network, tests/slurm_nodes.py), reached through ssh config aliases and
the agent. torchrun on both hosts, two processes on each all-reducing over gloo; the log prefixed per node; one
MLflow run, rank 0's; a host whose processes die, and one that never reaches the rendezvous, named."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sshd_fixture
from conftest import job_runs
from far_python import far_python_bin, far_torch_bin
from filelock import FileLock
from procs import group_members
from required import require
from slurm_nodes import LOCK, NodeNetwork
from test_slurm_ranks import ALL_REDUCE_SCRIPT
from test_slurm_two_nodes import stuck_torchrun
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.transitions import TERMINAL_STATES

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
PORT = 2222

#: The all-reduce, then an MLflow run from every rank: only rank 0's is the job's.
SCRIPT = (
    ALL_REDUCE_SCRIPT
    + """
import socket
import mlflow

with mlflow.start_run():
    mlflow.log_param("rank", os.environ["RANK"])
    mlflow.log_param("host", socket.gethostname())
    mlflow.log_metric("world", int(os.environ["WORLD_SIZE"]))
"""
)


@dataclasses.dataclass
class Hosts:
    aliases: list[str]
    names: list[str]  # each host's hostname, as its processes see it
    addresses: list[str]
    options: dict[str, object]
    servers: list[sshd_fixture.SSHServer]  # each host's sshd, to stop and start again


@pytest.fixture(scope="module")
def two_hosts(sshd_bed: sshd_fixture.TestBed) -> Iterator[Hosts]:
    require(os.geteuid() == 0, "root, for the hosts' network namespaces")
    require(os.path.exists(sshd_fixture.SSHD), "sshd (apt-get install openssh-server)")
    with FileLock(LOCK, timeout=600):
        folder = Path(tempfile.mkdtemp(prefix="jrc-hosts-"))
        folder.chmod(0o755)
        net = NodeNetwork.make(folder, uuid.uuid4().hex[:8], 2)
        servers = []
        try:
            path = f"SetEnv PATH={far_python_bin()}:/usr/local/bin:/usr/bin:/bin"
            authorized = sshd_bed.workdir / "authorized_keys"
            for i, (_, addr, _) in enumerate(net.nodes, start=1):
                wrap = functools.partial(net.enter, i)  # sshd inside host i's namespace
                servers.append(
                    sshd_fixture.start_sshd(folder, f"host{i}", authorized, path, address=addr, port=PORT, wrap=wrap)
                )
            known = folder / "known_hosts"
            known.write_text("".join(s.known_hosts_line for s in servers))
            aliases = [f"gpu{i}" for i in range(1, len(servers) + 1)]
            config = folder / "ssh_config"
            # The key comes from the agent (the test's SSH_AUTH_SOCK), as a person's would.
            entries = [f"Host {alias}\n    HostName {s.address}\n    Port {s.port}\n    User {sshd_bed.user}\n"
                       for alias, s in zip(aliases, servers, strict=True)]  # fmt: skip
            config.write_text("\n".join(entries))
            options = {"known_hosts": str(known), "ssh_config": str(config), "base_dir": sshd_bed.base_dir}
            yield Hosts(
                aliases, [name for name, _, _ in net.nodes], [addr for _, addr, _ in net.nodes], options, servers
            )
        finally:
            for server in servers:
                server.stop()
            net.remove()
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def host_list(
    make_service: Callable[..., JobService], quickstart: Path, two_hosts: Hosts, ssh_agent_env: object
) -> Iterator[tuple[JobService, Hosts]]:
    (quickstart / "reduce.py").write_text(SCRIPT)
    service = make_service(quickstart)
    service.machines.add("pair", "ssh", two_hosts.aliases[0], {**two_hosts.options, "hosts": two_hosts.aliases})
    try:
        yield service, two_hosts
    finally:
        service.close()


def test_torchrun_on_an_ssh_host_list_of_two_hosts_two_processes_each(
    host_list, quickstart: Path, tracking_uri: str
) -> None:
    service, hosts = host_list
    site = next(far_python_bin().parent.glob("lib/python3*/site-packages"))
    spec = {
        "machine": "pair",
        "command": "python reduce.py",
        "send": ["reduce.py"],
        "bring_back": ["reduced"],
        # torch from its own venv, MLflow from the far side's
        "env": {"PATH": f"{far_torch_bin()}:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(site)},
        "resources": {"nodes": 2, "processes_per_node": 2, "launcher": "torchrun"},
        "timeout": "10m",
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=300)
    log = service.read_log(job.id).data.decode()
    assert job.state == "succeeded", (job.reason, log)
    # Each host's two processes say so in the one log, each line behind its host and rank.
    lines = [line for line in log.splitlines() if " reduced 10.0" in line]
    by_host = {name: sorted(line.split(" rank ")[1].split("]")[0] for line in lines if line.startswith(f"[{name} "))
               for name in hosts.names}  # fmt: skip
    assert [len(ranks) for ranks in by_host.values()] == [2, 2], log
    assert sorted(r for ranks in by_host.values() for r in ranks) == ["0", "1", "2", "3"]
    assert all(line.endswith("of 4 reduced 10.0") for line in lines), lines
    # Outputs come from rank 0's host: its two ranks, each of a world of four.
    seen = {int(p.stem): json.loads(p.read_text()) for p in (quickstart / "reduced").glob("*.json")}
    assert 0 in seen and len(seen) == 2, seen
    for rank, env in seen.items():
        assert (env["RANK"], env["WORLD_SIZE"], env["sum"]) == (str(rank), "4", 10.0), env
    # One MLflow run, rank 0's.
    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].data.params["rank"] == "0", [r.data.params for r in runs]
    assert runs[0].data.params["host"] in hosts.names and runs[0].data.metrics["world"] == 4
    # Usage counts both hosts.
    (attempt,) = [a for a in service.usage_record.attempts() if a.job == job.id]
    assert attempt.nodes == 2


def test_a_check_reaches_every_host_and_more_nodes_than_hosts_are_refused(host_list) -> None:
    service, hosts = host_list
    facts = service.admin.check("pair")
    assert [h["host"] for h in facts["hosts"]] == hosts.aliases and all(h["cpus"] >= 1 for h in facts["hosts"])
    spec = {"machine": "pair", "command": "true", "resources": {"nodes": 3, "launcher": "plain"}}
    with pytest.raises(InvalidSettings) as refused:
        service.submit(JobSpec.from_json(spec))
    assert refused.value.field == "resources.nodes"
    assert "3 nodes asked, but pair lists 2 hosts" in str(refused.value) and "hosts" in str(refused.value)


def test_a_job_of_fewer_nodes_than_hosts_is_prepared_and_sent_only_where_it_runs(
    host_list, sshd_bed: sshd_fixture.TestBed
) -> None:
    service, _ = host_list
    jobs = sshd_bed.far_path(sshd_bed.base_dir.removeprefix("~/")) / "jobs"
    spec = {"machine": "pair", "command": "echo up; sleep 300", "send": ["reduce.py"]}
    one = service.submit(JobSpec.from_json(spec)).job
    service.advance(one.id)
    wait_for(lambda: b"up\n" in service.read_log(one.id).data, 60, "the one-node job to start")
    assert (jobs / one.id / "work" / "reduce.py").exists()
    assert not (jobs / f"{one.id}-n1").exists()  # the second host was never touched
    # Two nodes: the second host gets its own folder and the inputs as the job starts there.
    two = service.submit(JobSpec.from_json({**spec, "resources": {"nodes": 2, "launcher": "plain"}})).job
    service.advance(two.id)

    def hosts_up() -> int:
        service.driver.poll_active()  # brings the second host's lines into the one log
        return sum(line.endswith("] up") for line in service.read_log(two.id).data.decode().splitlines())

    wait_for(lambda: hosts_up() == 2, 60, "a process on each host")
    assert (jobs / f"{two.id}-n1" / "work" / "reduce.py").exists()
    for job in (one, two):
        assert service.cancel(job.id).state == "cancelled"


#: Rank 0 logs three loss points and writes a checkpoint, then waits for a ``go`` file; the other rank ends.
RANK0_SCRIPT = """\
import os, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.destroy_process_group()
if rank == 0:
    import mlflow

    with mlflow.start_run():
        for step in range(3):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        folder = os.environ["REMOTE_COMPUTE_CHECKPOINT_DIR"]
        with open(os.path.join(folder, "model.part"), "w") as f:
            f.write("step 2")
        os.replace(os.path.join(folder, "model.part"), os.path.join(folder, "model.pt"))
        print("logged", flush=True)
        while not os.path.exists("go"):
            time.sleep(0.05)
"""


def test_rank_zero_on_a_later_host_gives_the_live_metrics_and_the_checkpoints(
    host_list, quickstart: Path, sshd_bed: sshd_fixture.TestBed
) -> None:
    """torchrun's rendezvous orders the nodes by host name, not by list: listed with the host whose name sorts
    last first, rank 0 runs on the second host, and its store and checkpoint folder are the job's."""
    service, hosts = host_list
    order = [hosts.aliases[i] for i in sorted(range(2), key=lambda i: hosts.names[i], reverse=True)]
    service.machines.add("pair-reversed", "ssh", order[0], {**hosts.options, "hosts": order})
    (quickstart / "rank0.py").write_text(RANK0_SCRIPT)
    site = next(far_python_bin().parent.glob("lib/python3*/site-packages"))
    spec = {
        "machine": "pair-reversed",
        "command": "python rank0.py",
        "send": ["rank0.py"],
        "env": {"PATH": f"{far_torch_bin()}:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(site)},
        "resources": {"nodes": 2, "processes_per_node": 1, "launcher": "torchrun"},
        "checkpoints": "ckpt",
        "checkpoint_every": 0.3,
        "timeout": "10m",
    }
    job = service.submit(JobSpec.from_json(spec)).job

    def losses() -> list[tuple[int, float]]:
        service.advance(job.id)
        now = service.get(job.id)
        assert now.state not in TERMINAL_STATES, (now.state, now.reason, service.read_log(job.id).data.decode())
        page, _ = service.read_metrics(job.id)  # asking marks the job watched
        return [(p.step, p.value) for p in page.points if p.key == "loss"]

    def found() -> str:
        now = service.get(job.id)
        return f"rank 0's three loss points while the job runs; found {losses()} as the job was {now.state}:\n" + (
            service.read_log(job.id).data.decode()
        )

    wait_for(lambda: len(losses()) == 3, 180, found)
    # The script prints after it logged them, and the second host's lines join the job's log at a later poll.
    logged = f"[{min(hosts.names)} rank 0] logged"  # the second host
    wait_for(lambda: service.advance(job.id) and logged in service.read_log(job.id).data.decode(), 60, logged)
    assert service.get(job.id).state == "running"
    model = quickstart / ".punica" / "checkpoints" / job.id / "model.pt"
    wait_for(lambda: service.advance(job.id) and model.is_file(), 60, "rank 0's checkpoint to come home")
    assert model.read_text() == "step 2"
    jobs = sshd_bed.far_path(sshd_bed.base_dir.removeprefix("~/")) / "jobs"
    (jobs / f"{job.id}-n1" / "work" / "go").write_text("")
    done = service.wait(job.id, timeout=120)
    assert done.state == "succeeded", (done.reason, service.read_log(job.id).data.decode())


def two_by_two_plain(command: str, machine: str = "pair") -> JobSpec:
    """``command`` as two plain processes on each of the two hosts."""
    resources = {"nodes": 2, "processes_per_node": 2, "launcher": "plain"}
    return JobSpec.from_json({"machine": machine, "command": command, "resources": resources})


def test_a_host_that_stops_answering_while_the_other_runs_is_given_up_in_the_limit_and_the_other_stopped(
    host_list, sshd_bed: sshd_fixture.TestBed
) -> None:
    """The second host's sshd and its sessions go (the network to it drops) while both hosts run: the
    machine does not answer; past its ``unreachable_after`` the attempt ends machine_unreachable, and the
    first host's processes are stopped, not left running for nobody."""
    service, hosts = host_list
    options = {**hosts.options, "hosts": hosts.aliases, "unreachable_after": 3}
    service.machines.add("pair-3s", "ssh", hosts.aliases[0], options)
    job = service.submit(two_by_two_plain('echo "up $RANK"; sleep 300', "pair-3s")).job

    def ups() -> int:
        service.driver.poll_active()
        return sum(1 for line in service.read_log(job.id).data.decode().splitlines() if "] up " in line)

    wait_for(lambda: ups() == 4, 60, "two processes on each host")
    jobs = sshd_bed.far_path(sshd_bed.base_dir.removeprefix("~/")) / "jobs"
    first, second = (int((jobs / name / "pid").read_text()) for name in (job.id, f"{job.id}-n1"))
    hosts.servers[1].stop()
    try:
        ended = service.wait(job.id, timeout=120)
        assert ended.state == "lost", (ended.state, ended.reason)
        assert ended.reason.startswith("machine_unreachable: pair-3s did not answer for 3s"), ended.reason
        assert hosts.aliases[1] in ended.reason, ended.reason
        assert not group_members(first), "the first host's processes were stopped"
        assert group_members(second), "the silent host's are out of reach (the test ends them)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(second, signal.SIGKILL)
        hosts.servers[1].start_again()


def test_plain_processes_know_their_ranks_and_a_host_whose_processes_die_ends_the_job_naming_it(
    host_list, sshd_bed: sshd_fixture.TestBed
) -> None:
    service, hosts = host_list
    command = 'echo "up $RANK $LOCAL_RANK $NODE_RANK $NNODES $WORLD_SIZE $MASTER_ADDR $MASTER_PORT"; sleep 300'
    job = service.submit(two_by_two_plain(command)).job

    def ups() -> list[str]:
        service.driver.poll_active()
        return [line for line in service.read_log(job.id).data.decode().splitlines() if "] up " in line]

    wait_for(lambda: len(ups()) == 4, 60, "two processes on each host")
    seen = {}
    for line in ups():
        where, _, words = line.partition("] up ")
        rank, local, node, nnodes, world, addr, port = words.split()
        seen[rank] = (where.lstrip("["), local, node, nnodes, world, addr)
        assert port.isdigit()
    first, second = hosts.names
    assert seen == {
        "0": (f"{first} rank 0", "0", "0", "2", "4", hosts.addresses[0]),
        "1": (f"{first} rank 1", "1", "0", "2", "4", hosts.addresses[0]),
        "2": (f"{second} rank 2", "0", "1", "2", "4", hosts.addresses[0]),
        "3": (f"{second} rank 3", "1", "1", "2", "4", hosts.addresses[0]),
    }, seen
    # The second host's processes die (as in a crash: KILL, no exit code written).
    group = int((sshd_bed.far_path(sshd_bed.base_dir.removeprefix("~/")) / "jobs" / f"{job.id}-n1" / "pid").read_text())
    os.killpg(group, signal.SIGKILL)
    ended = service.wait(job.id, timeout=60)
    assert ended.state == "lost", (ended.state, ended.reason)
    assert ended.reason.startswith(f"lost: node 1 ({hosts.aliases[1]}): process vanished;"), ended.reason


def test_a_rendezvous_a_host_never_joins_fails_in_the_machines_limit_naming_that_host(
    host_list, quickstart: Path
) -> None:
    service, hosts = host_list
    options = {**hosts.options, "hosts": hosts.aliases, "rendezvous_timeout": 10}
    service.machines.add("pair-10s", "ssh", hosts.aliases[0], options)
    spec = stuck_torchrun(quickstart, "pair-10s")
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=180)
    log = service.read_log(job.id).data.decode()
    assert (job.state, job.exit_code) == ("failed", 1), (job.state, job.exit_code, job.reason, log)  # torchrun's
    assert job.reason.startswith(f"exit code 1: the rendezvous at {hosts.addresses[0]}:"), job.reason
    assert f"did not complete within 10s: {hosts.aliases[1]} never joined;" in job.reason, (job.reason, log)
    assert f"[{hosts.names[0]}] torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError" in log, log


def test_a_failing_plain_process_stops_its_host_and_the_others_and_fails_the_job_with_its_code(host_list) -> None:
    service, hosts = host_list
    command = 'if [ "$RANK" = 1 ]; then echo rank one fails; exit 5; fi; sleep 120'
    # Well within the others' sleep: they were stopped, on its host and on the other.
    job = service.wait(service.submit(two_by_two_plain(command)).job.id, timeout=60)
    assert (job.state, job.exit_code) == ("failed", 5), (job.state, job.exit_code, job.reason)
    assert job.reason == f"exit code 5: node 0 ({hosts.aliases[0]}) exited with 5; the job's other nodes were stopped"
    assert f"[{hosts.names[0]} rank 1] rank one fails" in service.read_log(job.id).data.decode()
