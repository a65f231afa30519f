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
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .engines.faces import CliCommand, all_faces, faces_of
from .engines.organization.client import ORG_PREFIX, OrganizationClient, organization, with_organization
from .errors import InvalidSettings, RemoteComputeError
from .jobs.job import Job
from .jobs.listing import add_list_arguments, iter_jobs, list_arguments, summary
from .jobs.logs import waiting_line
from .jobs.reasons import shorten
from .jobs.service import JobService, ServiceSettings, require_trained
from .jobs.spec import JobSpec, format_duration
from .jobs.transitions import TERMINAL_STATES
from .machines.admin import HostKeyNotConfirmed
from .run_options import add_run_options, command_of, is_python_version, spec_settings
from .workspace import Workspace, relative_to_note

_DECIMAL = re.compile(r"\d+\.\d*|\.\d+")
EXIT_FAILED = 1
EXIT_DETACHED = 3
#: The spec's fields that hold workspace-relative paths (``--send``, ``--bring-back``).
WORKSPACE_PATH_FIELDS = ("send", "bring_back")


def _service(args: argparse.Namespace) -> JobService:
    # The CLI exits when its job ends: the MLflow run is recorded by a detached recorder (recording/recorder.py).
    settings = ServiceSettings(record_in_background=True)
    return JobService(Workspace.find(args.workspace, fallback=args.workspace), settings)


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
        if isinstance(options[key], str) and _DECIMAL.fullmatch(value):
            options[key] = float(value)  # a price such as 2.5
    return options


# -- machines ---------------------------------------------------------------
def _done(args: argparse.Namespace, data: Any, text: str) -> int:
    """Print what a command did: ``data`` as JSON with ``--json``, else one line of ``text``."""
    if getattr(args, "json", False):
        _print_json(data)
    else:
        print(text)
    return 0


def _default_machine(args: argparse.Namespace) -> int:
    """``machines default``: the organization's default machine, through its service."""
    if not args.org:
        raise RemoteComputeError(
            "machines default: a default machine is the organization's (on a hub); add --org. Without one, "
            "a job that names no machine runs on local"
        )
    if args.clear and args.name:
        raise RemoteComputeError("machines default: give a machine's name or --clear, not both")
    client = _organization_or_refuse("the default machine")
    if args.clear:
        client.clear_default_machine()
        return _done(args, {"machine": None}, "the organization has no default machine now")
    current = client.set_default_machine(args.name) if args.name else client.default_machine()
    machine = current["machine"]
    if machine is None:
        return _done(args, current, "the organization has no default machine: a job that names none runs on local")
    verb = "is now" if args.name else "is"
    text = f"{ORG_PREFIX}{machine['name']} {verb} the organization's default machine (set by {current['set_by']})"
    return _done(args, current, text)


