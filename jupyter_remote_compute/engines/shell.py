"""An engine over a transport and a launcher: the far side written once for every shell-reached kind.

A kind here is two choices:

- a **transport** (``transport.Transport``): how a far-side sh script reaches the machine. This
  computer (``LocalTransport``), OpenSSH or paramiko (``ssh_connection``); a ``kubectl exec`` would be one more.
- a **launcher** (``Launcher``): how a job is placed on the machine and watched. ``DetachedLauncher``
  starts it as a detached process group (local, ssh); Slurm's submits a batch job
  (``slurm.SlurmLauncher``). Everything else is the same far side (``farside/``), run here once:

==============  ===========================================================================
``check``       facts.sh, plus what the launcher adds (a cluster's partitions)
``prepare``     prepare.sh: the job's folder, marked as this job's; another job's is refused
``send``        one tar stream through the content-addressed input cache (``cache_send``)
``read_log``    log.sh: a window of the job's log
``fetch``       manifest.sh: one verified tar of the declared outputs
``cleanup``     cleanup.sh: only the folder whose job.json names the job
==============  ===========================================================================

Far-side layout (``base_dir``)::

    <base>/cache/<sha256>      inputs by content, read-only, written by rename (farside/cache.sh)
    <base>/jobs/<job id>/      the job directory of ``base.py`` (work/, mlruns/, log, ...)
"""

from __future__ import annotations

import abc
import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from . import cache_send, farside
from .base import (
    Engine,
    EngineContext,
    EngineError,
    FetchResult,
    InputFile,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from .launcher import command_script, launch_input
from .resources import Resources
from .ssh_transfer import UnsafeArchive, check_relpath
from .transport import CALL_TIMEOUT, Dropped, Result, Transport, dropped_under, quote, sh_script

#: A command script longer than this is written in a call of its own, not on the start's command line.
LONG_COMMAND = 64 << 10


class Launcher:
    """How a job is placed on the machine and watched: start, poll, cancel, and what may be asked.

    The default (``DetachedLauncher``) is a process group on the machine itself. A launcher
    reaches the machine only through its engine's transport and far-side folders.
    """

    #: The container runtimes a job's image may run in here (environments/image.py, farside/container.sh).
    image_runtimes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, engine: ShellEngine) -> None:
        self.engine = engine

    def facts(self) -> dict[str, Any]:
        """Facts the launcher adds to ``check`` (a scheduler's partitions); none by default."""
        return {}

    def admit(self, resources: Resources) -> None:
        """Refuse at submit what this placement can never give (the machine's own facts by default)."""
        Engine.admit(self.engine, resources)

    @abc.abstractmethod
    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        """Start the command in the prepared job folder; idempotent (a second start finds the first)."""

    @abc.abstractmethod
    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        """The state of many jobs in one round trip, with the new metric bytes of the watched ones."""

    @abc.abstractmethod
    def cancel(self, job: RemoteJob, grace: float) -> None:
        """Stop the job: TERM, KILL after ``grace``, and return only once nothing of it runs."""


