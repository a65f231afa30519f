"""``jupyter remote-compute pipeline ...``: validate and run a pipeline of steps (``pipelines/cli.py``)."""

from __future__ import annotations

import argparse

from .console import Subcommands, job_service


def add_parser(sub: Subcommands) -> None:
    """The ``pipeline`` command's parser."""
    pipeline = sub.add_parser("pipeline", help="validate and run a pipeline (*.rcpipeline) of steps")
    psub = pipeline.add_subparsers(dest="action", required=True)
    for action, text in (
        ("run", "run it here, each node a job; unchanged nodes are reused"),
        ("validate", "say what is wrong before a run"),
    ):
        p = psub.add_parser(action, help=text)
        p.add_argument("file", help="the .rcpipeline file")
        p.add_argument("--json", action="store_true")
    p = psub.add_parser("list", help="pipeline runs, newest first")
    p.add_argument("--json", action="store_true")
    for action in ("show", "cancel"):
        p = psub.add_parser(action)
        p.add_argument("run_id")
        p.add_argument("--json", action="store_true")


def cmd_pipeline(args: argparse.Namespace) -> int:
    from ..pipelines.cli import pipeline_command

    return pipeline_command(job_service(args), args)
