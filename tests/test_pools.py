"""Pools: a job names a pool where it would name a machine, is placed on a machine of the pool with room,
or waits ``queued`` in the pool's line, first in, first out, saying why; placed once, whoever places it.

Two real sshds of the test bed are the pool's machines (``a`` on the main one, ``b`` on the jump one, each
with its own folder); a job waits on a gate file of its own, so a test sees it hold its machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurm_fixture
import sshd_fixture
from pool_bed import Gates, add_pair, gates, remove_b_folder
from waiting import wait_for

from jupyter_remote_compute.errors import ConfigFileError, Conflict, InvalidSettings, NotFound
from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.placement import Room, choose
from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.machines.registry import MachineRegistry
from jupyter_remote_compute.schema.machine import Machine
from jupyter_remote_compute.schema.pool import Pool, PoolInput
from jupyter_remote_compute.schema.resources import Resources

gates = gates  # the fixture, used here
sshd_bed = sshd_fixture.sshd_bed
slurm_bed = slurm_fixture.slurm_bed
ssh_agent_env = sshd_fixture.ssh_agent_env


@pytest.fixture
def pair(workspace: Path, make_service: Any, ssh_agent_env: Any) -> Iterator[JobService]:
    bed = ssh_agent_env
    service = make_service(workspace)
    add_pair(service, bed, max_jobs=1)
    yield service
    remove_b_folder(bed)


def poll_until(service: JobService, condition: Any, message: str, timeout: float = 120) -> Any:
    """Drive every job as the server's poller does, until ``condition()`` holds."""

    def once() -> Any:
        service.poll_active()
        return condition()

    return wait_for(once, timeout=timeout, message=message, interval=0.1)


def states(service: JobService, ids: dict[str, str]) -> dict[str, tuple[str, str]]:
    return {name: ((job := service.get(job_id)).state, job.machine) for name, job_id in ids.items()}


# -- placing on machines with room ------------------------------------------------------------------
def test_a_job_on_a_pool_is_placed_on_the_free_machine_and_says_why(pair: JobService, gates: Gates) -> None:
    busy = pair.submit(JobSpec.from_json(gates.spec("busy", machine="a"))).job
    poll_until(pair, lambda: gates.runs_of("busy") == 1, "the job naming a to run there")

    job = pair.submit(JobSpec.from_json(gates.spec("pooled"))).job
    # Placed in the submit's own write: a is full (max_jobs 1), b is free.
    assert (job.state, job.machine, job.kind, job.pool) == ("queued", "b", "ssh", "pair")
    assert job.placement == "placed on b: first with 1 of 1 job slots free"
    poll_until(pair, lambda: gates.runs_of("pooled") == 1, "the pool's job to run on b")
    for name in ("busy", "pooled"):
        gates.open(name)
    done = pair.wait(job.id, timeout=120)
    assert done.state == "succeeded", done.reason
    assert (done.machine, done.pool, done.placement) == ("b", "pair", job.placement)
    assert pair.wait(busy.id, timeout=120).state == "succeeded"
    # The run says where the pool put it, and why.
    from mlflow.tracking import MlflowClient

    run = MlflowClient(pair.settings.tracking.tracking_uri).get_run(done.mlflow_run_id)
    assert run.data.tags["remote_compute.pool"] == "pair"
    assert run.data.tags["remote_compute.placement"] == job.placement
    assert run.data.tags["remote_compute.machine"] == "b"


