"""``jupyter remote-compute usage``: job-hours, GPU-hours, queue time, bytes moved and cost estimates."""

from __future__ import annotations

import argparse
import sys

from .console import Subcommands, job_service, organization_or_refuse, print_json, table


def add_parser(sub: Subcommands) -> None:
    """The ``usage`` command's parser."""
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


def _hours(value: float) -> str:
    return f"{value:.2f}"


def cmd_usage(args: argparse.Namespace) -> int:
    from ..usage.ledger import summary_csv

    if args.all_users:
        # The organization's ledger, every user's: the service refuses a token without the admin scope.
        params = {"all_users": "1", "group_by": args.by}
        params.update({k: v for k, v in (("since", args.since), ("until", args.until)) if v})
        summary = organization_or_refuse("--all-users").usage(params)
    else:
        summary = job_service(args).usage(args.by, args.since, args.until)
    if args.json:
        print_json(summary)
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
            _hours(row.get("node_hours", row["job_hours"])),
            _hours(row["gpu_hours"]),
            _hours(row["queue_hours"]),
            f"{row['bytes_sent'] / 1e6:.1f}",
            f"{row['bytes_fetched'] / 1e6:.1f}",
            "-" if row["cost_estimate"] is None else f"~{row['cost_estimate']:.2f}",
        ]
        for row in summary["rows"]
    ]
    header = [k.upper() for k in keys]
    table(rows, [*header, "ATTEMPTS", "JOB-H", "NODE-H", "GPU-H", "QUEUE-H", "SENT MB", "FETCHED MB", "COST (EST.)"])
    if not rows:
        print("no usage recorded yet", file=sys.stderr)
    return 0
