"""The server's transfer threads: a job that ended is collected even while every send thread is busy."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from jupyter_remote_compute.handlers import TransferPool


class _Jobs:
    """Stands in for the JobService: a send blocks until released; each advance is noted."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.collected = threading.Event()
        self.sending = threading.Event()

    def advance(self, job_id: str) -> None:
        if job_id.startswith("send"):
            self.sending.set()
            self.release.wait(60)
        else:
            self.collected.set()


def test_a_collection_does_not_wait_behind_sends() -> None:
    jobs = _Jobs()
    pool = TransferPool(jobs, workers=1)  # type: ignore[arg-type]
    try:
        pool.advance(SimpleNamespace(id="send-1", state="sending"))  # type: ignore[arg-type]
        assert jobs.sending.wait(30)
        pool.advance(SimpleNamespace(id="send-2", state="queued"))  # type: ignore[arg-type]
        pool.advance(SimpleNamespace(id="ended", state="collecting"))  # type: ignore[arg-type]
        assert jobs.collected.wait(30), "the collection waited for the sends"
    finally:
        jobs.release.set()
        pool.shutdown()