def test_four_jobs_on_two_single_slot_machines_run_two_at_a_time_in_order(pair: JobService, gates: Gates) -> None:
    names = ["j1", "j2", "j3", "j4"]
    ids = {name: pair.submit(JobSpec.from_json(gates.spec(name))).job.id for name in names}
    assert states(pair, ids) == {
        "j1": ("queued", "a"),
        "j2": ("queued", "b"),
        "j3": ("queued", "pair"),
        "j4": ("queued", "pair"),
    }
    j3, j4 = pair.get(ids["j3"]), pair.get(ids["j4"])
    assert j3.waiting and j4.waiting
    assert j3.reason == "1st in line for pool pair: a runs 1 of 1 jobs, b runs 1 of 1 jobs"
    assert j4.reason == "2nd in line for pool pair: a runs 1 of 1 jobs, b runs 1 of 1 jobs"
    most = 0

    def holding() -> int:
        nonlocal most
        on = sum(1 for s, m in states(pair, ids).values() if s in ("sending", "running") and m != "pair")
        most = max(most, on)
        return on

    poll_until(pair, lambda: gates.runs_of("j1") and gates.runs_of("j2") and holding() == 2, "j1 and j2 to run")
    gates.open("j2")  # b frees first: the first in line takes it
    poll_until(pair, lambda: holding() and gates.runs_of("j3"), "j3 to run on b")
    assert states(pair, ids)["j3"] == ("running", "b") and pair.get(ids["j4"]).waiting
    assert pair.get(ids["j4"]).reason == "1st in line for pool pair: a runs 1 of 1 jobs, b runs 1 of 1 jobs"
    gates.open("j1")
    poll_until(pair, lambda: holding() and gates.runs_of("j4"), "j4 to run on a")
    assert states(pair, ids)["j4"] == ("running", "a")
    gates.open("j3")
    gates.open("j4")
    poll_until(pair, lambda: all(s == "succeeded" for s, _ in states(pair, ids).values()), "every job to end")
    assert most == 2
    assert [gates.runs_of(name) for name in names] == [1, 1, 1, 1]
    placed = {name: pair.get(job_id).placement for name, job_id in ids.items()}
    assert placed["j3"] == "placed on b: first with 1 of 1 job slots free", placed
    assert placed["j4"] == "placed on a: first with 1 of 1 job slots free", placed


def test_a_disabled_machine_takes_no_job_until_it_is_enabled(pair: JobService, gates: Gates) -> None:
    pair.machines.set_enabled("b", False)
    first = pair.submit(JobSpec.from_json(gates.spec("first"))).job
    second = pair.submit(JobSpec.from_json(gates.spec("second"))).job
    assert first.machine == "a"
    waiting = pair.get(second.id)
    assert waiting.waiting and waiting.reason == "1st in line for pool pair: a runs 1 of 1 jobs, b is disabled"
    # Polled while b is disabled: still waiting, still saying why.
    poll_until(pair, lambda: gates.runs_of("first") == 1, "the first job to run on a")
    assert pair.get(second.id).waiting

    pair.machines.set_enabled("b", True)
    pair.place()  # what the faces that enable a machine do (PATCH /machines/b, machines enable b): at once
    placed = pair.get(second.id)
    assert not placed.waiting
    assert (placed.machine, placed.placement) == ("b", "placed on b: first with 1 of 1 job slots free")
    poll_until(pair, lambda: gates.runs_of("second") == 1, "the second job to run on b")
    for name in ("first", "second"):
        gates.open(name)
    assert {pair.wait(j.id, timeout=120).state for j in (first, second)} == {"succeeded"}


def test_a_machines_checked_cpus_are_its_room_and_what_no_machine_has_is_refused(
    pair: JobService, gates: Gates
) -> None:
    """The room a check found (``machines check``: CPUs, GPUs, memory), less what the jobs there asked."""
    unknown = pair.submit(JobSpec.from_json(gates.spec("unknown", resources={"cpus": 1}))).job
    assert unknown.waiting, unknown.placement  # never checked: how many CPUs a and b have is not known
    assert unknown.reason == (
        "1st in line for pool pair: a's CPUs are not known (check the machine), "
        "b's CPUs are not known (check the machine)"
    )
    pair.cancel(unknown.id)
    cpus = pair.admin.check("a")["cpus"]
    assert pair.admin.check("b")["cpus"] == cpus  # one host behind both sshds
    pair.machines.update("a", options={"max_jobs": None})  # only its CPUs limit a now

    for resources, field, problem in (
        ({"cpus": cpus + 1}, "resources", f"no machine of pool pair can give it: a has {cpus} CPUs, b has {cpus} CPUs"),
        ({"gpus": 1}, "resources", "no machine of pool pair can give it: a has 0 GPUs, b has 0 GPUs"),
        ({"partition": "gpu"}, "resources", "a is one ssh machine, with no partitions or nodes"),
    ):
        with pytest.raises(InvalidSettings) as info:
            pair.submit(JobSpec.from_json(gates.spec("too-big", resources=resources)))
        assert info.value.field == field and problem in str(info.value), info.value

    whole = pair.submit(JobSpec.from_json(gates.spec("whole", resources={"cpus": cpus}))).job
    assert (whole.machine, whole.placement) == ("a", f"placed on a: first with {cpus} free CPU{'s' * (cpus > 1)}")
    one = pair.submit(JobSpec.from_json(gates.spec("one", resources={"cpus": 1}))).job
    assert (one.machine, one.placement) == ("b", f"placed on b: first with {cpus} free CPU{'s' * (cpus > 1)}")
    third = pair.submit(JobSpec.from_json(gates.spec("third", resources={"cpus": 1}))).job
    assert third.reason == f"1st in line for pool pair: a has 0 of {cpus} CPUs free, b runs 1 of 1 jobs"
    poll_until(pair, lambda: gates.runs_of("whole") and gates.runs_of("one"), "the first two jobs to run")
    gates.open("whole")
    placed = poll_until(pair, lambda: not (j := pair.get(third.id)).waiting and j, "the third job to take a")
    assert placed.machine == "a"
    for name in ("one", "third"):
        gates.open(name)
    assert {pair.wait(j.id, timeout=120).state for j in (whole, one, third)} == {"succeeded"}


