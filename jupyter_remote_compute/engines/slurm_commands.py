"""Slurm as text: the commands the slurm engine types on a login node and how it reads the answers.

Nothing here does I/O. Every function turns settings into an argv or a script, or turns a
command's output into typed records, so all of it is tested without a cluster and then again
against the real one in tests/test_slurm_bed.py.

Only text output formats are read (explicit ``--format`` strings with a ``|`` delimiter, and
``--parsable2`` for sacct): ``--json`` changes layout between Slurm versions. Times are asked for
as epoch seconds (``SLURM_TIME_FORMAT=%s``), so the cluster's time zone never matters.

The far side of a Slurm job uses the job folder of every push engine (``base.py``):

    <job dir>/batch.sh        the script sbatch runs (``batch_script``)
    <job dir>/command.sh      the job's command (``launcher.command_script``)
    <job dir>/work/           its working directory
    <job dir>/log             stdout and stderr (sbatch --output, appended across requeues)
    <job dir>/exit_code       written atomically by batch.sh: accounting is often off
    <job dir>/slurm_job_id    written by ``SUBMIT_SH`` once sbatch accepted the job
    <job dir>/secrets.env     the job's secrets (0600) from submit until batch.sh starts and removes it
    <job dir>/time_limit_warning   created when Slurm's warning signal arrives
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..errors import InvalidSettings
from .base import WORK_DIR
from .launcher import JOB_ENV_SH, READ_ENV_SH
from .resources import Resources, format_memory, scheduler_name

#: How long before its time limit a job is warned (sbatch --signal), unless the limit is shorter.
WARN_BEFORE_SECONDS = 300
#: The signal that warns the batch script; it notes the warning and does not stop the command.
WARN_SIGNAL = "USR1"
BATCH_SCRIPT = "batch.sh"
SLURM_JOB_ID_FILE = "slurm_job_id"
#: The job's secrets between submit and start: 0600, read and removed by batch.sh as it starts.
SECRETS_FILE = "secrets.env"
WARNING_FILE = "time_limit_warning"

_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


# -- machine settings and sbatch ------------------------------------------------------

# Options the engine sets itself (or that have their own setting): an extra argument naming one
# would fight the engine's value or break how it finds the job's log, name and id.
_OWNED_LONG = {
    "--output": "the engine writes the log to the job folder",
    "--error": "the engine writes the log to the job folder",
    "--input": "the job reads no standard input",
    "--open-mode": "the engine appends the log across requeues",
    "--job-name": "the engine names the job to find it again",
    "--parsable": "the engine reads sbatch's answer itself",
    "--chdir": "the job runs in its work folder",
    "--wrap": "the engine writes the batch script",
    "--export": "the engine passes the job's environment",
    "--signal": "the engine warns the job before its time limit",
    "--time": "use the job's timeout",
    "--wait": "the engine polls; sbatch must return at once",
    "--array": "one job is one Slurm job",
    "--test-only": "the job would never be queued",
    "--partition": "use the machine's or the job's partition setting",
    "--account": "use the machine's account setting",
    "--qos": "use the machine's qos setting",
    "--nodes": "use the job's nodes resource",
    "--cpus-per-task": "use the job's cpus resource",
    "--ntasks": "the engine runs one task per node",
    "--ntasks-per-node": "the engine runs one task per node",
    "--mem": "use the job's memory resource",
    "--mem-per-cpu": "use the job's memory resource",
    "--mem-per-gpu": "use the job's memory resource",
    "--gres": "use the job's gpus resource",
    "--gpus": "use the job's gpus resource",
    "--gpus-per-node": "use the job's gpus resource",
    "--gpus-per-task": "use the job's gpus resource",
    "--gpus-per-socket": "use the job's gpus resource",
    "--cpus-per-gpu": "use the job's cpus resource",
}
_OWNED_SHORT = {
    "-o": "--output",
    "-e": "--error",
    "-i": "--input",
    "-J": "--job-name",
    "-D": "--chdir",
    "-t": "--time",
    "-W": "--wait",
    "-a": "--array",
    "-p": "--partition",
    "-A": "--account",
    "-q": "--qos",
    "-N": "--nodes",
    "-c": "--cpus-per-task",
    "-n": "--ntasks",
    "-G": "--gpus",
}


def validate_sbatch_args(args: Any, field: str = "sbatch_args") -> tuple[str, ...]:
    """A machine's extra sbatch arguments: a list of strings, none naming an option the engine owns.

    Long options may be abbreviated on sbatch's command line, so ``--out=x`` is refused like ``--output``.
    """
    if isinstance(args, str) or not isinstance(args, (list, tuple)):
        raise InvalidSettings(f"{field}: expected a list such as ['--constraint=a100', '--exclusive']", field=field)
    out = []
    for i, arg in enumerate(args):
        where = f"{field}[{i}]"
        if not isinstance(arg, str) or not arg or any(c in arg for c in "\r\n\0"):
            raise InvalidSettings(f"{where}: expected a non-empty string on one line, got {arg!r}", field=field)
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            owned = [opt for opt in _OWNED_LONG if opt.startswith(name)] if len(name) > 2 else []
            if owned:
                raise InvalidSettings(f"{where}: {arg!r} is set by the engine ({_OWNED_LONG[owned[0]]})", field=field)
        elif arg.startswith("-") and len(arg) > 1:
            long = _OWNED_SHORT.get(arg[:2])
            if long:
                raise InvalidSettings(f"{where}: {arg!r} is set by the engine ({_OWNED_LONG[long]})", field=field)
        elif i == 0:
            raise InvalidSettings(f"{where}: {arg!r} is not an option; options start with '-'", field=field)
        out.append(arg)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """A slurm machine's scheduler settings (its address, base_dir and sign-in are the ssh engine's)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_args: tuple[str, ...] = ()
    defaults: Resources = dataclasses.field(default_factory=Resources)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SlurmSettings:
        def name(key: str) -> str | None:
            value = options.get(key)
            return None if value in (None, "") else scheduler_name(value, key)

        return cls(
            partition=name("partition"),
            account=name("account"),
            qos=name("qos"),
            sbatch_args=validate_sbatch_args(options.get("sbatch_args") or [], "sbatch_args"),
            defaults=Resources.from_json(options.get("resources"), "resources."),
        )


