"""The single-node Slurm test bed, driven as the slurm engine will drive it: over ssh, as the test user.

Every parser of engines/slurm_commands/ reads here what the real commands print.
"""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

import pytest
import slurm_fixture
import sshd_fixture
from far_python import far_torch_bin
from slurm_fixture import SlurmBed
from waiting import wait_for

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.engines import slurm_commands as sc
from jupyter_remote_compute.engines.launcher import command_script, launch_input
from jupyter_remote_compute.engines.resources import Resources
from jupyter_remote_compute.errors import InvalidSettings

sshd_bed = sshd_fixture.sshd_bed
slurm_bed = slurm_fixture.slurm_bed


def make_job_dir(
    bed: SlurmBed, name: str, command: str, resources: Resources | None = None, warn_command: bool = True
) -> str:
    """A job folder as the engine lays it out (written here: the test bed shares this filesystem)."""
    job_dir = bed.far_path(bed.base_dir) / name
    (job_dir / "work").mkdir(parents=True)
    (job_dir / "command.sh").write_text(command_script(command))
    script = sc.batch_script(str(job_dir), resources or Resources(), warn_command=warn_command)
    (job_dir / sc.BATCH_SCRIPT).write_text(script)
    (job_dir / "rank.sh").write_text(farside.script("rank"))
    (job_dir / "submit.sh").write_text(sc.SUBMIT_SH)
    owner = pwd.getpwnam(bed.user)
    for path in (job_dir, job_dir / "work", *job_dir.iterdir()):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return str(job_dir)


