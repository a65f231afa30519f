"""A job whose attempt ends for a cause its retry policy names goes back to the queue as its next attempt:
on the next machine of its ``fallback`` after a machine's fault (or in a pool's queue, placed on another
of its machines), from the last checkpoint set that came home; a failing command is retried ``max``
times; a bad policy is refused at submit, naming the field."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import sshd_fixture
from pool_bed import add_pair, remove_b_folder
from procs import group_members
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.job import parse_time
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.schema.pool import PoolInput

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

# Training that resumes from its newest checkpoint: each step's state is written to a temporary name
# and renamed into place. On its first attempt (nothing to resume from) it stops after step 2 and
# waits for a "go" that never comes: the test kills its machine's process group there.
TRAIN = """\
import os, time
d = os.environ["REMOTE_COMPUTE_CHECKPOINT_DIR"]
steps = [int(n[5:-3]) for n in os.listdir(d) if n.startswith("step-") and n.endswith(".pt")]
start = max(steps, default=0)
state = open(os.path.join(d, "step-%d.pt" % start)).read() if start else ""
print("resuming from step", start, flush=True)
for step in range(start + 1, 6):
    state += "%d," % step
    with open(os.path.join(d, "step.tmp"), "w") as f:
        f.write(state)
    os.replace(os.path.join(d, "step.tmp"), os.path.join(d, "step-%d.pt" % step))
    print("step", step, flush=True)
    if start == 0 and step == 2:
        given_up = time.monotonic() + 300  # a test that failed never kills it: the job ends, not orphaned
        while not os.path.exists("go") and time.monotonic() < given_up:
            time.sleep(0.05)
with open("trained.txt", "w") as f:
    f.write("from %d: %s" % (start, state))
