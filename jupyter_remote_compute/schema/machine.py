"""A machine as the registry keeps it and the API lists it (``Machine``), and what adds or changes one
(``MachineInput``, ``MachinePatch``): the REST bodies the panel's machine form and the organization
service send. Their shape is checked here; what a kind's options mean, ``machines/options.py`` checks.
An organization's machine may also say who may use it (``MachineAccess``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, PlainSerializer, Strict, with_config

from .base import problem, to_json, validate


def _options(value: Any) -> Any:
    if value is not None and not isinstance(value, Mapping):
        raise problem("expected a mapping of option names to values")
    return value


Options = Annotated[
    dict[str, Any] | None,
    BeforeValidator(_options, json_schema_input_type=dict[str, Any] | None),
    Field(
        description="the kind's options, by name (GET /kinds), and those every kind takes: price_per_hour, "
        "max_jobs, ...; notify, a webhook URL every job on the machine POSTs its state changes to, beside its "
        "own; notify_secret, the NAME of the Secret Manager entry that signs them (never the key); notify_events, "
        "the job states it is told of (default: every change)"
    ),
]


#: A JupyterHub user or group name as an access list holds it: hub names are free text, but not empty,
#: not padded, without control characters (they would be written to compute.yaml and shown in the panel).
HUB_NAME = r"^[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]{0,253}[^\s\x00-\x1f\x7f])?$"


def _hub_names(value: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise problem("expected a list of JupyterHub names")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not re.fullmatch(HUB_NAME, name):
            raise problem("expected a JupyterHub name (text without surrounding spaces or control characters)", i)
    return tuple(dict.fromkeys(value))  # each once, in the order given


HubNames = Annotated[
    tuple[str, ...],
    BeforeValidator(_hub_names, json_schema_input_type=list[str]),
    PlainSerializer(list, return_type=list[str]),
    Field(json_schema_extra={"items": {"type": "string", "pattern": HUB_NAME}}),
]


@with_config(ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True))
@dataclasses.dataclass(frozen=True)
class MachineAccess:
    """Who may use one of the organization's machines: these hub users and the members of these hub groups
    (beside the organization's admins). Both empty: every member with the use scope."""

    users: Annotated[HubNames, Field(description="JupyterHub user names")] = ()
    groups: Annotated[HubNames, Field(description="JupyterHub group names")] = ()

    def __bool__(self) -> bool:
        return bool(self.users or self.groups)

    def admits(self, user: str, groups: Iterable[str]) -> bool:
        """Whether ``user`` (in hub ``groups``) is on the list; an empty list admits everyone."""
        return not self or user in self.users or not set(self.groups).isdisjoint(groups)


Access = Annotated[
    MachineAccess | None,
    Field(description="an organization machine's: the hub users and groups that may use it (empty: every member)"),
]


#: A token for the machine: stored in the Secret Manager by the server; compute.yaml keeps only its name.
Token = Annotated[
    str | None,
    Field(description="stored in the Secret Manager, never in compute.yaml", json_schema_extra={"writeOnly": True}),
]
#: The machine list's version the change was made from: refused if compute.yaml changed since.
Version = Annotated[str | None, Field(description="the machine list's version: refused if compute.yaml changed since")]


@with_config(ConfigDict(json_schema_serialization_defaults_required=True))
@dataclasses.dataclass(frozen=True)
class Machine:
    """One machine as the registry sees it: the file's entry, made plain; lists add whose it is."""

    name: str
    kind: str
    address: str
    enabled: bool
    # UTC ISO 8601, e.g. "2026-11-29T10:02:00Z", set once at add
    created: Annotated[str | None, Field(json_schema_extra={"format": "date-time"})]
    options: Annotated[
        Mapping[str, Any],
        PlainSerializer(dict, return_type=dict[str, Any]),  # the registry keeps a read-only view
        Field(json_schema_extra={"additionalProperties": True}),
    ]
    builtin: bool = False
    # In lists (engines/organization/client.py): whose machine it is, `organization` or the user's name, and who set an
    # organization's machine.
    owner: Annotated[
        str | None,
        Field(
            description="whose machine it is: `organization`, or the user's name (in lists)",
            exclude_if=lambda v: v is None,
        ),
    ] = None
    admin: Annotated[
        str | None,
        Field(description="an organization machine's: the admin who set it", exclude_if=lambda v: v is None),
    ] = None
    access: Annotated[Access, Field(exclude_if=lambda v: v is None)] = None

    def to_json(self) -> dict[str, Any]:
        return to_json(Machine, self)


# Settings a body holds beside these are left alone, as they always were (a form may send what it showed).
@with_config(ConfigDict(extra="ignore"))
@dataclasses.dataclass(frozen=True)
class MachineInput:
    """What adds a machine (``POST /machines``)."""

    # the rule (and its message) is machines/options.py's check_name; the pattern tells a client
    name: Annotated[str, Field(json_schema_extra={"pattern": r"^[a-z0-9][a-z0-9-]{0,39}$"})]
    kind: Annotated[str, Field(description="an installed kind (GET /kinds) other than local")]
    address: str
    options: Options = None
    enabled: Annotated[bool, Strict()] = True
    token: Token = None
    version: Version = None
    access: Access = None

    @classmethod
    def from_json(cls, data: Any) -> MachineInput:
        return validate(cls, data)


@with_config(ConfigDict(extra="ignore"))
@dataclasses.dataclass(frozen=True)
class MachinePatch:
    """What changes a machine (``PATCH /machines/{name}``): only the settings given (not null) change."""

    address: str | None = None
    options: Options = None
    enabled: Annotated[bool | None, Strict()] = None
    token: Token = None
    version: Version = None
    access: Annotated[
        Access, Field(description="who may use it (an organization's machine): an empty one clears it")
    ] = None

    @classmethod
    def from_json(cls, data: Any) -> MachinePatch:
        return validate(cls, data)
