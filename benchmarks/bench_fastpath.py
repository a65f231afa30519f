"""The fast paths of issue 11: a no-op job through the CLI, and re-sending what did not change.

Not a test: it prints figures and each one's ratio against its goal, measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fastpath.py [--runs N] [--files N] [--size MiB]

- ``noop``: ``jupyter remote-compute run --machine local -- true``, the whole process (wall clock
  and CPU), against ``python -c pass``. Goal: ≤ 1.0 s on a 2-core machine. Done means recorded:
  the CLI returns once the job's MLflow run is, so its figure includes recording; what recorders
  still do after it exits is on its own line. The workspace's recorder stays up between jobs (MLflow
  loaded, the store open): the goal's figure is a job after the first; the first job of a workspace
  (``cold``: a new workspace each run, so the recorder starts and imports MLflow) is on its own line.
- ``fresh``: ``--size`` MiB (256) of fresh input through ``jupyter remote-compute run`` on an ssh
  machine (the tests' loopback sshd), hashing included, minus the same job without it, against raw
  ``cat | ssh 'cat >'`` with the same cipher. Goal: >= 0.8x.

Unchanged re-sends (file and 10,000-file tree against their first send) are measured by
bench_ssh_transfer.py.

Wall clock on a shared machine moves with its load: the CPU figure is the steadier one, and the
load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_remote_compute.jobs.store import JobStore  # noqa: E402 - after the path is set

MiB = 1 << 20


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_process(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall clock and CPU seconds (the process and whatever it waited for) of one run."""
    cpu = _child_cpu()
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, _child_cpu() - cpu


def _jobs(workspace: Path) -> dict[str, dict]:
    # Through the store: the latest changes may still be in the journal beside jobs.json.
    return {job_id: job.to_json() for job_id, job in JobStore(workspace / ".punica/jobs.json").jobs().items()}


def bench_noop(runs: int, tmp: Path) -> None:
    workspace = tmp / "noop"
    (workspace / ".punica").mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
        "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(tmp / "scratch"),
    }
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or "jupyter"
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "jupyter remote-compute run --machine local -- true": [
            jupyter, "remote-compute", "run", "--machine", "local", "--new", "--", "true"
        ],
    }  # fmt: skip
    print(f"no-op job, {runs} runs each (load average {os.getloadavg()[0]:.1f})")
    results = {}
    for name, argv in cases.items():
        timed_process(argv, workspace, env)  # warm the page cache and the MLflow store
        samples = [timed_process(argv, workspace, env) for _ in range(runs)]
        wall = [w for w, _ in samples]
        cpu = [c for _, c in samples]
        results[name] = (statistics.median(wall), min(wall), statistics.median(cpu))
        print(f"  {name:55s} wall median {results[name][0]:.3f} s, min {results[name][1]:.3f} s, "
              f"CPU median {results[name][2]:.3f} s")  # fmt: skip
    # The detached recorders: time from the CLI's exit until the last run id is on its job.
    start = time.perf_counter()
    while any(j["mlflow_run_id"] is None for j in _jobs(workspace).values()):
        if time.perf_counter() - start > 600:
            print("  recorders did not finish within 600 s")
            break
        time.sleep(0.1)
    print(f"  every MLflow run recorded {time.perf_counter() - start:.1f} s after the last CLI exited")
    # The first job of a workspace: no recorder runs yet, so this one starts it and waits for MLflow.
    cold = []
    for i in range(runs):
        fresh = tmp / f"cold-{i}"
        (fresh / ".punica").mkdir(parents=True)
        # Gone soon after: a recorder per fresh workspace would otherwise stay up its ten minutes.
        cold.append(timed_process(cases["jupyter remote-compute run --machine local -- true"], fresh,
                                  {**env, "JUPYTER_REMOTE_COMPUTE_RECORDER_IDLE": "2"}))  # fmt: skip
    print(f"  {'the same, first job of a workspace (recorder cold)':55s} wall median "
          f"{statistics.median(w for w, _ in cold):.3f} s, min {min(w for w, _ in cold):.3f} s, "
          f"CPU median {statistics.median(c for _, c in cold):.3f} s")  # fmt: skip
    noop = results["jupyter remote-compute run --machine local -- true"]
    base = results["python -c pass"]
    ok = noop[0] <= 1.0
    print(f"  goal ≤ 1.0 s: {noop[0]:.3f} s wall median ({noop[0] - base[0]:.3f} s over python -c pass), "
          f"CPU {noop[2]:.3f} s: {'met' if ok else 'NOT met'}")  # fmt: skip


