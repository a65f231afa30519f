"""What every command of the CLI shares: the workspace's job service, and reading and printing at a terminal."""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import RemoteComputeError
from ..jobs.service import JobService, ServiceSettings
from ..workspace import Workspace

if TYPE_CHECKING:
    from ..engines.organization.client import OrganizationClient

_DECIMAL = re.compile(r"\d+\.\d*|\.\d+")
EXIT_FAILED = 1
EXIT_DETACHED = 3


def job_service(args: argparse.Namespace) -> JobService:
    """The job service of the workspace ``--workspace`` names."""
    # The CLI exits when its job ends: the MLflow run is recorded by a detached recorder (recording/recorder.py).
    settings = ServiceSettings(record_in_background=True)
    return JobService(Workspace.find(args.workspace, fallback=args.workspace), settings)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def read_secret(prompt: str) -> str:
    """From a pipe, the first line; at a terminal, a prompt that does not echo."""
    value = getpass.getpass(prompt) if sys.stdin.isatty() else sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise RemoteComputeError("no value given on stdin or at the prompt")
    return value


def parse_options(pairs: Sequence[str] | None) -> dict[str, Any]:
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


def done(args: argparse.Namespace, data: Any, text: str) -> int:
    """Print what a command did: ``data`` as JSON with ``--json``, else one line of ``text``."""
    if getattr(args, "json", False):
        print_json(data)
    else:
        print(text)
    return 0


#: What ``add_subparsers`` returns: a command group's modules add their parsers to it.
Subcommands = argparse._SubParsersAction


def organization_or_refuse(what: str) -> OrganizationClient:
    """The organization service of this hub, or a refusal saying where ``what`` can be done."""
    from ..engines.organization.client import organization

    client = organization()
    if client is None:
        raise RemoteComputeError(
            f"{what} is the organization's, and there is no organization service here: run it in a terminal "
            "of a server the hub started"
        )
    return client
