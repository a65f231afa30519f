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
from ..launcher import JOB_ENV_SH, READ_ENV_SH, rank_env_sh
from ..resources import NO_RESOURCES, Resources, format_memory, scheduler_name

#: How long before its time limit a job is warned (sbatch --signal), unless the limit is shorter.
WARN_BEFORE_SECONDS = 300
#: The signal that warns the batch script; it notes the warning and passes it on to the command's process
#: group (unless the machine's ``warn_command`` is false), so a script may checkpoint on it.
WARN_SIGNAL = "USR1"
BATCH_SCRIPT = "batch.sh"
SLURM_JOB_ID_FILE = "slurm_job_id"
#: The job's secrets between submit and start: 0600, read and removed by batch.sh as it starts.
SECRETS_FILE = "secrets.env"
WARNING_FILE = "time_limit_warning"
#: Seconds a torchrun job's nodes have to meet at its rendezvous (torchrun's own default join_timeout).
RENDEZVOUS_TIMEOUT = 600

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
    "--ntasks": "use the job's nodes and processes_per_node resources",
    "--ntasks-per-node": "use the job's processes_per_node resource",
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
    rendezvous_timeout: int = RENDEZVOUS_TIMEOUT
    warn_command: bool = True  # the time limit's warning passed on to the command (batch_script)

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
            rendezvous_timeout=_seconds(options.get("rendezvous_timeout"), "rendezvous_timeout", RENDEZVOUS_TIMEOUT),
            warn_command=_flag(options.get("warn_command"), "warn_command", True),
        )


