"""Pools: which machine of a pool a job runs on, and the pool's queue while none has room.

A job that names a pool (compute.yaml's ``pools:``, machines/pools.py) is stored ``queued`` with the
pool's name as its machine and ``pool`` as its kind: it *waits* (``Job.waiting``). Placing it is one store
transaction that sets its machine, kind and machine snapshot and says why (``Job.placement``); from then
on it is a job on that machine like any other, sent by the driver's next step (queued → sending). The
transaction is the whole decision: two processes placing at once take turns on the state file's lock,
and a job that no longer waits when the lock is held is not placed again, so no job is placed twice and
a server killed at any point leaves either a waiting job or a placed one.

Each pass over a pool, oldest job first (created, then id): a job is placed while one of the pool's
machines has room for it by the pool's rule; the first that fits nowhere stops the pass (first in, first
out: a later, smaller job does not overtake it), and every job still waiting is told its place in line
and why each machine cannot take it. A pass runs when a job is submitted to the pool (in the submit's own
transaction: a free machine takes a pool's job at once), and on every poll (a job ended, a machine was
enabled or checked since).

A machine's room: its ``max_jobs`` option, and the GPUs, CPUs and memory its last check found
(``.punica/machine-facts.json``), less what the jobs on it asked (those queued there, sending, pending
or running; a collecting job's process has ended). A scheduler's machine (Slurm: ``Features.pending``)
queues on its own, so only its ``max_jobs`` counts here.

A pool's job whose attempt its machine's fault ended (lost, preempted, unreachable: jobs/retries.py)
joins the pool's queue again, as does a job whose ``fallback`` names the pool; it is placed on any
machine of the pool but the one that failed it, while the pool has another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..engines import engine_class
from ..engines.resources import Resources
from ..machines.admin import snapshot_of
from ..machines.facts import recorded_facts
from ..machines.registry import Machine
from ..schema.pool import Pool
from ..schema.retry import MACHINE_FAULTS
from .context import JobContext
from .job import Job, utcnow
from .snapshot import JobMap

#: A waiting job's ``kind``: it is on no machine yet.
POOL_KIND = "pool"
#: The waiting jobs told their exact place in line and why; those behind them say only that they wait
#: behind these, a reason that does not change as the line moves, so a pass writes a bounded number of
#: jobs however long the line (each write is the whole job, under the state file's lock).
TOLD = 10
#: Every machine's last check, by name (``machines/facts.py``'s ``recorded_facts``).
Facts = Mapping[str, Mapping[str, Any]]


@dataclasses.dataclass
class Room:
    """One machine of a pool: what it has, and what the jobs on it hold now."""

    machine: Machine
    max_jobs: int | None
    gpus: int | None  # None: not known (never checked), or a scheduler's to decide
    cpus: int | None
    memory_mb: int | None
    price: float | None
    scheduler: bool
    jobs: int = 0
    used_gpus: int = 0
    used_cpus: int = 0
    used_mb: int = 0

    def take(self, asked: Resources) -> None:
        self.jobs += 1
        self.used_gpus += asked.gpus or 0
        self.used_cpus += asked.cpus or 0
        self.used_mb += asked.memory_mb or 0

    def misfit(self, asked: Resources) -> str | None:
        """Why this machine cannot take a job asking ``asked`` now, in the words of a queued job's reason."""
        name = self.machine.name
        if not self.machine.enabled:
            return f"{name} is disabled"
        if self.max_jobs is not None and self.jobs >= self.max_jobs:
            return f"{name} runs {self.jobs} of {self.max_jobs} jobs"
        short = self.shortfall(asked)
        if short is not None or self.scheduler:
            return short
        for what, want, total, used in self._wanted(asked):
            if total is None:
                return f"{name}'s {what.split()[-1]} are not known (check the machine)"
            if total - used < want:
                return f"{name} has {max(0, total - used)} of {total} {what} free"
        return None

    def shortfall(self, asked: Resources) -> str | None:
        """Why the machine could never give ``asked``, even with nothing running on it (by its last check);
        None when it could, or might (not checked yet, a scheduler's)."""
        if self.scheduler:
            return None
        if asked.partition or (asked.nodes or 1) > 1:
            return f"{self.machine.name} is one {self.machine.kind} machine, with no partitions or nodes"
        for what, want, total, _used in self._wanted(asked):
            if total is not None and want > total:
                return f"{self.machine.name} has {total} {what}"
        return None

    def free(self, asked: Resources) -> str:
        """What room the machine had for the job, for its placement's explanation."""
        for what, _want, total, used in self._wanted(asked):
            if total is not None and not self.scheduler:
                n = total - used
                return f"{n} free {what[:-1] if n == 1 and what.endswith('s') else what}"
        if self.max_jobs is not None:
            return f"{self.max_jobs - self.jobs} of {self.max_jobs} job slots free"
        return "room"

    def _wanted(self, asked: Resources) -> list[tuple[str, int, int | None, int]]:
        """(what, asked, the machine's all or None, what its jobs hold) for each resource the job asks."""
        every = (
            ("GPUs", asked.gpus, self.gpus, self.used_gpus),
            ("CPUs", asked.cpus, self.cpus, self.used_cpus),
            ("MiB of memory", asked.memory_mb, self.memory_mb, self.used_mb),
        )
        return [(what, want, total, used) for what, want, total, used in every if want]


