"""The far-side launcher: POSIX sh that starts a job detached and records how it ended.

Every push engine (local, ssh, jupyter) writes the same two scripts into the
job directory and runs ``sh launch.sh <job dir>`` with the environment on its
standard input, so the built-in machine exercises exactly what a remote one
runs. Nothing beyond POSIX sh, ``setsid``, ``base64`` and ``mv`` is needed.

Secrets reach the command through that standard input, base64-encoded one
``NAME=value`` per line: never through argv (process lists are readable by
every user) and never through a file. The input ends with its own end line:
a launcher that reads to the end without it was cut short (the side writing
it died half-way) and starts nothing, rather than a command without its
variables.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..schema.spec import CHECKPOINT_DIR_VAR, CHECKPOINTS_VAR, STORE_SCHEME_VAR
from .base import TRACKING_DIR, WORK_DIR

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: The last line of ``launch_input``: an environment read without it was cut short.
ENV_END = "@@end"

# The launcher's stdin, one NAME=<base64 value> line each, exported; shared by every far-side script
# that receives an environment (the launcher, Slurm's submit script). $env_whole says whether the end
# line came: the stream is whole (a stream another program wrote, such as container.sh's, has none).
READ_ENV_SH = f"""\
env_whole=
while IFS= read -r line; do
  [ -n "$line" ] || continue
  if [ "$line" = {ENV_END} ]; then env_whole=1; continue; fi
  name=${{line%%=*}}
  value=$(printf '%s' "${{line#*=}}" | base64 -d) || exit 98
  export "$name=$value"
done
"""

#: The scheme of the job's store when the user's own store is not a folder (``remote-compute:///<job
#: folder>/mlruns``): MLflow's folder store still, opened through the plugin ``farside/mlflow_store.py``.
STORE_SCHEME = "remote-compute"
#: The job folder's folder of that plugin (the module and its dist-info), put on the job's PYTHONPATH.
STORE_PLUGIN_DIR = "mlflow-store"
_PLUGIN_MODULE = "remote_compute_mlflow_store"
_PLUGIN_DIST = f"{_PLUGIN_MODULE}-1.0.dist-info"
# The dist-info has no RECORD and no top_level.txt: nothing maps the module to a distribution, so MLflow
# never lists it among a logged model's requirements.
_PLUGIN_FILES = {
    f"{_PLUGIN_MODULE}.py": (Path(__file__).parent / "farside" / "mlflow_store.py").read_text(encoding="utf-8"),
    f"{_PLUGIN_DIST}/METADATA": f"Metadata-Version: 2.1\nName: {_PLUGIN_MODULE}\nVersion: 1.0\n",
    f"{_PLUGIN_DIST}/entry_points.txt": (
        f"[mlflow.tracking_store]\n{STORE_SCHEME} = {_PLUGIN_MODULE}:tracking_store\n\n"
        f"[mlflow.model_registry_store]\n{STORE_SCHEME} = {_PLUGIN_MODULE}:registry_store\n"
    ),
}
_WRITE_PLUGIN_SH = "".join(
    f"  printf '%s' {shlex.quote(text)} > \"$jobdir/{STORE_PLUGIN_DIR}/{name}\" &&\n"
    for name, text in _PLUGIN_FILES.items()
)

# The job's environment as every far-side script leaves it, after the job's own variables were read:
# the job-local MLflow store (names a spec may not set, see spec.RESERVED_ENV), then defaults that the
# job's env or the far machine's own environment may override. Python's fault handler puts where a
# crash in native code happened into the job's log (a bare "Segmentation fault" says nothing); MLflow's
# usage telemetry would have the job-local store start network threads on machines that often have no
# way out, and those threads outlive the script (MLflow documents MLFLOW_DISABLE_TELEMETRY). A job with
# checkpoints gets its folder's absolute path, made before the command starts (jobs/checkpoints.py).
# The store is a folder on every machine (the far side's scripts read its files, and it costs nothing
# to open); where the user's store is not one (STORE_SCHEME_VAR, set on this side), the job sees it
# under STORE_SCHEME, so a script that registers its model only on a database-backed store (MLflow's
# own examples skip registered_model_name when the scheme is file) registers it, as it would here. Its
# registry is the store's own: an MLFLOW_REGISTRY_URI the built-in machine inherits from the server
# would register the job's models where the replay never looks. The plugin's folder goes ahead of any
# PYTHONPATH the job or the machine has, never replacing it; it is not exported as a whole into a
# container, whose image's own PYTHONPATH stays (image.ENTRY_SH).
JOB_ENV_SH = f"""\
export PYTHONUNBUFFERED=1
export MLFLOW_TRACKING_URI="file://$jobdir/{TRACKING_DIR}"
export MLFLOW_ALLOW_FILE_STORE=true
unset MLFLOW_REGISTRY_URI
if [ "${{{STORE_SCHEME_VAR}-}}" = {STORE_SCHEME} ]; then
  mkdir -p -- "$jobdir/{STORE_PLUGIN_DIR}/{_PLUGIN_DIST}" &&
{_WRITE_PLUGIN_SH}  MLFLOW_TRACKING_URI="{STORE_SCHEME}://$jobdir/{TRACKING_DIR}" || exit 97
  PYTHONPATH="$jobdir/{STORE_PLUGIN_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"
  export PYTHONPATH
