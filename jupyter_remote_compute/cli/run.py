"""``jupyter remote-compute run``: submit a job (or attach to the same one running) and follow its log."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from ..errors import InvalidSettings, RemoteComputeError
from ..jobs.job import Job
from ..jobs.logs import waiting_line
from ..jobs.service import JobService, require_trained
from ..jobs.spec import JobSpec
from ..jobs.transitions import TERMINAL_STATES
from ..run_options import add_run_options, add_sweep_options, command_of, is_python_version, spec_settings
from ..workspace import Workspace, relative_to_note
from .console import EXIT_DETACHED, EXIT_FAILED, Subcommands, job_service

#: The spec's fields that hold workspace-relative paths (``--send``, ``--bring-back``).
WORKSPACE_PATH_FIELDS = ("send", "bring_back")


def add_parser(sub: Subcommands) -> None:
    """The ``run`` command's parser."""
    run = sub.add_parser("run", help="submit a job (or attach to the same one running) and follow its log")
    add_run_options(run)
    add_sweep_options(run)
    run.add_argument(
        "--notebook", help="execute this workspace notebook on the machine (nbclient) instead of a command"
    )
    run.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a notebook parameter, typed as papermill types it (7 int, 0.01 float, true bool, else a string)",
    )


def write_log(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def job_summary(job: Job) -> str:
    parts = [f"job {job.id} {job.state}"]
    if job.reason:
        parts.append(job.reason)
    if job.outputs:
        parts.append("outputs: " + ", ".join(sorted(job.outputs)))
    if job.mlflow_run_id:
        parts.append(f"MLflow run {job.mlflow_run_id}")
    elif job.state in TERMINAL_STATES and job.spec is not None and "not recorded in MLflow" not in (job.reason or ""):
        parts.append("MLflow run being recorded in the background (`jobs show` gives its id)")
    return "; ".join(parts)


def follow(service: JobService, job: Job) -> int:
    """Stream the log until the job ends; Ctrl-C detaches and the job keeps running.

    Ctrl-C is Python's KeyboardInterrupt for the follow, also where this process was started with
    SIGINT ignored (a script's background job, some runners): an interrupt always detaches, never
    goes unheard until the job ends.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        job = service.wait(job.id, on_log=write_log, on_wait=lambda j: sys.stderr.write(waiting_line(j)))
    except KeyboardInterrupt:
        print(
            f"\ndetached from job {job.id}; it keeps running.\n"
            f"  follow it again: jupyter remote-compute jobs log -f {job.id}\n"
            f"  cancel it:       jupyter remote-compute jobs cancel {job.id}",
            file=sys.stderr,
        )
        return EXIT_DETACHED
    finally:
        signal.signal(signal.SIGINT, before)
    print(job_summary(job), file=sys.stderr)
    try:
        require_trained(job)
    except RemoteComputeError:
        return EXIT_FAILED
    return 0


def _notebook_settings(args: argparse.Namespace, command: list[str]) -> dict[str, Any]:
    """``run --notebook NB -p name=value``: the settings of the job that executes the notebook
    (pipelines/notebook.py), as the pipeline's notebook step takes them."""
    from ..pipelines.notebook import parse_parameters

    if command:
        raise RemoteComputeError("run: give either --notebook or a command after --, not both")
    # --python is the environment's version (3.11, see run_options), else the python that runs the notebook
    python = None if is_python_version(args.python) else args.python
    if python is not None:
        args.python = None
    settings = spec_settings(args, ["-"])
    del settings["command"]
    if not settings["name"]:
        del settings["name"]
    settings.update(notebook=args.notebook, parameters=parse_parameters(args.parameter), python=python)
    return settings


def _sweep(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from ..pipelines.cli import sweep_command

    for flag, given in (("--detach", args.detach), ("--new", args.new)):
        if given:
            raise InvalidSettings(
                f"{flag}: a sweep is driven by this command and reuses trials that succeeded; leave {flag} out",
                field="sweep",
            )
    service = job_service(args)
    try:
        return sweep_command(service, args, settings)
    finally:
        service.close()


def cmd_run(args: argparse.Namespace) -> int:
    from ..pipelines.notebook import notebook_spec

    command = command_of(args)
    try:
        if args.notebook:
            settings = _notebook_settings(args, command)
            spec = notebook_spec(settings)[0]
        elif not command:
            raise RemoteComputeError("run: give the command after --, e.g. run --machine local -- python train.py")
        else:
            settings = spec_settings(args, command)
            spec = JobSpec.from_json(settings)
    except InvalidSettings as e:
        # A path given from a folder inside the workspace is taken from the workspace's folder: say which.
        if e.field and e.field.split("[", 1)[0] in WORKSPACE_PATH_FIELDS:
            root = Workspace.find(args.workspace, fallback=args.workspace).root
            raise InvalidSettings(f"{e.message}; {relative_to_note(root)}", field=e.field) from None
        raise
    if args.sweep or args.sweep_random is not None:
        return _sweep(args, settings)
    service = job_service(args)
    result = service.submit(spec, new=args.new)
    job = result.job
    print(("attached to running job " if result.attached else "submitted job ") + job.id, file=sys.stderr)
    if args.detach:
        if not result.attached:
            service.advance(job.id)
        return 0
    return follow(service, job)
