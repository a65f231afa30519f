"""``jupyter remote-compute agent`` (and ``python3 agent.pyz``): the pull agent's command line.

The token comes from ``--token-file`` (mode 600), ``--token-stdin`` or the environment variable
``JUPYTER_REMOTE_COMPUTE_AGENT_TOKEN``, never from the command line.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .client import Agent
from .server import Server, log

TOKEN_ENV = "JUPYTER_REMOTE_COMPUTE_AGENT_TOKEN"


class Stop(BaseException):
    """SIGTERM: stop claiming now."""


def read_token(args: argparse.Namespace) -> str:
    if args.token_file:
        path = Path(args.token_file).expanduser()
        try:
            mode = path.stat().st_mode
        except OSError as e:
            raise SystemExit(f"--token-file: cannot read {path}: {e.strerror}") from None
        if mode & 0o077:
            raise SystemExit(f"--token-file: {path} is readable by others; run: chmod 600 {path}")
        token = path.read_text().strip()
    elif args.token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit(
            f"no agent token: give --token-file PATH (mode 600), --token-stdin, or set {TOKEN_ENV}. "
            "It is never read from the command line."
        )
    return token


def default_state_dir(machine: str) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "jupyter-remote-compute-agent" / machine


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter remote-compute agent",
        description="Pull jobs for one machine from a Jupyter Server running jupyter-remote-compute.",
    )
    parser.add_argument("--server", required=True, help="the server's URL, e.g. https://hub.example.org/user/me")
    parser.add_argument("--machine", required=True, help="the agent machine's name on that server")
    parser.add_argument("--token-file", help="a file holding the agent token (mode 600)")
    parser.add_argument("--token-stdin", action="store_true", help="read the agent token from stdin")
    parser.add_argument("--state-dir", help="where jobs and the input cache live (default: ~/.local/state/...)")
    parser.add_argument("--max-jobs", type=int, default=1, help="jobs run at once (default 1)")
    parser.add_argument("--gpus-per-job", type=int, default=0, help="GPUs given to each job (CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--gpu-ids", help="the GPUs to hand out, e.g. 0,1,2,3 (default: nvidia-smi's)")
    parser.add_argument("--cafile", help="CA certificates to verify an HTTPS server with")
    return parser


def _gpu_ids(given: str | None) -> list[str]:
    if given:
        return [g.strip() for g in given.split(",") if g.strip()]
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, timeout=30
        ).stdout.decode()
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_jobs < 1:
        raise SystemExit("--max-jobs: at least 1")
    token = read_token(args)
    state = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir(args.machine)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    # One agent per state folder: a second one would adopt the first one's jobs.
    import fcntl

    lock = open(state / "agent.lock", "w")  # noqa: SIM115 - held open for the agent's whole life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            raise SystemExit(f"another agent runs on {state}") from None
        raise

    def stop(signum: int, frame: Any) -> None:
        raise Stop()

    signal.signal(signal.SIGTERM, stop)
    agent = Agent(
        Server(args.server, args.machine, token, args.cafile),
        state,
        args.max_jobs,
        _gpu_ids(args.gpu_ids),
        args.gpus_per_job,
    )
    try:
        return agent.run()
    except (Stop, KeyboardInterrupt):
        log("stopping: no new jobs are claimed; running jobs go on and are adopted again at the next start")
        return 0


if __name__ == "__main__":
    sys.exit(main())
