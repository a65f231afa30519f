"""The agent kind's faces: its routes, its lease setting and expiry, its CLI commands, its machine hooks.

Registered in ``engines.faces.BUILT_IN_FACES``; the server, the CLI and the machine admin read it
from there and know nothing of agents themselves.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .engines.agent_hub import DEFAULT_LEASE, AgentHub, welcome, with_presence
from .engines.faces import CliCommand, KindFaces, PeriodicTask, ServerView


def _routes() -> list[tuple[str, type]]:
    from .agent_handlers import AGENT_HANDLERS

    return list(AGENT_HANDLERS)


def _server_settings() -> dict[str, Any]:
    from traitlets import Float

    return {
        "agent_lease": Float(
            DEFAULT_LEASE,
            config=True,
            help="Seconds an agent's claim on a job lives without a heartbeat: then a job that started is lost, "
            "one that did not is queued again. Counted from this server's start at the earliest.",
        )
    }


def _expire_leases(server: ServerView) -> None:
    """Only the server talks to agents, so only it decides that a silent agent's lease ran out."""
    for machine in AgentHub(server.punica_dir).machines():
        for job_id in machine.expire(server.settings["agent_lease"], server.started_at):
            server.log.warning("remote-compute: job %s: the agent of %s let its lease run out", job_id, machine.name)


def _revoke(punica_dir: Path, name: str) -> None:
    """A removed machine's agent is let in no more."""
    AgentHub(punica_dir).machine(name).revoke_token()


def welcome_text(data: dict[str, Any]) -> str:
    return (
        f"\nagent token (shown once; the old one, if any, no longer works):\n  {data['agent_token']}\n"
        f"save it on the machine in ~/.config/jrc-agent.token (chmod 600), then run there:\n  {data['agent_command']}"
    )


def _token_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--rotate", action="store_true")
    group.add_argument("--revoke", action="store_true")
    p.add_argument("--server-url", help="this server's URL, for the command shown")
    p.add_argument("--json", action="store_true")


def cmd_agent_token(args: argparse.Namespace) -> int:
    """``machines agent-token NAME --rotate|--revoke``."""
    from .cli.console import done, job_service
    from .errors import RemoteComputeError

    service = job_service(args)
    if service.admin.get(args.name).kind != "agent":
        raise RemoteComputeError(f"{args.name} is not an agent machine: it has no agent token")
    punica = service.workspace.punica_dir
    if args.revoke:
        AgentHub(punica).machine(args.name).revoke_token()
        return done(args, {"name": args.name, "revoked": True}, f"revoked the agent token of {args.name}")
    data = {"name": args.name, **welcome(punica, args.name, args.server_url or "SERVER_URL")}
    return done(args, data, f"new agent token for {args.name}" + welcome_text(data))


def cmd_agent(args: argparse.Namespace) -> int:
    """``agent ...``: the pull agent of an agent machine, with its own options."""
    from .agent.command import main as agent_main

    return agent_main(args.rest)


FACES = KindFaces(
    routes=_routes,
    server_settings=_server_settings,
    periodic=(PeriodicTask("checking agent leases", _expire_leases),),
    cli=(
        CliCommand(
            "agent-token",
            "an agent machine's token: --rotate (a new one, shown once) or --revoke",
            cmd_agent_token,
            _token_arguments,
            group="machines",
        ),
        CliCommand("agent", "run the pull agent of an agent machine (its options: agent --help)", cmd_agent, raw=True),
    ),
    address_optional=True,
    on_added=welcome,
    added_text=welcome_text,
    on_removed=_revoke,
    describe=with_presence,
)
