"""A job of two processes on each of two nodes on the two-node Slurm test bed: the engine against sbatch + srun by hand.

Not a test: it prints figures. It starts the test beds of tests/sshd_fixture.py and the two-node
cluster of tests/slurm_fixture.py (root, Debian's Slurm, network namespaces), runs for about a
minute, and stops them. The goal (issue 44): submit → every rank running through the engine within
0.5 s of the same job submitted by hand.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_slurm_ranks.py [--runs N]

- by hand, on the login node: ``sbatch --nodes=2 --ntasks-per-node=2`` of a batch script whose
  ``srun`` starts the four processes, each touching a file of its rank; timed from just before
  sbatch to the fourth file;
- through the engine: ``JobService.submit`` and ``advance`` (the job folder sent, batch.sh and
  rank.sh written, sbatch over the open connection) of the same four processes (``plain``, their
  ranks from rank.sh), to the fourth file, read here (the bed shares this filesystem).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_slurm import bed_service  # noqa: E402
from filelock import FileLock  # noqa: E402
from slurm_fixture import SlurmBed, start_slurm_bed  # noqa: E402
from slurm_nodes import LOCK  # noqa: E402
from sshd_fixture import build_testbed  # noqa: E402
from waiting import wait_for  # noqa: E402

from jupyter_remote_compute.engines import slurm_commands as sc  # noqa: E402
from jupyter_remote_compute.jobs.service import JobService  # noqa: E402
from jupyter_remote_compute.jobs.spec import JobSpec  # noqa: E402

RANKS = 4

# Runs on the login node: submit, then look every 10 ms for the four ranks' files; prints the job id
# and the seconds from just before sbatch to the fourth.
FAR_BY_HAND = """\
dir=$1
mkdir -p "$dir" && rm -f "$dir"/up.*
t0=$(date +%s.%N)
id=$(sbatch --parsable --nodes=2 --ntasks-per-node=2 --output="$dir/log" \
  --wrap="srun sh -c 'touch $dir/up.\\$SLURM_PROCID; sleep 60'")
while [ "$(ls "$dir" | grep -c '^up\\.')" -lt 4 ]; do sleep 0.01; done
t1=$(date +%s.%N)
echo "$id $(echo "$t1 - $t0" | awk '{print $1 - $3}')"
"""


def quiet(bed: SlurmBed) -> None:
    bed.cancel_all()
    wait_for(lambda: set(bed.node_state().split()) == {"idle"}, 60, "the nodes to be idle", interval=0.02)


def by_hand(bed: SlurmBed, runs: int) -> list[float]:
    folder = str(bed.far_path(bed.base_dir) / "by-hand")
    took = []
    for _ in range(runs):
        job_id, seconds = bed.ssh(f"sh -c {shlex.quote(FAR_BY_HAND)} sh {shlex.quote(folder)}").stdout.split()
        took.append(float(seconds))
        bed.run(sc.scancel_argv([job_id]))
        quiet(bed)
    return took


def through_the_engine(bed: SlurmBed, service: JobService, runs: int) -> list[float]:
    spec = {
        "machine": "hpc",
        "command": "touch up.$RANK; sleep 60",
        "resources": {"nodes": 2, "processes_per_node": 2, "launcher": "plain"},
    }
    took = []
    for i in range(runs):
        started = time.perf_counter()
        job = service.submit(JobSpec.from_json({**spec, "name": f"ranks{i}"})).job
        job = service.advance(job.id)  # queued → sending → submitted
        work = bed.far_path(job.handle["dir"].removeprefix(str(bed.user_home) + "/")) / "work"
        wait_for(lambda w=work: len(list(w.glob("up.*"))) == RANKS, 120, "four ranks", interval=0.01)
        took.append(time.perf_counter() - started)
        bed.run(sc.scancel_argv([job.handle["slurm_job_id"]]))
        quiet(bed)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="repetitions of each (default 5)")
    args = parser.parse_args()
    ssh = build_testbed()
    try:
        with FileLock(LOCK, timeout=600):
            started = time.perf_counter()
            bed = start_slurm_bed(ssh, node_count=2)
            print(f"test bed: two Slurm nodes idle {time.perf_counter() - started:.1f} s after start")
            try:
                with bed_service(bed) as service:
                    hand = by_hand(bed, args.runs)
                    engine = through_the_engine(bed, service, args.runs)
            finally:
                bed.stop()
    finally:
        ssh.stop()
    hand_median, engine_median = statistics.median(hand), statistics.median(engine)
    print(f"submit -> {RANKS} ranks running, by hand on the login node: median {hand_median:.2f} s")
    print(f"  (min {min(hand):.2f} s, {args.runs} runs)")
    print(f"the same through the engine (send, sbatch, batch.sh, rank.sh): median {engine_median:.2f} s")
    print(f"  (min {min(engine):.2f} s); {engine_median - hand_median:+.2f} s (goal +0.5 s)")


if __name__ == "__main__":
    main()
