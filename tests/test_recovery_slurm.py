"""Slurm taking a job off its node, told apart from a failure, on the real Slurm bed (tests/slurm_fixture.py).

A job requeued (``scontrol requeue``, as an administrator or a preemption does) or whose node goes down
(``scontrol update state=down``) ends its attempt, ``preempted`` or ``lost``, with Slurm's own line from its
log in the reason; what Slurm holds to run again is cancelled. With a retry policy the next attempt is a new
Slurm job that starts from the last checkpoint set that came home while the first ran, and the job's webhook
hears each change. Slurm's warning before a job's time limit brings its newest checkpoints home at once, and is
passed on to the job's command, which may checkpoint on it (and on the TERM at the limit): those come home too.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import slurm_fixture
import sshd_fixture
import test_engine_slurm
from slurm_fixture import SlurmBed
from test_retries import TRAIN
from test_webhooks import Receiver
from waiting import wait_for

from jupyter_remote_compute.engines.base import WARNED_FILE
from jupyter_remote_compute.engines.slurm_commands import WARNING_FILE
from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.service import JobService
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
slurm_bed = slurm_fixture.slurm_bed
cluster = test_engine_slurm.cluster  # a service on a copy of the quickstart, with the bed as machine "hpc"

#: The training script that resumes from its newest checkpoint, beside the quickstart's own.
SCRIPT = "resume.py"


def slurm_state(bed: SlurmBed, slurm_id: str) -> str:
    done = subprocess.run(
        ["squeue", "--noheader", "--states=all", f"--jobs={slurm_id}", "--format=%T"],
        capture_output=True,
        text=True,
        env=bed.env,
    )
    return done.stdout.strip()


def checkpointed_at_step_2(
    service: JobService, workspace: Path, retry: dict[str, object] | None, **settings: object
) -> Job:
    """A training job on the cluster, running, once its step-2 checkpoint came home (it then waits)."""
    (workspace / SCRIPT).write_text(TRAIN)
    spec: dict[str, object] = {
        "machine": "hpc",
        "command": f"python3 {SCRIPT}",
        "send": [SCRIPT],
        "bring_back": ["trained.txt"],
        "checkpoints": "ckpt",
        "checkpoint_every": 0.2,
        **settings,
    }
    if retry is not None:
        spec["retry"] = retry
    job = service.submit(JobSpec.from_json(spec)).job
    home = workspace / ".punica/checkpoints" / job.id

    def second_step_home() -> Job | None:
        current = service.advance(job.id)
        return current if (home / "step-2.pt").is_file() else None

    running = wait_for(second_step_home, timeout=120, message="step 2's checkpoint to come home from Slurm")
    assert running.state == "running", running.public_json()
    return running


def next_attempt_running(service: JobService, job_id: str) -> Job:
    """Drive the job until its first attempt ended and the next one runs (or already ran)."""

    def running_again() -> Job | None:
        current = service.advance(job_id)
        return current if current.attempts and current.state not in ("queued", "sending", "pending") else None

    return wait_for(running_again, timeout=60, message="the next attempt to run in a new Slurm job")


def resumed_to_success(service: JobService, workspace: Path, job: Job, end: str, slurm_says: str) -> Job:
    """The attempt ended ``end`` quoting Slurm; the next Slurm job resumed from step 2 and succeeded."""
    first_slurm_id = job.handle["slurm_job_id"]
    done = service.wait(job.id, timeout=180)
    assert done.state == "succeeded", done.public_json()
    assert [a["end"] for a in done.attempts] == [end, "succeeded"], done.attempts
    reason = done.attempts[0]["reason"]
    assert reason.startswith(f"{end}: ") and f"*** JOB {first_slurm_id} ON " in reason, reason
    assert slurm_says in reason, reason
    # A new Slurm job ran the next attempt, from the checkpoint of step 2 the first one sent home.
    assert (workspace / "trained.txt").read_text() == "from 2: 1,2,3,4,5,"
    assert done.handle["slurm_job_id"] != first_slurm_id
    return done


def test_a_job_requeued_by_slurm_is_preempted_and_resumes_from_its_checkpoint(cluster, quickstart: Path) -> None:
    service, bed = cluster
    hook = Receiver()  # told of each change of the job's state
    running = checkpointed_at_step_2(service, quickstart, {"max": 1, "on": ["preempted"]}, notify=[hook.url])
    slurm_id = running.handle["slurm_job_id"]
    started = time.monotonic()
    bed.run(["scontrol", "requeue", slurm_id])  # by its owner, as an administrator or a preemption would
    next_attempt_running(service, running.id)
    print(f"\nrequeued to the next attempt running: {time.monotonic() - started:.1f} s")

    resumed_to_success(service, quickstart, running, "preempted", "DUE TO JOB REQUEUE")
    # What Slurm held to run again was cancelled: it never starts the first attempt over.
    assert slurm_state(bed, slurm_id) == "CANCELLED"
    print(f"requeued to the next attempt's success: {time.monotonic() - started:.1f} s")

    # Its webhook heard the preemption and the next attempt running, then the end.
    try:
        wait_for(lambda: any(n["state"] == "succeeded" for n in hook.notices()), 30, "the webhook's last POST")
        told = [(n["previous_state"], n["state"], n["attempt"], n["cause"]) for n in hook.notices()]
    finally:
        hook.close()
    assert ("running", "collecting", 1, "preempted") in told, told
    assert ("collecting", "queued", 2, "preempted") in told, told
    assert told.index(("collecting", "queued", 2, "preempted")) < told.index(("sending", "running", 2, None)), told
    assert told[-1] == ("collecting", "succeeded", 2, None), told


def test_a_job_whose_node_goes_down_is_lost_and_resumes_from_its_checkpoint(cluster, quickstart: Path) -> None:
    service, bed = cluster
    running = checkpointed_at_step_2(service, quickstart, {"max": 1, "on": ["lost"]})
    started = time.monotonic()
    down = ["scontrol", "update", f"nodename={bed.node}", "state=down", "reason=jrc test: node failure"]
    try:
        subprocess.run(down, check=True, capture_output=True, env=bed.env)

        next_attempt_running(service, running.id)
        print(f"\nnode down to the next attempt running: {time.monotonic() - started:.1f} s")
    finally:
        # The bed's node comes back by itself once slurmd answers (ReturnToService=2); make sure of it.
        if bed.node_state() not in ("idle", "mixed", "allocated"):
            subprocess.run(["scontrol", "update", f"nodename={bed.node}", "state=resume"], env=bed.env, check=False)
        wait_for(lambda: bed.node_state() in ("idle", "mixed", "allocated"), 60, "the node to be back")
    resumed_to_success(service, quickstart, running, "lost", "DUE TO NODE FAILURE")
    print(f"node down to the next attempt's success: {time.monotonic() - started:.1f} s")


def test_without_a_retry_policy_a_requeued_job_ends_and_slurm_does_not_run_it_again(cluster, quickstart: Path) -> None:
    service, bed = cluster
    running = checkpointed_at_step_2(service, quickstart, None)
    slurm_id = running.handle["slurm_job_id"]
    bed.run(["scontrol", "requeue", slurm_id])

    done = service.wait(running.id, timeout=120)
    assert done.state == "lost", done.public_json()
    assert done.reason.startswith("preempted: Slurm requeued it") and "DUE TO JOB REQUEUE ***" in done.reason
    assert done.attempts == [] and slurm_state(bed, slurm_id) == "CANCELLED"
    # The checkpoint set that came home stays: a job submitted again may start from it.
    assert (quickstart / ".punica/checkpoints" / done.id / "step-2.pt").read_text() == "1,2,"


# Training that writes a checkpoint of each step under a name of its own, two a second, until told to stop.
TICK = """\
import os, signal, time
d = os.environ["REMOTE_COMPUTE_CHECKPOINT_DIR"]
signal.signal(signal.SIGUSR1, lambda *_: print("warned", flush=True))  # passed on by the batch script
given_up = time.monotonic() + 240
step = 0
while not os.path.exists("stop") and time.monotonic() < given_up:
    step += 1
    with open(os.path.join(d, "step.tmp"), "w") as f:
        f.write(str(step))
    os.replace(os.path.join(d, "step.tmp"), os.path.join(d, "step-%d.pt" % step))
    print("step", step, flush=True)
    time.sleep(0.5)
