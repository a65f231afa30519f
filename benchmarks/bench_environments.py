"""A job whose Python environment is cached, against the same job without one, on ssh; and a first
build of 20 packages against `uv pip install -r` run by hand over ssh on the same machine.

Not a test: it prints figures and the difference against its goal, measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_environments.py [--runs N]

The machine is the tests' loopback sshd (its test user has no uv: the product's is sent once, before
the runs); packages come from a PEP 503 index on 127.0.0.1 holding one small wheel, as in
tests/test_environments.py. Each run is a new job (``new=True``) submitted and followed by one
``JobService`` to its end, MLflow recording included. Goal: the cached environment adds ≤ 0.3 s.

First build: each run a requirements set of its own (a fresh comment line, so a new digest) naming 20
tiny wheels of the index, installed with no uv cache (the job's env UV_NO_CACHE=1, ``--no-cache`` by
hand). What the build adds to a job (the job with it less the same job without an environment) is set
against one ssh call running the same uv (the one the product sent) as ``uv venv`` + ``uv pip install
-r``. Goal: ≤ 1.1x.
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
GOAL_BUILD_RATIO = 1.1
BUILD_PACKAGES = [f"rcbench-{i:02d}" for i in range(1, 21)]


def _index(root: Path):  # type: ignore[no-untyped-def]
    from test_environments import Index, _wheel

    files = root / "files"
    files.mkdir(parents=True)
    for project in ["rcdemo-a", *BUILD_PACKAGES]:
        _wheel(files, project, "1.0", "VALUE = 'a1'\n")
        (root / "simple" / project).mkdir(parents=True)
        name = f"{project.replace('-', '_')}-1.0-py3-none-any.whl"
        (root / "simple" / project / "index.html").write_text(f'<a href="../../files/{name}">{name}</a>\n')
    return Index(root)


def _by_hand(bed, uv: Path, index_url: str, requirements: str) -> float:  # type: ignore[no-untyped-def]
    """One ssh call that builds the same set with uv as a user would: venv, then pip install -r."""
    import shlex
    import subprocess

    far = "/tmp/bench-env-by-hand"
    script = (
        f"rm -rf {far} && mkdir -p {far} && printf %s {shlex.quote(requirements)} > {far}/req.txt && "
        f"{uv} venv -q {far}/venv && {uv} pip install -q --no-cache --python {far}/venv/bin/python "
        f"--default-index {index_url} -r {far}/req.txt"
    )
    ssh = ["ssh", "-F", str(bed.ssh_config), "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "BatchMode=yes"]
    start = time.perf_counter()
    subprocess.run([*ssh, "-p", str(bed.sshd.port), f"{bed.user}@127.0.0.1", script], check=True, timeout=300)
    return time.perf_counter() - start


def first_build(service: JobService, bed, index, base: dict, runs: int) -> None:  # type: ignore[no-untyped-def]
    """A new 20-package environment per run, against uv run by hand over ssh (see the module's text)."""
    import uuid

    workspace = service.ctx.workspace.root
    uv = next(bed.far_path(bed.base_dir.removeprefix("~/")).joinpath("tools").glob("uv-*"))
    plain = JobSpec.from_json(base)
    job_times, plain_times, hand_times = [], [], []
    for _ in range(runs):
        requirements = f"# {uuid.uuid4()}\n" + "".join(p + "\n" for p in BUILD_PACKAGES)
        (workspace / "req.txt").write_text(requirements)
        spec = JobSpec.from_json({**base, "env": {"UV_NO_CACHE": "1"}, "environment": {"requirements": "req.txt"}})
        start = time.perf_counter()
        job = service.wait(service.submit(spec, new=True).job.id, timeout=300)
        job_times.append(time.perf_counter() - start)
        assert job.state == "succeeded", job.reason
        start = time.perf_counter()
        job = service.wait(service.submit(plain, new=True).job.id, timeout=300)
        plain_times.append(time.perf_counter() - start)
        hand_times.append(_by_hand(bed, uv, index.url, requirements))
    built = statistics.median(job_times) - statistics.median(plain_times)
    hand = statistics.median(hand_times)
    print(f"first build of {len(BUILD_PACKAGES)} packages on ssh, {runs} runs, median")
    print(f"  job with a new environment {statistics.median(job_times):6.2f} s")
    print(f"  the same job without one   {statistics.median(plain_times):6.2f} s")
    print(f"  uv venv + uv pip install -r by hand over ssh {hand:6.2f} s")
    ratio = built / hand
    print(f"  the build adds {built:.2f} s to the job: {ratio:.2f}x by hand; goal <= {GOAL_BUILD_RATIO}x")


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
        first_build(service, bed, index, base, args.runs)
    finally:
        service.close()
        index.stop()
        bed.stop()


if __name__ == "__main__":
    main()
