"""Agent machines: how fast a queued job starts on the agent, and how fast files move agent ↔ server.

Not a test: it prints figures. It starts a real server and a real agent (as in tests/agent_fixture.py:
the agent.pyz the server serves, run by Debian's python3 as the ssh test user when we are root).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_agent.py [--jobs 50] [--mib 256]

- pickup: submit (a job with no inputs, queued as the CLI does) → the agent reports the command started, over
  ``--jobs`` jobs one after another (the agent waiting in its claim each time); against a loop that
  asks every 10 s, whose pickup is the wait for its next ask (uniform over the interval) plus the
  same work;
- transfer: one ``--mib`` MiB file, downloaded as an input by digest and uploaded as an output
  stream by the agent's own HTTP client, against ``curl`` fetching the same file from Jupyter's
  ``/files/`` and uploading it to the same outputs route.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from agent_fixture import running_bed  # noqa: E402
from waiting import wait_for  # noqa: E402

from jupyter_remote_compute.agent.server import Server as AgentClient  # noqa: E402

POLL_LOOP = 10.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def agent_state(workspace: Path, machine: str, job_id: str) -> dict:
    path = workspace / ".punica" / "agents" / machine / "jobs" / job_id / "state.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def pickup(bed, workspace: Path, jobs: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Jobs queued by a process of their own (as the CLI does), so the server only hands them out.

    The server's transfer threads also record each finished job's MLflow run; queueing here keeps
    that work (slow on a busy machine) out of what is measured, while the server still does it.
    """
    from jupyter_remote_compute.jobs.service import JobService
    from jupyter_remote_compute.jobs.spec import JobSpec
    from jupyter_remote_compute.workspace import Workspace

    bed.add_machine("bench")
    bed.start_agent("bench")
    service = JobService(Workspace(workspace))
    delays = []
    try:
        for _ in range(jobs):
            t0 = time.time()
            job_id = service.submit(JobSpec.from_json({"machine": "bench", "command": "true"}), new=True).job.id
            service.advance(job_id)

            def started(job_id: str = job_id) -> dict:
                state = agent_state(workspace, "bench", job_id)
                return state if state.get("started_at") else {}

            state = wait_for(started, timeout=120, interval=0.01, message="the agent to start the job")
            delays.append(state["started_at"] - t0)
            # The agent is back in its claim once it has handed the job over.
            wait_for(lambda j=job_id: agent_state(workspace, "bench", j).get("state") == "ended", timeout=120)
            wait_for(lambda: not any((bed.shared / "state-bench" / "jobs").glob("*/agent.json")), timeout=120)
    finally:
        service.close()
    return delays


def curl(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["curl", "-fsS", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def transfer(bed, workspace: Path, mib: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    big = workspace / "big.bin"
    with open(big, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    from jupyter_remote_compute.jobs.service import JobService
    from jupyter_remote_compute.jobs.spec import JobSpec
    from jupyter_remote_compute.workspace import Workspace

    token = bed.add_machine("transfer")
    client = AgentClient(bed.url, "transfer", token)
    service = JobService(Workspace(workspace))
    spec = JobSpec.from_json({"machine": "transfer", "command": "true", "send": ["big.bin"]})
    job = {"id": service.submit(spec, new=True).job.id}
    service.advance(job["id"])
    service.close()
    _, answer = client.request("POST", "claim", {"hold": 20}, timeout=60)
    claimed = answer["job"]
    digest = claimed["inputs"][0]["sha256"]
    scratch = Path(tempfile.mkdtemp(prefix="jrc-bench-"))
    try:
        with open(scratch / "down.bin", "wb") as f:
            t0 = time.perf_counter()
            client.request(
                "GET", f"jobs/{job['id']}/inputs/{digest}", query={"attempt": claimed["attempt"]}, sink=f.write
            )
            down = time.perf_counter() - t0
        query = f"attempt={claimed['attempt']}&manifest=.fetch-bench"
        with open(big, "rb") as f:
            t0 = time.perf_counter()
            client.request(
                "PUT", f"jobs/{job['id']}/outputs", query={"attempt": claimed["attempt"], "manifest": ".fetch-bench"},
                raw=f, length=big.stat().st_size, timeout=600,
            )  # fmt: skip
            up = time.perf_counter() - t0
        header = scratch / "header"
        header.write_text(f"Authorization: Bearer {token}\n")
        curl_down = curl("-H", f"Authorization: token {bed.server.token}", f"{bed.url}/files/big.bin", "-o",
                         str(scratch / "curl.bin"))  # fmt: skip
        curl_up = curl("-H", f"@{header}", "-T", str(big),
                       f"{bed.url}/remote-compute/agent/transfer/jobs/{job['id']}/outputs?{query}")  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        big.unlink()
    return {"agent download": down, "curl download": curl_down, "agent upload": up, "curl upload": curl_up}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    from conftest import QUICKSTART

    base = Path(tempfile.mkdtemp(prefix="jrc-bench-agent-"))
    os.chmod(base, 0o755)
    workspace = base / "quickstart"
    shutil.copytree(QUICKSTART, workspace, ignore=shutil.ignore_patterns("mlflow.db", "model.pkl", "metrics.json"))
    (base / "scratch").mkdir()
    try:
        with running_bed(workspace, base / "scratch", f"sqlite:///{base / 'mlflow.db'}", base / "server.log") as bed:
            if args.jobs:
                delays = pickup(bed, workspace, args.jobs)
                median, p95 = statistics.median(delays), percentile(delays, 0.95)
                print(f"pickup over {len(delays)} jobs (submit -> started on the agent):")
                print(f"  agent long poll: median {median:.3f} s, p95 {p95:.3f} s")
                print(
                    f"  a {POLL_LOOP:.0f} s poll loop doing the same work: median {POLL_LOOP / 2 + median:.2f} s, "
                    f"p95 {POLL_LOOP * 0.95 + median:.2f} s (its wait is uniform over the interval)"
                )
            times = transfer(bed, workspace, args.mib)
            print(f"transfer of {args.mib} MiB through the same server (loopback):")
            for name, seconds in times.items():
                print(f"  {name:15s} {seconds:6.2f} s  {args.mib / seconds:7.1f} MiB/s")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