def submit(
    bed: SlurmBed,
    job_dir: str,
    resources: Resources | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> str:
    job_id = Path(job_dir).name.replace("%", "-")
    argv = sc.sbatch_argv(job_id, job_dir, resources or Resources(), sc.SlurmSettings(), timeout)
    done = bed.run(["sh", f"{job_dir}/submit.sh", job_dir, *argv], stdin=launch_input(env or {}, {}))
    return sc.parse_sbatch_output(done.stdout)


def squeue(bed: SlurmBed, *job_ids: str) -> dict[str, sc.SlurmJob]:
    done = bed.run(sc.squeue_argv(job_ids), check=False)
    return sc.parse_squeue(done.stdout, done.stderr, done.returncode)


def wait_state(bed: SlurmBed, job_id: str, states: set[str], timeout: float = 30) -> sc.SlurmJob:
    def reached() -> sc.SlurmJob | None:
        job = squeue(bed, job_id).get(job_id)
        return job if job is not None and job.state in states else None

    return wait_for(reached, timeout, f"Slurm job {job_id} to be {'/'.join(sorted(states))}", interval=0.2)


def exit_code(job_dir: str) -> int | None:
    path = Path(job_dir) / "exit_code"
    return int(path.read_text()) if path.exists() else None


def log_text(job_dir: str) -> str:
    return (Path(job_dir) / "log").read_text(errors="replace")


def test_job_submitted_over_ssh_runs_to_completion(slurm_bed: SlurmBed) -> None:
    job_dir = make_job_dir(
        slurm_bed, "done", 'printf "%s|%s|%s\\n" "$GREETING" "$(id -un)" "$PWD" > out.txt; echo to-the-log'
    )
    before = time.time()
    job_id = submit(slurm_bed, job_dir, env={"GREETING": "hello, slurm"})
    job = wait_state(slurm_bed, job_id, {"COMPLETED"})
    assert sc.interpret(job, exit_code(job_dir)) == sc.Outcome("exited", exit_code=0)
    assert job.name == f"jrc-{Path(job_dir).name}" and job.nodes == slurm_bed.node
    assert job.submit is not None and job.start is not None and before - 2 <= job.submit <= job.start <= time.time()
    # The environment came through stdin; the command ran as the test user in work/.
    assert (Path(job_dir) / "work" / "out.txt").read_text() == f"hello, slurm|{slurm_bed.user}|{job_dir}/work\n"
    log = log_text(job_dir)
    assert "to-the-log" in log and f"Slurm job {job_id} on {slurm_bed.node}, attempt 1" in log
    assert (Path(job_dir) / "slurm_job_id").read_text().strip() == job_id
    # Submitting again (a crash before the id was recorded here) finds the first job, queues none.
    assert submit(slurm_bed, job_dir) == job_id


def test_a_percent_sign_in_the_job_folder_is_not_a_slurm_pattern(slurm_bed: SlurmBed) -> None:
    job_dir = make_job_dir(slurm_bed, "100%j", "echo logged")
    job_id = submit(slurm_bed, job_dir)
    wait_state(slurm_bed, job_id, {"COMPLETED"})
    assert "logged" in log_text(job_dir)


def test_nonzero_exit_is_the_commands_own_code(slurm_bed: SlurmBed) -> None:
    job_dir = make_job_dir(slurm_bed, "three", "exit 3")
    job_id = submit(slurm_bed, job_dir)
    job = wait_state(slurm_bed, job_id, {"FAILED"})
    assert job.reason == "NonZeroExitCode"
    assert exit_code(job_dir) == 3
    assert sc.interpret(job, exit_code(job_dir)) == sc.Outcome("exited", exit_code=3)


def test_pending_behind_a_job_holding_every_cpu_and_cancel_of_pending_and_running(slurm_bed: SlurmBed) -> None:
    hog_dir = make_job_dir(slurm_bed, "hog", "sleep 300")
    hog = submit(slurm_bed, hog_dir, Resources(cpus=slurm_bed.cpus))
    wait_state(slurm_bed, hog, {"RUNNING"})
    waiting_dir = make_job_dir(slurm_bed, "waiting", "sleep 300")
    waiting = submit(slurm_bed, waiting_dir, Resources(cpus=1))
    later_dir = make_job_dir(slurm_bed, "later", "echo ran > ran.txt")
    later = submit(slurm_bed, later_dir, Resources(cpus=1))

    # The scheduler gives its reason at its next pass; until then it may say "None".
    def has_reason() -> sc.SlurmJob | None:
        job = squeue(slurm_bed, waiting)[waiting]
        return job if job.reason else None

    pending = wait_for(has_reason, 30, "a pending reason", interval=0.2)
    assert pending.state == "PENDING" and pending.reason == "Resources" and pending.nodes == ""
    outcome = sc.interpret(pending)
    assert outcome.state == "pending" and "resources" in outcome.reason

    # One call answers for every job asked about.
    assert set(squeue(slurm_bed, hog, waiting, later)) == {hog, waiting, later}

    slurm_bed.run(sc.scancel_argv([waiting]))
    cancelled = wait_state(slurm_bed, waiting, {"CANCELLED"})
    assert sc.interpret(cancelled).state == "cancelled"
    assert exit_code(waiting_dir) is None  # it never ran

    slurm_bed.run(sc.scancel_argv([hog]))
    assert sc.interpret(wait_state(slurm_bed, hog, {"CANCELLED"})).state == "cancelled"
    # Slurm's TERM reached the command; the batch script outlived it and recorded how it ended.
    assert wait_for(lambda: exit_code(hog_dir), 10, "the hog's exit code") == 143
    # With the CPUs free, the job behind runs.
    assert sc.interpret(wait_state(slurm_bed, later, {"COMPLETED"}), exit_code(later_dir)).exit_code == 0
    assert (Path(later_dir) / "work" / "ran.txt").read_text() == "ran\n"


def test_job_over_its_memory_limit_is_killed_and_said_so(slurm_bed: SlurmBed) -> None:
    # jobacct_gather/linux samples every second; OverMemoryKill ends the job (task/none alone cannot).
    grab = "python3 -c 'import time; b = bytearray(400 * 1024 * 1024); time.sleep(60)'"
    job_dir = make_job_dir(slurm_bed, "greedy", grab)
    job_id = submit(slurm_bed, job_dir, Resources(memory_mb=64))
    job = wait_state(slurm_bed, job_id, {"FAILED", "OUT_OF_MEMORY", "CANCELLED"})
    outcome = sc.interpret(job, exit_code(job_dir), log_text(job_dir)[-4000:])
    assert outcome.state == "failed" and "out of memory" in outcome.reason


def test_more_cpus_than_any_node_has_would_wait_for_ever_so_it_is_refused(slurm_bed: SlurmBed) -> None:
    too_many = Resources(cpus=slurm_bed.cpus + 1)
    # Slurm itself accepts it (EnforcePartLimits is off by default) and keeps it pending for ever...
    job_dir = make_job_dir(slurm_bed, "toobig", "true")
    job_id = submit(slurm_bed, job_dir, too_many)
    job = wait_for(lambda: squeue(slurm_bed, job_id)[job_id].reason, 30, "a pending reason", interval=0.2)
    assert job == "PartitionConfig" and "will not start" in sc.pending_reason(job)
    slurm_bed.run(sc.scancel_argv([job_id]))
    # ...so the engine refuses it before sbatch, from the facts check reads.
    facts = sc.parse_check(slurm_bed.ssh(sc.CHECK_SH).stdout)
    with pytest.raises(InvalidSettings, match=f"cpus: {slurm_bed.cpus + 1} asked") as err:
        sc.refuse_unfit(too_many, facts.partitions)
    assert err.value.field == "cpus"
    sc.refuse_unfit(Resources(cpus=slurm_bed.cpus), facts.partitions)


def test_srun_start_exports_rendezvous_variables(slurm_bed: SlurmBed) -> None:
    # The start of a job of several processes (srun, one task each, plain) on the one node the bed has.
    show = 'echo "$MASTER_ADDR $MASTER_PORT $WORLD_SIZE $NODE_RANK $RANK $SLURM_STEP_ID" > rdv.txt'
    job_dir = make_job_dir(slurm_bed, "rdv", show, Resources(launcher="plain"))
    job_id = submit(slurm_bed, job_dir, Resources(nodes=1))
    wait_state(slurm_bed, job_id, {"COMPLETED"})
    addr, port, world, node_rank, rank, step = (Path(job_dir) / "work" / "rdv.txt").read_text().split()
    # MASTER_ADDR is the first node's NodeAddr in slurm.conf (127.0.0.1 here), not its name.
    assert (addr, int(port), world, node_rank, rank, step) == (
        "127.0.0.1",
        20000 + int(job_id) % 20000,
        "1",
        "0",
        "0",
        "0",
    )


@pytest.mark.parametrize(
    ("launcher", "gpus", "given", "seen"),
    [
        ("plain", 4, None, ["0,1", "2,3"]),  # Slurm named no devices: the node's first four, two a process
        ("plain", 4, "3,5,6,7", ["3,5", "6,7"]),  # the devices Slurm gave the step (GRES), shared out
        ("plain", 1, None, ["0", "0"]),  # fewer GPUs than processes: shared
        ("plain", 0, "2", ["2", "2"]),  # none asked: the job's own setting stands
        ("plain", 0, None, ["unset", "unset"]),
        ("torchrun", 2, None, ["0,1", "0,1"]),  # every worker sees the node's GPUs, picks cuda:LOCAL_RANK
    ],
)
def test_each_process_is_given_the_gpus_asked_per_node(
    slurm_bed: SlurmBed, launcher: str, gpus: int, given: str | None, seen: list[str]
) -> None:
    # The bed's node has no GPUs, so sbatch asks for none (no --gres): the batch script and rank.sh are
    # those of a job asking ``gpus`` per node, run by srun on the bed; ``given`` stands in for the
    # CUDA_VISIBLE_DEVICES Slurm sets for a step with GPUs.
    show = 'echo "${CUDA_VISIBLE_DEVICES-unset}" > "gpus.$RANK"'
    asked = Resources(gpus=gpus, processes_per_node=2, launcher=launcher)
    job_dir = make_job_dir(slurm_bed, f"gpus-{launcher}-{gpus}-{(given or '').replace(',', '')}", show, asked)
    env = {"CUDA_VISIBLE_DEVICES": given} if given else {}
    if launcher == "torchrun":
        env["PATH"] = f"{far_torch_bin()}:/usr/local/bin:/usr/bin:/bin"
    job_id = submit(slurm_bed, job_dir, Resources(processes_per_node=2, launcher=launcher, memory_mb=2048), env=env)
    wait_state(slurm_bed, job_id, {"COMPLETED", "FAILED"}, timeout=120)
    work = Path(job_dir) / "work"
    assert [(work / f"gpus.{rank}").read_text().strip() for rank in (0, 1)] == seen, log_text(job_dir)


def test_forgotten_job_ids_are_an_empty_answer(slurm_bed: SlurmBed) -> None:
    assert squeue(slurm_bed, "999999") == {}
    assert squeue(slurm_bed, "999998", "999999") == {}


def test_check_facts_and_no_accounting(slurm_bed: SlurmBed) -> None:
    facts = sc.parse_check(slurm_bed.ssh(sc.CHECK_SH).stdout)
    assert facts.version == "22.05.8" and facts.user == slurm_bed.user
    assert not facts.accounting and facts.default_account is None
    (partition,) = facts.partitions
    assert (partition.name, partition.default, partition.available) == (slurm_bed.partition, True, "up")
    assert (partition.cpus_per_node, partition.memory_mb_per_node) == (slurm_bed.cpus, slurm_bed.memory_mb)
    assert partition.nodes == 1 and partition.gpus_per_node == 0 and partition.time_limit_minutes is None
    (record,) = sc.parse_scontrol_oneliner(slurm_bed.ssh("scontrol show partition --oneliner").stdout)
    assert record["PartitionName"] == slurm_bed.partition and record["TotalCPUs"] == str(slurm_bed.cpus)


def test_a_login_node_without_slurm_is_a_clear_error(slurm_bed: SlurmBed) -> None:
    done = slurm_bed.ssh("PATH=/nonexistent; " + sc.CHECK_SH, check=False)
    with pytest.raises(sc.SlurmMissing, match="sbatch, squeue"):
        sc.parse_check(done.stdout)


def test_time_limit_warns_then_ends_the_job_as_timeout(slurm_bed: SlurmBed) -> None:
    # Slurm checks time limits about every 30 s: a one-minute limit ends the job 60-100 s in. The machine's
    # warn_command is off: the warning is noted, not passed on to the command (sleep would end of it).
    job_dir = make_job_dir(slurm_bed, "slow", "sleep 600", warn_command=False)
    job_id = submit(slurm_bed, job_dir, timeout=20)
    started = time.monotonic()
    job = wait_state(slurm_bed, job_id, {"TIMEOUT"}, timeout=180)
    print(f"TIMEOUT after {time.monotonic() - started:.0f} s")
    assert job.reason == "TimeLimit"
    assert sc.interpret(job, exit_code(job_dir)).reason == "stopped by Slurm at its time limit"
    # --signal=B:USR1@60 with a one-minute limit: the warning came, the command went on.
    assert (Path(job_dir) / sc.WARNING_FILE).exists()
    assert "time limit is near" in log_text(job_dir)
