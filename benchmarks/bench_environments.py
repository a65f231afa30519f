"""A job whose Python environment is cached, against the same job without one, on ssh.

Not a test: it prints figures and the difference against its goal, measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_environments.py [--runs N]

The machine is the tests' loopback sshd (its test user has no uv: the product's is sent once, before
the runs); packages come from a PEP 503 index on 127.0.0.1 holding one small wheel, as in
tests/test_environments.py. Each run is a new job (``new=True``) submitted and followed by one
``JobService`` to its end, MLflow recording included. Goal: the cached environment adds ≤ 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from jupyter_remote_compute.jobs.service import JobService, ServiceSettings  # noqa: E402 - after the path
from jupyter_remote_compute.jobs.spec import JobSpec  # noqa: E402
from jupyter_remote_compute.tracking import TrackingSettings  # noqa: E402
from jupyter_remote_compute.workspace import Workspace  # noqa: E402

GOAL_S = 0.3


def _index(root: Path):  # type: ignore[no-untyped-def]
    from test_environments import Index, _wheel

    files = root / "files"
    files.mkdir(parents=True)
    _wheel(files, "rcdemo-a", "1.0", "VALUE = 'a1'\n")
    (root / "simple" / "rcdemo-a").mkdir(parents=True)
    name = "rcdemo_a-1.0-py3-none-any.whl"
    (root / "simple" / "rcdemo-a" / "index.html").write_text(f'<a href="../../files/{name}">{name}</a>\n')
    return Index(root)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    from sshd_fixture import build_testbed

    tmp = Path(tempfile.mkdtemp(prefix="bench-env-"))
    index = _index(tmp / "index")
    bed = build_testbed()
    os.environ["SSH_AUTH_SOCK"] = str(bed.agent.sock)
    workspace = tmp / "ws"
    (workspace / ".punica").mkdir(parents=True)
    (workspace / "fit.py").write_text("print('hello')\n")
    settings = ServiceSettings(
        poll_interval=0.05,
        scratch_dir=tmp / "scratch",
        tracking=TrackingSettings(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", experiment="bench"),
    )
    service = JobService(Workspace(workspace), settings)
    try:
        service.machines.add("far", "ssh", "127.0.0.1", bed.options(index_url=index.url))
        base = {"machine": "far", "command": ["python3", "fit.py"], "send": ["fit.py"]}
        cases = {
            "no environment": JobSpec.from_json(base),
            "cached environment": JobSpec.from_json({**base, "environment": {"packages": ["rcdemo-a"]}}),
        }
        for spec in cases.values():  # warm: the environment built, uv sent, MLflow's store made
            job = service.wait(service.submit(spec, new=True).job.id, timeout=300)
            assert job.state == "succeeded", job.reason
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, spec in cases.items():  # interleaved, so a change of load hits both alike
                start = time.perf_counter()
                job = service.wait(service.submit(spec, new=True).job.id, timeout=300)
                times[name].append(time.perf_counter() - start)
                assert job.state == "succeeded", job.reason
        print(f"ssh job, {args.runs} runs each, median (load average {os.getloadavg()[0]:.1f})")
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name, median in medians.items():
            print(f"  {name:20s} {median:6.2f} s   (min {min(times[name]):.2f} s)")
        extra = medians["cached environment"] - medians["no environment"]
        print(f"  the cached environment adds {extra:+.2f} s; goal ≤ {GOAL_S} s ({extra / GOAL_S:.2f}x the goal)")
    finally:
        service.close()
        index.stop()
        bed.stop()


if __name__ == "__main__":
    main()