def test_following_a_pools_job_says_its_place_in_line_then_where_it_went(pair: JobService, gates: Gates) -> None:
    """What `run` and the panel's log view print while a pool's job waits (``on_wait``)."""
    from jupyter_remote_compute.jobs.logs import waiting_line

    pair.machines.set_enabled("a", False)
    pair.machines.set_enabled("b", False)
    job = pair.submit(JobSpec.from_json(gates.spec("followed"))).job
    lines: list[str] = []

    def heard(current: Job) -> None:
        lines.append(waiting_line(current))
        if current.waiting:
            pair.machines.set_enabled("b", True)  # the next look places it there
        else:
            gates.open("followed")

    done = pair.wait(job.id, timeout=120, on_wait=heard)
    assert done.state == "succeeded", done.reason
    assert lines[0] == f"job {job.id} is queued in pool pair: 1st in line for pool pair: a is disabled, b is disabled\n"
    assert (
        lines[1].startswith(f"job {job.id} is ") and " on b (placed on b: first with 1 of 1 job slots free)" in lines[1]
    )
    assert len(lines) == 2, lines


def test_a_job_whose_pool_is_removed_says_so_and_is_placed_once_it_is_back(pair: JobService, gates: Gates) -> None:
    pair.machines.set_enabled("a", False)
    job = pair.submit(JobSpec.from_json(gates.spec("orphan"))).job
    assert job.machine == "b"
    held = pair.submit(JobSpec.from_json(gates.spec("held"))).job
    assert pair.get(held.id).waiting
    pair.machines.remove_pool("pair")
    pair.place()
    assert pair.get(held.id).reason == "pool pair is no longer in compute.yaml: add it again, or cancel the job"
    pair.machines.put_pool("pair", PoolInput.from_json({"machines": ["a", "b"]}))
    pair.machines.set_enabled("a", True)
    pair.place()
    back = pair.get(held.id)
    assert (back.machine, back.placement) == ("a", "placed on a: first with 1 of 1 job slots free")
    for name in ("orphan", "held"):
        gates.open(name)
    assert {pair.wait(j.id, timeout=120).state for j in (job, held)} == {"succeeded"}


def test_a_waiting_job_cancelled_ends_without_a_machine(pair: JobService, gates: Gates) -> None:
    pair.machines.set_enabled("a", False)
    pair.machines.set_enabled("b", False)
    job = pair.submit(JobSpec.from_json(gates.spec("never"))).job
    assert job.waiting and job.reason == "1st in line for pool pair: a is disabled, b is disabled"
    ended = pair.cancel(job.id)
    ended = poll_until(pair, lambda: (j := pair.get(job.id)).state == "cancelled" and j, "the cancel to end it")
    assert ended.reason == "cancelled by user before it started" and ended.machine == "pair"
    assert gates.runs_of("never") == 0


def test_a_long_line_tells_the_first_ten_their_place_and_the_rest_that_they_wait_behind(
    pair: JobService, gates: Gates
) -> None:
    """Those behind the first ten keep one reason as the line moves: a placement rewrites ten jobs at most."""
    pair.machines.set_enabled("a", False)
    pair.machines.set_enabled("b", False)
    ids = [pair.submit(JobSpec.from_json(gates.spec(f"w{i}"))).job.id for i in range(12)]
    reasons = [pair.get(job_id).reason for job_id in ids]
    assert reasons[0] == "1st in line for pool pair: a is disabled, b is disabled"
    assert reasons[9] == "10th in line for pool pair: a is disabled, b is disabled"
    assert reasons[10:] == ["in line for pool pair, behind 10 or more jobs"] * 2
    pair.cancel(ids[0])
    assert pair.get(ids[10]).reason == "10th in line for pool pair: a is disabled, b is disabled"
    assert pair.get(ids[11]).reason == "in line for pool pair, behind 10 or more jobs"
    for job_id in ids[1:]:
        pair.cancel(job_id)


