"""A job's container image: the reference, the runtime that runs it, and how its command is wrapped.

A job whose ``environment.image`` names one runs its command inside it (``engines/farside/container.sh``,
the body of its ``command.sh``) on the kinds whose engine names runtimes (``Engine.image_runtimes``):
local and ssh (detached processes), slurm (in the batch job, podman only) and agent: the job folder
mounted at its own path, so the launcher, the log, the outputs and the job's MLflow store are the same
as outside. A Python environment asked for beside the image is built inside it (``environments/environment.py``),
in the machine's env cache mounted at its own path. The machine's ``environment`` option, else its
options ``image`` and ``container_runtime``, give the default image; ``container_network`` (host, none)
and ``container_gpus`` (none, all) are the machine's.

The reference is pinned on the machine the first time it runs there (``<base>/images/``); the far side
opens the job's log with the line ``image <ref> <digest> (<runtime> <version>, <rootless|rootful>)``,
which comes back with the log and tags the MLflow run (``log_image``).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..engines import farside
from ..engines.base import Engine, EngineError
from ..engines.launcher import JOB_ENV_SH, READ_ENV_SH, STORE_PLUGIN_DIR, STORE_SCHEME, command_script
from ..engines.resources import Resources
from ..errors import InvalidSettings
from ..schema.environment import Image

NETWORKS = ("host", "none")
#: The machine option container_gpus: whether its jobs' containers get all its GPUs without asking.
MACHINE_GPUS = ("none", "all")
#: What makes a runtime hand a container NVIDIA GPUs, named when a machine lacks it.
NVIDIA_HINT = {
    "podman": "install the NVIDIA Container Toolkit and run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`",
    "docker": "install the NVIDIA Container Toolkit, run `nvidia-ctk runtime configure --runtime=docker` "
    "and restart dockerd",
}
#: What to install, named in the refusal when a machine has no runtime.
INSTALL_HINT = {"podman": "apt-get install podman", "docker": "apt-get install docker.io"}

TAG_IMAGE = "remote_compute.image"
TAG_DIGEST = "remote_compute.image_digest"
_LOG_LINE = re.compile(r"^image (\S+) (sha256:[0-9a-f]{64}) \((\S+) (\S*), (rootless|rootful)\)$", re.MULTILINE)
#: container.sh prints its line before the command starts: it is among the first of the log.
_HEAD_BYTES = 64 << 10


def machine_default(options: Mapping[str, Any]) -> Image | None:
    """The image the machine's jobs run in unless they name their own (options ``image``, ``container_runtime``)."""
    ref = options.get("image")
    if not ref:
        return None
    return Image.from_json({"ref": ref, "runtime": options.get("container_runtime") or "auto"}, "options.image")


def network_of(options: Mapping[str, Any]) -> str:
    """The container's network: the host's own (default) or none; never the runtime's bridge."""
    network = options.get("container_network") or "host"
    if network not in NETWORKS:
        raise InvalidSettings(
            f"options.container_network: {network!r} is not one of {', '.join(NETWORKS)}",
            field="options.container_network",
        )
    return network


#: The spec's field an image is asked for in, named by every refusal.
FIELD = "environment.image"


def admit(image: Image, machine: str, kind: str, runtimes: Sequence[str], facts: Mapping[str, Any] | None) -> None:
    """Refuse, at submit, an image on a machine that cannot run it, naming what to install.

    ``runtimes`` are those the machine's kind runs images in (``Engine.image_runtimes``), ``facts``
    its ``Engine.image_facts`` (``containers``: the runtimes installed, from facts.sh; None: unknown).
    """
    if not runtimes:
        raise InvalidSettings(
            f"{FIELD}: {machine} is a {kind} machine, which does not run container images; "
            "use a local, ssh, slurm, agent or skypilot machine",
            field=FIELD,
        )
    if image.runtime != "auto" and image.runtime not in runtimes:
        raise InvalidSettings(
            f"environment.runtime: {machine} is a {kind} machine, whose jobs run images in {' or '.join(runtimes)}, "
            f"not {image.runtime}",
            field="environment.runtime",
        )
    if facts is None:
        return  # not known before the machine exists (a SkyPilot cluster not up): container.sh says
    installed = {c["runtime"] for c in facts.get("containers") or ()}
    wanted = [image.runtime] if image.runtime != "auto" else list(runtimes)
    if not installed.intersection(wanted):
        hint = " or ".join(f"{w} ({INSTALL_HINT[w]})" for w in wanted)
        unused = sorted(installed - set(wanted))
        has = f" (it has {', '.join(unused)}, which jobs' images do not run in)" if unused else ""
        raise InvalidSettings(
            f"{FIELD}: {machine} has no container runtime to run {image.ref}{has}: install {hint}", field=FIELD
        )


