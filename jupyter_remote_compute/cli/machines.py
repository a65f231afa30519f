"""``jupyter remote-compute machines ...``: list, add, edit, check and trust machines."""

from __future__ import annotations

import argparse
import sys

from ..engines.faces import faces_of
from ..engines.organization.client import ORG_PREFIX, with_organization
from ..errors import InvalidSettings, RemoteComputeError
from ..machines.admin import HostKeyNotConfirmed, MachineAdmin
from ..schema.pool import RULES
from .console import (
    Subcommands,
    done,
    job_service,
    organization_or_refuse,
    parse_options,
    print_json,
    read_secret,
    table,
)


def add_parser(sub: Subcommands) -> Subcommands:
    """The ``machines`` group and its actions; returns its subparsers, where kinds add actions of their own."""

    machines = sub.add_parser("machines", help="list, add, edit and check machines")
    msub = machines.add_subparsers(dest="action", required=True)
    p = msub.add_parser("list")
    p.add_argument("--json", action="store_true")
    for action in ("show", "remove", "enable", "disable", "check"):
        p = msub.add_parser(action)
        p.add_argument("name")
        p.add_argument("--json", action="store_true")
        if action == "remove":
            p.add_argument("--org", action="store_true", help="the organization's machine, through its service (admin)")
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
    _org_arguments(p, "may use it (none: every member with the use scope)")
    p = msub.add_parser("edit")
    p.add_argument("name")
    p.add_argument("--address")
    p.add_argument("--option", action="append", metavar="KEY=VALUE")
    p.add_argument("--token-stdin", action="store_true")
    p.add_argument("--json", action="store_true")
    _org_arguments(p, "may use it from now on: the list given replaces the machine's")
    p.add_argument(
        "--allow-everyone", action="store_true", help="no access list: every member with the use scope may use it"
    )
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
    # Pools (machines/pools.py): a job names one where it names a machine (run --machine POOL).
    p = msub.add_parser("pools", help="list the pools of compute.yaml")
    p.add_argument("--json", action="store_true")
    p = msub.add_parser("pool", help="make or change a pool (its machines and rule), or remove it")
    p.add_argument("name")
    p.add_argument(
        "--machine", action="append", dest="members", metavar="MACHINE", help="a machine (repeated, in order)"
    )
    p.add_argument("--placement", choices=RULES, help="first (default), least_loaded or cheapest")
    p.add_argument("--remove", action="store_true", help="remove the pool")
    p.add_argument("--json", action="store_true")
    return msub


def _org_arguments(p: argparse.ArgumentParser, who: str) -> None:
    """``--org`` and the access list of an organization's machine, on ``add`` and ``edit``."""
    p.add_argument("--org", action="store_true", help="the organization's machine, through its service (admin)")
    p.add_argument(
        "--allow-user", action="append", dest="allow_users", metavar="USER", help=f"a hub user who {who} (repeated)"
    )
    p.add_argument(
        "--allow-group",
        action="append",
        dest="allow_groups",
        metavar="GROUP",
        help=f"a hub group whose members {who.replace('may', 'may all', 1)} (repeated)",
    )


def _access(args: argparse.Namespace) -> dict[str, list[str]] | None:
    """The access list the flags give (``--allow-everyone``: an empty one, which clears it), or None."""
    if getattr(args, "allow_everyone", False):
        if args.allow_users or args.allow_groups:
            raise InvalidSettings(
                f"machines {args.action}: --allow-everyone or --allow-user/--allow-group, not both", field="access"
            )
        return {"users": [], "groups": []}
    if not (args.allow_users or args.allow_groups):
        return None
    return {"users": args.allow_users or [], "groups": args.allow_groups or []}


def _org_machine(args: argparse.Namespace) -> int:
    """``machines add|edit|remove NAME --org``: the organization's machine, changed through its service."""
    client = organization_or_refuse("an organization's machine")
    if args.action == "remove":
        client.remove_machine(args.name)
        return done(args, {"name": args.name, "removed": True}, f"removed {ORG_PREFIX}{args.name}")
    body: dict[str, object] = {}
    options = _options(args)
    if options:
        body["options"] = options
    if args.token_stdin:
        body["token"] = read_secret(f"Token for {args.name}: ")
    access = _access(args)
    if access is not None:
        body["access"] = access
    if args.action == "add":
        body.update(name=args.name, kind=args.kind, address=_address(args), enabled=not args.disabled)
        machine = client.add_machine(body)
        verb = "added"
    else:
        if args.address is not None:
            body["address"] = args.address
        machine = client.update_machine(args.name, body)
        verb = "updated"
    return done(args, machine, f"{verb} {ORG_PREFIX}{machine['name']}{_access_text(machine.get('access'))}")


def _access_text(access: dict[str, list[str]] | None) -> str:
    names = [*(access or {}).get("users", []), *(f"group {g}" for g in (access or {}).get("groups", []))]
    return f", for {', '.join(names)} only" if names else ", for every member"


