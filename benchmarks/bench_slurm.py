"""The slurm engine against Slurm by hand, in the same run on the single-node test bed.

Not a test: it prints figures and the engine's cost as a ratio of the by-hand one. It starts the
test beds of tests/sshd_fixture.py and tests/slurm_fixture.py (root and Debian's Slurm needed),
runs for about a minute, and stops them.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_slurm.py [--runs N] [--jobs N]

- submit → RUNNING on an idle node: ``sbatch`` then ``squeue`` until the job runs, timed on the
  login node itself (what Slurm costs) and from here over ssh, one connection per command (what
  a client that does not keep a connection open pays);
- the same through the engine: ``JobService.submit`` and ``advance`` (sending the job folder,
  ``sbatch`` through its open connection), then the engine's ``poll`` until it says running;
- one ``squeue`` call for ``--jobs`` held jobs of one user (default 200), the command and format
  of ``slurm_commands.squeue_argv``: on the login node, over ssh, and parsing its output here;
  and one engine ``poll`` of those 200 jobs (squeue, the jobs' exit-code files, parsing: one
  round trip on its open connection).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from slurm_fixture import SlurmBed, start_slurm_bed  # noqa: E402
from sshd_fixture import build_testbed  # noqa: E402
from waiting import wait_for  # noqa: E402

from jupyter_remote_compute.engines import slurm_commands as sc  # noqa: E402
from jupyter_remote_compute.engines.base import RemoteJob  # noqa: E402
from jupyter_remote_compute.jobs.context import remote_of  # noqa: E402
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings  # noqa: E402
from jupyter_remote_compute.jobs.spec import JobSpec  # noqa: E402
from jupyter_remote_compute.recording.tracking import TrackingSettings  # noqa: E402
from jupyter_remote_compute.workspace import Workspace  # noqa: E402

# Runs on the login node: submit, then ask squeue every 10 ms until the job runs (a loop without
# pause would take a CPU from slurmctld on a small machine); prints the job id and the seconds
# from just before sbatch to the first RUNNING answer.
FAR_SUBMIT_TO_RUNNING = """\
out=$1
t0=$(date +%s.%N)
id=$(sbatch --parsable --output="$out" --wrap='sleep 60')
while [ "$(squeue --noheader --jobs="$id" --format=%T)" != RUNNING ]; do sleep 0.01; done
t1=$(date +%s.%N)
echo "$id $(echo "$t1 - $t0" | awk '{print $1 - $3}')"
"""

# Runs on the login node: the same squeue ``count`` times; prints seconds per call.
FAR_SQUEUE = """\
count=$1; shift
t0=$(date +%s.%N)
i=0
while [ "$i" -lt "$count" ]; do "$@" > /dev/null; i=$((i + 1)); done
t1=$(date +%s.%N)
echo "$t0 $t1 $count" | awk '{print ($2 - $1) / $3}'
"""


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def idle(bed: SlurmBed) -> None:
    """Every job gone and the node idle again (not still completing the last one) before the next run."""
    bed.cancel_all()
    wait_for(lambda: bed.node_state() == "idle", 60, "the node to be idle", interval=0.02)


def engine_service(bed: SlurmBed, tmp: Path) -> JobService:
    """A JobService over an empty workspace with the bed as machine ``hpc``, its connection opened."""
    (tmp / "ws" / ".punica").mkdir(parents=True)
    settings = ServiceSettings(
        poll_interval=0.2,
        scratch_dir=tmp / "scratch",
        tracking=TrackingSettings(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", experiment="bench"),
    )
    service = JobService(Workspace(tmp / "ws"), settings)
    service.machines.add("hpc", "slurm", "127.0.0.1", bed.machine_options())
    service.admin.check("hpc")  # a server's engine has its connection open before a job comes
    return service


@contextlib.contextmanager
def bed_service(bed: SlurmBed) -> Iterator[JobService]:
    """``engine_service`` over a temporary folder, closed and removed after."""
    with tempfile.TemporaryDirectory(prefix="jrc-bench-slurm-") as tmp:
        service = engine_service(bed, Path(tmp))
        try:
            yield service
        finally:
            service.close()


def engine_submit_to_running(bed: SlurmBed, service: JobService, runs: int) -> list[float]:
    """submit → the engine's poll says running; each job is then cancelled by hand (never collected)."""
    engine = service.engine("hpc")
    took = []
    for i in range(runs):
        started = time.perf_counter()
        job = service.submit(JobSpec.from_json({"machine": "hpc", "command": "sleep 60", "name": f"b{i}"})).job
        service.advance(job.id)  # queued → sending → submitted
        remote = remote_of(service.get(job.id))
        deadline = time.monotonic() + 120
        while (state := engine.poll([remote])[job.id].state) != "running":
            # Ask again after 10 ms, as the by-hand loop does; a job that ended instead is an error.
            if state not in ("pending", "running") or time.monotonic() > deadline:
                slurm_id = remote.handle["slurm_job_id"]
                seen = bed.run(["scontrol", "show", "job", slurm_id], check=False).stdout.strip()
                raise RuntimeError(f"job {job.id} (Slurm {slurm_id}) never ran through the engine: {state}; {seen}")
            time.sleep(0.01)
        took.append(time.perf_counter() - started)
        bed.run(sc.scancel_argv([remote.handle["slurm_job_id"]]))
        idle(bed)
    return took