def rooms_of(pool: Pool, machines: Mapping[str, Machine], active: Iterable[Job], facts: Facts) -> list[Room]:
    """The pool's machines in its order, each with what the unfinished jobs on it hold; ``facts``: every
    machine's last check (``machines/facts.py``), read before the store's lock is taken."""
    rooms: dict[str, Room] = {}
    for name in pool.machines:
        machine = machines.get(name)
        if machine is None:  # the file names only its machines (machines/pools.py); a race with a removal
            continue
        options = machine.options
        scheduler = engine_class(machine.kind).features.pending
        found = {} if scheduler else facts.get(name) or {}
        memory = found.get("memory_bytes")
        price = options.get("price_per_hour")
        rooms[name] = Room(
            machine=machine,
            max_jobs=options.get("max_jobs") if isinstance(options.get("max_jobs"), int) else None,
            gpus=found["gpus"] if isinstance(found.get("gpus"), int) else None,
            cpus=found["cpus"] if isinstance(found.get("cpus"), int) else None,
            memory_mb=memory // (1 << 20) if isinstance(memory, int) else None,
            price=float(price) if isinstance(price, (int, float)) else None,
            scheduler=scheduler,
        )
    for job in active:
        room = rooms.get(job.machine)
        if room is not None and job.state != "collecting" and not job.waiting:
            room.take(job.spec.resources)
    return list(rooms.values())


def never_fits(pool: Pool, machines: Mapping[str, Machine], asked: Resources, facts: Facts) -> str | None:
    """Why no machine of the pool could give ``asked`` even with nothing running (by their last checks);
    None when one could, or might (not checked yet, a scheduler's, disabled for now)."""
    whys = []
    for room in rooms_of(pool, machines, (), facts):
        why = room.shortfall(asked)
        if why is None:
            return None
        whys.append(why)
    return ", ".join(whys) or "it has no machines"


def choose(pool: Pool, rooms: Sequence[Room], asked: Resources) -> tuple[Room | None, str]:
    """The machine the pool's rule places a job asking ``asked`` on, and why; else None and why none can."""
    fitting = [room for room in rooms if room.misfit(asked) is None]
    if not fitting:
        return None, ", ".join(why for room in rooms if (why := room.misfit(asked))) or "it has no machines"
    if pool.placement == "least_loaded":
        room = min(fitting, key=lambda r: r.jobs)  # min keeps the first of equals: the pool's order
        return room, f"least loaded ({room.jobs} job{'s' if room.jobs != 1 else ''} there, {room.free(asked)})"
    if pool.placement == "cheapest":
        room = min(fitting, key=lambda r: (r.price is None, r.price or 0.0))
        if room.price is None:
            return room, f"first with {room.free(asked)} (no machine with room declares a price_per_hour)"
        return room, f"cheapest with room ({room.price:g} per hour, {room.free(asked)})"
    return fitting[0], f"first with {fitting[0].free(asked)}"