fi
unset {STORE_SCHEME_VAR}
export PYTHONFAULTHANDLER="${{PYTHONFAULTHANDLER-1}}"
export MLFLOW_DISABLE_TELEMETRY="${{MLFLOW_DISABLE_TELEMETRY-true}}"
if [ -n "${{{CHECKPOINTS_VAR}-}}" ]; then
  {CHECKPOINT_DIR_VAR}="$jobdir/{WORK_DIR}/${CHECKPOINTS_VAR}"
  export {CHECKPOINT_DIR_VAR}
  mkdir -p -- "${CHECKPOINT_DIR_VAR}"
fi
unset {CHECKPOINTS_VAR}
"""

# Reads the environment from stdin, then starts run.sh in a new session (so
# it outlives this shell, the connection and the server) and records its pid,
# which is also its process group id. Idempotent: a job directory with a pid
# file has been started already. An environment without its end line starts
# nothing (exit 96): whoever wrote it died half-way, and the start they retry
# sends it whole.
LAUNCH_SH = f"""\
#!/bin/sh
set -u
jobdir=$1
# Starting twice (this side crashed between start and recording it) finds the first start.
if [ -f "$jobdir/pid" ]; then cat "$jobdir/pid"; exit 0; fi
cd "$jobdir/{WORK_DIR}" || exit 97
# Ids of this side's store mean nothing in the job's own store (a local job inherits them).
unset MLFLOW_EXPERIMENT_ID MLFLOW_RUN_ID
{READ_ENV_SH}if [ -z "$env_whole" ]; then
  echo "the job's environment came cut short: nothing was started" >&2
  exit 96
fi
{JOB_ENV_SH}: > "$jobdir/log"
setsid sh "$jobdir/run.sh" "$jobdir" < /dev/null >> "$jobdir/log" 2>&1 &
printf '%s\\n' "$!" > "$jobdir/pid.tmp" && mv -f "$jobdir/pid.tmp" "$jobdir/pid"
printf '%s\\n' "$!"
"""


def run_script(entry: str = "command.sh") -> str:
    """run.sh: runs ``entry`` (the job's command, or a node's start on an ssh host list) and writes its
    exit code atomically, so a reader sees either no file or the whole number."""
    return f"""#!/bin/sh
jobdir=$1
sh "$jobdir/{entry}"
code=$?
printf '%s\\n' "$code" > "$jobdir/exit_code.tmp" && mv -f "$jobdir/exit_code.tmp" "$jobdir/exit_code"
"""


RUN_SH = run_script()


def rank_env_sh(per_node: int, *, master_addr: str, master_port: str, nnodes: str, node_rank: str = "0") -> str:
    """The variables torchrun and ``torch.distributed`` read, set the same way on every kind that runs a
    job of several processes (Slurm's batch script, each host of an ssh host list), as sh lines.

    ``master_addr``, ``master_port``, ``nnodes`` and ``node_rank`` are sh words (the rendezvous at the
    first node, how many nodes, this node's place); ``LOCAL_WORLD_SIZE`` is ``per_node`` processes,
    ``WORLD_SIZE`` all of them; ``RANK`` and ``LOCAL_RANK`` are 0 until ``farside/rank.sh`` gives each
    process its own.
    """
    return f"""MASTER_ADDR={master_addr}
MASTER_PORT={master_port}
NNODES={nnodes}
LOCAL_WORLD_SIZE={int(per_node)}
WORLD_SIZE=$((NNODES * LOCAL_WORLD_SIZE))
NODE_RANK={node_rank}
RANK=0
LOCAL_RANK=0
export MASTER_ADDR MASTER_PORT NNODES LOCAL_WORLD_SIZE WORLD_SIZE NODE_RANK RANK LOCAL_RANK
"""


def command_script(command: str | Sequence[str]) -> str:
    """The job's command as a shell script: a string runs as written, argv is quoted."""
    body = command if isinstance(command, str) else "exec " + shlex.join(command)
    return "#!/bin/sh\n" + body + "\n"


def launch_input(env: Mapping[str, str], secret_env: Mapping[str, str]) -> bytes:
    """The launcher's standard input: every variable, one base64 line each, then ``ENV_END``."""
    lines = []
    for name, value in {**env, **secret_env}.items():
        if not ENV_NAME.match(name):
            raise ValueError(f"env: {name!r} is not a valid environment variable name")
        lines.append(name + "=" + base64.b64encode(value.encode()).decode("ascii"))
    return ("\n".join([*lines, ENV_END]) + "\n").encode("ascii")