"""


@pytest.fixture
def boxes(workspace, make_service, ssh_agent_env):  # type: ignore[no-untyped-def]
    """A service with ssh machines ``box`` and its fallback ``box2`` (the bed's jump host, with a folder
    of its own, removed after the test), and the test bed."""
    bed = ssh_agent_env
    service = make_service(workspace)
    service.machines.add("box", "ssh", "127.0.0.1", bed.options(ssh_transport="openssh"))
    other_base = bed.base_dir + "-fallback"
    service.machines.add(
        "box2", "ssh", "127.0.0.1", bed.options(ssh_transport="openssh", port=bed.jump.port, base_dir=other_base)
    )
    yield service, bed
    shutil.rmtree(bed.far_path(other_base.removeprefix("~/")), ignore_errors=True)


def kill_far_group(job) -> None:  # type: ignore[no-untyped-def]
    """The machine loses the job: its whole far process group killed, no exit code left behind."""
    pgid = int((Path(job.handle["dir"]) / "pid").read_text().split()[0])
    os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: not group_members(pgid), message="the group to die")


def test_a_lost_attempt_resumes_on_the_fallback_machine_from_its_last_checkpoint(workspace, boxes, capsys):
    service, _bed = boxes
    (workspace / "train.py").write_text(TRAIN)
    spec = {
        "machine": "box",
        "command": "python3 train.py",
        "send": ["train.py"],
        "bring_back": ["trained.txt"],
        "checkpoints": "ckpt",
        "checkpoint_every": 0.2,
        "retry": {"max": 2, "on": ["lost", "machine_unreachable"]},
        "fallback": ["box2"],
    }
    job = service.submit(JobSpec.from_json(spec)).job
    home = workspace / ".punica/checkpoints" / job.id

    def second_step_home() -> object:
        current = service.advance(job.id)
        return (home / "step-2.pt").is_file() and current

    running = wait_for(second_step_home, timeout=120, message="step 2's checkpoint to come home")
    assert running.state == "running" and running.machine == "box"
    lost_at = time.monotonic()
    kill_far_group(running)

    def running_elsewhere() -> object:
        current = service.advance(job.id)
        # Started there (a short rest of training may have ended already within this advance).
        return current.machine == "box2" and current.started and current

    try:
        moved = wait_for(running_elsewhere, timeout=60, message="the next attempt to run on box2")
    except TimeoutError:
        pytest.fail(f"the next attempt did not run on box2: {service.get(job.id).public_json()}")
    resumed_after = time.monotonic() - lost_at
    assert (moved.attempts[0]["machine"], moved.attempts[0]["end"]) == ("box", "lost"), moved.attempts
    assert moved.attempts[0]["reason"].startswith("lost: the process vanished on box")
    assert moved.key == job.key and moved.id == job.id

    done = service.wait(job.id, timeout=120)
    assert done.state == "succeeded", done.reason
    # Resumed from the checkpoint of step 2 that came home with the attempt that was lost.
    assert (workspace / "trained.txt").read_text() == "from 2: 1,2,3,4,5,"
    assert [(a["machine"], a["end"]) for a in done.attempts] == [("box", "lost"), ("box2", "succeeded")]
    assert all(a["started"] and a["ended"] for a in done.attempts)
    usage = service.usage_record.attempts_of(job.id)
    assert [(a.attempt, a.machine, a.state) for a in usage] == [(1, "box", "requeued"), (2, "box2", "succeeded")]
    assert (home / "step-5.pt").read_text() == "1,2,3,4,5,"
    # The work lost is what came after its newest checkpoint at home, no more than the attempt ran.
    lost, ran = done.attempts[0], parse_time(done.attempts[0]["ended"]) - parse_time(done.attempts[0]["started"])
    assert 0 <= lost["lost_s"] <= ran and "lost_s" not in done.attempts[1]
    from jupyter_remote_compute.cli import main

    assert main(["--workspace", str(workspace), "jobs", "show", job.id]) == 0
    shown = capsys.readouterr().out.splitlines()
    at = shown.index("attempts:")
    assert shown[at + 1].startswith("  1. box: lost after "), shown
    assert "of work lost (the process vanished on box" in shown[at + 1]
    assert shown[at + 2].startswith("  2. box2: succeeded after "), shown
    print(f"\nfrom the machine lost to the next attempt running on the fallback: {resumed_after:.1f} s")


# Training that logs its loss to MLflow at every step and resumes after its newest checkpoint. At step 3
# it logs the loss, then waits for a "go" before writing that step's checkpoint: the first attempt is
# lost there (step 3 logged, its checkpoint never written), the second does step 3 again.
TRAIN_LOGGED = """\
import os, time
import mlflow
d = os.environ["REMOTE_COMPUTE_CHECKPOINT_DIR"]
done = [int(n[5:-3]) for n in os.listdir(d) if n.startswith("step-") and n.endswith(".pt")]
with mlflow.start_run():
    mlflow.log_param("lr", "0.1")
    for step in range(max(done, default=-1) + 1, 6):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        if step == 3:
            given_up = time.monotonic() + 300
            while not os.path.exists("go") and time.monotonic() < given_up:
                time.sleep(0.05)
        with open(os.path.join(d, "step.tmp"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(d, "step.tmp"), os.path.join(d, "step-%d.pt" % step))
"""


def test_the_attempts_of_a_job_are_one_mlflow_run_with_an_unbroken_metric(workspace, boxes, tracking_uri):
    from mlflow.tracking import MlflowClient

    service, _bed = boxes
    (workspace / "train.py").write_text(TRAIN_LOGGED)
    client = MlflowClient(tracking_uri)
    spec = {
        "machine": "box",
        "command": "python3 train.py",
        "send": ["train.py"],
        "checkpoints": "ckpt",
        "checkpoint_every": 0.2,
        "retry": {"max": 1},
        "fallback": ["box2"],
    }
    job = service.submit(JobSpec.from_json(spec)).job
    home = workspace / ".punica/checkpoints" / job.id

    def step_3_logged_and_step_2_home() -> object:
        current = service.advance(job.id)
        if not (current.handle.get("dir") and (home / "step-2.pt").is_file()):
            return None
        losses = list(Path(current.handle["dir"], "mlruns").glob("*/*/metrics/loss"))
        return losses and len(losses[0].read_text().splitlines()) == 4 and current

    first = wait_for(step_3_logged_and_step_2_home, timeout=120, message="step 3 logged, step 2 home")
    kill_far_group(first)
    # The lost attempt is recorded while the next one runs: the run is made, and stays open.
    second = wait_for(
        lambda: (j := service.advance(job.id)).machine == "box2" and j.started and j.mlflow_run_id and j,
        timeout=120,
        message="the next attempt to run on box2 and the first to be in MLflow",
    )
    run = client.get_run(second.mlflow_run_id)
    assert run.info.status == "RUNNING"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2, 3]
    tags = run.data.tags
    assert (tags["remote_compute.attempts"], tags["remote_compute.attempt.1.machine"]) == ("1", "box")
    assert tags["remote_compute.attempt.1.end"] == "lost"
    (Path(second.handle["dir"]) / "work" / "go").touch()

    done = service.wait(job.id, timeout=120)
    assert done.state == "succeeded", done.reason
    assert done.mlflow_run_id == run.info.run_id
    runs = client.search_runs([run.info.experiment_id], filter_string=f"tags.`remote_compute.job_id` = '{job.id}'")
    assert [r.info.run_id for r in runs] == [run.info.run_id]
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.1"}
    history = client.get_metric_history(run.info.run_id, "loss")
    # Steps 0..5 once each: step 3, logged by both attempts, keeps the first attempt's point.
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / (s + 1)) for s in range(6)]
    tags = run.data.tags
    assert tags["remote_compute.attempts"] == "2" and tags["remote_compute.machine"] == "box2"
    assert [(tags[f"remote_compute.attempt.{n}.machine"], tags[f"remote_compute.attempt.{n}.end"]) for n in (1, 2)] == [
        ("box", "lost"),
        ("box2", "succeeded"),
    ]
    logs = {a.path for a in client.list_artifacts(run.info.run_id, "remote_compute")}
    assert {"remote_compute/attempt-1.log", "remote_compute/log"} <= logs, logs
    # Each attempt's store went once it was in the run.
    assert not list(service.workspace.job_dir(job.id).glob("attempt-*/"))


def test_an_unreachable_machine_ends_its_attempt_past_its_limit_and_the_job_goes_to_the_fallback(
    workspace, boxes, tmp_path
):
    """A machine of its own sshd, stopped while the job runs (its sessions too: connections are refused):
    past the machine's ``unreachable_after`` the attempt ends machine_unreachable, asking it nothing more,
    and the next attempt runs on the fallback machine."""
    from far_python import far_python_bin

    service, bed = boxes
    sshd = sshd_fixture.start_sshd(
        bed.workdir,
        f"lonely-{os.getpid()}",
        bed.workdir / "authorized_keys",
        f"SetEnv PATH={far_python_bin()}:/usr/local/bin:/usr/bin:/bin",
    )
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(bed.known_hosts.read_text() + sshd.known_hosts_line)
    (workspace / "wait.sh").write_text(
        'i=0; while [ ! -f go ] && [ $i -lt 6000 ]; do sleep 0.05; i=$((i+1)); done; echo "went on"\n'
    )
    options = bed.options(ssh_transport="openssh", port=sshd.port, known_hosts=str(known_hosts), unreachable_after=1)
    service.machines.add("lonely", "ssh", "127.0.0.1", options)
    first = None
    try:
        spec = {
            "machine": "lonely",
            "command": "sh wait.sh",
            "send": ["wait.sh"],
            "retry": {"max": 1, "on": ["machine_unreachable"]},
            "fallback": ["box2"],
        }
        job = service.submit(JobSpec.from_json(spec)).job
        first = wait_for(
            lambda: (j := service.advance(job.id)).state == "running" and j, timeout=120, message="the job to run"
        )
        sshd.stop()
        try:
            moved = wait_for(
                lambda: (j := service.advance(job.id)).machine == "box2" and j.started and j,
                timeout=120,
                message="the next attempt to run on box2",
            )
        except TimeoutError:
            pytest.fail(f"the next attempt did not run on box2: {service.get(job.id).public_json()}")
        ended = moved.attempts[0]
        assert (ended["machine"], ended["end"]) == ("lonely", "machine_unreachable"), moved.attempts
        assert ended["reason"].startswith("machine_unreachable: lonely did not answer for 1s"), ended["reason"]
        (Path(moved.handle["dir"]) / "work" / "go").touch()
        done = service.wait(job.id, timeout=120)
        assert done.state == "succeeded", done.reason
        assert [(a["machine"], a["end"]) for a in done.attempts] == [
            ("lonely", "machine_unreachable"),
            ("box2", "succeeded"),
        ]
        assert b"went on" in service.read_log(job.id).data
    finally:
        sshd.stop()
        if first is not None:  # the first attempt's command, left running where nobody could reach it
            with contextlib.suppress(OSError, ValueError):
                kill_far_group(first)


def test_a_failing_exit_code_is_retried_max_times_then_fails_with_the_last_reason(workspace, make_service):
    service = make_service(workspace)
    spec = {"command": 'echo "try at $(date +%s%N)"; exit 3', "retry": {"max": 2, "exit_codes": [3]}}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    assert job.state == "failed"
    assert [(a["machine"], a["end"]) for a in job.attempts] == [("local", "failed")] * 3
    reasons = [a["reason"] for a in job.attempts]
    assert all(r.startswith("exit code 3: try at ") for r in reasons) and len(set(reasons)) == 3, reasons
    assert job.reason == reasons[-1]
    usage = service.usage_record.attempts_of(job.id)
    assert [(a.attempt, a.state) for a in usage] == [(1, "requeued"), (2, "requeued"), (3, "failed")]

    # An exit code the policy does not name ends the job at once.
    other = service.wait(service.submit(JobSpec.from_json({**spec, "command": "exit 4"})).job.id, timeout=60)
    assert other.state == "failed" and [a["end"] for a in other.attempts] == ["failed"]


def test_a_job_back_in_the_queue_is_taken_up_by_the_next_process_without_a_second_attempt(
    workspace, make_service, tmp_path
):
    """The process that requeued the attempt goes away; another (a restarted server, the CLI) drives the
    next attempt: one attempt queued, metered once, and the job ends with two."""
    marker = tmp_path / "failed-once"
    first = make_service(workspace)
    command = f"test -e {marker} || {{ touch {marker}; exit 3; }}"
    spec = JobSpec.from_json({"command": command, "retry": {"max": 3, "on": ["failed"], "backoff": "1s"}})
    job = first.submit(spec).job
    queued = wait_for(
        lambda: (j := first.advance(job.id)).state == "queued" and j.attempts and j,
        timeout=60,
        message="the first attempt to end and the next to be queued",
    )
    assert queued.reason.startswith("attempt 2 of at most 4: attempt 1 failed (exit code 3")
    first.close()

    second = make_service(workspace)
    done = second.wait(job.id, timeout=60)
    assert done.state == "succeeded", done.reason
    assert [a["end"] for a in done.attempts] == ["failed", "succeeded"]
    # The backoff: the second attempt started no sooner than a second after the first ended.
    assert parse_time(done.attempts[1]["started"]) - parse_time(done.attempts[0]["ended"]) >= 1.0
    usage = second.usage_record.attempts_of(job.id)
    assert [(a.attempt, a.state) for a in usage] == [(1, "requeued"), (2, "succeeded")]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"retry": {"max": -1}}, "retry.max"),
        ({"retry": {"max": 3, "on": ["lost", "oom"]}}, "retry.on[1]"),
        ({"retry": {"exit_codes": [0]}}, "retry.exit_codes[0]"),
        ({"retry": {"backoff": "soon"}}, "retry.backoff"),
        ({"retry": {"tries": 3}}, "retry.tries"),
        ({"retry": "always"}, "retry"),
        ({"fallback": ["box2", "box2"]}, "fallback[1]"),
    ],
)
def test_a_bad_retry_policy_is_refused_naming_the_field(settings, field):
    with pytest.raises(InvalidSettings) as info:
        JobSpec.from_json({"command": "true", **settings})
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")


def test_a_fallback_machine_that_cannot_take_the_job_is_refused_at_submit(workspace, make_service):
    service = make_service(workspace)
    service.machines.add("nb", "jupyter", "http://127.0.0.1:9", {"token_secret": "nb-token"})
    for fallback, problem in ((["nowhere"], "nowhere"), (["local"], "own machine"), (["nb"], "checkpoints")):
        spec = JobSpec.from_json({"command": "true", "checkpoints": "ckpt", "retry": 1, "fallback": fallback})
        with pytest.raises(InvalidSettings) as info:
            service.submit(spec)
        assert info.value.field == "fallback[0]" and problem in str(info.value), info.value
    assert service.list_jobs() == []


def test_the_cli_and_the_magic_take_the_retry_policy_and_the_fallback_machines():
    from jupyter_remote_compute.cli import build_parser
    from jupyter_remote_compute.magics import build_train_parser
    from jupyter_remote_compute.run_options import command_of, spec_settings

    words = ["--retry", "2", "--retry-on", "lost,failed", "--fallback", "b1", "--fallback", "b2", "--", "train"]
    for args in (build_parser(plugins=False).parse_args(["run", *words]), build_train_parser().parse_args(words)):
        spec = JobSpec.from_json(spec_settings(args, command_of(args)))
        assert spec.retry is not None and (spec.retry.max, spec.retry.on) == (2, ("lost", "failed"))
        assert spec.fallback == ("b1", "b2")
    for bad, field in ((["--retry", "2x"], "retry.max"), (["--retry-on", "lost,oom"], "retry.on[1]")):
        args = build_parser(plugins=False).parse_args(["run", *bad, "--", "train"])
        with pytest.raises(InvalidSettings) as info:
            JobSpec.from_json(spec_settings(args, command_of(args)))
        assert info.value.field == field
    plain = build_parser(plugins=False).parse_args(["run", "--", "train"])
    assert "retry" not in spec_settings(plain, command_of(plain)) and "fallback" not in spec_settings(
        plain, command_of(plain)
    )


@pytest.fixture
def pair(workspace, make_service, ssh_agent_env):  # type: ignore[no-untyped-def]
    """A service with the pool ``pair`` of ssh machines ``a`` and ``b`` (pool_bed.py)."""
    service = make_service(workspace)
    add_pair(service, ssh_agent_env)
    yield service
    remove_b_folder(ssh_agent_env)


@pytest.mark.parametrize(
    "named",
    [{"machine": "pair"}, {"machine": "a", "fallback": ["pair"]}],
    ids=["a pool's job", "a fallback pool"],
)
def test_a_lost_attempt_joins_the_pools_queue_and_resumes_on_another_of_its_machines(workspace, pair, named):
    service = pair
    (workspace / "train.py").write_text(TRAIN)
    spec = {
        "command": "python3 train.py",
        "send": ["train.py"],
        "bring_back": ["trained.txt"],
        "checkpoints": "ckpt",
        "checkpoint_every": 0.2,
        "retry": {"max": 1, "on": ["lost"]},
        **named,
    }
    job = service.submit(JobSpec.from_json(spec)).job
    home = workspace / ".punica/checkpoints" / job.id

    def second_step_home() -> object:
        current = service.advance(job.id)
        return (home / "step-2.pt").is_file() and current.state == "running" and current

    running = wait_for(second_step_home, timeout=120, message="step 2's checkpoint to come home")
    assert running.machine == "a"  # the pool's first machine with room, or the machine named
    kill_far_group(running)
    # The machine that lost it has room again, and is the pool's first: the next attempt goes to b.
    done = wait_for(
        lambda: (current := service.advance(job.id)).state in ("succeeded", "failed") and current,
        timeout=120,
        message="the next attempt to end",
    )
    assert done.state == "succeeded", done.reason
    assert [(a["machine"], a["end"]) for a in done.attempts] == [("a", "lost"), ("b", "succeeded")]
    assert done.pool == "pair" and done.placement.startswith("placed on b: ")
    assert (workspace / "trained.txt").read_text() == "from 2: 1,2,3,4,5,"


def test_a_fallback_pool_whose_machine_cannot_take_the_job_is_refused_at_submit(workspace, make_service):
    service = make_service(workspace)
    service.machines.add("nb", "jupyter", "http://127.0.0.1:9", {"token_secret": "nb-token"})
    service.machines.put_pool("mixed", PoolInput.from_json({"machines": ["local", "nb"]}))
    spec = {"command": "true", "checkpoints": "ckpt", "retry": 1, "fallback": ["mixed"], "machine": "local"}
    with pytest.raises(InvalidSettings) as info:
        service.submit(JobSpec.from_json(spec))
    assert info.value.field == "fallback[0]" and "pool mixed's machine nb" in str(info.value), info.value
    assert service.list_jobs() == []