class DetachedLauncher(Launcher):
    """The job as a detached process group on the machine (``launch.sh``): it outlives every connection."""

    image_runtimes = ("podman", "docker")

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        return self.start_with(job, launch, {})

    def start_with(self, job: RemoteJob, launch: LaunchSpec, files: Mapping[str, str]) -> RemoteJob:
        """``start``, with ``files`` (name -> text) written into the job folder first, in the same call."""
        engine = self.engine
        d = engine.job_dir(job)
        payload = launch_input(launch.env, launch.secret_env)  # secrets: stdin only
        script = command_script(launch.command)
        if len(script) > LONG_COMMAND:
            # Too long for one command line: write it first, in its own call.
            res = engine.transport.run(f"cat > {quote(d + '/command.sh')}", script.encode(), retry=False)
            if res.code != 0:
                raise EngineError(res.error(f"{engine.name}: writing the command of {job.job_id}"))
            write = ":"
        else:
            write = f"printf '%s' {quote(script)} > command.sh"
        for name, text in files.items():
            write += f"\nprintf '%s' {quote(text)} > {quote(name)}"
        body = f"""cd -- {quote(d)} || exit 97
if [ -f pid ]; then read -r p < pid; echo "already $p"; exit 0; fi
{write}
exec sh {quote(d + "/launch.sh")} {quote(d)}
"""
        res = engine.transport.run(body, payload, timeout=60, retry=False)
        if res.code != 0:
            raise EngineError(res.error(f"{engine.name}: starting job {job.job_id}"))
        words = res.text().split()
        if not words or not words[-1].isdigit():
            raise EngineError(f"{engine.name}: the launcher did not report a process id ({res.text()[-200:]!r})")
        return dataclasses.replace(job, handle={**job.handle, "pid": int(words[-1])})

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        engine = self.engine
        words = farside.status_words([quote(engine.job_dir(job)) for job in jobs], bool(watched))
        stdin = farside.watch_input(jobs, watched) if watched else b""
        res = engine.transport.run(farside.command_line("status", *words), stdin, timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{engine.name}: poll"))
        text, blob = farside.split_metrics(res.out)
        return farside.parse_status(text, jobs, engine.name), farside.parse_metrics(blob, jobs)

    def cancel(self, job: RemoteJob, grace: float) -> None:
        engine = self.engine
        body = farside.command_line("cancel", quote(engine.job_dir(job)), farside.cancel_ticks(grace))
        res = engine.transport.run(body, timeout=grace + 30, retry=True)
        if res.code != 0:
            raise EngineError(res.error(f"{engine.name}: cancelling job {job.job_id}"))


class ShellEngine(Engine):
    """A machine reached by a ``Transport``, its jobs placed by a ``Launcher``, the rest the shared far side.

    A kind gives ``make_transport`` and, where it is not a detached process, ``launcher_class``.
    """

    #: How jobs are placed on this kind of machine.
    launcher_class: ClassVar[type[Launcher]] = DetachedLauncher
    #: The setting that names the far-side base folder, for the error when it cannot be made.
    base_setting: ClassVar[str] = "base_dir"

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        super().__init__(name, address, options, context)
        self.base_dir = self.default_base_dir()
        self.transport = self.make_transport()
        self.launcher = self.launcher_class(self)
        self._run = self.transport.run  # the shorthand every far-side call goes through

    @abc.abstractmethod
    def make_transport(self) -> Transport:
        """The way to this machine (made once per engine; it connects on first use)."""

    @abc.abstractmethod
    def default_base_dir(self) -> str:
        """The far-side base folder: absolute, or relative to the far side's home (``~/…``)."""

    def close(self) -> None:
        self.transport.close()

    # -- far-side paths ------------------------------------------------------------

    def base_expr(self) -> str:
        """The base dir as a sh word: ``~`` becomes "$HOME", a relative path is under the home dir."""
        base = self.base_dir
        if base == "~":
            return '"$HOME"'
        if base.startswith("~/"):
            return '"$HOME"/' + quote(base[2:])
        if base.startswith("/"):
            return quote(base)
        return '"$HOME"/' + quote(base)

    def jobs_expr(self) -> str:
        """The folder of job folders as a sh word."""
        return self.base_expr() + "/jobs"

    @staticmethod
    def job_dir(job: RemoteJob) -> str:
        """The job's folder on the machine, as ``prepare`` made it."""
        d = job.handle.get("dir") if job.handle else None
        if not isinstance(d, str) or not d.startswith("/"):
            raise EngineError(f"job {job.job_id}: no job directory on the machine yet (prepare it first)")
        return d

    # -- the job's life -------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        rtt_ms = self.transport.round_trip() * 1000
        index = (quote(str(self.machine_options.get(k) or "")) for k in farside.INDEX_OPTIONS)
        res = self._run(farside.command_line("facts", self.base_expr(), *index), timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: check"))
        common = farside.parse_facts(res.text(), rtt_ms, transport=self.transport.transport_name).to_json()
        extra = self.launcher.facts()  # the machine's own facts win: every kind reports the same shape
        return {**{k: v for k, v in extra.items() if k not in common}, **common}

    def admit(self, resources: Resources) -> None:
        self.launcher.admit(resources)

    def image_runtimes(self) -> tuple[str, ...]:
        return self.launcher.image_runtimes

    def image_pins(self) -> str:
        return self.base_expr() + "/images"

    def prepare(self, job: RemoteJob) -> RemoteJob:
        args = farside.prepare_args("", job.job_id, job.key)  # a job id that is no plain name stops here
        prepare = farside.command_line("prepare", '"$d"', *(quote(a) for a in args[1:]))
        body = f"""set -e
base={self.base_expr()}
jobs={self.jobs_expr()}
if ! (umask 077 && mkdir -p -- "$jobs"); then
  echo "cannot create the base folder $base ({self.base_setting}): choose a folder this user may write" >&2
  exit 3
fi
d="$jobs/"{quote(job.job_id)}
{prepare}
"""
        res = self._run(body, timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: preparing job {job.job_id}"))
        path = res.text().strip().splitlines()[-1]
        if not path.startswith("/"):
            raise EngineError(f"{self.name}: unexpected job directory {path!r}")
        return dataclasses.replace(job, handle={**(job.handle or {}), "dir": path})

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        return cache_send.send_inputs(self.transport, self.job_dir(job), files, self.machine_options, progress)

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        return self.launcher.start(job, launch)

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return self.poll_watched(jobs, {})[0]

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        if not jobs:
            return {}, {}
        return self.launcher.poll_watched(jobs, watched)

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        if limit == 0:
            return b""
        res = self._run(farside.command_line("log", quote(self.job_dir(job)), str(offset), str(limit)), timeout=120)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: reading the log of {job.job_id}"))
        return res.out

    def note(self, job: RemoteJob, line: str) -> None:
        """Add a line to the job's log on the machine, after what its command wrote so far: the command
        appends to the log too (``>>``; Slurm's ``--open-mode=append``), so neither writes over the other."""
        log_file = quote(self.job_dir(job) + "/log")
        data = (line.rstrip("\n") + "\n").encode()
        res = self._run(f"[ -f {log_file} ] && cat >> {log_file}", data, timeout=60, retry=False)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: adding a line to the log of {job.job_id}"))

    def cancel(self, job: RemoteJob, grace: float) -> None:
        self.launcher.cancel(job, grace)

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        return self._fetch(job, outputs, dest, progress, tracking=True)

    def list_checkpoints(self, job: RemoteJob, folder: str) -> dict[str, tuple[int, int]]:
        check_relpath(folder, "checkpoints")
        res = self._run(farside.command_line("checkpoints", quote(self.job_dir(job)), quote(folder)))
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: listing the checkpoints of {job.job_id}"))
        return farside.parse_checkpoint_listing(res.out.decode("utf-8", "surrogateescape"))

    def fetch_checkpoints(self, job: RemoteJob, paths: Sequence[str], dest: Path) -> FetchResult:
        return self._fetch(job, paths, dest, None, tracking=False)

    def _fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None,
        *,
        tracking: bool,
    ) -> FetchResult:
        d = self.job_dir(job)
        for out in outputs:
            check_relpath(out, "output")
        manifest = f".fetch-{uuid.uuid4().hex}"
        flags = () if tracking else ("--no-tracking",)
        body = farside.command_line("manifest", *flags, quote(d), quote(manifest), *(quote(o) for o in outputs))
        t = self.transport
        try:
            with t.channel(sh_script(body), CALL_TIMEOUT) as ch:
                ch.shutdown_write()
                err = bytearray()

                def read(n: int) -> bytes:
                    data = ch.recv(n)
                    t.drain_stderr(ch, err)
                    return data

                try:
                    result = farside.receive_outputs(read, outputs, dest, manifest, self.name, progress)
                except UnsafeArchive:
                    if not ch.get_transport().is_active():
                        # Cut short by a dropped connection, not a bad archive: fetch again.
                        raise Dropped("the connection closed while fetching outputs") from None
                    raise
                except (farside.NoManifest, farside.ArchiveCut) as e:
                    # Nothing came, or the stream stopped before its digests: the far side's words say why,
                    # unless it was the connection that went away.
                    code = t.finish(ch, err, CALL_TIMEOUT)
                    if dropped_under(ch, code):
                        raise Dropped("the connection closed while fetching outputs") from None
                    if code in (0, -1) and isinstance(e, farside.ArchiveCut):
                        raise
                    raise EngineError(Result(code, b"", bytes(err)).error(f"{self.name}: fetching outputs")) from None
                code = t.finish(ch, err, CALL_TIMEOUT)
        except Dropped as e:
            raise t.lost(e) from None
        if code != 0:
            raise EngineError(Result(code, b"", bytes(err)).error(f"{self.name}: fetching outputs"))
        return result

    def cleanup(self, job: RemoteJob) -> None:
        # Only the directory this job's prepare made (its job.json names the job) is removed.
        res = self._run(farside.command_line("cleanup", quote(self.job_dir(job)), quote(job.job_id)), timeout=300)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: removing job {job.job_id}"))
