"""The server's watch of the state file: what other processes write reaches an event subscriber.

A real server, its real event socket (``/api/events/subscribe``), and writers in processes of
their own, as the CLI, a kernel or a pipeline runner are.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.listing import index_of

# Another process adds one finished job (the poller never drives it, so only the watch can tell),
from jupyter_remote_compute.jobs.store import JobStore

# Another process adds one finished job (the poller never drives it, so only the watch can tell),
# optionally compacting right after its commit, as a writer whose journal outgrew the file does.
_WRITER = """
import sys
from pathlib import Path
from jupyter_remote_compute.jobs import store as store_module
from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.store import JobStore
path, job_id, compact = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "compact"
if compact:
    store_module.COMPACT_MIN_BYTES = 0
    store_module.COMPACT_SHARE = 0.0
with JobStore(path).transaction() as jobs:
    jobs[job_id] = Job(id=job_id, key=job_id, machine="local", kind="local", state="succeeded",
                       spec={"machine": "local", "command": "echo elsewhere", "name": "written elsewhere"})
"""


def _write_elsewhere(state_file: Path, job_id: str, *, compact: bool = False) -> float:
    """Add a finished job from another process; when its commit ended (epoch seconds)."""
    subprocess.run(
        [sys.executable, "-c", _WRITER, str(state_file), job_id, "compact" if compact else "append"],
        check=True,
        timeout=120,
    )
    return time.time()


def _seed(state_file: Path, count: int) -> None:
    with JobStore(state_file).transaction() as jobs:
        for i in range(count):
            job_id = f"20250101-000000-{i:06d}"
            jobs[job_id] = Job(
                id=job_id,
                key=job_id,
                machine="local",
                kind="local",
                state="succeeded",
                spec={"machine": "local", "command": f"python train.py --seed {i}"},
            )


async def _until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        await asyncio.sleep(0.02)


async def _event_of(ws, job_id: str, timeout: float) -> tuple[dict, float]:  # type: ignore[no-untyped-def]
    """The first event about ``job_id`` on the socket, and when it arrived (epoch seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no event of job {job_id} within {timeout:.0f} s"
        try:
            message = await asyncio.wait_for(ws.read_message(), left)
        except asyncio.TimeoutError:
            continue
        assert message is not None, "the event socket closed"
        data = json.loads(message)
        if data.get("id") == job_id:
            return data, time.time()


def _store_of(jp_serverapp) -> JobStore:  # type: ignore[no-untyped-def]
    return jp_serverapp.web_app.settings["remote_compute"].service.store


@pytest.fixture
def state_file(server_workspace: Path) -> Path:
    return server_workspace / ".punica" / "jobs.json"


@pytest.fixture
def seeded(state_file: Path) -> Path:
    """A thousand finished jobs, there before the server starts."""
    _seed(state_file, 1000)
    return state_file


async def test_jobs_other_processes_write_reach_the_event_socket_through_compactions(
    seeded: Path, jp_serverapp, jp_ws_fetch
):
    state_file = seeded
    store = _store_of(jp_serverapp)
    # The server reads the file and builds the list's index at start, before any request asks for it.
    await _until(lambda: index_of(store).generation >= 0, 60, "the server's first read of the state file")
    assert index_of(store).generation == store.snapshot().generation
    ws = await jp_ws_fetch("api", "events", "subscribe")
    try:
        for n, compact in enumerate((False, True, False, True)):
            # After a compaction the file is new and names a new journal: the next line goes there.
            job_id = f"20260101-000000-elsewhere{n}"
            _write_elsewhere(state_file, job_id, compact=compact)
            # Only the watch announces a job another process wrote already ended (the poll drives
            # unfinished ones): an event at all is the proof. How fast is bench_job_list.py's to say.
            event, _ = await _event_of(ws, job_id, 30)
            assert (event["state"], event["name"]) == ("succeeded", "written elsewhere")
    finally:
        ws.close()


@pytest.fixture
def newer_state_file(state_file: Path) -> Path:
    """A state file a newer version wrote, there before the server starts (so its compaction at start fails)."""
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps({"schema": 99, "jobs": {}}))
    return state_file


async def test_the_watch_outlives_a_state_file_it_could_not_read_at_start(
    newer_state_file: Path, jp_serverapp, jp_ws_fetch
):
    store = _store_of(jp_serverapp)
    ws = await jp_ws_fetch("api", "events", "subscribe")
    try:
        # The user takes the newer version's file away; the server reads what comes next.
        newer_state_file.unlink()
        await _until(lambda: index_of(store).generation >= 0, 30, "the watch to read the state file again")
        _write_elsewhere(newer_state_file, "20260101-000000-after")
        event, _ = await _event_of(ws, "20260101-000000-after", 30)
        assert event["state"] == "succeeded"
    finally:
        ws.close()
