"""``jupyter remote-compute``: machines, jobs and secrets from a terminal.

The CLI uses the same service as the server and the magic, on the same state
file, so a job started here shows up in the Compute panel and the other way
round. Secrets are read from stdin or a prompt, never from an argument
(argv is visible to every user of the machine).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import RemoteComputeError
from .jobs.service import JobService, require_trained
from .jobs.spec import JobSpec, format_duration
from .jobs.store import TERMINAL_STATES, Job
from .run_options import add_run_options, command_of, spec_settings
from .workspace import Workspace

EXIT_FAILED = 1
EXIT_DETACHED = 3


def _service(args: argparse.Namespace) -> JobService:
    return JobService(Workspace.find(args.workspace, fallback=args.workspace))


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _read_secret(prompt: str) -> str:
    """From a pipe, the first line; at a terminal, a prompt that does not echo."""
    value = getpass.getpass(prompt) if sys.stdin.isatty() else sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise RemoteComputeError("no value given on stdin or at the prompt")
    return value


def _options(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` options; whole numbers become ints, true/false booleans."""
    options: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise RemoteComputeError(f"--option {pair!r}: write KEY=VALUE")
        options[key] = int(value) if value.isdigit() else {"true": True, "false": False}.get(value.lower(), value)
    return options


# -- machines ---------------------------------------------------------------
def cmd_machines(args: argparse.Namespace) -> int:
    service = _service(args)
    registry = service.machines
    action = args.action
    if action == "list":
        machines = registry.list()
        if args.json:
            _print_json([m.to_json() for m in machines])
        else:
            _table(
                [[m.name, m.kind, m.address, "yes" if m.enabled else "no", m.created or "built-in"] for m in machines],
                ["NAME", "KIND", "ADDRESS", "ENABLED", "CREATED"],
            )
        return 0
    if action == "show":
        _print_json(registry.get(args.name).to_json())
        return 0
    if action == "add":
        options = _options(args.option)
        for name in ("user", "port", "identity_file", "base_dir"):
            if getattr(args, name, None) is not None:
                options[name] = getattr(args, name)
        token = _read_secret(f"Token for {args.name}: ") if args.token_stdin else None
        machine = service.add_machine(
            args.name, args.kind, args.address, options, enabled=not args.disabled, token=token
        )
        print(f"added {machine.name} ({machine.kind}, {machine.address})")
        return 0
    if action == "edit":
        token = _read_secret(f"Token for {args.name}: ") if args.token_stdin else None
        machine = service.update_machine(args.name, address=args.address, options=_options(args.option), token=token)
        print(f"updated {machine.name}")
        return 0
    if action == "remove":
        registry.remove(args.name)
        print(f"removed {args.name}")
        return 0
    if action in ("enable", "disable"):
        registry.set_enabled(args.name, action == "enable")
        print(f"{action}d {args.name}")
        return 0
    if action == "check":
        facts = service.check_machine(args.name)
        if args.json:
            _print_json(facts)
        else:
            for key, value in facts.items():
                print(f"{key}: {value}")
        return 0
    raise AssertionError(action)


# -- run and jobs -------------------------------------------------------------
def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _summary(job: Job) -> str:
    parts = [f"job {job.id} {job.state}"]
    if job.reason:
        parts.append(job.reason)
    if job.outputs:
        parts.append("outputs: " + ", ".join(sorted(job.outputs)))
    if job.mlflow_run_id:
        parts.append(f"MLflow run {job.mlflow_run_id}")
    return "; ".join(parts)


def _follow(service: JobService, job: Job) -> int:
    """Stream the log until the job ends; Ctrl-C detaches and the job keeps running."""
    try:
        job = service.wait(job.id, on_log=_write)
    except KeyboardInterrupt:
        print(
            f"\ndetached from job {job.id}; it keeps running.\n"
            f"  follow it again: jupyter remote-compute jobs log -f {job.id}\n"
            f"  cancel it:       jupyter remote-compute jobs cancel {job.id}",
            file=sys.stderr,
        )
        return EXIT_DETACHED
    print(_summary(job), file=sys.stderr)
    try:
        require_trained(job)
    except RemoteComputeError:
        return EXIT_FAILED
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    command = command_of(args)
    if not command:
        raise RemoteComputeError("run: give the command after --, e.g. run --machine local -- python train.py")
    spec = JobSpec.from_json(spec_settings(args, command))
    service = _service(args)
    result = service.submit(spec, new=args.new)
    job = result.job
    print(("attached to running job " if result.attached else "submitted job ") + job.id, file=sys.stderr)
    if args.detach:
        if not result.attached:
            service.advance(job.id)
        return 0
    return _follow(service, job)