def time_limit_minutes(timeout_seconds: float) -> int:
    """Slurm counts time limits in whole minutes: round up, so a job never gets less than it asked for."""
    if timeout_seconds <= 0:
        raise InvalidSettings("timeout: must be longer than zero", field="timeout")
    return max(1, math.ceil(timeout_seconds / 60))


def warn_before_seconds(limit_minutes: int | None) -> int:
    """How long before the limit to warn: five minutes, or half of a shorter limit (at least a minute)."""
    if limit_minutes is None:
        return WARN_BEFORE_SECONDS
    return max(60, min(WARN_BEFORE_SECONDS, limit_minutes * 30))


def slurm_path(path: str) -> str:
    """A path for sbatch's ``--output``, whose ``%`` starts a pattern (``%j``): ``%%`` is a literal one."""
    return path.replace("%", "%%")


def job_name(job_id: str) -> str:
    """The Slurm job name of one of our jobs: ``jrc-<job id>``, found again in squeue."""
    if not _JOB_NAME.match(job_id):
        raise ValueError(f"job id {job_id!r} cannot be part of a Slurm job name")
    return f"jrc-{job_id}"


def sbatch_argv(
    job_id: str,
    job_dir: str,
    resources: Resources,
    settings: SlurmSettings,
    timeout_seconds: float | None,
) -> list[str]:
    """``sbatch`` and its arguments for one job whose folder (absolute, on the shared filesystem) is ``job_dir``."""
    if not job_dir.startswith("/"):
        raise ValueError(f"job_dir must be absolute (sbatch expands no ~), got {job_dir!r}")
    asked = resources.over(settings.defaults)
    argv = ["sbatch", *settings.sbatch_args, "--parsable", f"--job-name={job_name(job_id)}"]
    partition = asked.partition or settings.partition
    if partition:
        argv.append(f"--partition={partition}")
    if settings.account:
        argv.append(f"--account={settings.account}")
    if settings.qos:
        argv.append(f"--qos={settings.qos}")
    if asked.nodes is not None:
        argv.append(f"--nodes={asked.nodes}")
    # One task per node: the batch script (or srun, on several nodes) starts the command once per node.
    argv.append("--ntasks-per-node=1")
    if asked.cpus is not None:
        argv.append(f"--cpus-per-task={asked.cpus}")
    if asked.memory_mb is not None:
        argv.append(f"--mem={format_memory(asked.memory_mb)}")
    if asked.gpus:
        argv.append(f"--gres=gpu:{asked.gpus}")
    limit = None
    if timeout_seconds is not None:
        limit = time_limit_minutes(timeout_seconds)
        argv.append(f"--time={limit}")
    argv.append(f"--signal=B:{WARN_SIGNAL}@{warn_before_seconds(limit)}")
    argv += [
        f"--chdir={job_dir}/{WORK_DIR}",
        f"--output={slurm_path(job_dir)}/log",
        "--open-mode=append",
        "--export=ALL",
        f"{job_dir}/{BATCH_SCRIPT}",
    ]
    return argv


