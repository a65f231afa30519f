"""Schemathesis hooks for the API fuzz test (loaded through SCHEMATHESIS_HOOKS).

A job the fuzzer submits runs on the built-in ``local`` machine and runs ``true``: the fuzzer
still chooses every other setting, and an invalid machine or command (wrong type, empty) stays
invalid, so the server's refusal of it is still tested.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from fuzz_failures import kept

HARMLESS_COMMAND = "true"


def _valid_command(command: object) -> bool:
    if isinstance(command, str):
        return bool(command.strip()) and "\0" not in command
    return isinstance(command, list) and bool(command) and all(isinstance(a, str) and "\0" not in a for a in command)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    operation = case.operation
    if (operation.method.upper(), operation.path) != ("POST", "/remote-compute/jobs"):
        return
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("machine"), str):
        body["machine"] = "local"
    if _valid_command(body.get("command")):
        body["command"] = HARMLESS_COMMAND if isinstance(body["command"], str) else [HARMLESS_COMMAND]


#: The 5xx answers that report the world, not a fault of the server: a machine that cannot be
#: reached (every address the fuzzer makes up is refused by loopback_only.py) is a 502 machine_error.
UPSTREAM_ERRORS = {(502, "machine_error")}


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure except a server error that is a documented upstream failure."""
    return kept(failure, response, UPSTREAM_ERRORS)
