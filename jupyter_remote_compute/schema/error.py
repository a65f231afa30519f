"""The body of every 4xx/5xx answer under ``/remote-compute/`` (``errors.RemoteComputeError.to_json``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, with_config
from typing_extensions import NotRequired, TypedDict


class HostKey(TypedDict):
    """An SSH host key a machine presented: what a person compares before trusting it."""

    type: str
    fingerprint: str


@with_config(ConfigDict(extra="allow"))
class ErrorDetails(TypedDict, total=False):
    """Facts to act on: an unknown host key to trust, the machines and jobs a secret is used by, …"""

    host_key: HostKey
    can_trust: bool
    used_by: list[str]


@with_config(ConfigDict(extra="forbid"))
class Error(TypedDict):
    """What went wrong, a stable code for programs, and the setting at fault."""

    code: Annotated[
        str,
        Field(
            description="stable: invalid, forbidden, policy_denied, not_found, method_not_allowed, conflict, "
            "not_trained, config_file, pipeline_invalid, machine_error, secret_store_unavailable, "
            "secret_in_settings, internal, …",
            examples=["invalid"],
        ),
    ]
    message: str
    field: NotRequired[Annotated[str, Field(description="the setting at fault, e.g. send[0] or env.TOKEN")]]
    details: NotRequired[ErrorDetails]
