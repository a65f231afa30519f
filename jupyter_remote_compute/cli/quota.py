"""``jupyter remote-compute quota ...``: the organization's quotas on a hub (an admin sets them)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .console import Subcommands, done, organization_or_refuse, print_json, table


def add_parser(sub: Subcommands) -> None:
    """The ``quota`` command's parser."""
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


def _used_of(quota: dict[str, Any], limit: str) -> str:
    if limit not in quota:
        return "-"
    used = quota["used"][limit]
    return f"{int(used)}/{quota[limit]}" if limit == "jobs" else f"{used:.2f}/{quota[limit]:g}"


def cmd_quota(args: argparse.Namespace) -> int:
    """The organization's quotas, through its service (only an admin changes them)."""
    client = organization_or_refuse("a quota")
    if args.action == "list":
        quotas = client.quotas()
        if args.json:
            print_json(quotas)
            return 0
        rows = []
        for q in quotas:
            limits = [_used_of(q, k) for k in ("gpu_hours", "job_hours", "jobs")]
            soft = "soft" if q["soft"] else f"hard, grace {q['grace_seconds']:g} s"
            rows.append([q["who"], q["period"], *limits, soft])
        table(rows, ["WHO", "PERIOD", "GPU-H USED/QUOTA", "JOB-H USED/QUOTA", "JOBS RUNNING/QUOTA", "KIND"])
        if not rows:
            print("no quota binds you", file=sys.stderr)
        return 0
    who, name = ("user", args.quota_user) if args.quota_user else ("group", args.quota_group)
    if args.action == "delete":
        client.remove_quota(who, name)
        return done(args, {"who": f"{who}:{name}", "deleted": True}, f"removed the quota of {who} {name}")
    body: dict[str, Any] = {"period": args.period, "soft": args.soft}
    for field in ("gpu_hours", "job_hours", "jobs", "grace_seconds"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    quota = client.set_quota(who, name, body)
    return done(args, quota, f"set the quota of {who} {name}")