def cmd_jobs(args: argparse.Namespace) -> int:
    service = _service(args)
    action = args.action
    if action == "list":
        jobs = service.list_jobs(machine=args.machine, state=args.state)
        for aside in service.store.set_aside():
            print(f"warning: {aside['message']}", file=sys.stderr)
        if args.json:
            _print_json([j.public_json() for j in jobs])
        else:
            _table(
                [[j.id, j.machine, j.state, j.created, j.name[:40], (j.reason or "")[:60]] for j in jobs],
                ["ID", "MACHINE", "STATE", "CREATED", "NAME", "REASON"],
            )
        return 0
    if action == "show":
        job = service.get(args.job_id)
        if args.json:
            _print_json(job.public_json())
        else:
            print(_summary(job))
            if job.started and job.ended:
                from .jobs.store import parse_time

                print("duration: " + format_duration(parse_time(job.ended) - parse_time(job.started)))
        return 0
    if action == "log":
        if args.follow and service.get(args.job_id).state not in TERMINAL_STATES:
            return _follow(service, service.get(args.job_id))
        offset = 0
        while True:
            chunk = service.read_log(args.job_id, offset)
            _write(chunk.data)
            offset = chunk.next_offset
            if not chunk.data:
                return 0
    if action == "cancel":
        job = service.cancel(args.job_id, by=getpass.getuser())
        print(_summary(job))
        return 0
    if action == "delete":
        service.delete(args.job_id)
        print(f"deleted {args.job_id}")
        return 0
    raise AssertionError(action)


# -- secrets ----------------------------------------------------------------
def cmd_secrets(args: argparse.Namespace) -> int:
    from .secrets import SecretStore

    store = SecretStore()
    if args.action == "set":
        store.set(args.name, _read_secret(f"Value for {args.name}: "))
        print(f"stored {args.name}")
    elif args.action == "list":
        names = store.names()
        if args.json:
            _print_json(names)
        else:
            print("\n".join(names))
    elif args.action == "delete":
        store.delete(args.name)
        print(f"deleted {args.name}")
    return 0


# -- the parser ---------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter remote-compute", description="Run training jobs on machines you name; bring back their outputs."
    )
    parser.add_argument("--workspace", default=None, help="workspace folder (default: nearest with .punica/ upward)")
    sub = parser.add_subparsers(dest="group", required=True)

    machines = sub.add_parser("machines", help="list, add, edit and check machines")
    msub = machines.add_subparsers(dest="action", required=True)
    p = msub.add_parser("list")
    p.add_argument("--json", action="store_true")
    for action in ("show", "remove", "enable", "disable", "check"):
        p = msub.add_parser(action)
        p.add_argument("name")
        p.add_argument("--json", action="store_true")
    p = msub.add_parser("add", help="add a machine; a token is read from stdin or a prompt")
    p.add_argument("name")
    p.add_argument("--kind", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--user")
    p.add_argument("--port", type=int)
    p.add_argument("--identity-file", dest="identity_file")
    p.add_argument("--base-dir", dest="base_dir")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="a kind-specific option")
    p.add_argument("--token-stdin", action="store_true", help="read the machine's token from stdin or a prompt")
    p.add_argument("--disabled", action="store_true")
    p = msub.add_parser("edit")
    p.add_argument("name")
    p.add_argument("--address")
    p.add_argument("--option", action="append", metavar="KEY=VALUE")
    p.add_argument("--token-stdin", action="store_true")

    run = sub.add_parser("run", help="submit a job (or attach to the same one running) and follow its log")
    add_run_options(run)

    jobs = sub.add_parser("jobs", help="list, show, follow, cancel and delete jobs")
    jsub = jobs.add_subparsers(dest="action", required=True)
    p = jsub.add_parser("list")
    p.add_argument("--machine")
    p.add_argument("--state")
    p.add_argument("--json", action="store_true")
    for action in ("show", "log", "cancel", "delete"):
        p = jsub.add_parser(action)
        p.add_argument("job_id")
        p.add_argument("--json", action="store_true")
        if action == "log":
            p.add_argument("-f", "--follow", action="store_true")

    secrets = sub.add_parser("secrets", help="the Secret Manager: values from stdin or a prompt, never argv")
    ssub = secrets.add_subparsers(dest="action", required=True)
    p = ssub.add_parser("list")
    p.add_argument("--json", action="store_true")
    for action in ("set", "delete"):
        ssub.add_parser(action).add_argument("name")
    return parser


COMMANDS = {"machines": cmd_machines, "run": cmd_run, "jobs": cmd_jobs, "secrets": cmd_secrets}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.workspace is None:
        args.workspace = os.getcwd()
    try:
        return COMMANDS[args.group](args)
    except RemoteComputeError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