# -- the rules, and the reasons a queued job gives ----------------------------------------------------
def _room(name: str, *, gpus: int | None = 2, used: int = 0, enabled: bool = True, price: float | None = None) -> Room:
    machine = Machine(name=name, kind="ssh", address="h", enabled=enabled, created=None, options={})
    return Room(machine, None, gpus, None, None, price, False, jobs=used, used_gpus=used)


def test_each_rule_chooses_and_explains() -> None:
    one_gpu = Resources(gpus=1)
    rooms = [_room("a", used=2), _room("b", used=1, price=3.0), _room("c", gpus=4, price=1.5)]
    assert choose(Pool("p", ("a", "b", "c")), rooms, one_gpu)[1] == "first with 1 free GPU"
    assert choose(Pool("p", ("a", "b", "c")), rooms, one_gpu)[0].machine.name == "b"
    room, why = choose(Pool("p", ("a", "b", "c"), "least_loaded"), rooms, one_gpu)
    assert (room.machine.name, why) == ("c", "least loaded (0 jobs there, 4 free GPUs)")
    room, why = choose(Pool("p", ("a", "b", "c"), "cheapest"), rooms, one_gpu)
    assert (room.machine.name, why) == ("c", "cheapest with room (1.5 per hour, 4 free GPUs)")
    full = [_room("a", used=2), _room("b", enabled=False), _room("c", gpus=None)]
    assert choose(Pool("gpus", ("a", "b", "c")), full, Resources(gpus=2)) == (
        None,
        "a has 0 of 2 GPUs free, b is disabled, c's GPUs are not known (check the machine)",
    )


# -- bad input ---------------------------------------------------------------------------------------
COMPUTE = """\
# machines of the team
machines:
  a:
    kind: ssh
    address: me@127.0.0.1
pools:
"""


@pytest.mark.parametrize(
    ("pools", "problem"),
    [
        ("  gpus:\n    machines: []\n", "line 8: pools.gpus.machines: a pool needs at least one machine"),
        ("  gpus:\n    machines: [a, nowhere]\n", "line 8: pools.gpus.machines[1]: no machine named 'nowhere'"),
        ("  gpus:\n    placement: first\n", "line 7: pools.gpus.machines: a pool needs at least one machine"),
        ("  gpus:\n    machines: [a]\n    placement: random\n", "line 9: pools.gpus.placement: 'random' is not a"),
        ("  a:\n    machines: [a]\n", "line 7: pool 'a' has a machine's name"),
        ("  gpus:\n    machines: [a]\n    size: 3\n", "line 9: pool 'gpus': unknown setting 'size'"),
    ],
)
def test_a_bad_pool_in_compute_yaml_is_refused_naming_its_line_and_field(
    workspace: Path, pools: str, problem: str
) -> None:
    path = workspace / ".punica/compute.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(COMPUTE + pools)
    with pytest.raises(ConfigFileError) as info:
        MachineRegistry(path).pools()
    assert f"{path}, {problem}" in str(info.value), info.value


def test_pools_are_written_with_the_files_comments_kept_and_clashes_refused(workspace: Path) -> None:
    path = workspace / ".punica/compute.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(COMPUTE.replace("pools:\n", "# the end\n"))
    registry = MachineRegistry(path)
    registry.put_pool("gpus", PoolInput.from_json({"machines": ["a", "local"]}))
    registry.put_pool("gpus", PoolInput.from_json({"machines": ["a"], "placement": "least_loaded"}))
    assert path.read_text() == COMPUTE + "  gpus:\n    machines: [a]\n    placement: least_loaded\n# the end\n"
    with pytest.raises(InvalidSettings) as info:
        registry.put_pool("cpus", PoolInput.from_json({"machines": ["a", "nowhere"]}))
    assert info.value.field == "machines[1]" and "no machine named 'nowhere'" in str(info.value)
    with pytest.raises(InvalidSettings) as info:
        PoolInput.from_json({"machines": []})
    assert str(info.value) == "machines: a pool needs at least one machine"
    with pytest.raises(InvalidSettings) as info:
        registry.update("a", options={"max_jobs": 0})
    assert info.value.field == "options.max_jobs" and "above zero" in str(info.value)
    with pytest.raises(Conflict, match="a pool cannot have a machine's name"):
        registry.put_pool("a", PoolInput.from_json({"machines": ["a"]}))
    with pytest.raises(Conflict, match="a machine cannot have a pool's name"):
        registry.add("gpus", "ssh", "me@127.0.0.2")
    with pytest.raises(Conflict, match="machine 'a' is in pool 'gpus'"):
        registry.remove("a")
    registry.remove_pool("gpus")
    assert path.read_text() == COMPUTE + "# the end\n"


