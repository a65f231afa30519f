"""Slurm as text: the commands the slurm engine types on a login node and how it reads the answers.

Nothing here does I/O. Every function turns settings into an argv or a script, or turns a
command's output into typed records, so all of it is tested without a cluster and then again
against the real one in tests/test_slurm_bed.py.

Only text output formats are read (explicit ``--format`` strings with a ``|`` delimiter, and
``--parsable2`` for sacct): ``--json`` changes layout between Slurm versions. Times are asked for
as epoch seconds (``SLURM_TIME_FORMAT=%s``), so the cluster's time zone never matters.

The far side of a Slurm job uses the job folder of every push engine (``base.py``):

    <job dir>/batch.sh        the script sbatch runs (``batch_script``)
    <job dir>/command.sh      the job's command (``launcher.command_script``)
    <job dir>/work/           its working directory
    <job dir>/log             stdout and stderr (sbatch --output, appended across requeues), with
                              Slurm's own line when it takes the job off its node (``requeued``)
    <job dir>/exit_code       written atomically by batch.sh: accounting is often off
    <job dir>/slurm_job_id    written by ``SUBMIT_SH`` once sbatch accepted the job
    <job dir>/secrets.env     the job's secrets (0600) from submit until batch.sh starts and removes it
    <job dir>/time_limit_warning   created when Slurm's warning signal arrives

``sbatch.py`` builds a submission, ``queue.py`` reads squeue and says what a state means,
``partitions.py`` reads what a login node offers. Their names are all here, as the engine uses them.
"""

from __future__ import annotations

from .partitions import (
    CHECK_SH,
    SINFO_FORMAT,
    Partition,
    SlurmFacts,
    SlurmMissing,
    gpus_in_gres,
    parse_check,
    parse_scontrol_oneliner,
    parse_sinfo,
    parse_time_limit,
    refuse_unfit,
)
from .queue import (
    SQUEUE_FORMAT,
    TAKEN_OFF_STATES,
    Outcome,
    SlurmJob,
    interpret,
    out_of_memory,
    parse_squeue,
    pending_reason,
    requeued,
    scancel_argv,
    squeue_argv,
)
from .sbatch import (
    BATCH_SCRIPT,
    SECRETS_FILE,
    SLURM_JOB_ID_FILE,
    SUBMIT_SH,
    WARN_BEFORE_SECONDS,
    WARN_SIGNAL,
    WARNING_FILE,
    SlurmSettings,
    batch_script,
    job_name,
    parse_sbatch_output,
    sbatch_argv,
    slurm_path,
    time_limit_minutes,
    validate_sbatch_args,
    warn_before_seconds,
)

__all__ = [
    "BATCH_SCRIPT",
    "CHECK_SH",
    "SECRETS_FILE",
    "SINFO_FORMAT",
    "SLURM_JOB_ID_FILE",
    "SQUEUE_FORMAT",
    "SUBMIT_SH",
    "TAKEN_OFF_STATES",
    "WARNING_FILE",
    "WARN_BEFORE_SECONDS",
    "WARN_SIGNAL",
    "Outcome",
    "Partition",
    "SlurmFacts",
    "SlurmJob",
    "SlurmMissing",
    "SlurmSettings",
    "batch_script",
    "gpus_in_gres",
    "interpret",
    "job_name",
    "out_of_memory",
    "parse_check",
    "parse_sbatch_output",
    "parse_scontrol_oneliner",
    "parse_sinfo",
    "parse_squeue",
    "parse_time_limit",
    "pending_reason",
    "refuse_unfit",
    "requeued",
    "sbatch_argv",
    "scancel_argv",
    "slurm_path",
    "squeue_argv",
    "time_limit_minutes",
    "validate_sbatch_args",
    "warn_before_seconds",
]
