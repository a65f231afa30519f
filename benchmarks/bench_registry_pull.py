"""A job that pulls its image from a private registry, against ``podman pull`` by hand from the same registry.

Not a test: it prints figures and the ratio, measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_registry_pull.py [--runs N]

The registry is tests/test_container_registry.py's (docker-registry on 127.0.0.1, htpasswd), holding
the test image (a 219 MB Debian rootfs, mmdebstrap). Local machine, root podman. Each round removes
the image from the store, then times: a job that has to pull it (credentials from the Secret
Manager, the pull watched by container.sh) and runs ``true``; ``podman pull --authfile`` by hand; and
a job with the image already there (pinned), so the pull's share of the job is the difference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from jupyter_remote_compute.jobs.service import JobService, ServiceSettings  # noqa: E402 - after the path
from jupyter_remote_compute.jobs.spec import JobSpec  # noqa: E402
from jupyter_remote_compute.recording.tracking import TrackingSettings  # noqa: E402
from jupyter_remote_compute.workspace import Workspace  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_containers import _timed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from test_container_registry import USER, serving_registry
    from test_containers import build_image

    tmp = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    os.chmod(tmp, 0o755)
    image = build_image(tmp)
    workspace = tmp / "ws"
    (workspace / ".punica").mkdir(parents=True)
    os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyrings.alt.file.PlaintextKeyring")
    os.environ.setdefault("XDG_DATA_HOME", str(tmp / "keyring"))
    settings = ServiceSettings(
        poll_interval=0.05,
        scratch_dir=tmp / "scratch",
        tracking=TrackingSettings(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", experiment="bench"),
    )
    service = JobService(Workspace(workspace), settings)
    try:
        with serving_registry(image.rootfs) as registry:
            service.secrets.set("bench/registry", registry.credentials)
            # the store keeps no layer of the image either: every pull downloads all 219 MB
            subprocess.run(["podman", "rmi", "-f", image.ref], check=True, capture_output=True)
            auth = tmp / "auth.json"
            subprocess.run(
                ["podman", "login", "--authfile", str(auth), "-u", USER, "--password-stdin", registry.host],
                input=registry.password, text=True, check=True, capture_output=True,
            )  # fmt: skip
            spec = {"command": "true", "environment": {"image": registry.ref}, "registry_secret": "bench/registry"}

            def rmi() -> None:
                subprocess.run(["podman", "rmi", "-f", registry.ref], capture_output=True)
                shutil.rmtree(tmp / "scratch" / "images", ignore_errors=True)  # the pins: the next job pulls

            def job() -> None:
                done = service.wait(service.submit(JobSpec.from_json(spec), new=True).job.id, timeout=600)
                assert done.state == "succeeded", done.reason

            def by_hand() -> None:
                subprocess.run(
                    ["podman", "pull", "--authfile", str(auth), registry.ref], check=True, capture_output=True
                )

            rmi()
            job()  # warm: MLflow's store made, the registry's caches filled
            times: dict[str, list[float]] = {"job that pulls": [], "podman pull by hand": [], "job, image pinned": []}
            for _ in range(args.runs):  # interleaved, so a change of load hits all alike
                rmi()
                times["job that pulls"].append(_timed(job))
                times["job, image pinned"].append(_timed(job))
                rmi()
                times["podman pull by hand"].append(_timed(by_hand))
            print(f"local, root podman, 219 MB image, {args.runs} runs each, median (load {os.getloadavg()[0]:.1f})")
            medians = {name: statistics.median(t) for name, t in times.items()}
            for name, median in medians.items():
                print(f"  {name:22s} {median:6.2f} s   (min {min(times[name]):.2f} s)")
            pull_share = medians["job that pulls"] - medians["job, image pinned"]
            print(
                f"  the job's pull takes {pull_share:.2f} s, {pull_share / medians['podman pull by hand']:.2f}x "
                f"podman pull by hand ({medians['podman pull by hand']:.2f} s)"
            )
            rmi()
    finally:
        service.close()
        image.remove()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
