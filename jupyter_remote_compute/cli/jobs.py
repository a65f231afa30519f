"""``jupyter remote-compute jobs ...``: list, show, follow, cancel, delete and prune jobs."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import InvalidSettings
from ..jobs.listing import add_list_arguments, iter_jobs, list_arguments, summary
from ..jobs.reasons import shorten
from ..jobs.service import JobService
from ..jobs.spec import format_duration
from ..jobs.transitions import TERMINAL_STATES
from ..jobview import attempt_lines, delivery_lines
from ..people import local_person
from .console import Subcommands, done, job_service, organization_or_refuse, print_json, table
from .run import follow, job_summary, write_log

LIST_DEFAULT = 50


def add_parser(sub: Subcommands) -> None:
    """The ``jobs`` command's parser."""
    jobs = sub.add_parser("jobs", help="list, show, follow, cancel and delete jobs")
    jsub = jobs.add_subparsers(dest="action", required=True)
    p = jsub.add_parser("list", help=f"the newest {LIST_DEFAULT} jobs, or those matching filters")
    add_list_arguments(p, LIST_DEFAULT)
    p.add_argument("--json", action="store_true", help="every matching job (unless --limit) as a JSON array")
    p.add_argument(
        "--all-users",
        dest="all_users",
        action="store_true",
        help="every user's jobs on the organization's machines (on a hub, with the admin scope); --machine and "
        "--limit apply",
    )
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
    table(
        [
            [j.id, j.machine, j.state, j.created, j.name[:40], shorten((j.reason or "").split("\n", 1)[0], 100)]
            for j in jobs[:total]
        ],
        ["ID", "MACHINE", "STATE", "CREATED", "NAME", "REASON"],
    )
    if more:
        print(f"(the newest {total} shown; --all or --limit N for more)", file=sys.stderr)
    return 0


def _list_all_users(args: argparse.Namespace) -> int:
    """Every user's jobs on the organization's machines, as its service keeps them, newest first."""
    for flag in ("state", "name", "since", "until"):
        if getattr(args, flag) is not None:
            raise InvalidSettings(
                f"--{flag}: not with --all-users (the organization's record of a job has its user, machine, "
                "creation and whether it runs); use --machine or --limit",
                field=flag,
            )
    if args.limit is not None and args.limit < 1:
        raise InvalidSettings("--limit: expected a whole number of at least 1", field="limit")
    jobs = organization_or_refuse("--all-users").jobs(all_users=True)
    if args.machine:
        jobs = [j for j in jobs if j["machine"] == args.machine.removeprefix("org:")]
    total = None if args.all or (args.json and args.limit is None) else (args.limit or LIST_DEFAULT)
    shown = jobs[:total]
    if args.json:
        print_json(shown)
        return 0
    table(
        [
            [j["user"], j["id"], f"org:{j['machine']}", j["created"], "yes" if j["running"] else "no",
             shorten(j.get("stopped") or "", 100)]
            for j in shown
        ],
        ["USER", "ID", "MACHINE", "CREATED", "RUNNING", "STOPPED BY THE ORGANIZATION"],
    )  # fmt: skip
    if len(jobs) > len(shown):
        print(f"(the newest {len(shown)} of {len(jobs)} shown; --all or --limit N for more)", file=sys.stderr)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    action = args.action
    if action == "list" and args.all_users:
        return _list_all_users(args)
    service = job_service(args)
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
            print_json(result.to_json())
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
            print_json(job.public_json())
        else:
            print(job_summary(job))
            if job.checkpoint:
                c = job.checkpoint
                print(
                    f"checkpoints: {c['files']} files, {c['bytes']} bytes, landed {c['at']} in "
                    f".punica/checkpoints/{job.id}/ ({c['fetched_bytes']} bytes brought home in all)"
                )
            for line in [*attempt_lines(job), *delivery_lines(job)]:
                print(line)
            if job.started and job.ended:
                from ..jobs.job import parse_time

                print("duration: " + format_duration(parse_time(job.ended) - parse_time(job.started)))
        return 0
    if action == "log":
        if args.follow and service.get(args.job_id).state not in TERMINAL_STATES:
            return follow(service, service.get(args.job_id))
        offset = 0
        while True:
            chunk = service.read_log(args.job_id, offset)
            write_log(chunk.data)
            offset = chunk.next_offset
            if not chunk.data:
                return 0
    if action == "cancel":
        job = service.cancel(args.job_id, by=local_person())
        return done(args, job.public_json(), job_summary(job))
    if action == "delete":
        service.delete(args.job_id)
        return done(args, {"id": args.job_id, "deleted": True}, f"deleted {args.job_id}")
    raise AssertionError(action)
