"""A Slurm cluster: the ssh transport to its login node, and a launcher that places jobs through Slurm.

``SlurmEngine`` is the ssh kind (``SSHEngine``: route, host keys, the content-addressed input
cache, the verified fetch, the job folder on the shared filesystem under ``base_dir``) with
``SlurmLauncher`` in place of the detached process. It overrides only ``cleanup`` (what Slurm still
holds of the job is cancelled first); what differs is how a job starts, is watched and stops, all in
the launcher:

- ``start`` writes ``batch.sh`` beside ``command.sh`` and submits it with ``sbatch`` (through
  ``slurm_commands.SUBMIT_SH``, so a second submission finds the first). The plain environment
  reaches sbatch on stdin; secrets go to a 0600 file (farside/envfile.sh) batch.sh reads and removes as it starts, so
  they are in neither argv, nor sbatch's exported environment (which slurmctld keeps in its state).
- ``poll`` asks ``squeue`` once for every job of the machine, and reads the exit codes the batch
  scripts wrote with the shared status script, in the same round trip. A controller that does not
  answer is left alone for a while (doubling, at most ``MAX_BACKOFF`` seconds). A job that ran and
  waits again, whose log ends with Slurm's line that it took the job off its node (node failure,
  preemption, requeue), has lost its attempt (``slurm_commands.requeued``): what Slurm holds of it is
  cancelled, and a retry policy starts the next attempt from its checkpoints.
- ``cancel`` is ``scancel``, then waits until Slurm no longer has the job running or completing.
- ``check`` adds the cluster's facts (version, partitions, nodes, CPUs, GPUs, limits) to the
  login node's.

All of Slurm's text (argv, scripts, parsers, states) lives in ``slurm_commands/``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidSettings
from . import farside
from .base import (
    RESOURCE_NAMES,
    EngineError,
    Features,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    OptionField,
    RemoteJob,
    RemoteStatus,
    refuse_distributed,
)
from .launcher import ENV_END, command_script, launch_input
from .resources import Resources
from .shell import Launcher, ShellEngine
from .slurm_commands import (
    BATCH_SCRIPT,
    CHECK_SH,
    SECRETS_FILE,
    SLURM_JOB_ID_FILE,
    SUBMIT_SH,
    TAKEN_OFF_STATES,
    Outcome,
    SlurmFacts,
    SlurmJob,
    SlurmMissing,
    SlurmSettings,
    batch_script,
    interpret,
    parse_check,
    parse_sbatch_output,
    parse_squeue,
    refuse_unfit,
    requeued,
    sbatch_argv,
    scancel_argv,
    squeue_argv,
)
from .ssh import SSHEngine
from .ssh_hosts import HOSTS
from .transport import quote

log = logging.getLogger(__name__)

#: The longest a busy controller is left alone between polls.
MAX_BACKOFF = 300.0
#: How long the cluster's partitions (for refusing unfit resources at submit) are trusted.
FACTS_TTL = 300.0
#: How long cancel waits, beyond the grace, for Slurm to finish killing the job (its KillWait).
CANCEL_SETTLE = 60.0
#: How much of a job's log's end is read for Slurm's own lines (a memory kill, a node taken away).
LOG_TAIL = 16 << 10
#: Slurm states in which the job's processes may still exist.
_LIVE_STATES = "PENDING|CONFIGURING|RUNNING|COMPLETING|SUSPENDED|STOPPED|SIGNALING|STAGE_OUT|RESIZING|REQUEUED"
#: Slurm states of a job that will not run again.
_ENDED_STATES = frozenset({"CANCELLED", "NODE_FAIL", "PREEMPTED"})
#: What squeue says when the controller is too busy (or down) to answer: try again later.
_BUSY_SIGNS = ("Socket timed out", "Unable to contact slurm controller", "slurm_load_jobs error", "Zero Bytes")


class SlurmLauncher(Launcher):
    """Jobs placed by Slurm: ``sbatch`` to start, ``squeue`` (with the far side's status) to watch, ``scancel``."""

    # A job's image runs in the batch job (command.sh is container.sh). Podman only: its containers are
    # the job's own processes, inside the allocation; docker's are its daemon's, out of Slurm's reach.
    image_runtimes = ("podman",)

    def __init__(self, engine: ShellEngine) -> None:
        super().__init__(engine)
        self.name = engine.name
        self.settings = SlurmSettings.from_options(engine.machine_options)
        self._lock = threading.Lock()
        self._facts: tuple[float, SlurmFacts] | None = None
        self._backoff = 0.0
        self._quiet_until = 0.0

    # -- what the cluster offers ----------------------------------------------------

    def _slurm_facts(self, fresh: bool = False) -> SlurmFacts:
        with self._lock:
            cached = self._facts
        if cached is not None and not fresh and time.monotonic() - cached[0] < FACTS_TTL:
            return cached[1]
        res = self.engine.transport.run(CHECK_SH, timeout=60)
        try:
            facts = parse_check(res.text())
        except SlurmMissing as e:
            raise EngineError(f"{self.name}: {e}") from None
        with self._lock:
            self._facts = (time.monotonic(), facts)
        return facts

    def facts(self) -> dict[str, Any]:
        return self._slurm_facts(fresh=True).to_json()  # beside the login node's own facts

    def admit(self, resources: Resources) -> None:
        """Refuse at submit what no node of the partition can give: Slurm would queue it for ever."""
        asked = resources.over(self.settings.defaults)
        refuse_distributed(asked, self.engine.features, self.name, self.engine.kind)
        per_node = asked.processes_per_node or 1
        if asked.cpus is not None and asked.launcher != "torchrun" and asked.cpus % per_node:
            raise InvalidSettings(
                f"resources.cpus: {asked.cpus} CPUs per node do not share evenly among {per_node} processes per "
                f"node; ask for a multiple of {per_node}",
                field="resources.cpus",
            )
        gpus = asked.gpus or 0
        if gpus and asked.launcher != "torchrun" and gpus % per_node and per_node % gpus:
            raise InvalidSettings(
                f"resources.gpus: {gpus} GPUs per node do not share evenly among {per_node} processes per node; "
                f"ask for a multiple or a divisor of {per_node}",
                field="resources.gpus",
            )
        try:
            refuse_unfit(asked, self._slurm_facts().partitions, self.settings.partition)
        except InvalidSettings as e:
            field = f"resources.{e.field}" if e.field else "resources"
            raise InvalidSettings(f"resources.{e}", field=field) from None

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        d, settings = self.engine.job_dir(job), self.settings
        resources = (launch.resources or Resources()).over(settings.defaults)
        argv = sbatch_argv(job.job_id, d, launch.resources or Resources(), settings, launch.timeout)
        # stdin: the plain environment (for sbatch's --export=ALL), a marker, then the secrets,
        # which this script splits off into a file only the user can read (farside/envfile.sh). Without
        # the secrets' end line the stream was cut short (this side died writing it): nothing is submitted.
        payload = launch_input(launch.env, {}) + b"@@secrets\n" + launch_input({}, launch.secret_env)
        body = f"""cd -- {quote(d)} || exit 97
umask 077
if [ -s {SLURM_JOB_ID_FILE} ]; then cat {SLURM_JOB_ID_FILE}; exit 0; fi
printf '%s' {quote(command_script(launch.command))} > command.sh
printf '%s' {quote(batch_script(d, resources, settings.rendezvous_timeout, settings.warn_command))} > {BATCH_SCRIPT}
printf '%s' {quote(farside.script("rank"))} > rank.sh
printf '%s' {quote(SUBMIT_SH)} > submit.sh
plain=
secrets=
part=plain
whole=
while IFS= read -r line; do
  if [ "$line" = @@secrets ]; then part=secrets; continue; fi
  if [ $part = secrets ] && [ "$line" = {ENV_END} ]; then whole=1; continue; fi
  if [ $part = plain ]; then plain="$plain$line
"; else secrets="$secrets$line
"; fi
done
if [ -z "$whole" ]; then echo "the job's environment came cut short: nothing was submitted" >&2; exit 96; fi
printf '%s' "$secrets" | {farside.command_line("envfile", SECRETS_FILE)}
printf '%s' "$plain" | sh submit.sh {quote(d)} {" ".join(quote(a) for a in argv)}
"""
        res = self.engine.transport.run(body, payload, timeout=120, retry=False)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: submitting job {job.job_id} (sbatch)"))
        slurm_id = parse_sbatch_output(res.text())
        return dataclasses.replace(job, handle={**job.handle, "slurm_job_id": slurm_id})

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        now = time.monotonic()
        if now < self._quiet_until:
            raise EngineError(
                f"{self.name}: the Slurm controller was busy; asking again in {self._quiet_until - now:.0f} s",
                transient=True,
            )
        ids = [self._slurm_id(job) for job in jobs]
        squeue = " ".join(quote(a) for a in squeue_argv(sorted(set(ids))))
        status = farside.command_line(
            "status", *farside.status_words([quote(self.engine.job_dir(job)) for job in jobs], bool(watched))
        )
        body = f"""e=$(mktemp) || exit 3
{squeue} >"$e.out" 2>"$e" </dev/null
rc=$?
echo @@squeue; cat "$e.out"; echo "@@rc $rc"; echo @@stderr; cat "$e"; echo @@end
rm -f "$e" "$e.out"
{status}
"""
        # squeue reads /dev/null: the watched jobs on stdin are status.sh's (live metrics).
        res = self.engine.transport.run(body, farside.watch_input(jobs, watched) if watched else b"", timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: poll"))
        text = res.text()
        head, _, rest = text.partition("@@end\n")
        out, _, err = head.partition("@@stderr\n")
        out = out.split("@@squeue\n", 1)[-1]
        out, _, rc_line = out.rpartition("@@rc ")
        rc = int(rc_line.strip() or 1)
        if rc != 0 and any(sign in err for sign in _BUSY_SIGNS):
            self._backoff = min(MAX_BACKOFF, max(5.0, self._backoff * 2))
            self._quiet_until = time.monotonic() + self._backoff
            raise EngineError(f"{self.name}: the Slurm controller did not answer: {err.strip()[:200]}", transient=True)
        queue = parse_squeue(out, err, rc)
        self._backoff = 0.0
        rest, blob = farside.split_metrics(rest.encode())
        files = farside.parse_status(rest, jobs, self.name)
        statuses = {}
        taken_off = []
        for job, slurm_id in zip(jobs, ids, strict=True):
            far = files[job.job_id]
            slurm = queue.get(slurm_id)
            code = far.exit_code if far.state == "exited" else None
            outcome = interpret(slurm, code)
            said = None
            word = (slurm.state.split() or [""])[0] if slurm is not None else ""
            if slurm is not None and far.log_size and word in TAKEN_OFF_STATES:
                # A job that ran (it has a log) and waits again, or ended without its command: did Slurm
                # take it off its node? Only the log says so (there may be no accounting).
                said = requeued(slurm, self._log_tail(job, far.log_size))
            if said is not None:
                outcome = said
                if word not in _ENDED_STATES:
                    taken_off.append(slurm_id)  # Slurm holds it to run again
            elif outcome.state in ("failed", "exited") and slurm is not None and outcome.exit_code != 0:
                # Only the log says a job was killed for its memory where Slurm samples it.
                outcome = interpret(slurm, code, self._log_tail(job, far.log_size))
            statuses[job.job_id] = dataclasses.replace(_status(outcome, far.log_size, slurm), warned=far.warned)
        if taken_off:
            self._withdraw(taken_off)
        return statuses, farside.parse_metrics(blob, jobs)

    def _withdraw(self, slurm_ids: list[str]) -> None:
        """Cancel what Slurm holds to run again of attempts that ended when it took them off their node: it
        would start the batch script from the start in a folder this side is done with. Idempotent; a
        failure is tried again at the next poll (the job's log still says why)."""
        res = self.engine.transport.run(" ".join(quote(a) for a in scancel_argv(sorted(set(slurm_ids)))), timeout=60)
        if res.code != 0:
            log.warning("%s: %s", self.name, res.error(f"cancelling requeued Slurm jobs {', '.join(slurm_ids)}"))

    def _log_tail(self, job: RemoteJob, size: int | None) -> str:
        """The end of the job's log, where Slurm writes why it stopped the job."""
        try:
            start = max(0, (size or 0) - LOG_TAIL)
            return self.engine.read_log(job, start, LOG_TAIL).decode("utf-8", "replace")
        except EngineError:
            return ""

    def cancel(self, job: RemoteJob, grace: float) -> None:
        d = self.engine.job_dir(job)
        slurm_id = job.handle.get(SLURM_JOB_ID_FILE)
        if not slurm_id:
            return  # never submitted: there is nothing in Slurm to stop
        slurm_id = self._slurm_id(job)
        tries = int((grace + CANCEL_SETTLE) * 2)
        scancel = " ".join(quote(a) for a in scancel_argv([slurm_id]))
        state = " ".join(quote(a) for a in squeue_argv([slurm_id]))
        # TERM now (Slurm KILLs after its own KillWait), then wait until nothing of the job is left.
        body = f"""{scancel} || exit $?
rm -f {quote(d + "/" + SECRETS_FILE)}
i=0
while :; do
  s=$({state} 2>/dev/null | cut -d'|' -f2)
  case "$s" in {_LIVE_STATES}) ;; *) exit 0 ;; esac
  i=$((i + 1))
  if [ $i -ge {tries} ]; then echo "Slurm job {slurm_id} is still $s after scancel" >&2; exit 4; fi
  sleep 0.5
done
"""
        res = self.engine.transport.run(body, timeout=grace + CANCEL_SETTLE + 30, retry=True)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: cancelling job {job.job_id} (Slurm job {slurm_id})"))

    @staticmethod
    def _slurm_id(job: RemoteJob) -> str:
        slurm_id = job.handle.get(SLURM_JOB_ID_FILE) if job.handle else None
        if not isinstance(slurm_id, str) or not slurm_id.isdigit():
            raise EngineError(f"job {job.job_id}: no Slurm job id recorded (it was not submitted)")
        return slurm_id


class SlurmEngine(SSHEngine):
    """A Slurm cluster: the ssh transport to its login node, and the Slurm launcher (sbatch) for its jobs."""

    launcher_class = SlurmLauncher

    kind = "slurm"
    label = "Slurm cluster"
    features = Features(
        host_keys=True,
        pending=True,
        resources=frozenset(RESOURCE_NAMES),
        checkpoints=True,
        launchers=("plain", "torchrun"),
    )
    options = {
        **{key: field for key, field in SSHEngine.options.items() if key != HOSTS},
        "base_dir": OptionField(
            str, "Directory for jobs and the input cache on the cluster's shared filesystem (~/.jupyter-remote-compute)"
        ),
        "partition": OptionField(str, "Partition jobs go to unless they name one (default: the cluster's)"),
        "account": OptionField(str, "Account jobs are charged to (sbatch --account)"),
        "qos": OptionField(str, "Quality of service (sbatch --qos)"),
        "resources": OptionField(
            dict, "Default resources: {gpus, cpus, memory, nodes, partition, processes_per_node, launcher}"
        ),
        "sbatch_args": OptionField(list, "Extra sbatch arguments, e.g. ['--constraint=a100']"),
        "rendezvous_timeout": OptionField(
            int,
            "Seconds a torchrun job's nodes have to meet at its rendezvous before it fails naming the nodes that "
            "never joined (default 600)",
        ),
        "warn_command": OptionField(
            bool,
            "Pass Slurm's warning before the time limit (USR1) on to the command's process group (every rank's, "
            "torchrun jobs' aside), so it can checkpoint (default true; a program without a USR1 handler ends on it)",
        ),
    }

    def cleanup(self, job: RemoteJob) -> None:
        # What Slurm still holds of the job (one requeued, waiting to run again) goes first: it would
        # start in a folder that is gone, or in the next attempt's of the same name.
        self.launcher.cancel(job, 0)
        super().cleanup(job)


def _status(outcome: Outcome, log_size: int | None, slurm: SlurmJob | None = None) -> RemoteStatus:
    """slurm_commands' outcome as the lifecycle's RemoteStatus, with Slurm's times where it has them."""
    times = _times(outcome, slurm)
    if outcome.state in ("pending", "running"):
        return RemoteStatus(outcome.state, log_size=log_size, detail=outcome.reason, **times)
    if outcome.state == "exited":
        return RemoteStatus("exited", exit_code=outcome.exit_code, log_size=log_size, **times)
    if outcome.state == "lost":
        return RemoteStatus("gone", log_size=log_size, detail=outcome.reason, cause=outcome.cause, **times)
    return RemoteStatus(
        outcome.state,
        exit_code=outcome.exit_code,
        log_size=log_size,
        detail=outcome.reason,
        cause=outcome.cause,
        **times,
    )


def _times(outcome: Outcome, slurm: SlurmJob | None) -> dict[str, float | None]:
    """queued_at/started_at/ended_at from squeue. A pending job's start and a running job's end are
    Slurm's forecasts (the scheduler's estimate, the time limit), not what happened: left out."""
    if slurm is None:
        return {}
    ran = outcome.state != "pending"
    ended = outcome.state not in ("pending", "running")
    return {
        "queued_at": slurm.submit,
        "started_at": slurm.start if ran else None,
        "ended_at": slurm.end if ended else None,
    }
