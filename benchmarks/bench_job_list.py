"""How the job list feels with 10,000 and 100,000 jobs (issue 19). Prints figures beside their goals; not a test.

    .venv/bin/python benchmarks/bench_job_list.py [--sizes 10000 100000] [--requests 200]

On a throw-away workspace, with a real Jupyter Server on loopback running the extension:
- GET /remote-compute/jobs (first page, 100 summaries) p50/p99 over a kept-alive connection, after
  the server has read the file once; the first answer after another process rewrote the file
  (read, parse, index) separately; the same page revalidated by ETag (a 304);
- GET with a filter matching few jobs (state=running) p50/p99;
- submit latency with the largest size in the state file (JobService.submit in this process, the
  work POST /jobs does: screen, hash, lock, read, append a journal line), and POST /jobs itself;
- with --transfer-mib N (1024 for the issue's figures): the first page p99 again while a job sends
  N MiB to the test bed's loopback sshd (tests/sshd_fixture.py), and how long a job event takes to
  reach a websocket client of /api/events/subscribe, for a job submitted through the server and for
  one written by another process (found by the server's journal watch).
Bounded: a few minutes at most on a quiet machine (a transfer adds its own time).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import itertools
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_store import _fill

from jupyter_remote_compute.jobs.listing import JobQuery, list_page
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.store import JobStore
from jupyter_remote_compute.jobs.transitions import TERMINAL_STATES
from jupyter_remote_compute.workspace import Workspace

GOALS_MS = {10_000: 20.0, 100_000: 50.0}  # GET first page p99
SUBMIT_GOAL_MS = 100.0
EVENT_GOAL_MS = 500.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A Jupyter Server with the extension, on loopback, serving the workspace."""

    def __init__(self, root: Path, scratch: Path, log: Path | None = None) -> None:
        self.port = _free_port()
        # The server's own log, when asked for: an exception in its watch or poll loop shows only there.
        self._log = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed in stop
        self.token = secrets.token_hex(16)
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", f"--ServerApp.token={self.token}",
                f"--ServerApp.root_dir={root}", "--ServerApp.jpserver_extensions=jupyter_remote_compute=True",
                f"--RemoteComputeApp.workspace={root}", f"--RemoteComputeApp.scratch_dir={scratch}",
            ],
            stdout=self._log,
            stderr=self._log,
        )  # fmt: skip
        # Generous: the first request after start waits while the server reads a large state file.
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        deadline = time.monotonic() + 180
        while True:
            try:
                if self.get("/api/status")[0] == 200:
                    return
            except OSError:
                self.conn.close()
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise SystemExit("the server did not start within 180 s")
            time.sleep(0.2)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        self.conn.request("GET", path, headers={"Authorization": f"token {self.token}", **(headers or {})})
        response = self.conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())

    def stop(self) -> None:
        self.conn.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self._log is not subprocess.DEVNULL:
            self._log.close()


def _timed(fn, n: int, *, product_in_process: bool = False) -> list[float]:  # type: ignore[no-untyped-def]
    """``n`` timings of ``fn`` in ms. This process holds a big store too: unless what is timed is the
    product's own code in this process, its cyclic collector is off meanwhile (as ``timeit`` does), so
    a full collection here (over a second at 100,000 jobs) is not charged to the server."""
    paused = not product_in_process and gc.isenabled()
    if paused:
        gc.disable()
    try:
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1000)
        return samples
    finally:
        if paused:
            gc.enable()


def _p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _line(what: str, samples: list[float], goal: float | None = None) -> None:
    figures = f"p50 {statistics.median(samples):7.2f} ms  p99 {_p(samples, 0.99):7.2f} ms"
    verdict = (
        "" if goal is None else f"   goal p99 <= {goal:.0f} ms: {'met' if _p(samples, 0.99) <= goal else 'NOT met'}"
    )
    print(f"  {what:<34}{figures}{verdict}")


