"""Reading squeue and what a Slurm state means to a job here; scancel's argv."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Literal

#: squeue fields, free text last: job id, state, start, submit, end, memory asked, node list, name, reason.
SQUEUE_FORMAT = "%i|%T|%S|%V|%e|%m|%N|%j|%r"
#: sacct fields (parsable2: ``|``-separated, no trailing one), free text last.
_EPOCH_TIME = "SLURM_TIME_FORMAT=%s"


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """One Slurm job as squeue or sacct reports it. Times are epoch seconds, None when Slurm has none."""

    job_id: str
    state: str  # Slurm's word: PENDING, RUNNING, CANCELLED (sacct may add " by <uid>")
    reason: str  # pending reason or why it ended; "" for Slurm's "None"
    submit: float | None
    start: float | None  # for a pending job, Slurm's estimate if it has one
    nodes: str  # node list as Slurm writes it (n[1-3]); "" while pending
    name: str
    exit_code: int | None = None  # sacct only: the batch script's exit code
    signal: int | None = None  # sacct only: the signal that ended it
    end: float | None = None  # for a running job, when its time limit will end it
    memory: str = ""  # squeue only: the memory limit Slurm holds it to, as Slurm writes it (64M, 2G)


def squeue_argv(job_ids: Sequence[str] = (), user: str | None = None) -> list[str]:
    """One squeue call for many jobs, finished ones included while Slurm remembers them (MinJobAge).

    With ``job_ids`` it asks for those; otherwise for every job of ``user`` (or the caller).
    """
    argv = ["env", _EPOCH_TIME, "squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]
    if job_ids:
        argv.append("--jobs=" + ",".join(_checked_ids(job_ids)))
    else:
        argv.append(f"--user={user}" if user else "--me")
    return argv


def _time(text: str) -> float | None:
    text = text.strip()
    # squeue writes NONE for the end of a job without a time limit, N/A or Unknown for what it has not.
    if not text or text.upper() in ("N/A", "UNKNOWN", "NONE", "(NULL)", "0"):
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"not an epoch time (SLURM_TIME_FORMAT=%s): {text!r}") from None


def _rows(stdout: str, fields: int, command: str, layout: str) -> list[list[str]]:
    """``|``-separated lines of ``fields`` fields; the last (free text) may itself hold ``|``."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", fields - 1)
        if len(parts) != fields:
            raise ValueError(f"{command} printed a line not in {layout!r}: {line[:200]!r}")
        rows.append(parts)
    return rows


def _checked_ids(job_ids: Sequence[str]) -> list[str]:
    for job_id in job_ids:
        if not job_id.isdigit():
            raise ValueError(f"not a Slurm job id: {job_id!r}")
    return list(job_ids)


def _reason(text: str) -> str:
    text = text.strip()
    return "" if text in ("None", "(null)") else text


def parse_squeue(stdout: str, stderr: str = "", returncode: int = 0) -> dict[str, SlurmJob]:
    """Jobs by id from ``squeue_argv``'s output.

    squeue exits 1 with "Invalid job id specified" when the only job asked for is one it has
    forgotten (with several ids it just leaves the forgotten out): that is an empty answer too.
    Any other failure raises ValueError with squeue's message.
    """
    if returncode != 0:
        if "Invalid job id specified" in stderr:
            return {}
        raise ValueError(f"squeue failed ({returncode}): {(stderr or stdout).strip()[:500]}")
    jobs = {}
    for parts in _rows(stdout, 9, "squeue", SQUEUE_FORMAT):
        job_id, state, start, submit, end, memory, nodes, name, reason = parts
        jobs[job_id] = SlurmJob(
            job_id=job_id,
            state=state.strip(),
            reason=_reason(reason),
            submit=_time(submit),
            start=_time(start),
            end=_time(end),
            nodes=nodes.strip(),
            name=name,
            memory=memory.strip(),
        )
    return jobs


# -- what a Slurm state means to us ---------------------------------------------------

OurState = Literal["pending", "running", "exited", "failed", "cancelled", "lost"]

