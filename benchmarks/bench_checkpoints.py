"""Checkpoint streaming over ssh: a 1 GiB checkpoint folder of which the job rewrites one 64 MiB file on a
period; the bytes brought home against the bytes that changed, and the job's own step time with its
checkpoints coming home against the same job without.

Not a test: it prints figures and ratios against their goals, measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_checkpoints.py [--seconds S] [--change-every S]

The machine is the tests' loopback sshd; the job is driven as the server drives jobs, one ``advance``
per poll at the product's default interval (2 s), with ``checkpoint_every`` 5 s. The job writes 16 files
of 64 MiB (random bytes, to a temporary name then renamed), then for ``--seconds`` does steps of fixed
work (sha256 of 32 MiB) and, every ``--change-every`` seconds, rewrites one of the files with new bytes.
Issue 40's goal is for 64 MiB changing a minute; the default changes it every 15 s (4x the rate, so a
run takes a minute). Goals: bytes brought home after the first set ≤ 1.1x the bytes rewritten; the
median step time within noise of the same job without checkpoints (both on this one machine, which
serves the far side, the transfer and this side on its 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_environments import loopback_bed  # noqa: E402 - after the path

from jupyter_remote_compute.jobs.service import JobService, ServiceSettings  # noqa: E402
from jupyter_remote_compute.jobs.spec import JobSpec  # noqa: E402

GOAL_RATIO = 1.1
FILES, SIZE = 16, 64 << 20
POLL = ServiceSettings().poll_interval
TRAIN = """\
import hashlib, json, os, sys, time
d = os.environ.get("REMOTE_COMPUTE_CHECKPOINT_DIR") or "ckpt"
os.makedirs(d, exist_ok=True)
files, size, seconds, every = (int(a) for a in sys.argv[1:5])
def save(i):
    with open(os.path.join(d, "part.tmp"), "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    os.replace(os.path.join(d, "part.tmp"), os.path.join(d, "part-%02d.bin" % i))
for i in range(files):
    save(i)
work = os.urandom(32 << 20)
steps, changed, start = [], 0, time.monotonic()
next_change = start + every
while time.monotonic() - start < seconds:
    t = time.perf_counter()
    hashlib.sha256(work).digest()
    steps.append(time.perf_counter() - t)
    if time.monotonic() >= next_change:
        save(changed % files)
        changed += 1
        next_change += every
json.dump({"steps": steps, "changed": changed * size}, open("steps.json", "w"))
"""


def run(service: JobService, spec: dict) -> tuple[dict, dict | None]:
    """One job to its end, advanced once per poll: what it measured, and its checkpoint summary."""
    job = service.submit(JobSpec.from_json(spec), new=True).job
    while not (job := service.advance(job.id)).ended:
        time.sleep(POLL)
    assert job.state == "succeeded", job.reason
    return json.loads((service.workspace.root / "steps.json").read_text()), job.checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60, help="how long the job's steps go on")
    parser.add_argument("--change-every", type=int, default=15, help="seconds between rewrites of one file")
    args = parser.parse_args()
    with loopback_bed("bench-checkpoints-") as (service, _index, bed, _tmp):
        (service.workspace.root / "train.py").write_text(TRAIN)
        service.machines.add("box", "ssh", "127.0.0.1", bed.options())
        command = f"python3 train.py {FILES} {SIZE} {args.seconds} {args.change_every}"
        base = {"machine": "box", "command": command, "send": ["train.py"], "bring_back": ["steps.json"]}
        plain, _ = run(service, base)
        streamed, summary = run(service, {**base, "checkpoints": "ckpt", "checkpoint_every": 5})
        assert summary is not None
        moved = summary["fetched_bytes"] - FILES * SIZE  # after the first whole set
        ratio = moved / streamed["changed"] if streamed["changed"] else float("nan")
        print(
            f"1 GiB folder, {SIZE >> 20} MiB rewritten every {args.change_every} s for {args.seconds} s,"
            f" polls every {POLL:.0f} s, checkpoint_every 5 s, load average {os.getloadavg()[0]:.1f}"
        )
        print(
            f"  brought home after the first set: {moved / 2**20:.0f} MiB for {streamed['changed'] / 2**20:.0f} MiB"
            f" rewritten: {ratio:.2f}x; goal ≤ {GOAL_RATIO}x"
        )
        medians = {name: statistics.median(m["steps"]) * 1000 for name, m in (("plain", plain), ("streamed", streamed))}
        print(
            f"  step time, median: {medians['streamed']:.1f} ms with checkpoints coming home against"
            f" {medians['plain']:.1f} ms without ({medians['streamed'] / medians['plain']:.2f}x;"
            f" {len(streamed['steps'])} and {len(plain['steps'])} steps)"
        )


if __name__ == "__main__":
    main()