def _measure_lists(server: Server, size: int, n: int) -> None:
    first_page = "/remote-compute/jobs?limit=100"
    t = time.perf_counter()
    status, body, headers = server.get(first_page)
    assert status == 200, body[:200]
    cold = (time.perf_counter() - t) * 1000
    print(f"  first GET after the server started {cold:7.1f} ms (it reads, parses and indexes the file first)")
    print(f"  page size                         {len(body) / 1000:8.1f} kB (the whole list was the file)")
    _line("GET /api/status (server floor)", _timed(lambda: server.get("/api/status"), n))
    _line("GET /jobs first page", _timed(lambda: server.get(first_page), n), GOALS_MS.get(size))
    etag = {k.lower(): v for k, v in headers.items()}["etag"]
    assert server.get(first_page, {"If-None-Match": etag})[0] == 304
    _line("GET /jobs first page, 304", _timed(lambda: server.get(first_page, {"If-None-Match": etag}), n))
    running = "/remote-compute/jobs?limit=100&state=running"
    _line("GET /jobs?state=running", _timed(lambda: server.get(running), n))
    second = f"{first_page}&cursor={json.loads(body)['next_cursor']}"
    _line("GET /jobs second page", _timed(lambda: server.get(second), n))


def _measure_under_transfer(server: Server, service: JobService, size: int, mib: int, n: int) -> None:
    """First page p99 while a job sends ``mib`` MiB over ssh; job events' delay to a websocket client."""
    from bench_load import EventListener, post, wait_until  # imports this module: loaded late

    big = service.workspace.root / f"big-{size}.bin"
    with open(big, "wb") as f:  # fresh random bytes: the far side's cache must not recognise them
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    events = EventListener(server)
    try:
        sent = post(server, "/remote-compute/jobs", {"machine": "box", "command": "true", "send": [big.name]})
        big_id = sent["job"]["id"]
        wait_until(
            lambda: json.loads(server.get(f"/remote-compute/jobs/{big_id}")[1])["state"] == "sending",
            300,
            "the big job to start sending",
        )
        # The server's floor in turn with the page, under the same load: on loopback the far side's sshd
        # and tar share this machine's cores, which a real far side does not.
        floor, samples = [], []
        for _ in range(n):
            floor += _timed(lambda: server.get("/api/status"), 1)
            samples += _timed(lambda: server.get("/remote-compute/jobs?limit=100"), 1)
        still = json.loads(server.get(f"/remote-compute/jobs/{big_id}")[1])["state"]
        _line(f"GET /api/status, {mib} MiB ssh", floor)
        _line(f"GET /jobs first page, {mib} MiB ssh", samples, GOALS_MS.get(size))
        print(f"  (the big job was {still!r} when the requests ended)")

        def delay_of(job_id: str) -> float:
            def arrived() -> float | None:
                if events.ended is not None:
                    raise SystemExit(f"the event socket closed: {events.ended}")
                # The listener appends to delays, then to seen: read no further than both reach.
                for i in range(min(len(events.delays), len(events.seen))):
                    if events.seen[i].get("id") == job_id:
                        return events.delays[i] * 1000
                return None

            return wait_until(arrived, 120, f"the event of job {job_id}")

        def submit_probe(i: int) -> str:
            # "new": a probe of the same command from an earlier size may still be unfinished (its
            # collection queued behind others): the POST would attach to it and no event would come.
            answer = post(server, "/remote-compute/jobs", {"command": f"echo probe {size} {i}", "new": True})
            assert not answer["attached"], answer
            return answer["job"]["id"]

        spec = JobSpec.from_json({"command": "true", "name": "event probe"})
        probe_ids = [submit_probe(i) for i in range(5)]  # one at a time: each POST waits for its answer
        through_server = [delay_of(job_id) for job_id in probe_ids]
        written = [service.submit(spec, new=True).job.id for _ in range(5)]
        elsewhere = [delay_of(job_id) for job_id in written]
        probe_ids += written
        cases = (("submitted through the server", through_server), ("written by another process", elsewhere))
        for what, delays in cases:
            verdict = "met" if max(delays) <= EVENT_GOAL_MS else "NOT met"
            print(
                f"  event of a job {what:<29} median {statistics.median(delays):6.1f} ms  max {max(delays):6.1f} ms"
                f"   goal <= {EVENT_GOAL_MS:.0f} ms: {verdict}   ({', '.join(f'{d:.0f}' for d in delays)})"
            )
        t = time.perf_counter()
        probes = [big_id, *probe_ids]
        wait_until(
            lambda: all(
                json.loads(server.get(f"/remote-compute/jobs/{job_id}")[1])["state"] in TERMINAL_STATES
                for job_id in probes
            ),
            900,
            "the big job and the probes to end",
        )
        # Not left to the next size's server: their collections and MLflow runs would load its measurements.
        print(f"  (the big job and the probes ended {time.perf_counter() - t:.0f} s after the probes)")
    finally:
        events.close()
        big.unlink()