"""


def script_job(service: JobService, workspace: Path, script: str, text: str, **settings: object) -> tuple[Job, Path]:
    """A job on the cluster running ``script`` (written as ``text``) with a checkpoint folder looked at every ten
    minutes, and where its checkpoints land."""
    (workspace / script).write_text(text)
    spec = {"machine": "hpc", "command": f"python3 {script}", "send": [script], "checkpoints": "ckpt"}
    job = service.submit(JobSpec.from_json({**spec, "checkpoint_every": "10m", **settings})).job
    return job, workspace / ".punica/checkpoints" / job.id


def test_slurms_warning_before_the_time_limit_brings_the_newest_checkpoints_home_at_once(
    cluster, quickstart: Path
) -> None:
    service, bed = cluster
    job, home = script_job(service, quickstart, "tick.py", TICK)

    def stepped(at_least: int) -> int | None:
        """The newest step the job's log shows, once it is ``at_least``."""
        service.advance(job.id)
        steps = [int(line[5:]) for line in service.read_log(job.id).data.decode().splitlines() if line[:5] == "step "]
        return max(steps) if steps and max(steps) >= at_least else None

    wait_for(lambda: stepped(4), 120, "the job to write its fourth checkpoint on Slurm")
    # Its first look saw them once; a file counts once unchanged between two looks, ten minutes apart.
    assert service.get(job.id).checkpoint is None and not home.exists()

    slurm_id = service.get(job.id).handle["slurm_job_id"]
    signalled = stepped(0)
    assert signalled is not None
    started = time.monotonic()
    bed.run(["scancel", "--signal=USR1", "--batch", slurm_id])  # what --signal=B:USR1@N sends before the limit

    def newest_home() -> int | None:
        service.advance(job.id)
        steps = [int(p.name[5:-3]) for p in home.glob("step-*.pt")] if home.exists() else []
        return max(steps) if steps and max(steps) >= signalled else None

    newest = wait_for(newest_home, 60, "a checkpoint set at least as new as the signal")
    print(f"\nwarned at step {signalled} to a set with step {newest} home: {time.monotonic() - started:.1f} s")
    current = service.get(job.id)
    assert current.state == "running", current.public_json()  # the set came before the job's end, not from it
    assert (home / f"step-{newest}.pt").read_text() == str(newest)
    log = service.read_log(job.id).data.decode()
    assert "time limit is near" in log and "\nwarned\n" in log  # noted, and passed on to the command
    assert WARNED_FILE == WARNING_FILE  # what the batch script makes is what status.sh looks for

    service.cancel(job.id)
    assert service.wait(job.id, timeout=120).state == "cancelled"


