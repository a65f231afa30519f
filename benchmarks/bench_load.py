"""The server under load: 10,000 jobs in the state file and a 1 GiB transfer under way (issue 16).

Not a test: it prints figures beside their goals. On a throw-away workspace it starts the test
bed's sshd and ssh-agent (tests/sshd_fixture.py) and a Jupyter Server with the extension, all on
loopback, then, while a job sends 1 GiB to the SSH machine:

- GET /remote-compute/jobs (first page) p50/p99;            goal p99 <= 50 ms
- how long a job event takes to reach a websocket client     goal <= 0.5 s
  (from the change's own timestamp to its arrival on /api/events/subscribe);
- the server's resident memory growth over the run;          goal <= 64 MiB

    PYTHONPATH=. .venv/bin/python benchmarks/bench_load.py [--jobs 10000] [--size-mib 1024] [--requests 300]

Bounded: every wait has a deadline; the whole run takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import websocket  # noqa: E402
from bench_job_list import Server, _line, _timed  # noqa: E402
from bench_store import _fill  # noqa: E402
from sshd_fixture import build_testbed  # noqa: E402

from jupyter_remote_compute.jobs.job import parse_time  # noqa: E402
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings  # noqa: E402
from jupyter_remote_compute.workspace import Workspace  # noqa: E402

LIST_GOAL_MS = 50.0
EVENT_GOAL_S = 0.5
RSS_GOAL_MIB = 64.0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RSSSampler:
    """The peak resident set of a process, sampled every 50 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self.peak = rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mib(self.pid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_until(condition, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"gave up waiting for {what} after {timeout:.0f} s")


class EventListener:
    """A websocket client of the server's event bus: arrival delay of every job event, in seconds."""

    def __init__(self, server: Server) -> None:
        url = f"ws://127.0.0.1:{server.port}/api/events/subscribe"
        self.ws = websocket.create_connection(url, header=[f"Authorization: token {server.token}"], timeout=120)
        self.delays: list[float] = []
        self.seen: list[dict] = []
        #: Why the socket stopped being read (None while it is): a wait for an event checks it.
        self.ended: str | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                message = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue  # a quiet spell (a long transfer) is not the end of the socket
            except Exception as e:
                self.ended = repr(e)
                return
            data = message.get("data") or message
            if "updated" in data and "state" in data:
                self.delays.append(time.time() - parse_time(data["updated"]))
                self.seen.append(data)

    def close(self) -> None:
        self.ws.close()


def post(server: Server, path: str, body: dict) -> dict:
    server.conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    response = server.conn.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"POST {path}: {response.status} {data[:300]!r}")
    return json.loads(data)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--events", type=int, default=10)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (figures scale with it)")

    bed = build_testbed()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "ws"
            (root / ".punica").mkdir(parents=True)
            scratch = Path(tmp) / "scratch"
            os.environ["JUPYTER_REMOTE_COMPUTE_SCRATCH"] = str(scratch)
            os.environ["SSH_AUTH_SOCK"] = str(bed.agent.sock)  # the server signs in through the agent
            with open(root / "big.bin", "wb") as f:
                block = os.urandom(1 << 20)
                for _ in range(args.size_mib):
                    f.write(block)
            service = JobService(Workspace(root), ServiceSettings(scratch_dir=scratch))
            service.admin.add("box", "ssh", "127.0.0.1", bed.options())
            _fill(service.store, args.jobs)
            service.close()
            print(f"{args.jobs} jobs in the state file ({(root / '.punica/jobs.json').stat().st_size / 1e6:.1f} MB)")

            server = Server(root, scratch)
            try:
                events = EventListener(server)
                rss = RSSSampler(server.proc.pid)
                big = post(server, "/remote-compute/jobs", {"machine": "box", "command": "true", "send": ["big.bin"]})
                big_id = big["job"]["id"]
                wait_until(
                    lambda: json.loads(server.get(f"/remote-compute/jobs/{big_id}")[1])["state"] == "sending",
                    120,
                    "the 1 GiB job to start sending",
                )
                print(f"while job {big_id} sends {args.size_mib} MiB to an SSH machine:")
                samples = _timed(lambda: server.get("/remote-compute/jobs?limit=100"), args.requests)
                still = json.loads(server.get(f"/remote-compute/jobs/{big_id}")[1])["state"]
                _line("GET /jobs first page", samples, LIST_GOAL_MS)
                print(f"  (the big job was {still!r} when the requests ended)")

                # Small jobs on this machine: each goes queued -> ... -> succeeded, an event per change.
                before = len(events.delays)
                for i in range(args.events):
                    post(server, "/remote-compute/jobs", {"command": f"echo {i}", "name": f"event probe {i}"})
                wait_until(
                    lambda: sum(1 for e in events.seen if e.get("state") == "succeeded") >= args.events,
                    300,
                    "the probe jobs' events",
                )
                delays = events.delays[before:]
                p95 = sorted(delays)[int(len(delays) * 0.95) - 1]
                verdict = "met" if p95 <= EVENT_GOAL_S else "NOT met"
                print(
                    f"  job event -> websocket client       median {statistics.median(delays) * 1000:7.1f} ms  "
                    f"p95 {p95 * 1000:7.1f} ms  max {max(delays) * 1000:7.1f} ms over {len(delays)} events   "
                    f"goal <= {EVENT_GOAL_S * 1000:.0f} ms: {verdict}"
                )
                wait_until(
                    lambda: (
                        json.loads(server.get(f"/remote-compute/jobs/{big_id}")[1])["state"]
                        in ("succeeded", "failed", "lost")
                    ),
                    600,
                    "the big job to end",
                )
                rss.stop()
                growth = rss.peak - rss.start
                verdict = "met" if growth <= RSS_GOAL_MIB else "NOT met"
                print(
                    f"  server RSS                          start {rss.start:6.1f} MiB  peak {rss.peak:6.1f} MiB  "
                    f"growth {growth:6.1f} MiB   goal <= {RSS_GOAL_MIB:.0f} MiB: {verdict}"
                )
                events.close()
            finally:
                server.stop()
    finally:
        bed.stop()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
