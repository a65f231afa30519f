"""What a job may ask of its machine: GPUs, CPUs, memory, nodes, a partition (``Resources``).

Every kind reads the same record: the machines that run the command themselves check it against
their facts (``Engine.admit``), schedulers pass it on (sbatch's options, SkyPilot's resources). It is
part of a job's key, written back in the spelling it was read in.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidSettings

_SCHEDULER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$")  # a partition, an account, a qos
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_MEMORY_UNIT_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory_mb(value: str | int, field: str = "memory") -> int:
    """MiB from ``"32G"``, ``"512M"``, ``"1.5G"``, ``"2T"`` or a plain number of MiB (Slurm's default unit)."""
    if isinstance(value, bool):
        raise InvalidSettings(f"{field}: expected an amount such as '32G' or '512M'", field=field)
    if isinstance(value, int):
        mb = float(value)
    else:
        found = _MEMORY.match(str(value))
        if not found:
            raise InvalidSettings(
                f"{field}: {value!r} is not an amount of memory; write e.g. '32G' or '512M'", field=field
            )
        mb = float(found.group(1)) * _MEMORY_UNIT_MB[found.group(2).upper()]
    if mb <= 0:
        raise InvalidSettings(f"{field}: must be more than zero", field=field)
    return math.ceil(mb)


def format_memory(mb: int) -> str:
    """Slurm's spelling: whole gibibytes as ``32G``, anything else as ``1536M``."""
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def positive_int(value: Any, field: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise InvalidSettings(f"{field}: expected a whole number, got {value!r}", field=field)
    if value < minimum:
        raise InvalidSettings(f"{field}: must be at least {minimum}, got {value}", field=field)
    return value


def scheduler_name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _SCHEDULER_NAME.match(value):
        raise InvalidSettings(
            f"{field}: {value!r} is not a Slurm name (letters, digits and _ . : + -, at most 64)", field=field
        )
    return value


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one job asks the scheduler for; ``None`` leaves the choice to the machine or the cluster.

    ``gpus`` and ``cpus`` are per node (the job runs one task per node); ``memory`` is in MiB per node.
    """

    gpus: int | None = None
    cpus: int | None = None
    memory_mb: int | None = None
    nodes: int | None = None
    partition: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, prefix: str = "") -> Resources:
        """Validate ``{"gpus": 2, "cpus": 8, "memory": "32G", "nodes": 1, "partition": "gpu"}``.

        ``prefix`` goes in front of field names in errors (``resources.memory``).
        """
        if data is not None and not isinstance(data, Mapping):
            field = prefix.rstrip(".") or "resources"
            raise InvalidSettings(f"{field}: expected a mapping such as {{gpus: 1, memory: 16G}}", field=field)
        data = dict(data or {})
        unknown = sorted(set(data) - {"gpus", "cpus", "memory", "nodes", "partition"})
        if unknown:
            raise InvalidSettings(
                f"{prefix}{unknown[0]}: not a resource; use gpus, cpus, memory, nodes or partition",
                field=prefix + unknown[0],
            )

        def given(name: str) -> Any:
            value = data.get(name)
            return None if value is None or value == "" else value

        gpus, cpus, memory, nodes, partition = (given(n) for n in ("gpus", "cpus", "memory", "nodes", "partition"))
        return cls(
            gpus=None if gpus is None else positive_int(gpus, prefix + "gpus", minimum=0),
            cpus=None if cpus is None else positive_int(cpus, prefix + "cpus"),
            memory_mb=None if memory is None else parse_memory_mb(memory, prefix + "memory"),
            nodes=None if nodes is None else positive_int(nodes, prefix + "nodes"),
            partition=None if partition is None else scheduler_name(partition, prefix + "partition"),
        )

    def to_json(self) -> dict[str, Any]:
        """Only what was asked for, memory in Slurm's spelling (so it reads back the same)."""
        out: dict[str, Any] = {}
        for name in ("gpus", "cpus", "nodes", "partition"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.memory_mb is not None:
            out["memory"] = format_memory(self.memory_mb)
        return out

    def over(self, defaults: Resources) -> Resources:
        """These resources, with ``defaults`` (a machine's) filling what this job left open."""
        return Resources(
            **{
                f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(defaults, f.name)
                for f in dataclasses.fields(self)
            }
        )