def parse_sbatch_output(text: str) -> str:
    """The job id from ``sbatch --parsable``: ``1234`` or ``1234;cluster``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    job_id = lines[-1].split(";", 1)[0] if lines else ""
    if not job_id.isdigit():
        raise ValueError(f"sbatch did not answer with a job id: {text.strip()[:200]!r}")
    return job_id


# -- the far-side scripts -------------------------------------------------------------

# Run as ``sh submit.sh <job dir> sbatch <args...>`` with the job's environment on stdin (the
# launcher's base64 lines, ``launcher.launch_input``): the variables are exported and sbatch's
# --export=ALL hands them to the job, so no secret is in argv or a file of ours (slurmctld keeps
# the job's environment in its own state folder, readable by Slurm's user only). Submitting twice
# (this side crashed before it recorded the id) finds the first submission.
SUBMIT_SH = f"""\
#!/bin/sh
set -u
jobdir=$1
shift
if [ -s "$jobdir/{SLURM_JOB_ID_FILE}" ]; then cat "$jobdir/{SLURM_JOB_ID_FILE}"; exit 0; fi
{READ_ENV_SH}answer=$("$@" < /dev/null) || exit $?
idfile="$jobdir/{SLURM_JOB_ID_FILE}"
printf '%s\\n' "$answer" > "$idfile.tmp" && mv -f "$idfile.tmp" "$idfile"
printf '%s\\n' "$answer"
"""


def batch_script(job_dir: str, nodes: int = 1) -> str:
    """The POSIX sh script sbatch runs: the command in ``work/``, its exit code written atomically.

    On several nodes the command starts through ``srun``, once per node, with the rendezvous
    variables torchrun and ``torch.distributed`` read: ``MASTER_ADDR`` (the first node),
    ``MASTER_PORT`` (from the job id, so two jobs sharing a node differ), ``WORLD_SIZE`` (nodes)
    and ``NODE_RANK``. They are set on one node too, so the same script runs either way.

    TERM (scancel, the time limit) reaches the command from Slurm itself; the script outlives it
    long enough to record its exit code. The warning signal is noted in the log and a file, and is
    not passed on: a program without a handler would die of it.
    """
    if not job_dir.startswith("/"):
        raise ValueError(f"job_dir must be absolute, got {job_dir!r}")
    if nodes > 1:
        start = (
            'srun --nodes="$WORLD_SIZE" --ntasks="$WORLD_SIZE" --ntasks-per-node=1 '
            'sh -c \'NODE_RANK=$SLURM_NODEID; export NODE_RANK; exec sh "$1/command.sh"\' sh "$jobdir" &'
        )
    else:
        start = 'sh "$jobdir/command.sh" &'
    return f"""#!/bin/sh