def rooms_for(job: Job, rooms: Sequence[Room]) -> Sequence[Room]:
    """The rooms a job may be placed in: after its machine's fault (its last attempt ended lost,
    preempted or unreachable), every machine of the pool but that one, while the pool has another."""
    last = job.attempts[-1] if job.attempts else None
    if last is None or last["end"] not in MACHINE_FAULTS:
        return rooms
    others = [room for room in rooms if room.machine.name != last["machine"]]
    return others or rooms


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def place_in(
    jobs: JobMap, pool: Pool, machines: Mapping[str, Machine], facts: Facts, new: Job | None = None
) -> list[str]:
    """Inside a store transaction: place the pool's waiting jobs, oldest first, while the first fits;
    tell the rest their place in line. ``new``: a job this transaction added (submit's). The ids of the
    jobs changed (placed, or a new reason)."""
    active = [*jobs.unfinished(), *([new] if new is not None else [])]
    line = sorted(
        (j for j in active if j.waiting and j.pool == pool.name and j.state == "queued" and not j.cancel_requested),
        key=lambda j: (j.created, j.id),
    )
    if not line:
        return []
    rooms = rooms_of(pool, machines, active, facts)
    changed: list[str] = []
    position = 0  # in line among the jobs still waiting after this pass
    for waiting in line:
        if position >= TOLD:
            reason = f"in line for pool {pool.name}, behind {TOLD} or more jobs"
            if waiting.reason != reason:
                jobs[waiting.id].reason = reason
                changed.append(waiting.id)
            continue
        asked = waiting.spec.resources
        room, why = choose(pool, rooms_for(waiting, rooms), asked)
        if position or room is None:
            # First in, first out: behind a job that fits nowhere, one that would fit waits its turn.
            position += 1
            own = "waits for the jobs ahead of it" if room is not None else why
            reason = f"{ordinal(position)} in line for pool {pool.name}: {own}"
            if waiting.reason != reason:
                jobs[waiting.id].reason = reason
                changed.append(waiting.id)
            continue
        job = jobs[waiting.id]
        job.machine, job.kind = room.machine.name, room.machine.kind
        job.machine_snapshot = snapshot_of(room.machine)
        job.placement = f"placed on {room.machine.name}: {why}"
        job.reason = None
        job.updated = utcnow()
        room.take(asked)
        changed.append(job.id)
    return changed


class Placement:
    """Passes over the pools with waiting jobs, each one store transaction (``place_in``)."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def place(self, names: Iterable[str] | None = None) -> list[Job]:
        """Place what fits in each pool named (None: every pool with a waiting job); the jobs changed."""
        waiting = {j.pool for j in self.ctx.store.active_jobs() if j.waiting}
        wanted = waiting if names is None else waiting & set(names)
        if not wanted:
            return []
        machine_list, pools = self.ctx.admin.registry.machines_and_pools()
        machines = {m.name: m for m in machine_list}
        facts = recorded_facts(self.ctx.workspace.punica_dir)
        changed: list[str] = []
        known = {pool.name: pool for pool in pools}
        with self.ctx.store.transaction() as jobs:
            for name in sorted(wanted):
                pool = known.get(name)
                if pool is not None:
                    changed += place_in(jobs, pool, machines, facts)
                    continue
                reason = f"pool {name} is no longer in compute.yaml: add it again, or cancel the job"
                for job in jobs.unfinished():
                    if job.waiting and job.pool == name and job.reason != reason:
                        jobs[job.id].reason = reason
                        changed.append(job.id)
        done = [self.ctx.store.get(job_id) for job_id in changed]
        for job in done:
            self.ctx.emit(job)
        return done
