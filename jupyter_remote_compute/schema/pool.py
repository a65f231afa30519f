"""A pool of machines (``Pool``) as compute.yaml's ``pools:`` holds it and the API lists it, and what sets
one (``PoolInput``, the body of ``PUT /pools/{name}``).

A job names a pool where it would name a machine; it is placed on one of the pool's machines by the pool's
rule when one has room, and waits in the pool's queue until then (jobs/placement.py). Pools and machines
share one namespace: the registry refuses a pool named as a machine, and the other way round.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, ConfigDict, Field, with_config

from . import values
from .base import STRICT, problem, to_json, validate

#: How a machine is chosen among those of the pool that have room: the first in the pool's order, the
#: one running the fewest jobs, or the one whose ``price_per_hour`` is lowest (one without a price last).
PlacementRule = Literal["first", "least_loaded", "cheapest"]
RULES: tuple[PlacementRule, ...] = get_args(PlacementRule)


def _machines(value: Any) -> Any:
    if not isinstance(value, (list, tuple)):  # one name is still a list of one: [a]
        raise problem("expected a list of machine names, such as [a, b]")
    names = values.machine_names(value)
    if not names:
        raise problem("a pool needs at least one machine")
    return names


def _rule(value: Any) -> Any:
    if value is None:
        return "first"
    if value not in RULES:
        raise problem(f"{value!r} is not a placement rule: use {', '.join(RULES)}")
    return value


Machines = Annotated[
    tuple[str, ...],
    BeforeValidator(_machines, json_schema_input_type=Annotated[list[str], Field(min_length=1)]),
    Field(description="the pool's machines, in the order the rule `first` tries them"),
]
Rule = Annotated[
    PlacementRule,
    BeforeValidator(_rule, json_schema_input_type=PlacementRule | None),
    Field(
        description="first: the first machine with room; least_loaded: the one running the fewest jobs; "
        "cheapest: the one with the lowest price_per_hour (none declared: last)"
    ),
]


@with_config(ConfigDict(json_schema_serialization_defaults_required=True))
@dataclasses.dataclass(frozen=True)
class Pool:
    """One pool of compute.yaml: its name, its machines in order, its placement rule."""

    name: str
    machines: tuple[str, ...]
    placement: PlacementRule = "first"

    def to_json(self) -> dict[str, Any]:
        return to_json(Pool, self)


@with_config(STRICT)
@dataclasses.dataclass(frozen=True)
class PoolInput:
    """What sets a pool (``PUT /pools/{name}``): its machines and rule, made or replaced whole."""

    machines: Machines
    placement: Rule = "first"
    version: Annotated[
        str | None, Field(description="the machine list's version: refused if compute.yaml changed since")
    ] = None

    @classmethod
    def from_json(cls, data: Any, prefix: str = "") -> PoolInput:
        return validate(cls, data, prefix)
