"""``jupyter remote-compute pipeline run|validate|list|show|cancel``: pipelines from a terminal.

``run`` drives the run in this process, on the same state files as the server, and prints each
node's state as it changes; Ctrl-C detaches (the jobs keep running, and a server on the workspace
takes the run up again, as after its own restart).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ..jobs.service import JobService
from ..people import local_person
from .document import PipelineInvalid
from .early_stop import Objective
from .runner import PipelineRunner
from .runs import NODE_DONE, PipelineRun
from .sweep import params_label, parse_axes, plan

EXIT_FAILED = 1
EXIT_DETACHED = 3


def _node_lines(run: PipelineRun) -> list[str]:
    lines = []
    sweep = run.sweep or {}
    latest = sweep.get("latest") or {}
    best = Objective(sweep["metric"], sweep["goal"]).best({k: v[1] for k, v in latest.items()}) if latest else None
    for node_id, node in run.nodes.items():
        params = params_label(sweep.get("parameters", {}).get(node_id, {}))
        line = f"  {node_id}{f' ({params})' if params else ''}: {node.state}"
        if node_id in latest:
            step, value = latest[node_id]
            line += f", {sweep['metric']} {value:.4g} at step {step:g}" + (" (best)" if node_id == best else "")
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
    print(f"pipeline run {run.id} of {run.label}: {run.state}" + (f" — {run.reason}" if run.reason else ""))
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
            print(f"{run.id}  {run.state:<9}  {run.label}")
        return 0
    if args.action == "show":
        _print_run(runner.get(args.run_id), args.json)
        return 0
    if args.action == "cancel":
        _print_run(runner.cancel(args.run_id, by=local_person()), args.json)
        return 0
    return _run(runner, args)


def _run(runner: PipelineRunner, args: argparse.Namespace) -> int:
    if not args.json:
        runner.add_listener(_node_printer(sys.stderr))
    run, attached = runner.start(args.file, background=False)
    return _follow(runner, run, attached, args.json)


def sweep_command(service: JobService, args: argparse.Namespace, settings: dict[str, Any]) -> int:
    """``run --sweep …``: the sweep driven here; 0 when every trial succeeded."""
    run = drive_sweep(service, args, settings, out=sys.stderr)
    if run is None:
        return EXIT_DETACHED
    _print_run(run, as_json=False)
    return 0 if run.state == "succeeded" else EXIT_FAILED


def drive_sweep(
    service: JobService, args: argparse.Namespace, settings: dict[str, Any], out: TextIO
) -> PipelineRun | None:
    """A sweep's trials drawn from ``args`` (``run_options.add_sweep_options``), checked, and driven here
    as a run's nodes, each one's state written to ``out`` as it changes; None when Ctrl-C detached."""
    sweep = plan(
        settings,
        parse_axes(args.sweep),
        random_count=args.sweep_random,
        max_parallel=args.max_parallel,
        metric=args.sweep_metric,
        early_stop=args.early_stop,
        confirmed=args.yes,
    )
    for warning in sweep.warnings:
        print(f"warning: {warning}", file=out)
    name = sweep.name
    runner = PipelineRunner(service)
    try:
        runner.add_listener(_node_printer(out, sweep.parameters))
        run, attached = runner.start_sweep(sweep)
        if attached:
            print(f"sweep {name} is already under way (pipeline run {run.id}, driven elsewhere)", file=out)
            return run
        print(f"sweep {name}: {sweep.trials} trials, {sweep.max_parallel} at once (pipeline run {run.id})", file=out)
        try:
            return runner.drive(run.id)
        except KeyboardInterrupt:
            print(f"\ndetached from sweep {name} (pipeline run {run.id}); its jobs keep running", file=out)
            return None
    finally:
        runner.close()


def _node_printer(out: TextIO, parameters: dict[str, dict[str, str]] | None = None) -> Any:
    """A listener printing each node's state (a trial's parameters beside it) as it changes."""
    seen: dict[str, Any] = {}

    def show(run: PipelineRun) -> None:
        for node_id, node in run.nodes.items():
            now = (node.state, node.job_id)
            before = seen.get(node_id)
            # Node threads tell their changes concurrently: an older copy of the run can come after a newer one.
            if before is not None and before[0] in NODE_DONE and node.state not in NODE_DONE:
                continue
            if before != now:
                seen[node_id] = now
                params = params_label((parameters or {}).get(node_id, {}))
                line = f"{node_id}{f' ({params})' if params else ''}: {node.state}"
                line += f" (job {node.job_id})" if node.job_id else ""
                print(line + (f" — {node.reason}" if node.reason else ""), file=out)

    return show


def _follow(runner: PipelineRunner, run: PipelineRun, attached: bool, as_json: bool) -> int:
    if attached:
        print(f"pipeline run {run.id} of {run.label} is already under way (driven elsewhere)", file=sys.stderr)
        _print_run(run, as_json)
        return 0
    print(f"pipeline run {run.id} of {run.label}", file=sys.stderr)
    try:
        run = runner.drive(run.id)
    except KeyboardInterrupt:
        print(f"\ndetached from pipeline run {run.id}; its jobs keep running", file=sys.stderr)
        return EXIT_DETACHED
    _print_run(run, as_json)
    return 0 if run.state == "succeeded" else EXIT_FAILED