def cmd_machines(args: argparse.Namespace) -> int:
    action = args.action
    if action == "default":
        return _default_machine(args)
    admin = _service(args).admin
    if action == "list":
        # On a hub with an organization service, its machines follow the user's own.
        machines, organization = with_organization([m.to_json() for m in admin.list()])
        if organization and organization.get("problem"):
            print(f"warning: the organization's machines are not listed: {organization['problem']}", file=sys.stderr)
        if args.json:
            _print_json(machines)
        else:
            _table(
                [
                    [
                        m["name"],
                        m["kind"],
                        m["address"],
                        "yes" if m["enabled"] else "no",
                        m["created"] or "built-in",
                        m["owner"],
                    ]
                    for m in machines
                ],
                ["NAME", "KIND", "ADDRESS", "ENABLED", "CREATED", "OWNER"],
            )
            if organization and organization.get("default"):
                print(f"a job that names no machine runs on the organization's default, {organization['default']}")
        return 0
    if action == "show":
        _print_json(admin.get(args.name).to_json())
        return 0
    if action == "add":
        options = _options(args.option)
        for name in ("user", "port", "identity_file", "base_dir"):
            if getattr(args, name, None) is not None:
                options[name] = getattr(args, name)
        token = _read_secret(f"Token for {args.name}: ") if args.token_stdin else None
        faces = faces_of(args.kind)
        address = args.address
        if address is None:
            if not faces.address_optional:
                raise RemoteComputeError(f"machines add: --address is required for a {args.kind} machine")
            address = args.name  # nothing dials such a machine: the address only describes it
        machine = admin.add(args.name, args.kind, address, options, enabled=not args.disabled, token=token)
        data = machine.to_json()
        text = f"added {machine.name} ({machine.kind}, {machine.address})"
        added = admin.introduce(machine, args.server_url or "SERVER_URL")
        if added:
            data.update(added)
            text += faces.added_text(data) if faces.added_text else ""
        return _done(args, data, text)
    if action == "edit":
        token = _read_secret(f"Token for {args.name}: ") if args.token_stdin else None
        machine = admin.update(args.name, address=args.address, options=_options(args.option), token=token)
        return _done(args, machine.to_json(), f"updated {machine.name}")
    if action == "remove":
        admin.remove(args.name)
        return _done(args, {"name": args.name, "removed": True}, f"removed {args.name}")
    if action in ("enable", "disable"):
        machine = admin.set_enabled(args.name, action == "enable")
        return _done(args, machine.to_json(), f"{action}d {args.name}")
    if action == "check":
        facts = admin.check(args.name)
        if args.json:
            _print_json(facts)
        else:
            for key, value in facts.items():
                if value is not None:  # not known there (no uv, no GPU memory): the JSON keeps null
                    print(f"{key}: {value}")
        return 0
    if action == "trust":
        if args.fingerprint is None:
            presented = admin.presented_host_key(args.name)
            if presented is not None:
                # Show the key and stop: trusting is a decision made after comparing, never a default.
                print(f"{args.name} presents {presented['type']} {presented['fingerprint']}")
                raise HostKeyNotConfirmed(
                    f"{args.name}: not trusted. Compare this fingerprint with the machine's own (ssh-keygen -lf "
                    f"/etc/ssh/ssh_host_*_key.pub on it), then run: jupyter remote-compute machines trust "
                    f"{args.name} --fingerprint {presented['fingerprint']}",
                    details={"host_key": presented},
                )
        result = admin.trust(args.name, args.fingerprint)
        return _done(args, result, f"trusted {args.name}: {result['fingerprint']}")
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
    elif job.state in TERMINAL_STATES and job.spec is not None and "not recorded in MLflow" not in (job.reason or ""):
        parts.append("MLflow run being recorded in the background (`jobs show` gives its id)")
    return "; ".join(parts)


