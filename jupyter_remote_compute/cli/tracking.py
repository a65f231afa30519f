"""``jupyter remote-compute tracking ...``: the organization's MLflow tracking server on a hub.

Where an admin sets one, the runs of every member's jobs on the organization's machines are recorded
there instead of the member's own store. Its URI holds no credentials: each member's server gives the
server's own (``MLFLOW_TRACKING_TOKEN``, or ``MLFLOW_TRACKING_USERNAME`` and ``_PASSWORD``) in its
environment.
"""

from __future__ import annotations

import argparse

from .console import Subcommands, done, organization_or_refuse


def add_parser(sub: Subcommands) -> None:
    """The ``tracking`` command's parser."""
    tracking = sub.add_parser("tracking", help="the organization's MLflow tracking server on a hub (an admin sets it)")
    tsub = tracking.add_subparsers(dest="action", required=True)
    p = tsub.add_parser("show", help="where the runs of jobs on the organization's machines are recorded")
    p.add_argument("--json", action="store_true")
    p = tsub.add_parser("set", help="record them on this MLflow tracking server (admin)")
    p.add_argument("uri", help="its http(s) URL, with no user or password in it")
    p.add_argument("--json", action="store_true")
    p = tsub.add_parser("clear", help="record them in each member's own store again (admin)")
    p.add_argument("--json", action="store_true")


def cmd_tracking(args: argparse.Namespace) -> int:
    """The organization's tracking server, through its service (only an admin changes it)."""
    client = organization_or_refuse("the tracking server")
    if args.action == "show":
        tracking = client.tracking()
        where = (
            f"{tracking['uri']} (set by {tracking['set_by']})"
            if tracking["uri"]
            else "none: the runs of jobs on the organization's machines go to each member's own store"
        )
        return done(args, tracking, where)
    if args.action == "set":
        tracking = client.set_tracking(args.uri)
        return done(args, tracking, f"the runs of jobs on the organization's machines now go to {tracking['uri']}")
    client.clear_tracking()
    cleared = {"uri": None, "set_by": None}
    return done(args, cleared, "no tracking server: the runs go to each member's own store again")
