"""``check``: what a login node offers (Slurm's commands, version, partitions, account), and
refusing resources no partition can give."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...errors import InvalidSettings
from .. import farside
from ..resources import Resources, format_memory

SINFO_FORMAT = "%P|%a|%l|%D|%T|%c|%m|%G|%N"

#: One round trip for ``check``: each section starts with ``@@name`` and ends with ``@@rc <code>``.
CHECK_SH = farside.script("slurm-check")


class SlurmMissing(Exception):
    """The login node lacks Slurm's commands; the message says which."""


@dataclasses.dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    available: str  # "up", "down", "drain", "inactive"
    time_limit: str  # as Slurm writes it: "infinite", "1-00:00:00", "30:00"
    time_limit_minutes: int | None  # None: no limit
    nodes: int
    node_states: dict[str, int]  # e.g. {"idle": 3, "mixed": 1}
    cpus_per_node: int  # the largest node's
    memory_mb_per_node: int
    gpus_per_node: int
    node_list: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"node_list": list(self.node_list)}


@dataclasses.dataclass(frozen=True)
class SlurmFacts:
    version: str
    user: str
    partitions: tuple[Partition, ...]
    default_account: str | None
    accounting: bool  # whether sacctmgr could answer (slurmdbd reachable)

    def to_json(self) -> dict[str, Any]:
        return {
            "slurm_version": self.version,
            "user": self.user,
            "partitions": [p.to_json() for p in self.partitions],
            "default_account": self.default_account,
            "accounting": self.accounting,
        }


def parse_time_limit(text: str) -> int | None:
    """Minutes from Slurm's ``[days-]hours:minutes:seconds`` (or ``minutes``), rounded up; None if unlimited."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited", "none", "n/a", ""):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        raise ValueError(f"not a Slurm time: {text!r}")
    total = (int(days or 0) * 24 + hours) * 60 + minutes
    return total + (1 if seconds else 0)


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a gres string: ``gpu:4``, ``gpu:a100:2(S:0-1)``, ``gpu:2,shard:8``, ``(null)``."""
    total = 0
    for item in gres.split(","):
        item = item.split("(", 1)[0].strip()
        fields = item.split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def _number(text: str) -> int:
    digits = text.strip().rstrip("+")  # "2+": nodes of the group differ; the smallest is given
    return int(digits) if digits.isdigit() else 0


def parse_sinfo(stdout: str) -> list[Partition]:
    """Partitions from ``sinfo --format=SINFO_FORMAT`` (one line per partition and node state)."""
    grouped: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 9:
            raise ValueError(f"sinfo printed a line not in {SINFO_FORMAT!r}: {line[:200]!r}")
        name, avail, limit, count, state, cpus, memory, gres, nodes = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        entry = grouped.setdefault(
            name,
            {
                "default": default,
                "available": avail,
                "time_limit": limit,
                "states": {},
                "cpus": 0,
                "mem": 0,
                "gpus": 0,
                "nodes": [],
            },
        )
        entry["states"][state] = entry["states"].get(state, 0) + _number(count)
        entry["cpus"] = max(entry["cpus"], _number(cpus))
        entry["mem"] = max(entry["mem"], _number(memory))
        entry["gpus"] = max(entry["gpus"], gpus_in_gres(gres))
        entry["nodes"].append(nodes)
    return [
        Partition(
            name=name,
            default=e["default"],
            available=e["available"],
            time_limit=e["time_limit"],
            time_limit_minutes=parse_time_limit(e["time_limit"]),
            nodes=sum(e["states"].values()),
            node_states=e["states"],
            cpus_per_node=e["cpus"],
            memory_mb_per_node=e["mem"],
            gpus_per_node=e["gpus"],
            node_list=tuple(e["nodes"]),
        )
        for name, e in grouped.items()
    ]


def parse_scontrol_oneliner(stdout: str) -> list[dict[str, str]]:
    """Records from ``scontrol show <thing> --oneliner``: one ``Key=Value`` line each."""
    records = []
    for line in stdout.splitlines():
        if "=" not in line:
            continue
        record = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                record[key] = value
        records.append(record)
    return records


def _sections(stdout: str) -> tuple[dict[str, tuple[str, int]], list[str]]:
    sections: dict[str, tuple[str, int]] = {}
    missing: list[str] = []
    name, lines = "", []
    for line in stdout.splitlines():
        if line.startswith("@@missing "):
            missing.append(line.split(None, 1)[1])
        elif line.startswith("@@rc "):
            sections[name] = ("\n".join(lines), int(line.split()[1]))
            name, lines = "", []
        elif line.startswith("@@"):
            name, lines = line[2:].strip(), []
        else:
            lines.append(line)
    return sections, missing


def parse_check(stdout: str) -> SlurmFacts:
    """The facts ``CHECK_SH`` printed; SlurmMissing when the login node has no Slurm commands."""
    sections, missing = _sections(stdout)
    if missing:
        raise SlurmMissing(
            f"the login node has no {', '.join(missing)} on its PATH: is this a Slurm login node? "
            "(if Slurm comes from a module, load it in the login shell's profile)"
        )
    version_text, version_rc = sections.get("version", ("", 1))
    if version_rc != 0:
        raise SlurmMissing(f"sinfo --version failed: {version_text.strip()[:300]}")
    partitions_text, partitions_rc = sections.get("partitions", ("", 1))
    if partitions_rc != 0:
        raise ValueError(f"sinfo failed: {partitions_text.strip()[:300]}")
    account_text, account_rc = sections.get("account", ("", 1))
    account_lines = [line.strip() for line in account_text.splitlines() if line.strip()]
    accounting = account_rc == 0
    return SlurmFacts(
        version=version_text.strip().split()[-1] if version_text.strip() else "",
        user=sections.get("user", ("", 0))[0].strip(),
        partitions=tuple(parse_sinfo(partitions_text)),
        default_account=(account_lines[0] or None) if accounting and account_lines else None,
        accounting=accounting,
    )


def refuse_unfit(resources: Resources, partitions: Sequence[Partition], default_partition: str | None = None) -> None:
    """Refuse, before sbatch, what no node of the partition can give (Slurm would queue it for ever).

    Many clusters accept such a job and leave it pending (reason PartitionConfig or
    PartitionNodeLimit); a clear error at submit, naming the resource, is better.
    """
    wanted = resources.partition or default_partition
    if wanted:
        matching = [p for p in partitions if p.name == wanted]
        if not matching:
            names = ", ".join(p.name for p in partitions) or "none"
            raise InvalidSettings(
                f"partition: {wanted!r} is not a partition here (there are: {names})", field="partition"
            )
    else:
        matching = [p for p in partitions if p.default]
    if not matching:
        return  # no default partition: sbatch itself says what it wants
    part = matching[0]
    limits = (
        ("cpus", resources.cpus, part.cpus_per_node, "CPUs per node"),
        ("gpus", resources.gpus, part.gpus_per_node, "GPUs per node"),
        ("memory", resources.memory_mb, part.memory_mb_per_node, "MiB of memory per node"),
        ("nodes", resources.nodes, part.nodes, "nodes"),
    )
    for field, asked, most, what in limits:
        if asked is not None and asked > most:
            raise InvalidSettings(
                f"{field}: {format_memory(asked) if field == 'memory' else asked} asked, but partition "
                f"{part.name!r} has at most {most} {what}",
                field=field,
            )