# Training that checkpoints when Slurm warns it (USR1) and when its time is up (TERM), and otherwise waits.
TRAPS = """\
import os, signal, sys, time
d = os.environ["REMOTE_COMPUTE_CHECKPOINT_DIR"]

def save(name, why):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(why)
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    print("checkpointed on", why, flush=True)

signal.signal(signal.SIGUSR1, lambda *_: save("warned.pt", "USR1"))

def stopped(*_):
    save("last.pt", "TERM")
    sys.exit(0)

signal.signal(signal.SIGTERM, stopped)
print("started", flush=True)
while True:
    time.sleep(0.2)
"""


def test_slurms_warning_and_its_time_limit_reach_the_command_which_checkpoints_on_them(
    cluster, quickstart: Path
) -> None:
    service, _ = cluster
    # A one-minute limit: --signal=B:USR1@60 warns at Slurm's first look (it looks every ~30 s), the limit
    # ends it 60-100 s in.
    job, home = script_job(service, quickstart, "traps.py", TRAPS, timeout=60)
    started = time.monotonic()

    def warned_home() -> Job | None:
        current = service.advance(job.id)
        return current if (home / "warned.pt").is_file() else None

    # The warning reached the script in its own process group; what it wrote came home while it ran.
    running = wait_for(warned_home, 90, "the checkpoint written on Slurm's warning to come home")
    print(f"\nwarned checkpoint home {time.monotonic() - started:.0f} s after submit")
    assert running.state == "running", running.public_json()
    assert (home / "warned.pt").read_text() == "USR1"

    done = service.wait(job.id, timeout=180)
    print(f"ended {done.state} {time.monotonic() - started:.0f} s after submit: {done.reason}")
    assert done.state == "failed" and (done.reason or "").startswith("timed out"), done.public_json()
    # The TERM at the limit reached it too, and the shell around it waited while it saved: that set came home.
    assert (home / "last.pt").read_text() == "TERM" and (home / "warned.pt").read_text() == "USR1"
    log = service.read_log(job.id).data.decode()
    assert "sent USR1 to the command" in log and "checkpointed on USR1" in log and "checkpointed on TERM" in log
