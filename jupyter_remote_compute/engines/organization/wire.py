"""What the organization service and its engine say to each other about jobs on its machines, as JSON."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..base import MetricBytes, RemoteStatus


def status_json(status: RemoteStatus) -> dict[str, Any]:
    return dataclasses.asdict(status)


def status_from_json(data: Mapping[str, Any]) -> RemoteStatus:
    fields = {f.name for f in dataclasses.fields(RemoteStatus)}
    given = {k: v for k, v in data.items() if k in fields}
    if "notices" in given:
        given["notices"] = tuple(str(n) for n in given["notices"] or ())
    return RemoteStatus(**given)


def metrics_json(metrics: Mapping[str, MetricBytes]) -> dict[str, dict[str, list[Any]]]:
    """New bytes of metric files, by job and path, as JSON: ``[offset, base64]``."""
    return {
        job_id: {path: [offset, base64.b64encode(data).decode("ascii")] for path, (offset, data) in files.items()}
        for job_id, files in metrics.items()
    }


def metrics_from_json(data: Mapping[str, Mapping[str, Sequence[Any]]]) -> dict[str, MetricBytes]:
    return {
        job_id: {path: (int(offset), base64.b64decode(text)) for path, (offset, text) in files.items()}
        for job_id, files in data.items()
    }
