"""An ssh host list: one machine whose ``hosts`` are several ssh hosts, a job of several nodes across them.

Each host is reached as an ssh machine is (its own ``SSHEngine``: the ssh config, the agent, known_hosts),
with the machine's options. The first host is the machine's address and the rendezvous. A job is
prepared and its inputs sent on the first host; a job of several nodes is prepared and sent on the other
hosts it runs on as it starts (each once, and never on a host beyond its ``nodes``); one detached launcher
each (``launcher.py``), whose ``node.sh`` sets the rank environment
(``launcher.rank_env_sh``: the first host's address, a port from the job id, this host's ``NODE_RANK``)
and runs ``farside/rank.sh`` as Slurm's batch script does: ``torchrun`` per node, or (``plain``) the
node's processes. Lines are prefixed per node and rank there; each poll copies the other hosts' new
whole lines into the first host's log, so the job has one log. Outputs, the MLflow store, live metrics
and checkpoints come from the host where rank 0 runs. A host whose processes fail, vanish or stop
answering once another has ended fails the job naming it, and the others are stopped; a host that stops
answering while the others run is the machine not answering (the job's ``unreachable_after``), and once
the attempt is given up the others are stopped too (``abandon``).

On a host after the first, the job's folder is ``<job id>-n<N>``: hosts sharing a home (NFS, or this
machine's test bed) keep their folders apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidSettings
from . import farside
from .base import (
    Engine,
    EngineContext,
    EngineError,
    Features,
    FetchResult,
    InputFile,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
    refuse_distributed,
)
from .launcher import rank_env_sh, run_script
from .resources import Resources
from .shell import DetachedLauncher
from .transport import quote

#: The machine option that makes an ssh machine a host list.
HOSTS = "hosts"
#: Seconds a torchrun job's nodes have to meet at the rendezvous (torchrun's own join_timeout).
RENDEZVOUS_TIMEOUT = 600
#: Seconds each other host's processes have to stop once one host failed.
STOP_GRACE = 10.0

FEATURES = Features(
    host_keys=True,
    checkpoints=True,
    resources=frozenset({"cpus", "gpus", "memory", "nodes"}),
    launchers=("plain", "torchrun"),
)


def check_hosts(address: str, hosts: Any, validate: Any) -> tuple[str, ...]:
    """A machine's ``hosts``: two or more ssh addresses, each once, the first the machine's address.

    ``validate`` is the ssh kind's address check (ValueError with what is wrong)."""
    where = f"options.{HOSTS}"
    if isinstance(hosts, str) or not isinstance(hosts, list | tuple) or len(hosts) < 2:
        raise InvalidSettings(
            f"{where}: expected a list of two or more ssh hosts, the first the machine's address "
            f"(e.g. [{address}, node2])",
            field=where,
        )
    out: list[str] = []
    for i, host in enumerate(hosts):
        if not isinstance(host, str):
            raise InvalidSettings(f"{where}[{i}]: expected an ssh host (text), not {type(host).__name__}", field=where)
        try:
            host = validate(host)
        except ValueError as e:
            raise InvalidSettings(f"{where}[{i}]: {str(e).removeprefix('address: ')}", field=where) from None
        if host in out:
            raise InvalidSettings(f"{where}[{i}]: {host} is listed twice; list each host once", field=where)
        out.append(host)
    if out[0] != address:
        raise InvalidSettings(
            f"{where}[0]: the first host is the rendezvous and must be the machine's address ({address}), "
            f"not {out[0]}; list {address} first",
            field=where,
        )
    return tuple(out)


def master_port(job_id: str) -> int:
    """The rendezvous port of a job: from its id, so two jobs on the same first host differ."""
    return 20000 + int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16) % 20000


