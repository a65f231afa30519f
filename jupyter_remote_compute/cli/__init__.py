"""``jupyter remote-compute``: machines, jobs and secrets from a terminal.

The CLI uses the same service as the server and the magic, on the same state
file, so a job started here shows up in the Compute panel and the other way
round. Secrets are read from stdin or a prompt, never from an argument
(argv is visible to every user of the machine).

One module per command group (``machines``, ``run``, ``jobs``, ``pipeline``, ``usage``, ``quota``,
``tracking``, ``secrets``), each with its parser and its command; ``console`` holds what they share.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from ..engines.faces import CliCommand, all_faces
from ..errors import RemoteComputeError
from . import jobs, machines, pipeline, quota, run, secrets, tracking, usage
from .console import EXIT_DETACHED, EXIT_FAILED

__all__ = ["EXIT_DETACHED", "EXIT_FAILED", "build_parser", "main"]


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """The whole CLI; ``plugins=False`` leaves out the commands of kinds other packages add."""
    parser = argparse.ArgumentParser(
        prog="jupyter remote-compute", description="Run training jobs on machines you name; bring back their outputs."
    )
    parser.add_argument("--workspace", default=None, help="workspace folder (default: nearest with .punica/ upward)")
    sub = parser.add_subparsers(dest="group", required=True)
    msub = machines.add_parser(sub)
    run.add_parser(sub)
    pipeline.add_parser(sub)
    jobs.add_parser(sub)
    usage.add_parser(sub)
    quota.add_parser(sub)
    tracking.add_parser(sub)
    secrets.add_parser(sub)

    # Listed for --help; main() hands it its arguments before this parser sees them.
    p = sub.add_parser("organization", help="serve the organization's machines as a JupyterHub service")
    p.add_argument("rest", nargs=argparse.REMAINDER)

    # The kinds' own commands: top-level ones, and actions of the groups above.
    groups = {None: sub, "machines": msub}
    for command in _kind_commands(plugins):
        p = groups[command.group].add_parser(command.name, help=command.help)
        p.set_defaults(kind_command=command.run)
        if command.raw:
            p.add_argument("rest", nargs=argparse.REMAINDER)
        elif command.add_arguments is not None:
            command.add_arguments(p)
    return parser


def _kind_commands(plugins: bool) -> list[CliCommand]:
    return [command for faces in all_faces(plugins=plugins).values() for command in faces.cli]


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "machines": machines.cmd_machines,
    "run": run.cmd_run,
    "jobs": jobs.cmd_jobs,
    "usage": usage.cmd_usage,
    "quota": quota.cmd_quota,
    "tracking": tracking.cmd_tracking,
    "secrets": secrets.cmd_secrets,
    "pipeline": pipeline.cmd_pipeline,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["organization"]:
        # The hub's service, not a workspace's command: its own options, and JupyterHub imported only here.
        from ..org.service import main as organization

        return organization(argv[1:])
    # This package's own commands need no plugin's: the scan of installed packages is spared them.
    plugins = not argv or argv[0] not in COMMANDS or argv[0] == "machines"
    for command in _kind_commands(plugins):
        if command.raw and command.group is None and argv[:1] == [command.name]:
            # Its own options (and no workspace read): hand it the rest as it is.
            return command.run(argparse.Namespace(rest=argv[1:]))
    args = build_parser(plugins).parse_args(argv)
    if args.workspace is None:
        args.workspace = os.getcwd()
    try:
        handler = getattr(args, "kind_command", None) or COMMANDS[args.group]
        return handler(args)
    except RemoteComputeError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_FAILED