def submit_to_running(bed: SlurmBed, runs: int, service: JobService) -> None:
    out = str(bed.far_path(bed.base_dir) / "bench-%j.log")
    far, over_ssh = [], []
    for _ in range(runs):
        answer = bed.ssh(f"sh -c {shlex.quote(FAR_SUBMIT_TO_RUNNING)} sh {shlex.quote(out)}").stdout.split()
        far.append(float(answer[1]))
        bed.run(sc.scancel_argv([answer[0]]))
        idle(bed)
    for _ in range(runs):
        started = time.perf_counter()
        job_id = sc.parse_sbatch_output(bed.run(["sbatch", "--parsable", f"--output={out}", "--wrap=sleep 60"]).stdout)
        while True:
            done = bed.run(sc.squeue_argv([job_id]))
            if sc.parse_squeue(done.stdout)[job_id].state == "RUNNING":
                break
        over_ssh.append(time.perf_counter() - started)
        bed.run(sc.scancel_argv([job_id]))
        idle(bed)
    print(f"submit -> RUNNING on the login node: median {ms(statistics.median(far))} (min {ms(min(far))}, {runs} runs)")
    print(
        f"submit -> RUNNING over ssh, a connection per command: median {ms(statistics.median(over_ssh))} "
        f"(min {ms(min(over_ssh))})"
    )
    try:
        engine = engine_submit_to_running(bed, service, runs)
    except RuntimeError as e:
        print(f"submit -> running through the engine: not measured ({e})")
        return
    print(
        f"submit -> running through the engine (send, sbatch, poll on one connection): median "
        f"{ms(statistics.median(engine))} (min {ms(min(engine))}); "
        f"{statistics.median(engine) / statistics.median(far):.1f}x the login node's, "
        f"{statistics.median(engine) / statistics.median(over_ssh):.2f}x ssh by hand"
    )


def squeue_cost(bed: SlurmBed, jobs: int, service: JobService) -> None:
    # Held jobs stay PENDING (reason JobHeldUser) and cost the node nothing.
    submit_many = f"for i in $(seq {jobs}); do sbatch --parsable --hold --output=/dev/null --wrap=true; done"
    job_ids = [line.strip() for line in bed.ssh(submit_many).stdout.split() if line.strip()]
    assert len(job_ids) == jobs, job_ids[-3:]
    argv = sc.squeue_argv(job_ids)
    per_call = float(bed.ssh(f"sh -c {shlex.quote(FAR_SQUEUE)} sh 20 {shlex.join(argv)}").stdout)
    timings, parse_times, noop = [], [], []
    for _ in range(10):
        started = time.perf_counter()
        bed.ssh("true")
        noop.append(time.perf_counter() - started)
        started = time.perf_counter()
        done = bed.run(argv)
        timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        parsed = sc.parse_squeue(done.stdout, done.stderr, done.returncode)
        parse_times.append(time.perf_counter() - started)
        assert len(parsed) == jobs and all(job.reason == "JobHeldUser" for job in parsed.values())
    print(f"one squeue for {jobs} jobs on the login node: {ms(per_call)} (mean of 20)")
    print(
        f"one squeue for {jobs} jobs over ssh (new connection): median {ms(statistics.median(timings))}, "
        f"of which ssh itself (ssh true): {ms(statistics.median(noop))}"
    )
    print(f"parsing its {len(done.stdout)} bytes here: median {ms(statistics.median(parse_times))}")
    # The engine's poll of the same jobs, as if they were 200 of ours (their folders do not exist:
    # the status script answers "gone" for each, the same work as for real folders).
    base = str(bed.far_path(bed.base_dir))
    remotes = [
        RemoteJob(f"bench{i}", "", {"slurm_job_id": job_id, "dir": f"{base}/bench{i}"})
        for i, job_id in enumerate(job_ids)
    ]
    engine = service.engine("hpc")
    polls = []
    for _ in range(10):
        started = time.perf_counter()
        statuses = engine.poll(remotes)
        polls.append(time.perf_counter() - started)
        assert len(statuses) == jobs and all(s.state == "pending" for s in statuses.values())
    print(
        f"one engine poll of {jobs} jobs (open connection): median {ms(statistics.median(polls))} "
        f"(min {ms(min(polls))}); {statistics.median(polls) / per_call:.1f}x squeue on the login node, "
        f"{statistics.median(polls) / statistics.median(timings):.2f}x squeue over a new ssh connection"
    )
    bed.run(sc.scancel_argv(job_ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="submit -> RUNNING repetitions (default 5)")
    parser.add_argument("--jobs", type=int, default=200, help="jobs in the squeue call (default 200)")
    args = parser.parse_args()
    ssh = build_testbed()
    try:
        started = time.perf_counter()
        bed = start_slurm_bed(ssh)
        print(f"test bed: Slurm node idle {time.perf_counter() - started:.1f} s after start, {bed.cpus} CPUs")
        try:
            with bed_service(bed) as service:
                squeue_cost(bed, args.jobs, service)
                submit_to_running(bed, args.runs, service)
        finally:
            bed.stop()
    finally:
        ssh.stop()


if __name__ == "__main__":
    main()
