"""``jupyter remote-compute secrets ...``: the Secret Manager; values from stdin or a prompt, never argv."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .console import Subcommands, organization_or_refuse, print_json, read_secret, table


def add_parser(sub: Subcommands) -> None:
    """The ``secrets`` command's parser."""
    secrets = sub.add_parser("secrets", help="the Secret Manager: values from stdin or a prompt, never argv")
    ssub = secrets.add_subparsers(dest="action", required=True)
    p = ssub.add_parser("list", help="every secret's name and where it lives (never its value)")
    p.add_argument("--json", action="store_true")
    _org_flag(p)
    for action in ("set", "delete"):
        p = ssub.add_parser(action)
        p.add_argument("name")
        _org_flag(p)


def _org_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--org",
        action="store_true",
        help="the organization service's own secrets, which its machines name (admin; e.g. a registry_secret)",
    )


def cmd_secrets(args: argparse.Namespace) -> int:
    if args.org:
        return _org_secrets(args)
    from ..secrets import SecretStore

    store = SecretStore()
    if args.action == "set":
        store.set(args.name, read_secret(f"Value for {args.name}: "))
        print(f"stored {args.name} in {store.where()}")
        _print_store_note(store.status())
    elif args.action == "list":
        _list(store.status(), [e.to_json() for e in store.entries()], args.json, "you")
    elif args.action == "delete":
        store.delete(args.name)
        print(f"deleted {args.name}")
    return 0


def _org_secrets(args: argparse.Namespace) -> int:
    """``secrets list|set|delete --org``: the same, in the organization service's Secret Manager."""
    client = organization_or_refuse("the organization's secrets")
    if args.action == "set":
        stored = client.set_secret(args.name, read_secret(f"Value for the organization's {args.name}: "))
        print(f"stored the organization's {args.name} in the service's {stored['where']}")
    elif args.action == "list":
        answer = client.secrets()
        _list(answer["store"], answer["secrets"], args.json, "an admin")
    elif args.action == "delete":
        client.remove_secret(args.name)
        print(f"deleted the organization's {args.name}")
    return 0


def _list(status: dict[str, Any], entries: list[dict[str, Any]], as_json: bool, owner: str) -> None:
    if as_json:
        print_json({"store": status, "secrets": entries})
        return
    if entries:
        table(
            [
                [e["name"], "deployment (read-only)" if e["read_only"] else owner, e["where"], e["problem"] or ""]
                for e in entries
            ],
            ["NAME", "PROVIDED BY", "WHERE", "PROBLEM"],
        )
    # About the store, not a secret: on stderr, so the table alone can be piped on.
    sys.stdout.flush()
    print(f"new secrets go to {status['where']}", file=sys.stderr)
    _print_store_note(status)


def _print_store_note(status: dict[str, Any]) -> None:
    if status["note"]:
        print(f"note: {status['note']}", file=sys.stderr)
    if not status["usable"]:
        print(f"warning: {status['problem']}", file=sys.stderr)