def bench_fresh_input(runs: int, size_mib: int, tmp: Path) -> None:
    """256 MiB of fresh input through the CLI on an ssh machine, minus the same job without it,
    against raw ``cat | ssh 'cat >'`` with the same cipher and key (the loopback sshd of the tests)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from sshd_fixture import build_testbed

    from jupyter_remote_compute.machines.registry import MachineRegistry

    bed = build_testbed()
    try:
        workspace = tmp / "fresh"
        (workspace / ".punica").mkdir(parents=True)
        base = "~/.jrc-bench-fastpath"
        MachineRegistry(workspace / ".punica/compute.yaml").add("far", "ssh", "127.0.0.1", bed.options(base_dir=base))
        data = workspace / "big.bin"
        with open(data, "wb") as f:
            for _ in range(size_mib):
                f.write(os.urandom(MiB))
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SSH_AUTH_SOCK": str(bed.agent.sock),
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow-fresh.db'}",
        }
        cli = [sys.executable, "-m", "jupyter_remote_compute.cli", "run", "--machine", "far", "--new"]
        raw = [
            "ssh", "-F", "/dev/null", "-i", str(bed.user_key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-c", "aes128-gcm@openssh.com", "-p", str(bed.sshd.port), f"{bed.user}@127.0.0.1", "cat > raw.bin",
        ]  # fmt: skip

        def fresh() -> None:
            # Nothing cached on either side: the digest is computed and every byte moves.
            (workspace / ".punica/digests.json").unlink(missing_ok=True)
            shutil.rmtree(bed.home / base.removeprefix("~/") / "cache", ignore_errors=True)

        def raw_send() -> float:
            start = time.perf_counter()
            with open(data, "rb") as f:
                subprocess.run(raw, stdin=f, check=True)
            return time.perf_counter() - start

        print(f"{size_mib} MiB fresh input through the CLI on an ssh machine, {runs} runs (load "
              f"{os.getloadavg()[0]:.1f})")  # fmt: skip
        with_input, without, raws = [], [], []
        for _ in range(runs):
            fresh()
            with_input.append(timed_process([*cli, "--send", "big.bin", "--", "true"], workspace, env)[0])
            without.append(timed_process([*cli, "--", "true"], workspace, env)[0])
            raws.append(raw_send())
        w, wo, r = (statistics.median(x) for x in (with_input, without, raws))
        ratio = r / max(w - wo, 1e-9)
        print(f"  CLI with the input {w:.2f} s, without {wo:.2f} s: the input costs {w - wo:.2f} s "
              f"({size_mib * MiB / max(w - wo, 1e-9) / 1e6:.0f} MB/s)")  # fmt: skip
        print(f"  raw cat | ssh 'cat >' {r:.2f} s ({size_mib * MiB / r / 1e6:.0f} MB/s)")
        print(f"  ratio {ratio:.2f}x (goal >= 0.8x): {'met' if ratio >= 0.8 else 'NOT met'}")
    finally:
        bed.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", type=int, default=256, help="MiB of fresh input (default 256)")
    parser.add_argument("--only", choices=["noop", "fresh"], default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fastpath-"))
    try:
        if args.only in (None, "noop"):
            bench_noop(args.runs, tmp)
        if args.only in (None, "fresh"):
            bench_fresh_input(args.runs, args.size, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