def test_a_job_naming_an_unknown_pool_or_one_no_machine_can_serve_is_refused(
    workspace: Path, make_service: Any
) -> None:
    service = make_service(workspace)
    with pytest.raises(NotFound, match=r"no machine named 'gpus' .*, nor a pool of that name"):
        service.submit(JobSpec.from_json({"machine": "gpus", "command": "true"}))
    service.machines.put_pool("here", PoolInput.from_json({"machines": ["local"]}))
    with pytest.raises(InvalidSettings) as info:
        service.submit(JobSpec.from_json({"machine": "here", "command": "true", "fallback": ["local"]}))
    assert info.value.field == "fallback"
    # An image on a pool with a machine whose kind runs none: refused, naming that machine and why.
    service.machines.add("notebooks", "jupyter", "http://127.0.0.1:9", {"token_secret": "nb-token"})
    service.machines.put_pool("mixed", PoolInput.from_json({"machines": ["local", "notebooks"]}))
    image_job = {"machine": "mixed", "command": "true", "environment": {"image": "docker.io/library/python:3.11"}}
    with pytest.raises(InvalidSettings) as info:
        service.submit(JobSpec.from_json(image_job))
    assert info.value.field == "environment.image"
    assert "not every machine of pool mixed can run docker.io/library/python:3.11" in info.value.message
    assert "notebooks is a jupyter machine, which does not run container images" in info.value.message
    assert service.list_jobs() == []


def test_a_pool_of_the_built_in_machine_runs_a_job_from_the_cli_path(workspace: Path, make_service: Any) -> None:
    """No server: the face that follows the job (the CLI, the magic) places it."""
    service = make_service(workspace)
    service.machines.put_pool("here", PoolInput.from_json({"machines": ["local"]}))
    job = service.submit(JobSpec.from_json({"machine": "here", "command": "echo pooled"})).job
    assert (job.machine, job.placement) == ("local", "placed on local: first with room")
    done: Job = service.wait(job.id, timeout=60)
    assert done.state == "succeeded" and done.pool == "here"


def test_a_pool_with_the_slurm_cluster_places_a_job_there_when_both_ssh_machines_are_busy(
    pair: JobService, gates: Gates, slurm_bed: Any
) -> None:
    """The issue's pool: two ssh machines and the local Slurm cluster. A scheduler keeps its own queue, so
    only its max_jobs (none here) limits what the pool places there: it has room while a and b are busy."""
    pair.machines.add("cluster", "slurm", "127.0.0.1", slurm_bed.machine_options())
    pair.machines.put_pool("mixed", PoolInput.from_json({"machines": ["a", "b", "cluster"]}))
    jobs = {name: pair.submit(JobSpec.from_json(gates.spec(name, machine="mixed"))).job for name in ("m1", "m2", "m3")}
    assert {name: (job.machine, job.kind) for name, job in jobs.items()} == {
        "m1": ("a", "ssh"),
        "m2": ("b", "ssh"),
        "m3": ("cluster", "slurm"),
    }
    assert jobs["m3"].placement == "placed on cluster: first with room"
    poll_until(pair, lambda: all(gates.runs_of(name) for name in jobs), "each job to run where it was placed")
    for name in jobs:
        gates.open(name)
    done = {name: pair.wait(job.id, timeout=180) for name, job in jobs.items()}
    assert {name: (job.state, job.machine) for name, job in done.items()} == {
        "m1": ("succeeded", "a"),
        "m2": ("succeeded", "b"),
        "m3": ("succeeded", "cluster"),
    }