# Written by jupyter-remote-compute: the batch script Slurm runs for this job folder.
jobdir={shlex.quote(job_dir)}
cd "$jobdir/{WORK_DIR}" || exit 97
# Secrets come from a file only this user can read, removed at once: they were never in sbatch's
# environment, so slurmctld's saved job state does not hold them (a requeued attempt runs without).
if [ -f "$jobdir/{SECRETS_FILE}" ]; then
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    name=${{line%%=*}}
    value=$(printf '%s' "${{line#*=}}" | base64 -d) || exit 98
    export "$name=$value"
  done < "$jobdir/{SECRETS_FILE}"
  rm -f "$jobdir/{SECRETS_FILE}"
fi
# A requeued job runs again from here: an exit code from an earlier attempt is not this one's.
rm -f "$jobdir/exit_code" "$jobdir/exit_code.tmp" "$jobdir/{WARNING_FILE}"
{JOB_ENV_SH}MASTER_ADDR=$(scontrol show hostnames "${{SLURM_JOB_NODELIST:-}}" 2>/dev/null | head -n 1)
[ -n "$MASTER_ADDR" ] || MASTER_ADDR=$(hostname)
MASTER_PORT=$((20000 + ${{SLURM_JOB_ID:-0}} % 20000))
WORLD_SIZE=${{SLURM_JOB_NUM_NODES:-1}}
NODE_RANK=0
export MASTER_ADDR MASTER_PORT WORLD_SIZE NODE_RANK
attempt=$((${{SLURM_RESTART_COUNT:-0}} + 1))
echo "jupyter-remote-compute: Slurm job ${{SLURM_JOB_ID:-?}} on ${{SLURM_JOB_NODELIST:-?}}, attempt $attempt"
warned() {{
  echo "jupyter-remote-compute: Slurm's time limit is near; the job will be stopped soon"
  : > "$jobdir/{WARNING_FILE}"
}}
trap warned {WARN_SIGNAL}
trap 'kill -TERM "$child" 2>/dev/null' TERM
{start}
child=$!
# A trapped signal interrupts wait; wait again until the command itself has ended.
while :; do
  wait "$child"
  code=$?
  kill -0 "$child" 2>/dev/null || break
done
printf '%s\\n' "$code" > "$jobdir/exit_code.tmp" && mv -f "$jobdir/exit_code.tmp" "$jobdir/exit_code"
exit "$code"
"""


# -- squeue and sacct -----------------------------------------------------------------

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
        return Outcome("failed", "a node it ran on failed", exit_code)
    if word == "BOOT_FAIL":
        return Outcome("failed", "its node failed to boot")
    if word == "PREEMPTED":
        return Outcome("failed", "preempted by Slurm for a higher-priority job", exit_code)
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


_OOM_SIGNS = ("Exceeded job memory limit", "exceeded memory limit", "oom-kill event", "oom_kill event")


def out_of_memory(log_tail: str) -> bool:
    """Whether Slurm's own lines in a job's log say it was killed for its memory."""
    return any(sign in log_tail for sign in _OOM_SIGNS)


def scancel_argv(job_ids: Sequence[str]) -> list[str]:
    """Cancel jobs: Slurm sends TERM to every process of the job, waits its KillWait, then KILLs."""
    return ["scancel", *_checked_ids(job_ids)]


# -- check: what a login node offers --------------------------------------------------

SINFO_FORMAT = "%P|%a|%l|%D|%T|%c|%m|%G|%N"
REQUIRED_COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")

#: One round trip for ``check``: each section starts with ``@@name`` and ends with ``@@rc <code>``.
CHECK_SH = f"""\
for c in {" ".join(REQUIRED_COMMANDS)}; do command -v "$c" >/dev/null 2>&1 || echo "@@missing $c"; done
echo @@version; sinfo --version 2>&1; echo "@@rc $?"
echo @@partitions; sinfo --noheader --format='{SINFO_FORMAT}' 2>&1; echo "@@rc $?"
echo @@user; id -un; echo "@@rc $?"
echo @@account
timeout 20 sacctmgr --noheader --parsable2 show user "$(id -un)" format=DefaultAccount 2>&1; echo "@@rc $?"
"""


class SlurmMissing(Exception):
    """The login node lacks Slurm's commands; the message says which."""


