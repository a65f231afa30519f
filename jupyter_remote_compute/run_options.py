"""The options every face takes to run a job (the CLI's ``run``, ``%remote_train``), parsed one way."""

from __future__ import annotations

import argparse
from typing import Any

from .engines.organization.client import job_machine
from .errors import InvalidSettings
from .pipelines.sweep import CONFIRM_ABOVE

RESOURCE_OPTIONS = ("gpus", "cpus", "memory", "nodes", "partition", "processes_per_node", "launcher")

#: How every face's command runs (the CLI, %remote_train, the New Job form, a pipeline step, the REST API).
COMMAND_RULE = (
    "one line for the machine's shell (sh), run in the job's folder as written, so &&, pipes and $VARS work; "
    "words given apart (the CLI's several arguments after --, a list in the REST API) are quoted one by one"
)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """--machine, --send, --bring-back, --env, --name, --timeout, --checkpoints, --checkpoint-every,
    --detach, --new, --registry-secret, the retries (--retry, --retry-on, --fallback), --notify, --notify-secret,
    the resources (--gpus, --cpus, --memory, --nodes, --partition, --procs-per-node, --launcher), the Python environment
    (--requirements, --package, --python, --same-env, --image, --runtime), then ``--`` and the command."""
    parser.add_argument(
        "--machine",
        help="machine or pool name from the Compute panel or compute.yaml (default: local, or on a hub the "
        "organization's default machine)",
    )
    parser.add_argument("--send", action="append", default=[], metavar="PATH_OR_GLOB", help="files the job needs")
    parser.add_argument(
        "--bring-back", dest="bring_back", action="append", default=[], metavar="PATH", help="files the job writes"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="NAME=VALUE or NAME=secret:SECRET_NAME"
    )
    parser.add_argument("--name", default="", help="a name for the job (panel, MLflow run)")
    parser.add_argument("--timeout", help="the longest the job may run, e.g. 3600, 30m, 2h")
    parser.add_argument(
        "--checkpoints",
        metavar="DIR",
        help="a folder of the job's (REMOTE_COMPUTE_CHECKPOINT_DIR) whose files come home while it runs",
    )
    parser.add_argument(
        "--checkpoint-every",
        dest="checkpoint_every",
        metavar="DURATION",
        help="how often the checkpoint folder is looked at, e.g. 30s, 5m (default 60 s)",
    )
    parser.add_argument("--detach", action="store_true", help="start the job and return at once")
    parser.add_argument("--new", action="store_true", help="start a new job even if the same work is running")
    parser.add_argument(
        "--registry-secret",
        dest="registry_secret",
        metavar="NAME",
        help="the Secret Manager entry (user:password) to pull the image with (default: the machine's)",
    )
    add_retry_options(parser)
    wanted = parser.add_argument_group("resources", "what the job asks its machine for (default: the machine's)")
    wanted.add_argument("--gpus", help="GPUs per node")
    wanted.add_argument("--cpus", help="CPUs per node")
    wanted.add_argument("--memory", help="memory per node, e.g. 32G or 512M")
    wanted.add_argument("--nodes", help="nodes (a scheduler's machines)")
    wanted.add_argument("--partition", help="the scheduler's partition (queue)")
    wanted.add_argument(
        "--procs-per-node",
        dest="processes_per_node",
        metavar="K",
        help="processes (ranks) per node, each with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT (Slurm)",
    )
    wanted.add_argument(
        "--launcher",
        help="how the processes start: torchrun (one per node, c10d rendezvous at the first node) or plain "
        "(the command once per process); JobSpec names the choices when another is given",
    )
    env = parser.add_argument_group("environment", "the Python environment the command runs in, built on the machine")
    env.add_argument(
        "--requirements", metavar="FILE", help="requirements.txt, pyproject.toml (+ uv.lock) or pylock.toml"
    )
    env.add_argument("--package", dest="packages", action="append", default=[], metavar="SPEC", help="a package to add")
    env.add_argument(
        "--python",
        help="the environment's Python version, e.g. 3.11 (with --notebook, a command such as python3.11 that runs it)",
    )
    env.add_argument("--same-env", dest="same_env", action="store_true", help="the packages of this Python, pinned")
    env.add_argument(
        "--image", help="a container image the command (and the environment) runs in (default: the machine's)"
    )
    env.add_argument(
        "--runtime", choices=("auto", "podman", "docker"), help="the container runtime for --image (default: auto)"
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- then the command: " + COMMAND_RULE,
    )


def is_python_version(value: str | None) -> bool:
    """``3.11`` is a Python version for the environment; ``python3``, a path, is a command (``--notebook``)."""
    return bool(value) and all(part.isdigit() for part in str(value).split("."))


def command_of(args: argparse.Namespace) -> list[str]:
    """The command after ``--``."""
    command = list(args.command)
    return command[1:] if command[:1] == ["--"] else command


