"""What a job may ask of its machine: GPUs, CPUs, memory, nodes, a partition (``Resources``).

Every kind reads the same record (``engines/resources.py`` says how); it is part of a job's key,
written back in the spelling it was read in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, PlainSerializer, with_config
from pydantic_core import core_schema

from . import values
from .base import STRICT, absent, problem, to_json, unless_none, validate

#: How a job across processes starts (``Resources.launcher``).
Launcher = Literal["torchrun", "plain"]
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)


def _launcher(value: Any) -> Any:
    if value not in LAUNCHERS:
        raise problem(f"{value!r} is not a launcher: use {' or '.join(LAUNCHERS)}")
    return value


@with_config(STRICT)
@dataclasses.dataclass(frozen=True)
class Resources:
    """What one job asks the scheduler for; ``None`` leaves the choice to the machine or the cluster.

    ``gpus`` and ``cpus`` are per node, shared by the node's ``processes_per_node`` processes;
    ``memory`` is in MiB per node, written in Slurm's spelling (``32G``, ``1536M``) so it reads back
    the same. ``nodes``, ``processes_per_node`` and ``launcher`` together make a job of several
    processes (``distributed``), which only kinds that declare a launcher run (``engines/base.py``).
    """

    gpus: Annotated[
        int | None,
        BeforeValidator(unless_none(values.at_least(0)), json_schema_input_type=Annotated[int, Field(ge=0)] | None),
        Field(description="GPUs per node", exclude_if=absent),
    ] = None
    cpus: Annotated[
        int | None,
        BeforeValidator(unless_none(values.at_least(1)), json_schema_input_type=Annotated[int, Field(ge=1)] | None),
        Field(description="CPUs per node", exclude_if=absent),
    ] = None
    memory_mb: Annotated[
        int | None,
        BeforeValidator(unless_none(values.memory_mb), json_schema_input_type=Annotated[int, Field(ge=1)] | str | None),
        PlainSerializer(values.format_memory, return_type=str, when_used="unless-none"),
        Field(alias="memory", description="memory per node: 32G, 512M, or MiB", exclude_if=absent),
    ] = None
    nodes: Annotated[
        int | None,
        BeforeValidator(unless_none(values.at_least(1)), json_schema_input_type=Annotated[int, Field(ge=1)] | None),
        Field(exclude_if=absent),
    ] = None
    partition: Annotated[
        str | None,
        BeforeValidator(unless_none(values.scheduler_name), json_schema_input_type=str | None),
        Field(description="a scheduler's partition", exclude_if=absent),
    ] = None
    processes_per_node: Annotated[
        int | None,
        BeforeValidator(unless_none(values.at_least(1)), json_schema_input_type=Annotated[int, Field(ge=1)] | None),
        Field(
            description="processes (ranks) of the command per node; more than one needs a launcher", exclude_if=absent
        ),
    ] = None
    launcher: Annotated[
        Launcher | None,
        BeforeValidator(unless_none(_launcher), json_schema_input_type=Launcher | None),
        Field(
            description="how the command starts on every node: torchrun (one torchrun per node starts its "
            "processes, rendezvous at the first node) or plain (the command once per process, its rank in "
            "the environment)",
            exclude_if=absent,
        ),
    ] = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_before_validator_function(_resources_in, handler(source))

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, prefix: str = "") -> Resources:
        """``{"gpus": 2, "cpus": 8, "memory": "32G", "nodes": 1, "partition": "gpu"}`` checked;
        ``prefix`` goes in front of field names in errors (``resources.``)."""
        return validate(cls, data, prefix.rstrip("."))

    def to_json(self) -> dict[str, Any]:
        """Only what was asked for, memory in Slurm's spelling."""
        return to_json(Resources, self)

    @property
    def world_size(self) -> int:
        """How many processes the command runs as: nodes times processes per node."""
        return (self.nodes or 1) * (self.processes_per_node or 1)

    @property
    def distributed(self) -> bool:
        """Whether the job runs as more than one process, or names how its processes start."""
        return self.world_size > 1 or self.launcher is not None

    def over(self, defaults: Resources) -> Resources:
        """These resources, with ``defaults`` (a machine's) filling what this job left open."""
        return Resources(
            **{
                f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(defaults, f.name)
                for f in dataclasses.fields(self)
            }
        )


def _resources_in(data: Any) -> Any:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise problem("expected a mapping such as {gpus: 1, memory: 16G}")
    return data


NO_RESOURCES = Resources()