_PENDING_REASONS = {
    "Resources": "waiting for resources: the nodes it needs are busy",
    "Priority": "waiting behind jobs with a higher priority",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "waiting for a dependency that can never be met; cancel it",
    "BeginTime": "waiting for its start time",
    "JobHeldUser": "held by its owner (scontrol release to let it run)",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "waiting for nodes that are down, drained or reserved",
    "PartitionTimeLimit": "its time limit is longer than the partition allows; it will not start",
    "PartitionNodeLimit": "it asks for more nodes than the partition has or allows; it will not start",
    "PartitionConfig": "it asks for more than the partition's nodes have; it will not start",
    "PartitionDown": "waiting: the partition is down",
    "PartitionInactive": "waiting: the partition is inactive",
    "NodeDown": "waiting: a node it needs is down",
    "BadConstraints": "no node can satisfy what it asks for; it will not start",
    "Reservation": "waiting for its reservation to start",
    "QOSMaxJobsPerUserLimit": "waiting: you have as many jobs running as your QOS allows",
    "QOSMaxSubmitJobPerUserLimit": "waiting: you have as many jobs queued as your QOS allows",
    "QOSMaxCpuPerUserLimit": "waiting: your running jobs use all the CPUs your QOS allows",
    "QOSMaxGRESPerUser": "waiting: your running jobs use all the GPUs your QOS allows",
    "QOSMaxWallDurationPerJobLimit": "its time limit is longer than its QOS allows; it will not start",
    "QOSGrpCpuLimit": "waiting: the QOS's CPUs are all in use",
    "QOSGrpGRES": "waiting: the QOS's GPUs are all in use",
    "AssocMaxJobsLimit": "waiting: your account has as many jobs running as it may",
    "AssocGrpCpuLimit": "waiting: your account's CPUs are all in use",
    "AssocGrpGRES": "waiting: your account's GPUs are all in use",
    "AssocGrpJobsLimit": "waiting: your account has as many jobs running as it may",
    "launch failed requeued held": "held after its launch failed; an administrator must release it",
    "JobLaunchFailure": "its launch failed",
    "NonZeroExitCode": "",
    "TimeLimit": "",
}


def pending_reason(reason: str) -> str:
    """Slurm's pending reason as a short sentence; unknown reasons are shown as Slurm wrote them."""
    reason = reason.strip().strip("()")
    if not reason:
        return "waiting for the scheduler"
    word = reason.split(",", 1)[0].strip()
    sentence = _PENDING_REASONS.get(word)
    if sentence:
        return sentence
    return f"waiting ({reason})"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A Slurm job in our words: state, a reason a user understands, and the command's exit code if known."""

    state: OurState
    reason: str = ""
    exit_code: int | None = None
    cause: str | None = None  # a retry policy's cause where Slurm says it (schema/retry.py)


_CANCELLED_BY = re.compile(r"^CANCELLED(?: by (\d+))?$", re.IGNORECASE)


def interpret(job: SlurmJob | None, exit_code: int | None = None, log_tail: str = "") -> Outcome:
    """What a Slurm job's state means to us.

    ``exit_code`` is what batch.sh wrote (None when there is no file), ``log_tail`` the end of the
    job's log: the only place that says a job was killed for its memory when memory is enforced by
    sampling (jobacct_gather's OverMemoryKill reports FAILED, not OUT_OF_MEMORY). ``job`` None
    means Slurm no longer knows it: its exit code file decides, else it is lost.
    """
    if job is None:
        if exit_code is not None:
            return Outcome("exited", exit_code=exit_code)
        return Outcome("lost", "Slurm no longer knows the job and it left no exit code")
    state = job.state.strip().upper()
    word = state.split()[0] if state else ""
    if word == "PENDING":
        return Outcome("pending", pending_reason(job.reason))
    if word in ("REQUEUED", "REQUEUE_FED"):
        return Outcome("pending", "requeued by Slurm; it will run again from the start")
    if word in ("REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"):
        return Outcome("pending", "requeued and held; it waits for a release (scontrol release)")
    if word == "CONFIGURING":
        return Outcome("pending", "its nodes are being set up")
    if word in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"):
        return Outcome("running")
    if word in ("SUSPENDED", "STOPPED"):
        return Outcome("running", "suspended by Slurm; it resumes when Slurm lets it")
    if out_of_memory(log_tail) or word == "OUT_OF_MEMORY":
        limit = f"its {job.memory} limit" if job.memory else "its memory limit"
        return Outcome("failed", f"out of memory: the job exceeded {limit} and Slurm stopped it; ask for more memory")
    if word == "COMPLETED":
        return Outcome("exited", exit_code=0 if exit_code is None else exit_code)
    if word == "FAILED":
        if exit_code is not None:
            return Outcome("exited", exit_code=exit_code)
        if job.exit_code is not None and job.reason != "JobLaunchFailure":
            return Outcome("exited", exit_code=job.exit_code)
        return Outcome("failed", "Slurm could not run its batch script; see the job's log")
    if word == "TIMEOUT":
        return Outcome("failed", "stopped by Slurm at its time limit", exit_code)
    if word == "DEADLINE":
        return Outcome("failed", "stopped by Slurm: it could not finish before its deadline", exit_code)
    if word == "NODE_FAIL":
        return Outcome("failed", "a node it ran on failed", exit_code, cause="lost")
    if word == "BOOT_FAIL":
        return Outcome("failed", "its node failed to boot")
    if word == "PREEMPTED":
        return Outcome("failed", "preempted by Slurm for a higher-priority job", exit_code, cause="preempted")
    if word == "REVOKED":
        return Outcome("lost", "revoked by Slurm: a sibling cluster of the federation runs it")
    cancelled = _CANCELLED_BY.match(state)
    if cancelled:
        who = cancelled.group(1)
        if who is None:
            return Outcome("cancelled", "cancelled in Slurm", exit_code)
        by = "an administrator (root)" if who == "0" else f"user id {who}"
        return Outcome("cancelled", f"cancelled in Slurm by {by}", exit_code)
    # A state this version does not know: say so, but do not end a job that may still be running.
    return Outcome("running", f"Slurm reports {job.state}")