@dataclasses.dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    available: str  # "up", "down", "drain", "inactive"
    time_limit: str  # as Slurm writes it: "infinite", "1-00:00:00", "30:00"
    time_limit_minutes: int | None  # None: no limit
    nodes: int
    node_states: dict[str, int]  # e.g. {"idle": 3, "mixed": 1}
    cpus_per_node: int  # the largest node's
    memory_mb_per_node: int
    gpus_per_node: int
    node_list: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"node_list": list(self.node_list)}


@dataclasses.dataclass(frozen=True)
class SlurmFacts:
    version: str
    user: str
    partitions: tuple[Partition, ...]
    default_account: str | None
    accounting: bool  # whether sacctmgr could answer (slurmdbd reachable)

    def to_json(self) -> dict[str, Any]:
        return {
            "slurm_version": self.version,
            "user": self.user,
            "partitions": [p.to_json() for p in self.partitions],
            "default_account": self.default_account,
            "accounting": self.accounting,
        }


def parse_time_limit(text: str) -> int | None:
    """Minutes from Slurm's ``[days-]hours:minutes:seconds`` (or ``minutes``), rounded up; None if unlimited."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited", "none", "n/a", ""):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        raise ValueError(f"not a Slurm time: {text!r}")
    total = (int(days or 0) * 24 + hours) * 60 + minutes
    return total + (1 if seconds else 0)


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a gres string: ``gpu:4``, ``gpu:a100:2(S:0-1)``, ``gpu:2,shard:8``, ``(null)``."""
    total = 0
    for item in gres.split(","):
        item = item.split("(", 1)[0].strip()
        fields = item.split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def _number(text: str) -> int:
    digits = text.strip().rstrip("+")  # "2+": nodes of the group differ; the smallest is given
    return int(digits) if digits.isdigit() else 0


def parse_sinfo(stdout: str) -> list[Partition]:
    """Partitions from ``sinfo --format=SINFO_FORMAT`` (one line per partition and node state)."""
    grouped: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 9:
            raise ValueError(f"sinfo printed a line not in {SINFO_FORMAT!r}: {line[:200]!r}")
        name, avail, limit, count, state, cpus, memory, gres, nodes = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        entry = grouped.setdefault(
            name,
            {
                "default": default,
                "available": avail,
                "time_limit": limit,
                "states": {},
                "cpus": 0,
                "mem": 0,
                "gpus": 0,
                "nodes": [],
            },
        )
        entry["states"][state] = entry["states"].get(state, 0) + _number(count)
        entry["cpus"] = max(entry["cpus"], _number(cpus))
        entry["mem"] = max(entry["mem"], _number(memory))
        entry["gpus"] = max(entry["gpus"], gpus_in_gres(gres))
        entry["nodes"].append(nodes)
    return [
        Partition(
            name=name,
            default=e["default"],
            available=e["available"],
            time_limit=e["time_limit"],
            time_limit_minutes=parse_time_limit(e["time_limit"]),
            nodes=sum(e["states"].values()),
            node_states=e["states"],
            cpus_per_node=e["cpus"],
            memory_mb_per_node=e["mem"],
            gpus_per_node=e["gpus"],
            node_list=tuple(e["nodes"]),
        )
        for name, e in grouped.items()
    ]


