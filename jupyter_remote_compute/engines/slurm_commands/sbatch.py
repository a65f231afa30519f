"""What submitting a Slurm job builds: the machine's settings, sbatch's argv, and the scripts
that submit the job and that sbatch runs."""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidSettings
from ..base import WORK_DIR
from ..launcher import JOB_ENV_SH, READ_ENV_SH
from ..resources import Resources, format_memory, scheduler_name

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
