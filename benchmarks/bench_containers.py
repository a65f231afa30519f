"""A job in a cached container image on ssh (rootless podman), against the same job without one and
against ``podman run`` by hand on the same machine.

Not a test: it prints figures and the differences against their goals, measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_containers.py [--runs N]

The machine is the tests' loopback sshd and its test user, with the image tests/test_containers.py
builds (mmdebstrap, ``podman import``) in that user's rootless store, ``--network none``. Each job
run is a new job (``new=True``) submitted and followed by one ``JobService`` to its end, MLflow
recording included. By hand is one ssh command, ``podman run --rm --network none --userns=keep-id
IMAGE true``, against ``ssh … true``. Goals: the cached image adds ≤ 0.5 s to a job, and the job's
container costs ≤ 0.3 s more than the one started by hand.
"""

from __future__ import annotations

import argparse
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

from jupyter_remote_compute.jobs.service import JobService, ServiceSettings  # noqa: E402 - after the path
from jupyter_remote_compute.jobs.spec import JobSpec  # noqa: E402
from jupyter_remote_compute.recording.tracking import TrackingSettings  # noqa: E402
from jupyter_remote_compute.workspace import Workspace  # noqa: E402

GOAL_JOB_S = 0.5
GOAL_BY_HAND_S = 0.3


def _timed(run) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    from sshd_fixture import build_testbed
    from test_containers import build_image, configure_rootless

    tmp = Path(tempfile.mkdtemp(prefix="bench-containers-"))
    os.chmod(tmp, 0o755)
    image = build_image(tmp)
    bed = build_testbed()
    made = configure_rootless(bed.user)
    os.environ["SSH_AUTH_SOCK"] = str(bed.agent.sock)
    workspace = tmp / "ws"
    (workspace / ".punica").mkdir(parents=True)
    settings = ServiceSettings(
        poll_interval=0.05,
        scratch_dir=tmp / "scratch",
        tracking=TrackingSettings(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", experiment="bench"),
    )
    service = JobService(Workspace(workspace), settings)
    ssh = ["ssh", "-F", str(bed.ssh_config), "-o", f"UserKnownHostsFile={bed.known_hosts}", "-p", str(bed.sshd.port)]
    ssh += ["-o", "BatchMode=yes", f"{bed.user}@127.0.0.1"]
    by_hand = {
        "ssh true": [*ssh, "true"],
        "ssh podman run": [*ssh, f"podman run --rm --network none --userns=keep-id {image.ref} true"],
    }
    try:
        image.import_for(bed.user)
        service.machines.add("far", "ssh", "127.0.0.1", bed.options(container_network="none"))
        cases = {
            "job, no image": JobSpec.from_json({"machine": "far", "command": "true"}),
            "job, cached image": JobSpec.from_json(
                {"machine": "far", "command": "true", "environment": {"image": image.ref}}
            ),
        }
        for spec in cases.values():  # warm: the image pinned, MLflow's store made
            job = service.wait(service.submit(spec, new=True).job.id, timeout=300)
            assert job.state == "succeeded", job.reason
        for cmd in by_hand.values():
            subprocess.run(cmd, check=True, capture_output=True)
        times: dict[str, list[float]] = {name: [] for name in [*cases, *by_hand]}
        for _ in range(args.runs):  # interleaved, so a change of load hits all alike
            for name, spec in cases.items():
                job_id = service.submit(spec, new=True).job.id
                times[name].append(_timed(lambda job_id=job_id: service.wait(job_id, timeout=300)))
                assert service.get(job_id).state == "succeeded", service.get(job_id).reason
            for name, cmd in by_hand.items():
                times[name].append(_timed(lambda cmd=cmd: subprocess.run(cmd, check=True, capture_output=True)))
        print(f"ssh, rootless podman, {args.runs} runs each, median (load average {os.getloadavg()[0]:.1f})")
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name, median in medians.items():
            print(f"  {name:20s} {median:6.2f} s   (min {min(times[name]):.2f} s)")
        job_extra = medians["job, cached image"] - medians["job, no image"]
        hand_extra = medians["ssh podman run"] - medians["ssh true"]
        print(f"  the cached image adds {job_extra:+.2f} s to a job; goal ≤ {GOAL_JOB_S} s")
        print(
            f"  the job's container costs {job_extra - hand_extra:+.2f} s more than podman run by hand "
            f"({hand_extra:+.2f} s); goal ≤ {GOAL_BY_HAND_S} s"
        )
    finally:
        service.close()
        image.remove()
        bed.stop()
        if made:
            made.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