def _options(args: argparse.Namespace) -> dict[str, object]:
    """``--option`` pairs and, on ``add``, the ssh flags that are options too."""
    options = parse_options(args.option)
    for name in ("user", "port", "identity_file", "base_dir"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return options


def _address(args: argparse.Namespace) -> str:
    """``--address``, or the name where the kind dials nothing (the address only describes it)."""
    if args.address is not None:
        return str(args.address)
    if not faces_of(args.kind).address_optional:
        raise RemoteComputeError(f"machines add: --address is required for a {args.kind} machine")
    return str(args.name)


def _pools(args: argparse.Namespace, admin: MachineAdmin) -> int:
    """``machines pools`` and ``machines pool NAME``."""
    if args.action == "pools":
        pools = [pool.to_json() for pool in admin.pools()]
        if args.json:
            print_json(pools)
        else:
            table(
                [[p["name"], ", ".join(p["machines"]), p["placement"]] for p in pools],
                ["NAME", "MACHINES", "PLACEMENT"],
            )
        return 0
    if args.remove:
        if args.members or args.placement:
            raise InvalidSettings("machines pool --remove: give no --machine or --placement with it", field="remove")
        admin.remove_pool(args.name)
        return done(args, {"name": args.name, "removed": True}, f"removed pool {args.name}")
    body: dict[str, object] = {"machines": args.members or []}
    if args.placement:
        body["placement"] = args.placement
    pool = admin.put_pool_from(args.name, body)
    return done(args, pool.to_json(), f"pool {pool.name}: {', '.join(pool.machines)} ({pool.placement})")


def _default_machine(args: argparse.Namespace) -> int:
    """``machines default``: the organization's default machine, through its service."""
    if not args.org:
        raise RemoteComputeError(
            "machines default: a default machine is the organization's (on a hub); add --org. Without one, "
            "a job that names no machine runs on local"
        )
    if args.clear and args.name:
        raise RemoteComputeError("machines default: give a machine's name or --clear, not both")
    client = organization_or_refuse("the default machine")
    if args.clear:
        client.clear_default_machine()
        return done(args, {"machine": None}, "the organization has no default machine now")
    current = client.set_default_machine(args.name) if args.name else client.default_machine()
    machine = current["machine"]
    if machine is None:
        return done(args, current, "the organization has no default machine: a job that names none runs on local")
    verb = "is now" if args.name else "is"
    text = f"{ORG_PREFIX}{machine['name']} {verb} the organization's default machine (set by {current['set_by']})"
    return done(args, current, text)


def cmd_machines(args: argparse.Namespace) -> int:
    action = args.action
    if action == "default":
        return _default_machine(args)
    if getattr(args, "org", False):
        return _org_machine(args)
    if getattr(args, "allow_users", None) or getattr(args, "allow_groups", None) or getattr(args, "allow_everyone", 0):
        raise InvalidSettings(
            f"machines {action}: who may use a machine is said of the organization's machines: add --org",
            field="access",
        )
    service = job_service(args)
    admin = service.admin
    if action in ("pools", "pool"):
        return _pools(args, admin)
    if action == "list":
        # On a hub with an organization service, its machines follow the user's own.
        machines, organization = with_organization([m.to_json() for m in admin.list()])
        if organization and organization.get("problem"):
            print(f"warning: the organization's machines are not listed: {organization['problem']}", file=sys.stderr)
        if args.json:
            print_json(machines)
        else:
            table(
                [
                    [
                        m["name"],
                        m["kind"],
                        m["address"],
                        "yes" if m["enabled"] else "no",
                        m["created"] or ("built-in" if m.get("builtin") else "-"),  # hand-written: no date
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
        print_json(admin.get(args.name).to_json())
        return 0
    if action == "add":
        options = _options(args)
        token = read_secret(f"Token for {args.name}: ") if args.token_stdin else None
        faces = faces_of(args.kind)
        machine = admin.add(args.name, args.kind, _address(args), options, enabled=not args.disabled, token=token)
        data = machine.to_json()
        text = f"added {machine.name} ({machine.kind}, {machine.address})"
        added = admin.introduce(machine, args.server_url or "SERVER_URL")
        if added:
            data.update(added)
            text += faces.added_text(data) if faces.added_text else ""
        return done(args, data, text)
    if action == "edit":
        token = read_secret(f"Token for {args.name}: ") if args.token_stdin else None
        machine = admin.update(args.name, address=args.address, options=parse_options(args.option), token=token)
        return done(args, machine.to_json(), f"updated {machine.name}")
    if action == "remove":
        admin.remove(args.name)
        return done(args, {"name": args.name, "removed": True}, f"removed {args.name}")
    if action in ("enable", "disable"):
        machine = admin.set_enabled(args.name, action == "enable")
        if machine.enabled:
            service.place()  # a pool's waiting job takes it now, whether or not a server polls
        return done(args, machine.to_json(), f"{action}d {args.name}")
    if action == "check":
        facts = admin.check(args.name)
        if args.json:
            print_json(facts)
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
        return done(args, result, f"trusted {args.name}: {result['fingerprint']}")
    raise AssertionError(action)