def parse_scontrol_oneliner(stdout: str) -> list[dict[str, str]]:
    """Records from ``scontrol show <thing> --oneliner``: one ``Key=Value`` line each."""
    records = []
    for line in stdout.splitlines():
        if "=" not in line:
            continue
        record = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                record[key] = value
        records.append(record)
    return records


def _sections(stdout: str) -> tuple[dict[str, tuple[str, int]], list[str]]:
    sections: dict[str, tuple[str, int]] = {}
    missing: list[str] = []
    name, lines = "", []
    for line in stdout.splitlines():
        if line.startswith("@@missing "):
            missing.append(line.split(None, 1)[1])
        elif line.startswith("@@rc "):
            sections[name] = ("\n".join(lines), int(line.split()[1]))
            name, lines = "", []
        elif line.startswith("@@"):
            name, lines = line[2:].strip(), []
        else:
            lines.append(line)
    return sections, missing


def parse_check(stdout: str) -> SlurmFacts:
    """The facts ``CHECK_SH`` printed; SlurmMissing when the login node has no Slurm commands."""
    sections, missing = _sections(stdout)
    if missing:
        raise SlurmMissing(
            f"the login node has no {', '.join(missing)} on its PATH: is this a Slurm login node? "
            "(if Slurm comes from a module, load it in the login shell's profile)"
        )
    version_text, version_rc = sections.get("version", ("", 1))
    if version_rc != 0:
        raise SlurmMissing(f"sinfo --version failed: {version_text.strip()[:300]}")
    partitions_text, partitions_rc = sections.get("partitions", ("", 1))
    if partitions_rc != 0:
        raise ValueError(f"sinfo failed: {partitions_text.strip()[:300]}")
    account_text, account_rc = sections.get("account", ("", 1))
    account_lines = [line.strip() for line in account_text.splitlines() if line.strip()]
    accounting = account_rc == 0
    return SlurmFacts(
        version=version_text.strip().split()[-1] if version_text.strip() else "",
        user=sections.get("user", ("", 0))[0].strip(),
        partitions=tuple(parse_sinfo(partitions_text)),
        default_account=(account_lines[0] or None) if accounting and account_lines else None,
        accounting=accounting,
    )


def refuse_unfit(resources: Resources, partitions: Sequence[Partition], default_partition: str | None = None) -> None:
    """Refuse, before sbatch, what no node of the partition can give (Slurm would queue it for ever).

    Many clusters accept such a job and leave it pending (reason PartitionConfig or
    PartitionNodeLimit); a clear error at submit, naming the resource, is better.
    """
    wanted = resources.partition or default_partition
    if wanted:
        matching = [p for p in partitions if p.name == wanted]
        if not matching:
            names = ", ".join(p.name for p in partitions) or "none"
            raise InvalidSettings(
                f"partition: {wanted!r} is not a partition here (there are: {names})", field="partition"
            )
    else:
        matching = [p for p in partitions if p.default]
    if not matching:
        return  # no default partition: sbatch itself says what it wants
    part = matching[0]
    limits = (
        ("cpus", resources.cpus, part.cpus_per_node, "CPUs per node"),
        ("gpus", resources.gpus, part.gpus_per_node, "GPUs per node"),
        ("memory", resources.memory_mb, part.memory_mb_per_node, "MiB of memory per node"),
        ("nodes", resources.nodes, part.nodes, "nodes"),
    )
    for field, asked, most, what in limits:
        if asked is not None and asked > most:
            raise InvalidSettings(
                f"{field}: {format_memory(asked) if field == 'memory' else asked} asked, but partition "
                f"{part.name!r} has at most {most} {what}",
                field=field,
            )
