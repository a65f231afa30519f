"""What a job may ask of its machine: GPUs, CPUs, memory, nodes, a partition (``Resources``).

Every kind reads the same record: the machines that run the command themselves check it against
their facts (``Engine.admit``), schedulers pass it on (sbatch's options, SkyPilot's resources). It is
part of a job's key, written back in the spelling it was read in. The record is defined in
``schema/spec.py``.
"""

from __future__ import annotations

from typing import Any

from ..schema import values
from ..schema.base import checked
from ..schema.resources import NO_RESOURCES, Resources
from ..schema.values import format_memory

__all__ = ["NO_RESOURCES", "Resources", "format_memory", "parse_memory_mb", "scheduler_name"]


def parse_memory_mb(value: str | int, field: str = "memory") -> int:
    """MiB from ``"32G"``, ``"512M"``, ``"1.5G"``, ``"2T"`` or a plain number of MiB (Slurm's default unit)."""
    return checked(values.memory_mb, value, field)


def scheduler_name(value: Any, field: str) -> str:
    return checked(values.scheduler_name, value, field)
