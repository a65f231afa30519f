"""engines/slurm_commands/ without a cluster: validation, argv, scripts and every parser.

Canned outputs here are copied from what Slurm 22.05 printed on the test bed (or, for sacct with
accounting and multi-partition sinfo, from the formats Slurm documents); tests/test_slurm_bed.py
runs the same parsers on the real commands.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jupyter_remote_compute.engines import slurm_commands as sc
from jupyter_remote_compute.engines.launcher import launch_input
from jupyter_remote_compute.engines.resources import Resources, format_memory, parse_memory_mb
from jupyter_remote_compute.errors import InvalidSettings

# -- resources ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("32G", 32768),
        ("512M", 512),
        ("512", 512),
        (512, 512),
        ("1.5G", 1536),
        ("2T", 2 * 1024 * 1024),
        ("100K", 1),
        ("4GB", 4096),
        ("4 GiB", 4096),
        ("8g", 8192),
    ],
)
def test_memory_amounts(text: str | int, mb: int) -> None:
    assert parse_memory_mb(text) == mb


@pytest.mark.parametrize("text", [" ", "lots", "-1G", "0", "12X", "1.2.3G", True])
def test_bad_memory_names_the_field(text: object) -> None:
    with pytest.raises(InvalidSettings) as err:
        Resources.from_json({"memory": text}, "resources.")
    assert err.value.field == "resources.memory" and "memory" in err.value.message


def test_memory_is_written_back_as_slurm_spells_it() -> None:
    assert format_memory(32768) == "32G" and format_memory(1536) == "1536M"
    assert Resources.from_json({"memory": "1.5G"}).to_json() == {"memory": "1536M"}


def test_resources_from_json_round_trip() -> None:
    data = {"gpus": 2, "cpus": "8", "memory": "32G", "nodes": 1, "partition": "gpu"}
    res = Resources.from_json(data)
    assert res == Resources(gpus=2, cpus=8, memory_mb=32768, nodes=1, partition="gpu")
    assert res.to_json() == {"gpus": 2, "cpus": 8, "memory": "32G", "nodes": 1, "partition": "gpu"}
    assert Resources.from_json({"gpus": None, "cpus": ""}) == Resources()


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"cpus": 0}, "cpus", "at least 1"),
        ({"cpus": 2.5}, "cpus", "whole number"),
        ({"nodes": -1}, "nodes", "at least 1"),
        ({"gpus": -1}, "gpus", "at least 0"),
        ({"gpus": True}, "gpus", "whole number"),
        ({"partition": "gpu; rm -rf /"}, "partition", "not a Slurm name"),
        (
            {"ram": "1G"},
            "ram",
            "unknown setting; use gpus, cpus, memory, nodes, partition, processes_per_node or launcher",
        ),
    ],
)
def test_bad_resources_name_their_field(data: dict, field: str, words: str) -> None:
    with pytest.raises(InvalidSettings, match=words) as err:
        Resources.from_json(data)
    assert err.value.field == field and err.value.message.startswith(field)


def test_resources_must_be_a_mapping() -> None:
    with pytest.raises(InvalidSettings, match="resources: expected a mapping") as err:
        sc.SlurmSettings.from_options({"resources": "4 gpus"})
    assert err.value.field == "resources"


def test_job_resources_override_machine_defaults_field_by_field() -> None:
    defaults = Resources(cpus=4, memory_mb=8192, partition="cpu")
    assert Resources(cpus=8).over(defaults) == Resources(cpus=8, memory_mb=8192, partition="cpu")


# -- sbatch ---------------------------------------------------------------------------


def test_sbatch_argv_maps_every_resource() -> None:
    settings = sc.SlurmSettings(partition="batch", account="proj1", qos="normal", sbatch_args=("--exclusive",))
    res = Resources(gpus=2, cpus=8, memory_mb=32768, nodes=2, partition="gpu")
    argv = sc.sbatch_argv("j1", "/shared/jobs/j1", res, settings, 3601)
    assert argv == [
        "sbatch",
        "--exclusive",
        "--parsable",
        "--job-name=jrc-j1",
        "--partition=gpu",  # the job's choice beats the machine's
        "--account=proj1",
        "--qos=normal",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--mem=32G",
        "--gres=gpu:2",
        "--time=61",  # 3601 s rounded up to whole minutes
        "--signal=B:USR1@300",
        "--chdir=/shared/jobs/j1/work",
        "--output=/shared/jobs/j1/log",
        "--open-mode=append",
        "--export=ALL",
        "/shared/jobs/j1/batch.sh",
    ]


def test_sbatch_argv_with_nothing_asked_leaves_it_to_the_cluster() -> None:
    argv = sc.sbatch_argv("j2", "/s/j%2", Resources(), sc.SlurmSettings(), None)
    assert not [a for a in argv if a.startswith(("--partition", "--mem", "--time", "--gres", "--cpus", "--nodes"))]
    assert "--output=/s/j%%2/log" in argv  # % starts a pattern in sbatch's file names
    assert "--signal=B:USR1@300" in argv


@pytest.mark.parametrize(("seconds", "minutes", "warn"), [(1, 1, 60), (60, 1, 60), (61, 2, 60), (600, 10, 300)])
def test_time_limit_rounds_up_and_warning_fits_inside(seconds: float, minutes: int, warn: int) -> None:
    assert sc.time_limit_minutes(seconds) == minutes
    assert sc.warn_before_seconds(minutes) == warn


def test_sbatch_argv_refuses_a_relative_job_dir() -> None:
    with pytest.raises(ValueError, match="absolute"):
        sc.sbatch_argv("j", "~/jobs/j", Resources(), sc.SlurmSettings(), None)


@pytest.mark.parametrize(
    "arg",
    [
        "--output=x",
        "--out=x",
        "-o",
        "-ox",
        "--job-name=a",
        "-J",
        "--parsable",
        "--time=5",
        "-t5",
        "--mem=1G",
        "--gres=gpu:1",
        "--gpus-per-task=1",
        "--partition=x",
        "-p",
        "--wrap=ls",
        "--chdir=/",
        "--export=NONE",
        "-c4",
        "-N2",
    ],
)
def test_extra_sbatch_args_may_not_take_what_the_engine_owns(arg: str) -> None:
    with pytest.raises(InvalidSettings, match="set by the engine") as err:
        sc.validate_sbatch_args(["--exclusive", arg])
    assert err.value.field == "sbatch_args" and "sbatch_args[1]" in err.value.message


def test_extra_sbatch_args_accepts_ordinary_options() -> None:
    args = ["--constraint=a100", "--exclusive", "--reservation", "maint", "--mail-type=END", "-C", "v100"]
    assert sc.validate_sbatch_args(args) == tuple(args)


@pytest.mark.parametrize("value", ["--exclusive", None, ["--x\n--output=y"], ["value-first"], [3]])
def test_extra_sbatch_args_must_be_a_clean_list(value: object) -> None:
    with pytest.raises(InvalidSettings):
        sc.validate_sbatch_args(value)


def test_machine_settings_from_options() -> None:
    settings = sc.SlurmSettings.from_options(
        {"partition": "gpu", "account": "", "sbatch_args": ["--exclusive"], "resources": {"memory": "4G"}}
    )
    assert settings == sc.SlurmSettings(
        partition="gpu", sbatch_args=("--exclusive",), defaults=Resources(memory_mb=4096)
    )
    with pytest.raises(InvalidSettings) as err:
        sc.SlurmSettings.from_options({"resources": {"cpus": 0}})
    assert err.value.field == "resources.cpus"
    assert sc.SlurmSettings.from_options({}).rendezvous_timeout == 600
    assert sc.SlurmSettings.from_options({"rendezvous_timeout": 30}).rendezvous_timeout == 30
    with pytest.raises(InvalidSettings) as err:
        sc.SlurmSettings.from_options({"rendezvous_timeout": "5m"})
    assert err.value.field == "rendezvous_timeout" and "whole number of seconds" in str(err.value)


@pytest.mark.parametrize(("text", "job_id"), [("1234\n", "1234"), ("77;cluster2\n", "77")])
def test_sbatch_parsable_answer(text: str, job_id: str) -> None:
    assert sc.parse_sbatch_output(text) == job_id


def test_sbatch_answer_without_a_job_id_is_an_error() -> None:
    with pytest.raises(ValueError, match="no such partition"):
        sc.parse_sbatch_output("sbatch: error: no such partition\n")


# -- the far-side scripts, run by a real sh with a stand-in for sbatch ---------------------


def run_sh(script: str, *args: str, stdin: bytes = b"", cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script, "sh", *args], input=stdin.decode(), capture_output=True, text=True, cwd=cwd
    )


def test_submit_script_exports_the_environment_and_records_the_id(tmp_path: Path) -> None:
    fake_sbatch = tmp_path / "fake-sbatch"
    fake_sbatch.write_text(
        '#!/bin/sh\nprintf "%s|%s|%s\\n" "$SECRET_X" "$PLAIN" "$*" > "$(dirname "$0")/seen"\necho 42\n'
    )
    fake_sbatch.chmod(0o755)
    stdin = launch_input({"PLAIN": "a b"}, {"SECRET_X": "s3cr=t\nline2"})
    done = run_sh(sc.SUBMIT_SH, str(tmp_path), str(fake_sbatch), "--parsable", stdin=stdin)
    assert done.returncode == 0 and done.stdout == "42\n"
    assert (tmp_path / "seen").read_text() == "s3cr=t\nline2|a b|--parsable\n"  # secret via env, not argv
    assert (tmp_path / "slurm_job_id").read_text() == "42\n"
    # A second submission finds the first and does not call sbatch again.
    (tmp_path / "seen").unlink()
    assert run_sh(sc.SUBMIT_SH, str(tmp_path), str(fake_sbatch), stdin=stdin).stdout == "42\n"
    assert not (tmp_path / "seen").exists()


def test_submit_script_passes_on_sbatchs_failure(tmp_path: Path) -> None:
    done = run_sh(sc.SUBMIT_SH, str(tmp_path), "sh", "-c", "echo 'sbatch: error: nope' >&2; exit 1")
    assert done.returncode == 1 and "nope" in done.stderr and not (tmp_path / "slurm_job_id").exists()


def test_batch_script_runs_the_command_in_work_and_records_its_exit_code(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "command.sh").write_text(
        'echo "$PWD $WORLD_SIZE $NODE_RANK $MASTER_PORT $MLFLOW_TRACKING_URI"\nexit 5\n'
    )
    (tmp_path / "exit_code").write_text("0\n")  # left by an earlier attempt (a requeue)
    done = run_sh(sc.batch_script(str(tmp_path)), cwd=tmp_path)
    assert done.returncode == 5 and (tmp_path / "exit_code").read_text() == "5\n"
    assert f"{tmp_path}/work 1 0 20000 file://{tmp_path}/mlruns" in done.stdout
    assert "attempt 1" in done.stdout


def test_batch_script_quotes_a_job_dir_with_spaces(tmp_path: Path) -> None:
    job_dir = tmp_path / "a b 'c'"
    (job_dir / "work").mkdir(parents=True)
    (job_dir / "command.sh").write_text("touch made\n")
    assert run_sh(sc.batch_script(str(job_dir))).returncode == 0
    assert (job_dir / "work" / "made").exists() and (job_dir / "exit_code").read_text() == "0\n"


def test_batch_script_of_several_processes_starts_them_through_srun() -> None:
    plain = sc.batch_script("/j", Resources(nodes=4, processes_per_node=2))
    assert (
        'srun --kill-on-bad-exit=1 --nodes="$NNODES" --ntasks="$WORLD_SIZE" --ntasks-per-node="$LOCAL_WORLD_SIZE" '
        'sh "$jobdir/rank.sh" "$jobdir" plain 0 &'
    ) in plain
    assert "LOCAL_WORLD_SIZE=2\nWORLD_SIZE=$((NNODES * LOCAL_WORLD_SIZE))" in plain
    torchrun = sc.batch_script("/j", Resources(nodes=2, processes_per_node=4, launcher="torchrun", gpus=4))
    assert '--ntasks="$NNODES" --ntasks-per-node=1 sh "$jobdir/rank.sh" "$jobdir" torchrun 4 "$join" &' in torchrun
    assert "\njoin=600\n" in torchrun and "never joined" in torchrun and "never joined" not in plain
    assert "srun" not in sc.batch_script("/j", Resources(nodes=1))
    # The warning goes to srun (which passes it on to every rank) for plain ranks only; torchrun would stop
    # its workers on it, and warn_command false keeps it from them all.
    forward = '\n  kill -s USR1 "$child" 2>/dev/null\n'
    assert forward in plain and forward not in torchrun
    assert forward not in sc.batch_script("/j", Resources(nodes=4, processes_per_node=2), warn_command=False)


def test_sbatch_asks_one_task_per_process_or_per_node_for_torchrun() -> None:
    def asked(**resources: object) -> list[str]:
        argv = sc.sbatch_argv("j1", "/j", Resources(**resources), sc.SlurmSettings(), None)  # type: ignore[arg-type]
        return [a for a in argv if a.startswith(("--ntasks-per-node", "--cpus-per-task", "--nodes"))]

    assert asked(nodes=2, processes_per_node=2, cpus=4) == ["--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=2"]
    # torchrun is one task per node starting the node's processes: a CPU each at least.
    assert asked(processes_per_node=3, launcher="torchrun") == ["--ntasks-per-node=1", "--cpus-per-task=3"]
    assert asked() == ["--ntasks-per-node=1"]


# -- squeue and sacct -----------------------------------------------------------------

# squeue_argv's output on the test bed (SLURM_TIME_FORMAT=%s), names added.
SQUEUE_OUT = """\
3|PENDING|N/A|1796028654|NONE|256M||jrc-b|Resources
4|PENDING|1827564739|1796028654|1827565339|256M||jrc-c|Priority
1|RUNNING|1796028655|1796028653|1796029255|64M|jrcnode009d5179|jrc-a|None
7|FAILED|1796028658|1796028654|1796028659|2G|jrcnode009d5179|jrc-d|NonZeroExitCode
8|PENDING|N/A|1796028654|N/A|256M||odd|name|ReqNodeNotAvail, UnavailableNodes:n[1-2]
"""


def test_parse_squeue() -> None:
    jobs = sc.parse_squeue(SQUEUE_OUT)
    assert jobs["3"] == sc.SlurmJob("3", "PENDING", "Resources", 1796028654.0, None, "", "jrc-b", memory="256M")
    assert jobs["1"].reason == "" and jobs["1"].start == 1796028655.0 and jobs["1"].nodes == "jrcnode009d5179"
    assert (jobs["7"].end, jobs["7"].memory) == (1796028659.0, "2G")
    assert jobs["4"].start == 1827564739.0  # Slurm's estimate for a pending job
    # Only the reason is free text; a name with the delimiter would shift it, so names are ours.
    assert jobs["8"].name == "odd"


def test_squeue_forgetting_the_only_job_asked_for_is_an_empty_answer() -> None:
    assert sc.parse_squeue("", "slurm_load_jobs error: Invalid job id specified\n", 1) == {}
    with pytest.raises(ValueError, match="Unable to contact"):
        sc.parse_squeue("", "slurm_load_jobs error: Unable to contact slurm controller\n", 1)


def test_squeue_argv() -> None:
    argv = sc.squeue_argv(["1", "2"])
    assert argv[:3] == ["env", "SLURM_TIME_FORMAT=%s", "squeue"] and argv[-1] == "--jobs=1,2"
    assert sc.squeue_argv(user="ann")[-1] == "--user=ann" and sc.squeue_argv()[-1] == "--me"
    with pytest.raises(ValueError):
        sc.squeue_argv(["1;reboot"])


def test_parse_squeue_refuses_another_format() -> None:
    with pytest.raises(ValueError, match="not in"):
        sc.parse_squeue("JOBID PARTITION NAME\n")


# -- states -------------------------------------------------------------------------


def job(state: str, reason: str = "", exit_code: int | None = None, memory: str = "") -> sc.SlurmJob:
    return sc.SlurmJob("9", state, reason, None, None, "", "jrc-x", exit_code=exit_code, memory=memory)


@pytest.mark.parametrize(
    ("state", "reason", "file_code", "ours", "words"),
    [
        ("PENDING", "Resources", None, "pending", "resources"),
        ("PENDING", "Priority", None, "pending", "higher priority"),
        ("PENDING", "QOSMaxJobsPerUserLimit", None, "pending", "QOS allows"),
        ("PENDING", "ReqNodeNotAvail, UnavailableNodes:n1", None, "pending", "down, drained or reserved"),
        ("PENDING", "PartitionTimeLimit", None, "pending", "will not start"),
        ("PENDING", "SomethingNew", None, "pending", "waiting (SomethingNew)"),
        ("CONFIGURING", "", None, "pending", "set up"),
        ("REQUEUED", "", None, "pending", "requeued"),
        ("RUNNING", "", None, "running", ""),
        ("COMPLETING", "", 0, "running", ""),
        ("SUSPENDED", "", None, "running", "suspended"),
        ("COMPLETED", "", 0, "exited", ""),
        ("FAILED", "NonZeroExitCode", 3, "exited", ""),
        ("FAILED", "JobLaunchFailure", None, "failed", "could not run its batch script"),
        ("TIMEOUT", "TimeLimit", 143, "failed", "time limit"),
        ("OUT_OF_MEMORY", "", None, "failed", "out of memory"),
        ("NODE_FAIL", "", None, "failed", "node it ran on failed"),
        ("PREEMPTED", "", None, "failed", "preempted"),
        ("BOOT_FAIL", "", None, "failed", "boot"),
        ("DEADLINE", "", None, "failed", "deadline"),
        ("CANCELLED", "", 143, "cancelled", "cancelled"),
        ("CANCELLED by 0", "", None, "cancelled", "administrator"),
        ("CANCELLED by 1001", "", None, "cancelled", "user id 1001"),
        ("SOME_FUTURE_STATE", "", None, "running", "SOME_FUTURE_STATE"),
    ],
)
def test_states_in_our_words(state: str, reason: str, file_code: int | None, ours: str, words: str) -> None:
    outcome = sc.interpret(job(state, reason), file_code)
    assert outcome.state == ours and words in outcome.reason
    if ours == "exited":
        assert outcome.exit_code == file_code


def test_memory_kill_by_sampling_is_read_from_the_log() -> None:
    # What jobacct_gather's OverMemoryKill wrote on the test bed; Slurm's state says only FAILED.
    tail = "slurmstepd-n1: error: StepId=1.batch exceeded memory limit (429477888 > 67108864), being killed\n"
    outcome = sc.interpret(job("FAILED", "JobLaunchFailure", memory="64M"), None, tail)
    assert outcome.state == "failed"
    assert outcome.reason.startswith("out of memory: the job exceeded its 64M limit"), outcome.reason
    # Without squeue's memory field the reason still says what happened, without a made-up figure.
    assert "exceeded its memory limit" in sc.interpret(job("FAILED", "JobLaunchFailure"), None, tail).reason


def test_a_job_slurm_forgot_is_decided_by_its_exit_code_file() -> None:
    assert sc.interpret(None, 0) == sc.Outcome("exited", exit_code=0)
    assert sc.interpret(None, None).state == "lost"


# Slurm 22.05's own lines (slurmstepd's), as the bed's job logs hold them.
REQUEUE_LINE = "slurmstepd-n1: error: *** JOB 9 ON n1 CANCELLED AT 2026-12-06T01:41:24 DUE TO JOB REQUEUE ***"
NODE_LINE = (
    "slurmstepd-n1: error: *** JOB 9 ON n1 CANCELLED AT 2026-12-06T01:41:34 DUE TO NODE FAILURE, "
    "SEE SLURMCTLD LOG FOR DETAILS ***"
)
PREEMPT_LINE = "slurmstepd-n1: error: *** JOB 9 ON n1 CANCELLED AT 2026-12-06T01:41:44 DUE TO PREEMPTION ***"


@pytest.mark.parametrize(
    ("line", "cause", "words"),
    [
        (REQUEUE_LINE, "preempted", "Slurm requeued it, taking it off n1: *** JOB 9 ON n1"),
        (NODE_LINE, "lost", "its node n1 failed: *** JOB 9 ON n1"),
        (PREEMPT_LINE, "preempted", "Slurm preempted it on n1 for a higher-priority job: *** JOB 9"),
    ],
)
@pytest.mark.parametrize("state", ["PENDING", "REQUEUED", "CANCELLED by 1005", "NODE_FAIL"])
def test_a_job_slurm_took_off_its_node_ends_its_attempt_quoting_slurm(
    line: str, cause: str, words: str, state: str
) -> None:
    said = sc.requeued(job(state, "BeginTime"), f"step 2\n{line}\n")
    assert said is not None and (said.state, said.cause) == ("lost", cause)
    assert words in said.reason and said.reason.endswith("***")


def test_on_several_nodes_the_node_that_failed_is_the_one_srun_names() -> None:
    tail = f"[n1 rank 0] up\n[n2 rank 1] up\nsrun: error: Node failure on n2\n{NODE_LINE}\n"
    said = sc.requeued(job("NODE_FAIL"), tail)
    assert said is not None and said.cause == "lost" and said.reason.startswith("its node n2 failed: *** JOB 9 ON n1")


def test_slurms_line_about_another_job_or_a_running_job_is_not_this_attempts_end() -> None:
    other = REQUEUE_LINE.replace("JOB 9 ", "JOB 8 ")
    assert sc.requeued(job("PENDING", "BeginTime"), other) is None
    assert sc.requeued(job("RUNNING"), REQUEUE_LINE) is None  # Slurm runs it again: not read from a pending state
    assert sc.requeued(job("PENDING", "BeginTime"), "step 2\n*** JOB 9 ON n1 CANCELLED AT 2026 ***\n") is None
    # Requeued, run again by Slurm, then cancelled: the last time Slurm stopped it says how it ended.
    cancelled = "slurmstepd-n1: error: *** JOB 9 ON n1 CANCELLED AT 2026-12-06T01:50:00 ***"
    assert sc.requeued(job("CANCELLED"), f"{REQUEUE_LINE}\nattempt 2\n{cancelled}\n") is None


def test_scancel_argv() -> None:
    assert sc.scancel_argv(["5", "6"]) == ["scancel", "5", "6"]


# -- check ----------------------------------------------------------------------------

SINFO_OUT = """\
gpu*|up|1-00:00:00|2|idle|64|512000|gpu:a100:4(S:0-1)|g[1-2]
gpu*|up|1-00:00:00|1|mixed|64|512000|gpu:a100:4(S:0-1)|g3
cpu|up|30:00|8|idle|32+|128000+|(null)|c[1-8]
old|down|infinite|1|drained|4|8000|(null)|o1
"""


def test_parse_sinfo_groups_partitions() -> None:
    gpu, cpu, old = sc.parse_sinfo(SINFO_OUT)
    assert (gpu.name, gpu.default, gpu.nodes, gpu.node_states) == ("gpu", True, 3, {"idle": 2, "mixed": 1})
    assert (gpu.gpus_per_node, gpu.cpus_per_node, gpu.time_limit_minutes) == (4, 64, 24 * 60)
    assert (cpu.cpus_per_node, cpu.memory_mb_per_node, cpu.time_limit_minutes, cpu.gpus_per_node) == (32, 128000, 30, 0)
    assert (old.available, old.time_limit_minutes) == ("down", None)


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("infinite", None),
        ("UNLIMITED", None),
        ("5", 5),
        ("30:00", 30),
        ("30:01", 31),
        ("2:00:00", 120),
        ("1-00:00:00", 1440),
        ("2-12:30:00", 3630),
    ],
)
def test_time_limits(text: str, minutes: int | None) -> None:
    assert sc.parse_time_limit(text) == minutes


@pytest.mark.parametrize(
    ("gres", "gpus"), [("(null)", 0), ("gpu:2", 2), ("gpu:a100:4(S:0-1)", 4), ("gpu:2,shard:8", 2)]
)
def test_gpus_in_gres(gres: str, gpus: int) -> None:
    assert sc.gpus_in_gres(gres) == gpus


CHECK_OUT = """\
@@version
slurm-wlm 22.05.8
@@rc 0
@@partitions
debug*|up|infinite|1|idle|2|24105|(null)|node1
@@rc 0
@@user
ann
@@rc 0
@@account
proj-ml
@@rc 0
"""


def test_parse_check_with_accounting() -> None:
    facts = sc.parse_check(CHECK_OUT)
    assert (facts.version, facts.user, facts.default_account, facts.accounting) == ("22.05.8", "ann", "proj-ml", True)
    assert facts.to_json()["partitions"][0]["name"] == "debug"


def test_parse_check_without_slurm_commands() -> None:
    with pytest.raises(sc.SlurmMissing, match="no sbatch, sinfo on its PATH"):
        sc.parse_check("@@missing sbatch\n@@missing sinfo\n@@version\nsh: sinfo: not found\n@@rc 127\n")


def test_the_check_script_asks_sinfo_in_the_format_the_parser_reads() -> None:
    assert f"--format='{sc.SINFO_FORMAT}'" in sc.CHECK_SH


def test_fit_is_checked_against_the_partition() -> None:
    parts = sc.parse_sinfo(SINFO_OUT)
    sc.refuse_unfit(Resources(gpus=4, cpus=64), parts)  # the default partition, gpu
    with pytest.raises(InvalidSettings, match="gpus: 1 asked, but partition 'cpu' has at most 0") as err:
        sc.refuse_unfit(Resources(gpus=1, partition="cpu"), parts)
    assert err.value.field == "gpus"
    with pytest.raises(InvalidSettings, match="memory: 1000G asked") as err:
        sc.refuse_unfit(Resources(memory_mb=1000 * 1024), parts)
    with pytest.raises(InvalidSettings, match="'nope' is not a partition here") as err:
        sc.refuse_unfit(Resources(), parts, default_partition="nope")
    assert err.value.field == "partition"