def gpu_request(resources: Resources, options: Mapping[str, Any], engine: Engine) -> str:
    """container.sh's GPUS for a job: the count it asks for (``resources.gpus``), all of the machine's
    (option ``container_gpus: all``), those its machine chooses per job (the agent's), or none."""
    wanted = options.get("container_gpus") or "none"
    if wanted not in MACHINE_GPUS:
        raise InvalidSettings(
            f"options.container_gpus: {wanted!r} is not one of {', '.join(MACHINE_GPUS)}",
            field="options.container_gpus",
        )
    if resources.gpus:
        return str(resources.gpus)
    if wanted == "all":
        return "all"
    return "visible" if engine.gpus_chosen_per_job else "none"


def admit_gpus(
    image: Image, gpus: str, machine: str, kind: str, runtimes: Sequence[str], facts: Mapping[str, Any] | None
) -> None:
    """Refuse, at submit, GPUs for a container on a machine whose runtime cannot give them (facts.sh's
    ``nvidia`` of its runtime). Unknown facts let the job go: the runtime's own words fail it there.
    A Slurm machine's facts are its login node's, which say nothing of the nodes jobs run on."""
    if gpus in ("none", "visible") or kind == "slurm":
        return
    installed = {c["runtime"]: c for c in (facts or {}).get("containers") or ()}
    wanted = [image.runtime] if image.runtime != "auto" else list(runtimes)
    runtime = next((r for r in wanted if r in installed), None)  # container.sh's auto: podman, else docker
    if runtime is None or installed[runtime].get("nvidia") is not False:
        return
    field = "options.container_gpus" if gpus == "all" else "resources.gpus"
    raise InvalidSettings(
        f"{field}: {machine}'s {runtime} cannot give a container GPUs (no NVIDIA container support found): "
        f"{NVIDIA_HINT[runtime]} on {machine}",
        field=field,
    )


#: What the machine gives a job where it has it (container.sh passes those that are set): the GPUs an
#: agent chose, the rendezvous of Slurm's batch script (slurm_commands.sbatch.batch_script), Slurm's own.
MACHINE_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NODE_RANK",
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_JOB_PARTITION",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_CPUS_ON_NODE",
    "SLURM_RESTART_COUNT",
    "SLURMD_NODENAME",
)


def env_names(env: Sequence[str]) -> list[str]:
    """The variables the container gets: the job's own, those every job has (``JOB_ENV_SH``), and
    the machine's own job variables where it sets them (``MACHINE_ENV``)."""
    common = re.findall(r"^export ([A-Za-z_][A-Za-z0-9_]*)=", JOB_ENV_SH, re.MULTILINE)
    return list(dict.fromkeys([*env, *common, *MACHINE_ENV]))


# Run by the image's sh as `sh .container-entry ENVFILE COMMAND LOG RAN`: the job's variables from the
# 0600 file (the launcher's format), which is removed before the command starts; the command's output
# goes straight to the job's log (mounted), as it does outside. RAN tells container.sh the container
# started: the run's exit code is the command's from then on. A job whose store has the launcher's own
# scheme gets the plugin's folder (in the job folder, COMMAND's) ahead of the image's own PYTHONPATH,
# which the launcher's outside never replaces (env_names does not pass it).
ENTRY_SH = f"""exec < "$1"
{READ_ENV_SH}case ${{MLFLOW_TRACKING_URI-}} in {STORE_SCHEME}://*)
  plugin="${{2%/*}}/{STORE_PLUGIN_DIR}"
  case ":${{PYTHONPATH-}}:" in *":$plugin:"*) ;; *) PYTHONPATH="$plugin${{PYTHONPATH:+:$PYTHONPATH}}" ;; esac
  export PYTHONPATH ;;
esac
exec < /dev/null >> "$3" 2>&1
rm -f -- "$1"
: > "$4"
exec sh "$2"
"""