#: Slurm's own line in a job's log (slurmstepd's) when it stopped the job, and why: a cancel says no more,
#: a job taken off its node ``*** JOB 7 ON node1 CANCELLED AT 2026-12-06T01:41:24 DUE TO JOB REQUEUE ***``.
_STOPPED = re.compile(r"\*\*\* JOB (?P<id>\d+) ON (?P<node>\S+) CANCELLED AT \S+(?P<why>[^\n*]*)\*\*\*")
_DUE_TO = re.compile(r"DUE TO (NODE FAILURE|PREEMPTION|JOB REQUEUE)\b")
#: srun's line, in a job of several nodes, naming the node that failed (slurmstepd's names the batch host).
_SRUN_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)$", re.MULTILINE)
#: Why Slurm took a job off its node, as a retry policy's cause and in words.
_TAKEN_OFF_AS = {
    "NODE FAILURE": ("lost", "its node {node} failed"),
    "PREEMPTION": ("preempted", "Slurm preempted it on {node} for a higher-priority job"),
    "JOB REQUEUE": ("preempted", "Slurm requeued it, taking it off {node}"),
}
#: Slurm states a job taken off its node may be in while we look: held for its restart, or ended there
#: (``CANCELLED`` once this side ended the attempt and cancelled what Slurm held).
TAKEN_OFF_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "CANCELLED", "NODE_FAIL", "PREEMPTED"}
)


def requeued(job: SlurmJob, log_tail: str) -> Outcome | None:
    """The attempt Slurm took off its node (node failure, preemption, ``scontrol requeue``), as Slurm's own
    line at the end of the job's log says; None when it says nothing of the kind.

    Slurm would run the batch script again from the start, later (a requeue waits ~2 minutes), without the
    secrets it never held: the attempt ends here instead (``lost`` after a node failure, ``preempted``
    otherwise, Slurm's line in the reason), and a retry policy starts the next one from its checkpoints.
    """
    if (job.state.split() or [""])[0].upper() not in TAKEN_OFF_STATES:
        return None
    said = None
    for found in _STOPPED.finditer(log_tail):
        if found.group("id") == job.job_id:
            said = found  # the last time Slurm stopped this job: a cancel after a requeue it ran again is a cancel
    due = _DUE_TO.search(said.group("why")) if said is not None else None
    if said is None or due is None:
        return None
    cause, words = _TAKEN_OFF_AS[due.group(1)]
    node = said.group("node")
    failed = _SRUN_NODE_FAILURE.findall(log_tail) if due.group(1) == "NODE FAILURE" else []
    reason = f"{words.format(node=failed[-1] if failed else node)}: {said.group(0)}"
    return Outcome("lost", reason, cause=cause)


_OOM_SIGNS = ("Exceeded job memory limit", "exceeded memory limit", "oom-kill event", "oom_kill event")


def out_of_memory(log_tail: str) -> bool:
    """Whether Slurm's own lines in a job's log say it was killed for its memory."""
    return any(sign in log_tail for sign in _OOM_SIGNS)


def scancel_argv(job_ids: Sequence[str]) -> list[str]:
    """Cancel jobs: Slurm sends TERM to every process of the job, waits its KillWait, then KILLs."""
    return ["scancel", *_checked_ids(job_ids)]