def spec_settings(args: argparse.Namespace, command: str | list[str]) -> dict[str, Any]:
    """The job settings from parsed options, in the shape ``JobSpec.from_json`` validates. ``command``:
    a line for the machine's shell, or words (one word is taken as the line, quoted by the caller's shell)."""
    env: dict[str, str] = {}
    for pair in args.env:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InvalidSettings(f"env: {pair!r}: write NAME=VALUE or NAME=secret:SECRET_NAME", field="env")
        env[name] = value
    environment = {
        "requirements": getattr(args, "requirements", None),
        "packages": list(getattr(args, "packages", None) or []),
        "python": getattr(args, "python", None),  # JobSpec says what a version looks like
        "same_as_here": bool(getattr(args, "same_env", False)),
        "image": getattr(args, "image", None),
        # JobSpec refuses a runtime without an image, naming the field
        "runtime": getattr(args, "runtime", None),
    }
    settings = {
        "machine": job_machine(args.machine),
        "command": command if isinstance(command, str) else command[0] if len(command) == 1 else command,
        "send": list(args.send),
        "bring_back": list(args.bring_back),
        "env": env,
        "name": args.name,
        "timeout": args.timeout,
        # Checked with the rest of the spec (JobSpec.from_json), so errors name resources.<field>.
        "resources": {name: value for name in RESOURCE_OPTIONS if (value := getattr(args, name, None)) is not None},
    }
    for name in ("checkpoints", "checkpoint_every"):
        if getattr(args, name, None):
            settings[name] = getattr(args, name)
    if getattr(args, "registry_secret", None):
        settings["registry_secret"] = args.registry_secret
    settings.update(retry_settings(args))
    if any(environment.values()):  # none asked: the machine's defaults, if it has them
        settings["environment"] = environment
    return settings


def add_sweep_options(parser: argparse.ArgumentParser) -> None:
    """--sweep NAME=V1,V2,… (repeated: a grid), --sweep-random N, --max-parallel K, --yes (pipelines/sweep.py)."""
    sweep = parser.add_argument_group(
        "sweep", "run the command once per combination of parameters, each trial a job ({name} in the command)"
    )
    sweep.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=VALUES",
        help="a swept parameter: lr=0.001,0.01,0.1, or with --sweep-random a range: lr=loguniform(1e-4,1e-1), "
        "depth=int(2,8), x=uniform(0,1); {lr} in the command (or a --send/--bring-back path) is its value, "
        "and $lr is set too",
    )
    sweep.add_argument(
        "--sweep-random",
        dest="sweep_random",
        type=int,
        metavar="N",
        help="N trials, each drawing every parameter at random (a list is a choice), the same N on a rerun",
    )
    sweep.add_argument(
        "--max-parallel", dest="max_parallel", type=int, default=4, metavar="K", help="trials at once (default 4)"
    )
    sweep.add_argument(
        "--sweep-metric",
        dest="sweep_metric",
        metavar="METRIC[:min|max]",
        help="the MLflow metric the trials log that judges them (default goal: min), followed live",
    )
    sweep.add_argument(
        "--early-stop",
        dest="early_stop",
        choices=("median",),
        help="median: stop a trial whose metric is worse than the median of the others at the same step",
    )
    sweep.add_argument("--yes", action="store_true", help=f"run a sweep of over {CONFIRM_ABOVE} trials")


def add_retry_options(parser: argparse.ArgumentParser) -> None:
    """--retry N, --retry-on CAUSE,…, --fallback MACHINE (repeated): the job's retry policy and fallback."""
    retries = parser.add_argument_group("retries", "an attempt that ends for one of these causes runs again")
    retries.add_argument("--retry", metavar="N", help="attempts after the first, at most (default with --retry-on: 3)")
    retries.add_argument(
        "--retry-on",
        dest="retry_on",
        metavar="CAUSES",
        help="the causes retried, of lost,preempted,machine_unreachable,failed "
        "(default: lost,preempted,machine_unreachable)",
    )
    retries.add_argument(
        "--fallback",
        action="append",
        default=[],
        metavar="MACHINE",
        help="a machine (or a pool, whose queue it joins) a lost, preempted or unreachable attempt continues "
        "on (repeated: in order)",
    )
    told = parser.add_argument_group("webhooks", "who is told of each change of the job's state")
    told.add_argument(
        "--notify",
        action="append",
        default=[],
        metavar="URL",
        help="a URL each state change is POSTed to as JSON (repeated; secret:NAME: a URL kept in the Secret Manager)",
    )
    told.add_argument(
        "--notify-secret",
        dest="notify_secret",
        metavar="NAME",
        help="the Secret Manager entry that signs every --notify POST (HMAC-SHA256, X-Hub-Signature-256)",
    )


def retry_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``retry``, ``fallback`` and ``notify`` from --retry, --retry-on, --fallback, --notify and --notify-secret,
    as ``JobSpec.from_json`` checks them."""
    settings: dict[str, Any] = {}
    retry, on = getattr(args, "retry", None), getattr(args, "retry_on", None)
    if retry is not None or on is not None:
        policy: dict[str, Any] = {}
        if retry is not None:  # a number stays a string when it is none, for the error to show it
            policy["max"] = int(retry) if retry.strip().isdigit() else retry
        if on is not None:
            policy["on"] = [cause.strip() for cause in on.split(",") if cause.strip()]
        settings["retry"] = policy
    if getattr(args, "fallback", None):
        settings["fallback"] = list(args.fallback)
    secret = getattr(args, "notify_secret", None)
    if getattr(args, "notify", None) or secret:  # a secret without a URL is refused by JobSpec: notify[0].url
        settings["notify"] = [{"url": url, **({"secret": secret} if secret else {})} for url in args.notify or [None]]
    return settings