def _measure_post_submit(server: Server, n: int) -> None:
    from bench_load import post  # imports this module: loaded late

    probes = itertools.count()

    def submit() -> None:
        # A new command each time: the same work again would attach to the job already running it.
        answer = post(server, "/remote-compute/jobs", {"command": f"echo submit probe {next(probes)}"})
        assert not answer.get("attached"), answer

    # The server's first submit: the secret detectors and the keyring are loaded at start, not here.
    print(f"  {'first POST /jobs after start':<34}{_timed(submit, 1)[0]:7.2f} ms")
    samples = _timed(submit, n)
    _line("POST /jobs (server running)", samples, SUBMIT_GOAL_MS)
    # Which ones were slow says why: the first few after start, or ones landing on other jobs' work.
    slowest = sorted(range(n), key=samples.__getitem__, reverse=True)[:3]
    print("    slowest: " + ", ".join(f"#{i + 1} {samples[i]:.0f} ms" for i in slowest))


def _measure_in_process(path: Path) -> None:
    """The list logic alone, without HTTP and the server, on a store of its own."""
    reader = JobStore(path)
    list_page(reader, JobQuery.parse())
    samples = _timed(lambda: list_page(reader, JobQuery.parse()), 1000, product_in_process=True)
    _line("list_page in-process (no HTTP)", samples)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--submits", type=int, default=5)
    parser.add_argument("--transfer-mib", type=int, default=0, help="also measure during an ssh transfer this big")
    parser.add_argument("--server-log", type=Path, help="append the servers' output to this file")
    args = parser.parse_args()

    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (figures scale with it)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        (root / ".punica").mkdir(parents=True)
        (root / "train.py").write_text("print('hi')\n")
        scratch = Path(tmp) / "scratch"
        os.environ["JUPYTER_REMOTE_COMPUTE_SCRATCH"] = str(scratch)
        service = JobService(Workspace(root), ServiceSettings(scratch_dir=scratch))
        bed = None
        if args.transfer_mib:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from sshd_fixture import build_testbed

            bed = build_testbed()
            os.environ["SSH_AUTH_SOCK"] = str(bed.agent.sock)  # the server signs in through the agent
            service.admin.add("box", "ssh", "127.0.0.1", bed.options())
        try:
            filled = 0
            for size in sorted(args.sizes):
                t = time.perf_counter()
                _fill(service.store, size - filled)  # prepared before the server starts, as a workspace is
                filled = size
                mb = service.workspace.state_file.stat().st_size / 1e6
                print(f"{size} jobs: state file {mb:.1f} MB, written in {time.perf_counter() - t:.1f} s")
                t = time.perf_counter()
                server = Server(root, scratch, args.server_log)
                try:
                    print(f"  server started in {time.perf_counter() - t:8.1f} s")
                    _measure_lists(server, size, args.requests)
                    _measure_in_process(service.store.path)
                    if args.transfer_mib:
                        _measure_under_transfer(server, service, size, args.transfer_mib, args.requests)
                    if size == max(args.sizes):
                        _measure_post_submit(server, args.submits)
                finally:
                    server.stop()
        finally:
            if bed is not None:
                bed.stop()

        print(f"submit with {filled} jobs in the state file (no server running)")
        spec = JobSpec.from_json({"command": "echo hi", "send": ["train.py"]})
        service.submit(spec, new=True)  # the first commit of a process serialises every job once
        samples = _timed(lambda: service.submit(spec, new=True), args.submits, product_in_process=True)
        _line("JobService.submit", samples, SUBMIT_GOAL_MS)
        service.close()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