class HostListEngine(Engine):
    """An ssh machine with ``hosts``: an ``SSHEngine`` per host, a job's nodes across them."""

    kind = "ssh"
    label = "SSH"
    features = FEATURES

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        from .ssh import SSHEngine  # the ssh kind makes this engine for a machine with hosts

        super().__init__(name, address, options, context)
        self.hosts = check_hosts(address, options.get(HOSTS), SSHEngine.validate_address)
        each = {k: v for k, v in options.items() if k != HOSTS}
        self.nodes = [SSHEngine(f"{name} (node {i}, {h})", h, each, context) for i, h in enumerate(self.hosts)]
        self._lock = threading.Lock()
        self._log_offsets: dict[tuple[str, int], int] = {}
        self._rank0: dict[str, int] = {}
        # What ``send`` sent to the first host, for ``start`` to send to the other hosts a job runs on (the
        # lifecycle sends and starts in one pass; a job whose sender died is sent again whole).
        self._inputs: dict[str, tuple[Sequence[InputFile], ProgressCallback | None]] = {}

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    # -- the job on each host -------------------------------------------------------

    def _sub(self, job: RemoteJob, i: int) -> RemoteJob:
        """The job as host ``i``'s engine knows it: its own folder (and process, once started)."""
        sub_id = job.job_id if i == 0 else f"{job.job_id}-n{i}"
        entries = job.handle.get("nodes") or []
        handle = dict(entries[i]) if i < len(entries) else {}
        return RemoteJob(sub_id, job.key, handle)  # type: ignore[arg-type]

    def _started(self, job: RemoteJob) -> list[int]:
        return [i for i, entry in enumerate(job.handle.get("nodes") or []) if entry.get("pid")]

    # -- checks ---------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        facts = [node.check() for node in self.nodes]  # each host answers, or its error names it
        first = dict(facts[0])
        first[HOSTS] = [{"host": h, "cpus": f.get("cpus"), "gpus": len(f.get("gpus") or [])}
                        for h, f in zip(self.hosts, facts, strict=True)]  # fmt: skip
        return first

    def admit(self, resources: Resources) -> None:
        refuse_distributed(resources, self.features, self.name, self.kind)
        nodes = resources.nodes or 1
        if nodes > len(self.hosts):
            raise InvalidSettings(
                f"resources.nodes: {nodes} nodes asked, but {self.name} lists {len(self.hosts)} hosts "
                f"({', '.join(self.hosts)}); ask for at most {len(self.hosts)} or add hosts to its {HOSTS}",
                field="resources.nodes",
            )
        one = dataclasses.replace(resources, nodes=None, processes_per_node=None, launcher=None)
        for node in self.nodes[:nodes]:
            node.admit(one)  # each host gives the CPUs, GPUs and memory asked per node

    # -- the job's life ---------------------------------------------------------------

    def prepare(self, job: RemoteJob) -> RemoteJob:
        # The first host only: how many nodes the job runs on is known at start.
        done = self.nodes[0].prepare(self._sub(job, 0))
        entries = [{**self._sub(job, 0).handle, "dir": done.handle["dir"]}]
        return dataclasses.replace(job, handle={**job.handle, "dir": entries[0]["dir"], "nodes": entries})

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        with self._lock:
            self._inputs[job.job_id] = (files, progress)
        return self.nodes[0].send(self._sub(job, 0), files, progress)

    def _send_to(self, job: RemoteJob, nodes: int, entries: list[dict[str, Any]]) -> None:
        """Prepare the job and send its inputs on hosts 1 … ``nodes``-1 (those not prepared yet)."""
        with self._lock:
            inputs = self._inputs.get(job.job_id)
        if inputs is None:
            raise EngineError(f"{self.name}: the inputs of {job.job_id} were not sent from this process; send it again")
        files, progress = inputs
        # The first host's transfer was the job's progress; each other host's keeps it whole (and its lease).
        whole = (lambda done, total: progress(total, total)) if progress else None
        for i in range(1, nodes):
            if i < len(entries) and entries[i].get("dir"):
                continue
            sub = self._sub(job, i)
            done = self.nodes[i].prepare(sub)
            entry = {**sub.handle, "dir": done.handle["dir"]}
            if i < len(entries):
                entries[i] = entry
            else:
                entries.append(entry)
            self.nodes[i].send(dataclasses.replace(sub, handle=done.handle), files, whole)

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        resources = launch.resources or Resources()
        entries = [dict(e) for e in job.handle.get("nodes") or []]
        if not resources.distributed:
            started = self.nodes[0].start(self._sub(job, 0), launch)
            entries[0] = dict(started.handle)
            with self._lock:
                self._inputs.pop(job.job_id, None)
            return dataclasses.replace(job, handle={**job.handle, "pid": started.handle["pid"], "nodes": entries})
        nodes = resources.nodes or 1
        self._send_to(job, nodes, entries)
        with self._lock:
            self._inputs.pop(job.job_id, None)
        job = dataclasses.replace(job, handle={**job.handle, "nodes": entries})
        per_node = resources.processes_per_node or 1
        addr = self.nodes[0].hop().hostname  # the first host as the others reach it
        port = master_port(job.job_id)
        gpus = resources.gpus or 0
        mode = "torchrun" if resources.launcher == "torchrun" else "node"
        join = self._join()
        for i in range(nodes):
            sub = self._sub(job, i)
            d = self.nodes[i].job_dir(sub)
            env = rank_env_sh(
                per_node, master_addr=quote(addr), master_port=str(port), nnodes=str(nodes), node_rank=str(i)
            )
            node_sh = f"#!/bin/sh\n{env}exec sh {quote(d + '/rank.sh')} {quote(d)} {mode} {gpus} {join}\n"
            files = {"rank.sh": farside.script("rank"), "node.sh": node_sh, "run.sh": run_script("node.sh")}
            launcher = self.nodes[i].launcher
            assert isinstance(launcher, DetachedLauncher)
            try:
                started = launcher.start_with(sub, launch, files)
            except EngineError:
                self._stop(job, entries, range(i), STOP_GRACE)  # no node runs without the others
                raise
            entries[i] = dict(started.handle)
        handle = {**job.handle, "pid": entries[0]["pid"], "nodes": entries}
        if mode == "torchrun":
            handle["rendezvous"] = f"{addr}:{port}"
        return dataclasses.replace(job, handle=handle)  # type: ignore[arg-type]

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return self.poll_watched(jobs, {})[0]

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        if not jobs:
            return {}, {}
        # One round trip per host, for the jobs running there.
        per_node: dict[int, list[RemoteJob]] = {}
        for job in jobs:
            for i in self._started(job) or [0]:
                per_node.setdefault(i, []).append(job)
        seen: dict[int, dict[str, RemoteStatus]] = {}
        failed: dict[int, EngineError] = {}
        metrics: dict[str, MetricBytes] = {}
        for i, some in per_node.items():
            subs = [self._sub(job, i) for job in some]
            # Live metrics from the store of the host where rank 0 runs (the job's MLflow store), asked of that
            # host by the job's id there.
            ours = {job.job_id for job in some if job.job_id in watched and self._rank0_node(job) == i}
            pairs = list(zip(some, subs, strict=True))
            offsets = {sub.job_id: watched[job.job_id] for job, sub in pairs if job.job_id in ours}
            try:
                statuses, found = self.nodes[i].poll_watched(subs, offsets)
            except EngineError as e:
                failed[i] = e
                continue
            seen[i] = {job.job_id: statuses[sub.job_id] for job, sub in pairs}
            metrics.update({job.job_id: found.get(sub.job_id, {}) for job, sub in pairs if job.job_id in ours})
        out = {job.job_id: self._status_of(job, seen, failed) for job in jobs}
        return out, {k: v for k, v in metrics.items() if v}

    def _status_of(
        self, job: RemoteJob, seen: Mapping[int, Mapping[str, RemoteStatus]], failed: Mapping[int, EngineError]
    ) -> RemoteStatus:
        started = self._started(job) or [0]
        statuses = {i: seen[i][job.job_id] for i in started if i in seen}
        first = statuses.get(0)
        if len(started) == 1:
            if 0 in failed:
                raise failed[0]
            assert first is not None
            return first
        ended = {i: s for i, s in statuses.items() if s.state not in ("running", "pending", "queued")}
        bad = {i: s for i, s in ended.items() if not (s.state == "exited" and s.exit_code == 0)}
        if failed and ended:
            # A host that stops answering once another has ended: the job cannot finish there.
            i, error = next(iter(failed.items()))
            self._stop(job, job.handle.get("nodes") or [], [j for j in started if j not in ended], STOP_GRACE)
            why = f"node {i} ({self.hosts[i]}) did not answer: {error}; the job's other nodes were stopped"
            return RemoteStatus("gone", detail=why, cause="lost", log_size=self._merge_logs(job, statuses, whole=True))
        if failed:
            i, error = next(iter(failed.items()))
            raise EngineError(
                f"{self.name}: node {i} ({self.hosts[i]}) did not answer: {error}", transient=error.transient
            )
        if bad:
            self._stop(job, job.handle.get("nodes") or [], [j for j in started if j not in ended], STOP_GRACE)
            size = self._merge_logs(job, statuses, whole=True)
            if all(s.detail == "cancelled" for s in bad.values()):
                return RemoteStatus("gone", detail="cancelled", log_size=size)
            i, s = next((i, s) for i, s in sorted(bad.items()) if s.detail != "cancelled")
            where = f"node {i} ({self.hosts[i]})"
            if s.state == "exited":
                code = s.exit_code
                why = f"exit code {code}: {where} exited with {code}; the job's other nodes were stopped"
                rendezvous = job.handle.get("rendezvous")
                if rendezvous and (waited := self._waited(job, sorted(ended))):
                    # torchrun gave up at the rendezvous there (rank.sh left node<N>.waited): name who never came.
                    never = ", ".join(self.hosts[j] for j in started if j not in waited) or "a node"
                    why = (
                        f"exit code {code}: the rendezvous at {rendezvous} did not complete within "
                        f"{self._join()}s: {never} never joined; the job's other nodes were stopped"
                    )
                return RemoteStatus("failed", exit_code=code, detail=why, log_size=size)
            what = s.detail.split(" on ")[0] if s.detail else s.state
            why = f"{where}: {what}; the job's other nodes were stopped"
            return RemoteStatus("gone", detail=why, cause="lost", log_size=size)
        if len(ended) == len(started):
            return RemoteStatus("exited", exit_code=0, log_size=self._merge_logs(job, statuses, whole=True))
        assert first is not None
        return dataclasses.replace(first, state="running", log_size=self._merge_logs(job, statuses, whole=False))

    def _waited(self, job: RemoteJob, which: Sequence[int]) -> list[int]:
        """Of the nodes ``which``, those whose torchrun gave up waiting at the rendezvous."""
        waited = []
        for i in which:
            d = self.nodes[i].job_dir(self._sub(job, i))
            if self.nodes[i].transport.run(f"test -f {quote(f'{d}/ranks/node{i}.waited')}", timeout=60).code == 0:
                waited.append(i)
        return waited

    def _join(self) -> int:
        return int(self.machine_options.get("rendezvous_timeout") or RENDEZVOUS_TIMEOUT)

    def _stop(
        self, job: RemoteJob, entries: Sequence[Mapping[str, Any]], which: Sequence[int] | range, grace: float
    ) -> None:
        for i in which:
            if i < len(entries) and entries[i].get("pid"):
                sub = RemoteJob(self._sub(job, i).job_id, job.key, dict(entries[i]))  # type: ignore[arg-type]
                # Best effort: the job fails either way, naming the node that failed.
                with contextlib.suppress(EngineError):
                    self.nodes[i].cancel(sub, grace)

    # -- one log ----------------------------------------------------------------------

    def _offset_file(self, job: RemoteJob, i: int) -> str:
        return self.nodes[0].job_dir(self._sub(job, 0)) + f"/node{i}.log_offset"

    def _merge_logs(self, job: RemoteJob, statuses: Mapping[int, RemoteStatus], *, whole: bool) -> int | None:
        """Append each other host's new lines (all of them once it ended) to the first host's log; its size."""
        first = statuses.get(0)
        size = first.log_size if first is not None else None
        for i, status in sorted(statuses.items()):
            if i == 0 or not status.log_size:
                continue
            key = (job.job_id, i)
            with self._lock:
                offset = self._log_offsets.get(key)
            if offset is None:
                res = self.nodes[0].transport.run(f"cat {quote(self._offset_file(job, i))} 2>/dev/null || echo 0")
                text = res.text().strip()
                offset = int(text) if text.isdigit() else 0
            if status.log_size <= offset:
                continue
            data = self.nodes[i].read_log(self._sub(job, i), offset, status.log_size - offset)
            if not whole:
                data = data[: data.rfind(b"\n") + 1]
            if not data:
                continue
            new = offset + len(data)
            log = quote(self.nodes[0].job_dir(self._sub(job, 0)) + "/log")
            off = quote(self._offset_file(job, i))
            body = f"cat >> {log} && printf '%s\\n' {new} > {off}.tmp && mv -f {off}.tmp {off}"
            res = self.nodes[0].transport.run(body, data, timeout=60, retry=False)
            if res.code != 0:
                raise EngineError(res.error(f"{self.name}: adding node {i}'s lines to the log of {job.job_id}"))
            with self._lock:
                self._log_offsets[key] = new
            if size is not None:
                size += len(data)
        return size

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        return self.nodes[0].read_log(self._sub(job, 0), offset, limit)

    def note(self, job: RemoteJob, line: str) -> None:
        self.nodes[0].note(self._sub(job, 0), line)

    # -- stopping, results, cleaning up -----------------------------------------------------

    def cancel(self, job: RemoteJob, grace: float) -> None:
        started = self._started(job)
        errors = []
        for i in started or [0]:
            try:
                self.nodes[i].cancel(self._sub(job, i), grace)
            except EngineError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def abandon(self, job: RemoteJob) -> None:
        """A host stopped answering past the machine's limit: the job's processes on the hosts that still
        answer are stopped, so none runs on once the attempt is given up (the silent host's are out of reach)."""
        if len(self._started(job)) > 1:
            with contextlib.suppress(EngineError):  # the silent host's; every host was tried
                self.cancel(job, STOP_GRACE)

    def _rank0_node(self, job: RemoteJob) -> int:
        """The host where rank 0 runs: its outputs, MLflow store, live metrics and checkpoints.

        The first host, but for a torchrun job across hosts, whose rendezvous orders the nodes by host name,
        not by list: there, the host where rank.sh left ``ranks/0/node`` (until it did, the first host)."""
        started = self._started(job)
        if len(started) < 2 or not job.handle.get("rendezvous"):
            return 0
        with self._lock:
            if job.job_id in self._rank0:
                return self._rank0[job.job_id]
        for i in started:
            d = self.nodes[i].job_dir(self._sub(job, i))
            if self.nodes[i].transport.run(f"test -f {quote(d + '/ranks/0/node')}", timeout=60).code == 0:
                with self._lock:
                    self._rank0[job.job_id] = i
                return i
        return 0

    def fetch(
        self, job: RemoteJob, outputs: Sequence[str], dest: Path, progress: ProgressCallback | None = None
    ) -> FetchResult:
        i = self._rank0_node(job)
        return self.nodes[i].fetch(self._sub(job, i), outputs, dest, progress)

    def list_checkpoints(self, job: RemoteJob, folder: str) -> dict[str, tuple[int, int]]:
        i = self._rank0_node(job)
        return self.nodes[i].list_checkpoints(self._sub(job, i), folder)

    def fetch_checkpoints(self, job: RemoteJob, paths: Sequence[str], dest: Path) -> FetchResult:
        i = self._rank0_node(job)
        return self.nodes[i].fetch_checkpoints(self._sub(job, i), paths, dest)

    def cleanup(self, job: RemoteJob) -> None:
        for i, node in enumerate(self.nodes):
            sub = self._sub(job, i)
            if sub.handle.get("dir"):
                node.cleanup(sub)

    def trust_host(self, expected_fingerprint: str | None = None) -> str:
        return ", ".join(node.trust_host(expected_fingerprint) for node in self.nodes)
