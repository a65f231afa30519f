"""How the job store and the local machine feel with many jobs. Prints figures; not a test.

    .venv/bin/python benchmarks/bench_store.py [--jobs 10000]

Measures, on a throw-away workspace:
- list latency (the panel's `GET /jobs`) with N jobs in the state file, cold (another process wrote
  last) and warm (cached by the file's stat);
- submit latency with N jobs present (screen, hash, lock, read, attach-or-queue, write);
- local submit → process started (send + launch), against a bare `subprocess.Popen` of the same command,
  the floor any launcher pays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jupyter_remote_compute.jobs.job import Job, new_job_id
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.store import JobStore
from jupyter_remote_compute.workspace import Workspace


def _median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.2f} ms (p90 {sorted(samples)[int(len(samples) * 0.9)] * 1000:.2f})"


def _fill(store: JobStore, n: int) -> None:
    with store.transaction() as jobs:
        for i in range(n):
            job_id = new_job_id() + f"{i:05d}"
            jobs[job_id] = Job(
                id=job_id,
                key=f"{i:032x}",
                machine="local",
                kind="local",
                state="succeeded",
                spec={"machine": "local", "command": f"python train.py --seed {i}", "send": ["train.py"],
                      "bring_back": ["model.pkl"], "env": {}, "timeout": None, "name": f"run {i}", "key": None},
                outputs={"model.pkl": {"sha256": "0" * 64, "size": 1234}},
                mlflow_run_id=f"{i:032x}",
            )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        (root / ".punica").mkdir(parents=True)
        (root / "train.py").write_text("print('hi')\n")
        os.environ["JUPYTER_REMOTE_COMPUTE_SCRATCH"] = str(Path(tmp) / "scratch")
        service = JobService(Workspace(root), ServiceSettings(scratch_dir=Path(tmp) / "scratch"))

        t0 = time.perf_counter()
        _fill(service.store, args.jobs)
        size = service.workspace.state_file.stat().st_size
        print(f"state file with {args.jobs} jobs: {size / 1e6:.1f} MB, written in {time.perf_counter() - t0:.2f} s")

        cold, warm = [], []
        for _ in range(args.repeat):
            fresh = JobService(Workspace(root), service.settings)  # as another process would
            t = time.perf_counter()
            fresh.list_jobs()
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            fresh.list_jobs()
            warm.append(time.perf_counter() - t)
        print(f"list, cold read        {_median_ms(cold)}")
        print(f"list, warm (cached)    {_median_ms(warm)}")

        submits = []
        for i in range(args.repeat):
            spec = JobSpec.from_json({"command": f"echo {i}", "send": ["train.py"]})
            t = time.perf_counter()
            service.submit(spec)
            submits.append(time.perf_counter() - t)
        print(f"submit with {args.jobs} jobs {_median_ms(submits)}")

        started, bare = [], []
        for i in range(min(args.repeat, 10)):
            spec = JobSpec.from_json({"command": f"sleep 0.{i}1", "send": ["train.py"]})
            t = time.perf_counter()
            job = service.submit(spec).job
            service.advance(job.id)
            started.append(time.perf_counter() - t)
            t = time.perf_counter()
            proc = subprocess.Popen(["sh", "-c", f"sleep 0.{i}1"], start_new_session=True)
            bare.append(time.perf_counter() - t)
            proc.wait()
        print(f"local submit → started {_median_ms(started)}")
        print(f"bare Popen (floor)     {_median_ms(bare)}")
        ratio = statistics.median(started) / statistics.median(bare)
        print(f"ratio submit→started / bare Popen: {ratio:.1f}x")
        service.close()


if __name__ == "__main__":
    sys.exit(main())
