"""Pipeline runs on the server's event bus: one event each time a run or one of its nodes changes."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from .runner import PipelineRunner
from .runs import PipelineRun

RUN_EVENT_SCHEMA = Path(__file__).parent / "run_event.yaml"
RUN_EVENT_ID = "https://events.jupyter.org/jupyter_remote_compute/pipeline_run"


def run_event(run: PipelineRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "file": run.file,
        "state": run.state,
        "reason": run.reason,
        "updated": run.updated,
        "user": run.user,
        "nodes": {k: {"state": n.state, "job_id": n.job_id, "reason": n.reason} for k, n in run.nodes.items()},
        "sweep": run.sweep,
    }


def publish_runs(runner: PipelineRunner, event_logger: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Register the schema and emit every change of ``runner``'s runs, on the loop's thread."""
    event_logger.register_event_schema(RUN_EVENT_SCHEMA)

    def emit(data: dict[str, Any]) -> None:
        event_logger.emit(schema_id=RUN_EVENT_ID, data=data)

    def heard(run: PipelineRun) -> None:
        # The runner's threads change runs; the event bus belongs to the loop.
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
            loop.call_soon_threadsafe(emit, run_event(run))

    runner.add_listener(heard)
