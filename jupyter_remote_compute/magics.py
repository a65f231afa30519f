"""``%remote_train``, ``%%remote_train`` and ``%remote_jobs``: the lifecycle from a notebook.

The kernel uses the library directly (no server extension needed) on the
workspace found from its working directory, so the Compute panel, the CLI and
the magic see the same jobs. The options are those of ``jupyter remote-compute
run``, plus ``--wait``; they are parsed once, by argparse, from the line split
the way a shell would split it. The command after ``--`` is kept as written: the
machine's shell runs it, as it runs every face's command (``&&``, pipes, quotes).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import io
import shlex
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

from .errors import NotTrained, RemoteComputeError
from .fsutil import atomic_write
from .jobs.listing import add_list_arguments, iter_jobs, list_arguments
from .jobs.service import JobService, ServiceSettings, require_trained
from .jobs.spec import JobSpec, format_duration, parse_duration
from .jobview import JobTable, RemoteTrainJob, detach_hint, follow, summary_line
from .people import local_person
from .run_options import add_run_options, add_sweep_options, spec_settings
from .workspace import Workspace

#: Where ``%%remote_train`` keeps cell bodies: in the workspace (so they can be sent), never in .punica.
CELLS_DIR = ".remote-compute-cells"

TRAIN_EXAMPLES = """\
The command after -- is one line for the machine's shell (sh), run in the job's
folder as written (&&, pipes and quotes work there), as in the New Job form and a
pipeline step; IPython fills in {name} and $name from the notebook first, as in any
magic. Paths are relative to the workspace (the folder holding .punica/, else the
notebook's folder). Running the same cell again attaches to its job while it
runs; interrupting the kernel stops waiting and the job keeps running.

examples:
  %remote_train --machine gpu-box --send train.py --send 'data/*.csv' --bring-back model.pkl -- python train.py
  %remote_train --machine local --env HF_TOKEN=secret:hf/token --timeout 2h --wait 10m -- python train.py
  %remote_train --send prepare.py --send train.py -- python prepare.py && python train.py --epochs 3
  job = %remote_train --detach --send train.py --bring-back model.pkl -- python train.py
  job.wait(); job.outputs["model.pkl"]

  %%remote_train --machine gpu-box --send 'data/*.csv' --bring-back model.pkl
  # the cell body is the script: it runs with `python` in the job's folder
  import pickle; pickle.dump({"a": 1}, open("model.pkl", "wb"))
"""

JOBS_SHOWN = 50  # what %remote_jobs lists without --limit or --all
JOBS_EXAMPLES = """\
examples:
  %remote_jobs                      the newest 50 jobs of the workspace (--all: every one)
  %remote_jobs --state running      only running jobs
  %remote_jobs --name sweep --since 2026-11-01 --limit 200
  %remote_jobs 20261129-100200-ab12cd   one job, as an object: .wait(), .log(), .cancel(), .outputs
  %remote_jobs --cancel 20261129-100200-ab12cd
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports to the notebook instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n\n{self.format_usage()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Done(message)


class _Done(Exception):
    """--help was printed; nothing else to do."""


def build_train_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="%remote_train",
        description="Run a training command on a machine, stream its log here and bring its outputs back.",
        epilog=TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(p)
    add_sweep_options(p)
    p.add_argument("--wait", help="how long this cell waits (default: until the job ends); the job keeps running")
    return p


def build_jobs_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="%remote_jobs",
        description="List the workspace's jobs, show one, or cancel one.",
        epilog=JOBS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job_id", nargs="?", help="show this job as an object")
    p.add_argument("--cancel", metavar="JOB_ID", help="cancel this job")
    add_list_arguments(p, JOBS_SHOWN)
    return p


def _words(line: str) -> list[tuple[str, int]]:
    """The line split as a shell splits it, each word with where the text after it starts."""
    lexer = shlex.shlex(io.StringIO(line), posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    words = []
    while (word := lexer.get_token()) != lexer.eof:
        words.append((word, lexer.instream.tell()))
    return words


def _parse(parser: argparse.ArgumentParser, line: str) -> argparse.Namespace | None:
    """The options; for ``%remote_train`` also ``args.command_line``, the command as written after ``--``."""
    try:
        words = _words(line)
    except ValueError as e:  # an unclosed quote
        raise UsageError(f"{parser.prog}: {e}") from None
    try:
        args = parser.parse_args([word for word, _ in words])
    except _Done:
        print(parser.format_help())
        return None
    if "command" in args:
        # argparse took the command's words last: its text starts after the word before them (and
        # after --), so the machine's shell gets the line as typed, quotes and && included.
        first = len(words) - len(args.command) + (args.command[:1] == ["--"])
        args.command_line = line[words[first - 1][1] :].strip() if first else line.strip()
    return args


def write_cell(root: Path, body: str) -> str:
    """Keep a cell body as a script in the workspace; the same body is the same file (and so the same job).

    Named by the body's whole sha256: screening takes a digest-length hex run for what it is, not a token.
    """
    digest = hashlib.sha256(body.encode()).hexdigest()
    rel = f"{CELLS_DIR}/{digest}.py"
    path = root / rel
    if not path.is_file() or path.read_text(encoding="utf-8") != body:
        atomic_write(path, body.encode(), mode=0o644)  # a file of the user's, as a notebook is
    ignore = root / CELLS_DIR / ".gitignore"
    if not ignore.exists():
        # Copies of notebook cells, not sources: the notebook is what is versioned.
        atomic_write(ignore, b"*\n", mode=0o644)
    return rel


@magics_class
class RemoteComputeMagics(Magics):
    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self._services: dict[Path, JobService] = {}
        self._lock = threading.Lock()
        #: Jobs this kernel stopped waiting for: running the cell again shows them even once they ended.
        self._detached: set[str] = set()

    def service(self) -> JobService:
        """The lifecycle service of the workspace around the kernel's current directory."""
        workspace = Workspace.find()
        with self._lock:
            service = self._services.get(workspace.root)
            if service is None:
                # MLflow is not imported into the kernel: a detached recorder records the run once the
                # job has ended (recording/recorder.py), so a short job returns as soon as its outputs landed.
                settings = ServiceSettings(record_in_background=True)
                service = self._services[workspace.root] = JobService(workspace, settings)
            return service

    def close(self) -> None:
        with self._lock:
            for service in self._services.values():
                service.close()
            self._services.clear()

    @line_cell_magic
    def remote_train(self, line: str, cell: str | None = None) -> RemoteTrainJob | None:
        __tracebackhide__ = True
        args = _parse(build_train_parser(), line)
        if args is None:
            return None
        command: str = args.command_line
        service = self.service()
        if cell is not None:
            if not cell.strip():
                raise UsageError("%%remote_train: the cell is empty; write the script to run in it")
            script = write_cell(service.workspace.root, cell)
            command = f"python {script} {command}".strip()
            args.send = [script, *args.send]
            args.name = args.name or f"cell {script.rsplit('/', 1)[-1][:8]}"
        elif not command:
            raise UsageError("%remote_train: give the command after --, e.g. %remote_train -- python train.py")
        wait = parse_duration(args.wait, "wait")
        settings = spec_settings(args, command)
        spec = JobSpec.from_json(settings)
        if args.sweep or args.sweep_random is not None:
            self._sweep(service, args, settings)
            return None

        job = None
        if self._detached and not args.new:
            previous = service.latest_same_work(spec)
            # This kernel stopped waiting for it and it ended since: "run the cell again" shows how it went.
            if previous is not None and previous.id in self._detached and not previous.active:
                job = previous
                print(f"job {job.id} on {job.machine} ended while detached")
        if job is None:
            result = service.submit(spec, new=args.new)
            job = result.job
            verb = "attached to running job" if result.attached else "submitted job"
            # A pool's job says where it went and why, or that it waits in the pool's line.
            where = f" ({job.placement})" if job.placement else f" ({job.reason})" if job.waiting else ""
            print(f"{verb} {job.id} on {job.machine}{where}")
        self._detached.discard(job.id)

        try:
            job = follow(
                service,
                job.id,
                0 if args.detach else wait,
                progress_label=f"sending to {job.machine}",
                notes=sys.stdout,  # a notebook draws stderr as an error: the bar is not one
            )
        except KeyboardInterrupt:
            self._detached.add(job.id)
            print(
                f"\ndetached from job {job.id}; it keeps running on {job.machine}.\n{detach_hint(job.id)}",
                file=sys.stderr,
            )
            raise KeyboardInterrupt(f"detached from job {job.id}; it keeps running") from None
        if args.detach:
            self._detached.add(job.id)
            return RemoteTrainJob(service, job)
        if job.active:
            self._detached.add(job.id)
            print(
                f"still {job.state} after waiting {format_duration(wait or 0)}; the job keeps running. "
                + detach_hint(job.id)
            )
        else:
            # A job that did not train says why once: in the NotTrained raised below.
            print(summary_line(job, reason=job.state == "succeeded"))
        try:
            require_trained(job)
        except NotTrained as e:
            # Raised from here, without the lifecycle's frames: the message says everything.
            raise e.with_traceback(None) from None
        return RemoteTrainJob(service, job)

    def _sweep(self, service: JobService, args: argparse.Namespace, settings: dict[str, Any]) -> None:
        """``%remote_train --sweep …``: the trials driven in this cell, each one's state printed as it changes."""
        from .pipelines.cli import drive_sweep

        for flag, given in (("--detach", args.detach), ("--new", args.new), ("--wait", args.wait)):
            if given:
                raise UsageError(f"{flag}: a sweep is driven by this cell and reuses the trials that succeeded")
        run = drive_sweep(service, args, settings, out=sys.stdout)
        if run is None:
            raise KeyboardInterrupt("detached from the sweep; its jobs keep running")
        print(f"{run.label}: {run.state}" + (f" — {run.reason}" if run.reason else ""))
        if run.state != "succeeded":
            raise RemoteComputeError(run.reason or f"the sweep {run.state}") from None

    @line_magic
    def remote_jobs(self, line: str) -> JobTable | RemoteTrainJob | None:
        __tracebackhide__ = True
        args = _parse(build_jobs_parser(), line)
        if args is None:
            return None
        service = self.service()
        if args.cancel:
            job = service.cancel(args.cancel, by=local_person())
            print(summary_line(job))
            return RemoteTrainJob(service, job)
        if args.job_id:
            return RemoteTrainJob(service, args.job_id)
        query, total = list_arguments(args, JOBS_SHOWN)
        jobs = list(iter_jobs(service.store, query, None if total is None else total + 1))
        if total is not None and len(jobs) > total:
            print(f"the newest {total} jobs; --all or --limit N for more", file=sys.stderr)
        return JobTable(jobs[:total])


# ``%remote_train?`` shows the docstring: make it the full help, examples included.
RemoteComputeMagics.remote_train.__doc__ = build_train_parser().format_help()
RemoteComputeMagics.remote_jobs.__doc__ = build_jobs_parser().format_help()


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics (``%load_ext jupyter_remote_compute``)."""
    magics = RemoteComputeMagics(ipython)
    ipython.register_magics(magics)
    # Close open connections (SSH) when the kernel exits; running jobs are not affected.
    atexit.register(magics.close)