def _follow(service: JobService, job: Job) -> int:
    """Stream the log until the job ends; Ctrl-C detaches and the job keeps running.

    Ctrl-C is Python's KeyboardInterrupt for the follow, also where this process was started with
    SIGINT ignored (a script's background job, some runners): an interrupt always detaches, never
    goes unheard until the job ends.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        job = service.wait(job.id, on_log=_write, on_wait=lambda j: sys.stderr.write(waiting_line(j)))
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
    print(_summary(job), file=sys.stderr)
    try:
        require_trained(job)
    except RemoteComputeError:
        return EXIT_FAILED
    return 0


def _notebook_spec(args: argparse.Namespace, command: list[str]) -> JobSpec:
    """``run --notebook NB -p name=value``: the job that executes the notebook (pipelines/notebook.py)."""
    from .pipelines.notebook import notebook_spec, parse_parameters

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
    return notebook_spec(settings)[0]


def cmd_run(args: argparse.Namespace) -> int:
    command = command_of(args)
    try:
        if args.notebook:
            spec = _notebook_spec(args, command)
        elif not command:
            raise RemoteComputeError("run: give the command after --, e.g. run --machine local -- python train.py")
        else:
            spec = JobSpec.from_json(spec_settings(args, command))
    except InvalidSettings as e:
        # A path given from a folder inside the workspace is taken from the workspace's folder: say which.
        if e.field and e.field.split("[", 1)[0] in WORKSPACE_PATH_FIELDS:
            root = Workspace.find(args.workspace, fallback=args.workspace).root
            raise InvalidSettings(f"{e.message}; {relative_to_note(root)}", field=e.field) from None
        raise
    service = _service(args)
    result = service.submit(spec, new=args.new)
    job = result.job
    print(("attached to running job " if result.attached else "submitted job ") + job.id, file=sys.stderr)
    if args.detach:
        if not result.attached:
            service.advance(job.id)
        return 0
    return _follow(service, job)


LIST_DEFAULT = 50


def _list_jobs(service: JobService, args: argparse.Namespace) -> int:
    """The newest jobs as a table; with --json every matching job, written page by page as it is read."""
    query, total = list_arguments(args, None if args.json else LIST_DEFAULT)
    if args.json:
        sys.stdout.write("[")
        for i, job in enumerate(iter_jobs(service.store, query, total)):
            sys.stdout.write(("," if i else "") + "\n" + json.dumps(summary(job), default=str))
        sys.stdout.write("\n]\n")
        return 0
    # One more than shown tells whether to say there are more.
    jobs = list(iter_jobs(service.store, query, None if total is None else total + 1))
    more = total is not None and len(jobs) > total
    _table(
        [
            [j.id, j.machine, j.state, j.created, j.name[:40], shorten((j.reason or "").split("\n", 1)[0], 100)]
            for j in jobs[:total]
        ],
        ["ID", "MACHINE", "STATE", "CREATED", "NAME", "REASON"],
    )
    if more:
        print(f"(the newest {total} shown; --all or --limit N for more)", file=sys.stderr)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    service = _service(args)
    action = args.action
    if action == "list":
        status = _list_jobs(service, args)  # reading the list is what moves a damaged file aside
        for aside in service.store.set_aside():
            print(f"warning: {aside['message']}", file=sys.stderr)
        return status
    if action == "prune":
        result = service.prune(
            older_than=args.older_than, states=args.state, keep_newest=args.keep, dry_run=args.dry_run
        )
        if args.json:
            _print_json(result.to_json())
            return 0
        before, after = result.state_file_bytes
        verb = "would remove" if result.dry_run else "removed"
        print(f"{verb} {len(result.removed)} finished jobs; state file {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
        for machine, why in result.left_on_machines.items():
            print(f"  left their folders on {machine}: {why}", file=sys.stderr)
        return 0
    if action == "show":
        job = service.get(args.job_id)
        if args.json:
            _print_json(job.public_json())
        else:
            print(_summary(job))
            if job.checkpoint:
                c = job.checkpoint
                print(
                    f"checkpoints: {c['files']} files, {c['bytes']} bytes, landed {c['at']} in "
                    f".punica/checkpoints/{job.id}/ ({c['fetched_bytes']} bytes brought home in all)"
                )
            if job.started and job.ended:
                from .jobs.job import parse_time

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
        return _done(args, job.public_json(), _summary(job))
    if action == "delete":
        service.delete(args.job_id)
        return _done(args, {"id": args.job_id, "deleted": True}, f"deleted {args.job_id}")
    raise AssertionError(action)


# -- usage ------------------------------------------------------------------
def _hours(value: float) -> str:
    return f"{value:.2f}"


def _organization_or_refuse(what: str) -> OrganizationClient:
    client = organization()
    if client is None:
        raise RemoteComputeError(
            f"{what} is the organization's, and there is no organization service here: run it in a terminal "
            "of a server the hub started"
        )
    return client


def cmd_usage(args: argparse.Namespace) -> int:
    from .usage.ledger import summary_csv

    if args.all_users:
        # The organization's ledger, every user's: the service refuses a token without the admin scope.
        params = {"all_users": "1", "group_by": args.by}
        params.update({k: v for k, v in (("since", args.since), ("until", args.until)) if v})
        summary = _organization_or_refuse("--all-users").usage(params)
    else:
        summary = _service(args).usage(args.by, args.since, args.until)
    if args.json:
        _print_json(summary)
        return 0
    if args.csv:
        sys.stdout.write(summary_csv(summary))
        return 0
    keys = summary["group_by"]
    rows = [
        [
            *(row[k] or "-" for k in keys),
            str(row["attempts"]) + (f" ({row['running']} running)" if row["running"] else ""),
            _hours(row["job_hours"]),
            _hours(row["gpu_hours"]),
            _hours(row["queue_hours"]),
            f"{row['bytes_sent'] / 1e6:.1f}",
            f"{row['bytes_fetched'] / 1e6:.1f}",
            "-" if row["cost_estimate"] is None else f"~{row['cost_estimate']:.2f}",
        ]
        for row in summary["rows"]
    ]
    header = [k.upper() for k in keys]
    _table(rows, [*header, "ATTEMPTS", "JOB-H", "GPU-H", "QUEUE-H", "SENT MB", "FETCHED MB", "COST (EST.)"])
    if not rows:
        print("no usage recorded yet", file=sys.stderr)
    return 0


# -- quotas -----------------------------------------------------------------
def _used_of(quota: dict[str, Any], limit: str) -> str:
    if limit not in quota:
        return "-"
    used = quota["used"][limit]
    return f"{int(used)}/{quota[limit]}" if limit == "jobs" else f"{used:.2f}/{quota[limit]:g}"


def cmd_quota(args: argparse.Namespace) -> int:
    """The organization's quotas, through its service (only an admin changes them)."""
    client = _organization_or_refuse("a quota")
    if args.action == "list":
        quotas = client.quotas()
        if args.json:
            _print_json(quotas)
            return 0
        rows = []
        for q in quotas:
            limits = [_used_of(q, k) for k in ("gpu_hours", "job_hours", "jobs")]
            soft = "soft" if q["soft"] else f"hard, grace {q['grace_seconds']:g} s"
            rows.append([q["who"], q["period"], *limits, soft])
        _table(rows, ["WHO", "PERIOD", "GPU-H USED/QUOTA", "JOB-H USED/QUOTA", "JOBS RUNNING/QUOTA", "KIND"])
        if not rows:
            print("no quota binds you", file=sys.stderr)
        return 0
    who, name = ("user", args.quota_user) if args.quota_user else ("group", args.quota_group)
    if args.action == "delete":
        client.remove_quota(who, name)
        return _done(args, {"who": f"{who}:{name}", "deleted": True}, f"removed the quota of {who} {name}")
    body: dict[str, Any] = {"period": args.period, "soft": args.soft}
    for field in ("gpu_hours", "job_hours", "jobs", "grace_seconds"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    quota = client.set_quota(who, name, body)
    return _done(args, quota, f"set the quota of {who} {name}")


# -- secrets ----------------------------------------------------------------
def cmd_secrets(args: argparse.Namespace) -> int:
    from .secrets import SecretStore

    store = SecretStore()
    if args.action == "set":
        store.set(args.name, _read_secret(f"Value for {args.name}: "))
        print(f"stored {args.name} in {store.where()}")
        _print_store_note(store.status())
    elif args.action == "list":
        entries = store.entries()
        status = store.status()
        if args.json:
            _print_json({"store": status, "secrets": [e.to_json() for e in entries]})
            return 0
        if entries:
            _table(
                [
                    [e.name, "deployment (read-only)" if e.read_only else "you", e.where, e.problem or ""]
                    for e in entries
                ],
                ["NAME", "PROVIDED BY", "WHERE", "PROBLEM"],
            )
        # About the store, not a secret: on stderr, so the table alone can be piped on.
        sys.stdout.flush()
        print(f"new secrets go to {status['where']}", file=sys.stderr)
        _print_store_note(status)
    elif args.action == "delete":
        store.delete(args.name)
        print(f"deleted {args.name}")
    return 0


def _print_store_note(status: dict[str, Any]) -> None:
    if status["note"]:
        print(f"note: {status['note']}", file=sys.stderr)
    if not status["usable"]:
        print(f"warning: {status['problem']}", file=sys.stderr)


# -- the parser ---------------------------------------------------------------
def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """The whole CLI; ``plugins=False`` leaves out the commands of kinds other packages add."""
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
    p.add_argument("--address", help="host or URL (a kind nothing dials may leave it out)")
    p.add_argument("--server-url", help="this server's URL, for a command the kind shows to run on the machine")
    p.add_argument("--user")
    p.add_argument("--port", type=int)
    p.add_argument("--identity-file", dest="identity_file")
    p.add_argument("--base-dir", dest="base_dir")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="a kind-specific option")
    p.add_argument("--token-stdin", action="store_true", help="read the machine's token from stdin or a prompt")
    p.add_argument("--disabled", action="store_true")
    p.add_argument("--json", action="store_true")
    p = msub.add_parser("edit")
    p.add_argument("name")
    p.add_argument("--address")
    p.add_argument("--option", action="append", metavar="KEY=VALUE")
    p.add_argument("--token-stdin", action="store_true")
    p.add_argument("--json", action="store_true")
    p = msub.add_parser(
        "default", help="show or set (an admin) the organization's default machine, where a job naming none runs"
    )
    p.add_argument("name", nargs="?", help="one of the organization's machines (none: show the default)")
    p.add_argument("--org", action="store_true", help="the organization's default (the only one there is)")
    p.add_argument("--clear", action="store_true", help="no default: a job naming no machine runs on local")
    p.add_argument("--json", action="store_true")
    p = msub.add_parser("trust", help="trust an SSH machine's host key, after comparing its fingerprint")
    p.add_argument("name")
    p.add_argument(
        "--fingerprint",
        metavar="SHA256:...",
        help="the fingerprint you compared with the machine's own; without it, the presented key is only shown",
    )
    p.add_argument("--json", action="store_true")

    run = sub.add_parser("run", help="submit a job (or attach to the same one running) and follow its log")
    add_run_options(run)
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

    jobs = sub.add_parser("jobs", help="list, show, follow, cancel and delete jobs")
    jsub = jobs.add_subparsers(dest="action", required=True)
    p = jsub.add_parser("list", help=f"the newest {LIST_DEFAULT} jobs, or those matching filters")
    add_list_arguments(p, LIST_DEFAULT)
    p.add_argument("--json", action="store_true", help="every matching job (unless --limit) as a JSON array")
    p = jsub.add_parser("prune", help="forget old finished jobs (never an active one); MLflow runs stay")
    p.add_argument("--older-than", dest="older_than", help="finished more than this long ago, e.g. 90d, 12h")
    p.add_argument("--state", help="only these finished states, comma-separated (default: every finished state)")
    p.add_argument("--keep", type=int, metavar="N", help="keep the newest N finished jobs whatever their age")
    p.add_argument("--dry-run", dest="dry_run", action="store_true", help="say what would go, remove nothing")
    p.add_argument("--json", action="store_true")
    for action in ("show", "cancel", "delete"):
        p = jsub.add_parser(action)
        p.add_argument("job_id")
        p.add_argument("--json", action="store_true")
    p = jsub.add_parser("log", help="print a job's log (text; -f follows it until the job ends)")
    p.add_argument("job_id")
    p.add_argument("-f", "--follow", action="store_true")

    usage = sub.add_parser("usage", help="job-hours, GPU-hours, queue time, bytes moved and cost estimates")
    usage.add_argument(
        "--by", default="machine", help="group by these, comma-separated: machine, user, month, kind, state"
    )
    usage.add_argument("--since", help="only attempts that ended at or after this ISO 8601 time")
    usage.add_argument("--until", help="only attempts that ended at or before this ISO 8601 time")
    usage.add_argument(
        "--all-users",
        dest="all_users",
        action="store_true",
        help="the organization's usage, every user's (on a hub, with the admin scope); --by may add group",
    )
    form = usage.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true")
    form.add_argument("--csv", action="store_true")

    quota = sub.add_parser("quota", help="the organization's quotas on a hub (an admin sets them)")
    qsub = quota.add_subparsers(dest="action", required=True)
    p = qsub.add_parser("list", help="the quotas that bind you (an admin: every quota), with what is used")
    p.add_argument("--json", action="store_true")
    for action, text in (("set", "set a user's or group's quota per month"), ("delete", "remove one")):
        p = qsub.add_parser(action, help=text)
        whom = p.add_mutually_exclusive_group(required=True)
        whom.add_argument("--user", dest="quota_user", help="a hub user's name")
        whom.add_argument("--group", dest="quota_group", help="a hub group's name")
        p.add_argument("--json", action="store_true")
        if action == "set":
            p.add_argument("--gpu-hours", dest="gpu_hours", type=float, help="GPU-hours per period")
            p.add_argument("--job-hours", dest="job_hours", type=float, help="job-hours per period")
            p.add_argument("--jobs", type=int, help="jobs running at once")
            p.add_argument("--period", default="month", choices=["month"])
            p.add_argument(
                "--grace", dest="grace_seconds", type=float, help="seconds a job may run on once used up (300)"
            )
            p.add_argument("--soft", action="store_true", help="only notice, never stop a job")

    secrets = sub.add_parser("secrets", help="the Secret Manager: values from stdin or a prompt, never argv")
    ssub = secrets.add_subparsers(dest="action", required=True)
    p = ssub.add_parser("list", help="every secret's name and where it lives (never its value)")
    p.add_argument("--json", action="store_true")
    for action in ("set", "delete"):
        ssub.add_parser(action).add_argument("name")

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


def cmd_pipeline(args: argparse.Namespace) -> int:
    from .pipelines.cli import pipeline_command

    return pipeline_command(_service(args), args)


COMMANDS = {
    "machines": cmd_machines,
    "run": cmd_run,
    "jobs": cmd_jobs,
    "usage": cmd_usage,
    "quota": cmd_quota,
    "secrets": cmd_secrets,
    "pipeline": cmd_pipeline,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["organization"]:
        # The hub's service, not a workspace's command: its own options, and JupyterHub imported only here.
        from .org.service import main as organization

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
        run = getattr(args, "kind_command", None) or COMMANDS[args.group]
        return run(args)
    except RemoteComputeError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