#: command.sh's base of the machine, from the job folder as env.sh finds it (``<base>/[jobs/]<id>``), so
#: the env cache is mounted at the very path env.sh inside the image looks for it.
_BASE_SH = "base=${jobdir%/*}; case $base in */jobs) base=${base%/jobs} ;; esac\n"
#: What a job that builds a Python environment in its image gets mounted, each at its own path: the
#: machine's env cache (the environments, keyed by the image's digest too) and tools (a uv sent there).
_ENV_MOUNTS = ("envs", "tools")


def container_command(
    image: Image,
    command: str | Sequence[str],
    env: Sequence[str],
    options: Mapping[str, Any],
    pins: str,
    gpus: str = "none",
    env_cache: bool = False,
    read_only: Sequence[str] = (),
) -> str:
    """The job's command.sh body for a job in ``image``: write the command beside it, then container.sh.

    ``pins`` is the machine's folder of image pins, as a sh word (``Engine.image_pins``); ``gpus`` is
    container.sh's GPUS (``gpu_request``), which it turns into the runtime's flags; ``env_cache`` mounts
    the machine's ``envs/`` and ``tools/`` (a job building its environment in the image); ``read_only``
    are files of this machine mounted read-only at their own path (this side's uv).
    """
    inner = command_script(command)
    mounts: list[str] = []
    if env_cache:
        mounts = [w for d in _ENV_MOUNTS for w in ("-v", f'"$base/{d}:$base/{d}"')]
    for path in read_only:
        mounts += ["-v", shlex.quote(f"{path}:{path}:ro")]
    words = [
        '"$jobdir"',
        pins,
        shlex.quote(image.ref),
        shlex.quote(image.runtime),
        shlex.quote(network_of(options)),
        shlex.quote(" ".join(env_names(env))),
        shlex.quote(ENTRY_SH),
        shlex.quote(gpus),
        *mounts,
    ]
    prepare = ""
    if env_cache:
        dirs = " ".join(f'"$base/{d}"' for d in _ENV_MOUNTS)
        prepare = _BASE_SH + f"mkdir -p -- {dirs} || exit 97\n"
    return (
        "jobdir=$(cd .. && pwd -P) || exit 97\n"
        + prepare
        + f"printf '%s' {shlex.quote(inner)} > \"$jobdir/command.inner.sh\" || exit 97\n"
        f"exec {farside.command_line('container', *words)}"
    )


def launch_command(
    spec: Any,
    command: str | Sequence[str],
    env: Sequence[str],
    engine: Engine,
    env_cache: bool = False,
    read_only: Sequence[str] = (),
) -> str | Sequence[str]:
    """What the launcher runs for ``spec`` (a JobSpec): ``command`` (its own, or behind its environment),
    inside its image if it has one; ``env_cache`` and ``read_only`` as ``container_command``'s."""
    if not spec.image:
        return command
    runtimes = engine.image_runtimes()
    if not runtimes:
        raise EngineError(f"{engine.name} is a {engine.kind} machine, which does not run container images")
    image = spec.image
    if image.runtime == "auto" and len(runtimes) == 1:
        image = dataclasses.replace(image, runtime=runtimes[0])  # "auto" never picks one the kind refuses
    options = engine.machine_options
    gpus = gpu_request(spec.resources, options, engine)
    return container_command(
        image, command, env, options, engine.image_pins(), gpus, env_cache=env_cache, read_only=read_only
    )


def parse_log_head(head: str) -> dict[str, str] | None:
    """The image's reference, digest, runtime and mode from container.sh's line, if the job had one."""
    m = _LOG_LINE.search(head)
    if not m:
        return None
    return {"image": m.group(1), "digest": m.group(2), "runtime": m.group(3), "version": m.group(4), "mode": m.group(5)}


def read_log_head(log_path: Path | None) -> dict[str, str] | None:
    """``parse_log_head`` of a job's log on this side (None without a log or an image)."""
    if log_path is None or not log_path.is_file():
        return None
    with open(log_path, "rb") as f:
        return parse_log_head(f.read(_HEAD_BYTES).decode("utf-8", "replace"))


def log_image(client: Any, run_id: str, log_path: Path | None) -> None:
    """Tag the job's MLflow run with its image and the digest it ran (if it ran in one)."""
    found = read_log_head(log_path)
    if found:
        client.set_tag(run_id, TAG_IMAGE, found["image"])
        client.set_tag(run_id, TAG_DIGEST, found["digest"])
