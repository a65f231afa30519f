"""What the usage record keeps: one ``Attempt`` of one job, a line of ``.punica/usage.jsonl`` (``usage/ledger.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, with_config

from .base import to_json, validate


@with_config(ConfigDict(extra="ignore"))
@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of one job, as metered: one line of the usage record."""

    job: str
    attempt: int  # 1 for the first; a requeue starts the next
    name: str
    machine: str
    kind: str
    user: str | None
    queued: float  # epoch seconds: submitted, or put back in the queue
    started: float | None  # None: never ran
    ended: float | None  # None: still under way (``running``)
    state: str  # the job's end state, ``requeued``, or (running) its live state
    gpus: int  # GPUs the attempt held (asked for, else all the machine has)
    source: str  # engine | scheduler | estimated
    bytes_sent: int = 0
    bytes_fetched: int = 0
    price_per_hour: float | None = None  # the machine's setting, if it has one
    running: bool = False  # counted up to now, not final
    groups: tuple[str, ...] = ()  # the user's hub groups when it ran (the organization's ledger)
    nodes: int = 1  # the nodes the attempt held (a job of several nodes); lines before it held one

    def end(self, now: float) -> float:
        return self.ended if self.ended is not None else now

    def wall_s(self, now: float) -> float:
        return max(0.0, self.end(now) - self.started) if self.started is not None else 0.0

    def queue_s(self, now: float) -> float:
        until = self.started if self.started is not None else self.end(now)
        return max(0.0, until - self.queued)

    def metrics(self, now: float) -> dict[str, float]:
        """The figures a job's MLflow run carries (``tracking.USAGE_METRICS``)."""
        wall = self.wall_s(now)
        return {
            "remote_compute.wall_s": round(wall, 3),
            "remote_compute.gpu_s": round(wall * self.gpus, 3),
            "remote_compute.queue_s": round(self.queue_s(now), 3),
            "remote_compute.bytes_sent": float(self.bytes_sent),
            "remote_compute.bytes_fetched": float(self.bytes_fetched),
        }

    def to_json(self) -> dict[str, Any]:
        return to_json(Attempt, self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        """A line of the record; fields a later version added are left out."""
        return validate(cls, data)
