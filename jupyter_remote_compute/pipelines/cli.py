"""``jupyter remote-compute pipeline run|validate|list|show|cancel``: pipelines from a terminal.

``run`` drives the run in this process, on the same state files as the server, and prints each
node's state as it changes; Ctrl-C detaches (the jobs keep running, and a server on the workspace
takes the run up again, as after its own restart).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..jobs.service import JobService
from .document import PipelineInvalid
from .runner import PipelineRun, PipelineRunner

EXIT_FAILED = 1
EXIT_DETACHED = 3


def _node_lines(run: PipelineRun) -> list[str]:
    lines = []
    for node_id, node in run.nodes.items():
        line = f"  {node_id}: {node.state}"
        if node.job_id:
            line += f" (job {node.job_id})"
        if node.reason:
            line += f" — {node.reason}"
        lines.append(line)
    return lines


def _print_run(run: PipelineRun, as_json: bool) -> None:
    if as_json:
        print(json.dumps(run.public_json(), indent=2, default=str))
        return
    print(f"pipeline run {run.id} of {run.file}: {run.state}" + (f" — {run.reason}" if run.reason else ""))
    print("\n".join(_node_lines(run)))


def pipeline_command(service: JobService, args: argparse.Namespace) -> int:
    runner = PipelineRunner(service)
    try:
        return _dispatch(runner, args)
    finally:
        runner.close()
        service.close()


def _dispatch(runner: PipelineRunner, args: argparse.Namespace) -> int:
    if args.action == "validate":
        try:
            pipeline = runner.validate(args.file)
        except PipelineInvalid as e:
            if args.json:
                print(json.dumps(e.to_json()["details"], indent=2))
            else:
                print(f"{args.file}: not valid:", file=sys.stderr)
                for problem in e.problems:
                    print(f"  {problem.text()}", file=sys.stderr)
            return EXIT_FAILED
        text = f"{args.file}: valid ({len(pipeline.nodes)} nodes, {len(pipeline.edges)} edges)"
        print(json.dumps({"problems": []}) if args.json else text)
        return 0
    if args.action == "list":
        runs = runner.list_runs()
        if args.json:
            print(json.dumps([r.public_json() for r in runs], indent=2, default=str))
        for run in [] if args.json else runs:
            print(f"{run.id}  {run.state:<9}  {run.file}")
        return 0
    if args.action == "show":
        _print_run(runner.get(args.run_id), args.json)
        return 0
    if args.action == "cancel":
        _print_run(runner.cancel(args.run_id), args.json)
        return 0
    return _run(runner, args)


def _run(runner: PipelineRunner, args: argparse.Namespace) -> int:
    seen: dict[str, Any] = {}

    def show(run: PipelineRun) -> None:
        for node_id, node in run.nodes.items():
            now = (node.state, node.job_id)
            if seen.get(node_id) != now:
                seen[node_id] = now
                line = f"{node_id}: {node.state}" + (f" (job {node.job_id})" if node.job_id else "")
                print(line + (f" — {node.reason}" if node.reason else ""), file=sys.stderr)

    if not args.json:
        runner.add_listener(show)
    run, attached = runner.start(args.file, background=False)
    if attached:
        print(f"pipeline run {run.id} of {run.file} is already under way (driven elsewhere)", file=sys.stderr)
        _print_run(run, args.json)
        return 0
    print(f"pipeline run {run.id} of {run.file}", file=sys.stderr)
    try:
        run = runner.drive(run.id)
    except KeyboardInterrupt:
        print(f"\ndetached from pipeline run {run.id}; its jobs keep running", file=sys.stderr)
        return EXIT_DETACHED
    _print_run(run, args.json)
    return 0 if run.state == "succeeded" else EXIT_FAILED