def _flag(value: Any, field: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidSettings(f"{field}: expected true or false, got {value!r}", field=field)
    return value


def _seconds(value: Any, field: str, default: int) -> int:
    if value is None or value == "":
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSettings(f"{field}: expected a whole number of seconds, at least 1, got {value!r}", field=field)
    return value


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
    # One task per process, or per node where torchrun (one task) starts the node's processes; a
    # node's CPUs are shared among its tasks, one CPU per process at least.
    per_node = asked.processes_per_node or 1
    tasks = 1 if asked.launcher == "torchrun" else per_node
    argv.append(f"--ntasks-per-node={tasks}")
    cpus = asked.cpus if asked.cpus is not None else (per_node if tasks == 1 and per_node > 1 else None)
    if cpus is not None:
        argv.append(f"--cpus-per-task={max(1, cpus // tasks)}")
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


# After srun: the first rank whose own code is a failure, not the TERM or KILL srun ended it with.
FIRST_FAILED_RANK_SH = """\
if [ "$code" != 0 ]; then
  for f in "$jobdir"/ranks/*/exit_code; do
    [ -f "$f" ] || continue
    c=$(cat "$f")
    case $c in '' | 0 | 143 | 137) continue ;; esac
    r=${f%/exit_code}
    node=$(cat "$r/node" 2>/dev/null)
    echo "jupyter-remote-compute: rank ${r##*/} on $node exited with $c; the job's other processes were stopped"
    code=$c
    break
  done
fi
"""

# After srun, for torchrun: a node whose torchrun gave up waiting at the rendezvous left its name in
# ranks/node<N>.waited; the allocation's nodes that left none never joined. The job's code is that
# torchrun's, not the TERM srun stopped the others with.
RENDEZVOUS_TIMED_OUT_SH = """\
if [ "$code" != 0 ] && ls "$jobdir"/ranks/node*.waited >/dev/null 2>&1; then
  waited=" $(cat "$jobdir"/ranks/node*.waited | tr '\\n' ' ')"
  for f in "$jobdir"/ranks/node*.waited; do
    c=$(cat "${f%.waited}.exit_code" 2>/dev/null)
    case $c in '' | 0 | 143 | 137) ;; *) code=$c ;; esac
  done
  missing=
  for n in $(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null); do
    case $waited in *" $n "*) ;; *) missing="$missing${missing:+, }$n" ;; esac
  done
  echo "jupyter-remote-compute: the rendezvous at $MASTER_ADDR:$MASTER_PORT did not complete within" \\
    "${join}s: ${missing:-a node} never joined; the job's other processes were stopped"
fi
"""


def batch_script(
    job_dir: str,
    resources: Resources = NO_RESOURCES,
    rendezvous_timeout: int = RENDEZVOUS_TIMEOUT,
    warn_command: bool = True,
) -> str:
    """The POSIX sh script sbatch runs: the command in ``work/``, its exit code written atomically.

    Every job gets the variables torchrun and ``torch.distributed`` read (``launcher.rank_env_sh``),
    the same way on every node: ``MASTER_ADDR`` (the address Slurm has for the allocation's first
    node), ``MASTER_PORT`` (from the job id, so two jobs sharing a node differ), ``NNODES`` (the
    allocation's). A job of one process runs its command here; a
    ``distributed`` one starts through ``srun`` and ``farside/rank.sh``: ``plain``, one task per
    process, ranks from Slurm, each with its share of the node's GPUs in ``CUDA_VISIBLE_DEVICES``;
    ``torchrun``, one task per node, each a torchrun whose c10d rendezvous is at the first node,
    its workers seeing all the node's GPUs; a rendezvous not complete within ``rendezvous_timeout``
    seconds fails the job naming the nodes that never joined. ``--kill-on-bad-exit`` ends every
    process when one fails.

    TERM (scancel, the time limit) reaches the command from Slurm itself, and from the script; the
    script outlives it long enough to record its exit code. The warning signal is noted in the log and
    a file and, with ``warn_command``, passed on to a job of one process: its command runs in a session
    of its own (``setsid``), in a shell that only notes USR1 itself, so the signal sent to that process
    group reaches the user's programs (which may checkpoint on it; one without a handler ends) and not
    the shell that waits for them. A job of several processes started ``plain`` gets it through
    ``srun``, which passes it on to every process of its step; ``rank.sh``'s own shells note it (or
    ignore it, the one copying the log), so each rank's command gets it. A ``torchrun`` job is not sent
    it: torchrun ends on it, or, told to handle it, stops its workers.
    """
    if not job_dir.startswith("/"):
        raise ValueError(f"job_dir must be absolute, got {job_dir!r}")
    per_node = resources.processes_per_node or 1
    rank_env = rank_env_sh(
        per_node,
        master_addr='"$addr"',
        master_port="$((20000 + ${SLURM_JOB_ID:-0} % 20000))",
        nnodes="${SLURM_JOB_NUM_NODES:-1}",
    )
    after = ""
    passed_on = warn_command and not resources.distributed
    # A plain job's ranks (rank.sh traps USR1 in its own shells) get it through srun, which passes a
    # signal on to its step's processes; torchrun ends on it (or, told to handle it, stops its workers).
    to_ranks = warn_command and resources.distributed and resources.launcher != "torchrun"
    if passed_on:
        # The sourcing shell outlives a USR1 and a TERM, waiting for what it started (whose actions are the
        # defaults again): a program that checkpoints on either has until Slurm's KillWait.
        start = f'setsid sh -c \'trap : {WARN_SIGNAL} TERM; . "$0"\' "$jobdir/command.sh" &'
    elif not resources.distributed:
        start = 'sh "$jobdir/command.sh" &'
    else:
        # rank.sh sets each process's CUDA_VISIBLE_DEVICES from the GPUs asked per node.
        gpus = resources.gpus or 0
        if resources.launcher == "torchrun":
            tasks = f'--ntasks="$NNODES" --ntasks-per-node=1 sh "$jobdir/rank.sh" "$jobdir" torchrun {gpus} "$join"'
        else:
            tasks = (
                '--ntasks="$WORLD_SIZE" --ntasks-per-node="$LOCAL_WORLD_SIZE" '
                f'sh "$jobdir/rank.sh" "$jobdir" plain {gpus}'
            )
        # A requeued job's ranks start afresh.
        start = (
            f'rm -rf "$jobdir/ranks"\njoin={int(rendezvous_timeout)}\n'
            f'srun --kill-on-bad-exit=1 --nodes="$NNODES" {tasks} &'
        )
        # srun answers for the ranks it stopped (143) when one failed: the job's code is the one that
        # failed, named with its node (rank.sh leaves each rank's code and node in ranks/R/).
        after = FIRST_FAILED_RANK_SH + (RENDEZVOUS_TIMED_OUT_SH if resources.launcher == "torchrun" else "")
    # The command's process group where it has one of its own (a pid alone else).
    group = '-- "-$child"' if passed_on else '"$child"'
    tell = f" (sent {WARN_SIGNAL} to the command)" if passed_on else ""
    forward = f"kill -s {WARN_SIGNAL} {group} 2>/dev/null" if passed_on or to_ranks else ":"
    if to_ranks:
        tell = f" (sent {WARN_SIGNAL} to every process of the job)"
    # TERM goes to the command's first process only: Slurm sends its own to every process of the job, and a
    # second to the whole group would reach what that process runs to stop cleanly (container.sh's
    # `podman stop`), leaving the container behind.
    stop = 'kill -s TERM "$child" 2>/dev/null'
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
{JOB_ENV_SH}# The first node's address as Slurm reaches it (NodeAddr), else its name.
first=$(scontrol show hostnames "${{SLURM_JOB_NODELIST:-}}" 2>/dev/null | head -n 1)
addr=$(scontrol show node "$first" 2>/dev/null | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | head -n 1)
[ -n "$addr" ] || addr=${{first:-$(hostname)}}
{rank_env}attempt=$((${{SLURM_RESTART_COUNT:-0}} + 1))
echo "jupyter-remote-compute: Slurm job ${{SLURM_JOB_ID:-?}} on ${{SLURM_JOB_NODELIST:-?}}, attempt $attempt"
warned() {{
  echo "jupyter-remote-compute: Slurm's time limit is near; the job will be stopped soon{tell}"
  : > "$jobdir/{WARNING_FILE}"
  {forward}
}}
trap warned {WARN_SIGNAL}
trap '{stop}' TERM
{start}
child=$!
# A trapped signal interrupts wait; wait again until the command itself has ended.
while :; do
  wait "$child"
  code=$?
  kill -0 "$child" 2>/dev/null || break
done
{after}printf '%s\\n' "$code" > "$jobdir/exit_code.tmp" && mv -f "$jobdir/exit_code.tmp" "$jobdir/exit_code"
exit "$code"
"""
