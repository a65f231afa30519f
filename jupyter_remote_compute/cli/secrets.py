"""``jupyter remote-compute secrets ...``: the Secret Manager; values from stdin or a prompt, never argv."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .console import Subcommands, print_json, read_secret, table


def add_parser(sub: Subcommands) -> None:
    """The ``secrets`` command's parser."""
    secrets = sub.add_parser("secrets", help="the Secret Manager: values from stdin or a prompt, never argv")
    ssub = secrets.add_subparsers(dest="action", required=True)
    p = ssub.add_parser("list", help="every secret's name and where it lives (never its value)")
    p.add_argument("--json", action="store_true")
    for action in ("set", "delete"):
        ssub.add_parser(action).add_argument("name")


def cmd_secrets(args: argparse.Namespace) -> int:
    from ..secrets import SecretStore

    store = SecretStore()
    if args.action == "set":
        store.set(args.name, read_secret(f"Value for {args.name}: "))
        print(f"stored {args.name} in {store.where()}")
        _print_store_note(store.status())
    elif args.action == "list":
        entries = store.entries()
        status = store.status()
        if args.json:
            print_json({"store": status, "secrets": [e.to_json() for e in entries]})
            return 0
        if entries:
            table(
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
