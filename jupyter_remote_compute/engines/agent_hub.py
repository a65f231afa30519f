"""The server side of pull agents: per-machine tokens, job queue and what each agent reported.

Everything lives in files under ``.punica/agents/<machine>/``, so every process that drives jobs
(the server, the CLI, a kernel) sees the same queue, while only the server talks to agents:

    token.json                 the sha256 of the machine's agent token (never the token), 0600
    seen.json                  when the agent last called, and the facts it reported
    retired.json               the last attempt of jobs removed while an agent may have held it
    queue.stamp                touched whenever a job is queued: a waiting claim wakes on its mtime
    jobs/<job id>/state.json   the job as the agent sees it (below)
    jobs/<job id>/inputs.json  what the agent may download (digest -> workspace file)
    jobs/<job id>/launch.json  the command and its plain environment (secret values never)
    jobs/<job id>/log          the log bytes the agent sent, in order
    jobs/<job id>/outputs.tar  the outputs the agent uploaded (manifest.sh's stream)

A job's ``state`` here: ``queued`` → ``claimed`` (an agent holds a lease on attempt N) →
``running`` → ``ended`` (``how``: exited, cancelled, gone, failed), or ``lost`` when a started
attempt's lease ran out. A lease that runs out before the command started queues the job again.
Changes are made under a file lock per machine and written atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..fsutil import PRIVATE_FILE, SharedFileLock, atomic_write, private_dir

AGENTS_DIR = "agents"
TOKEN_PREFIX = "jrca_"
#: An agent that called within this many seconds is online: a claim is held ~25 s, then renewed.
ONLINE_WINDOW = 45.0
#: How long a claim is held open when no job is ready (under common proxies' 60 s read timeout).
CLAIM_HOLD = 25.0
#: Seconds a claim or a running attempt lives without a heartbeat (the server's default).
DEFAULT_LEASE = 60.0

STATES = ("queued", "claimed", "running", "ended", "lost")


class StaleAttempt(Exception):
    """The agent acts on an attempt that is no longer the job's (a lease that ran out): answer 409."""


class UnknownJob(Exception):
    """No such job for this machine (never one, cleaned up, or another machine's): answer 404."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def _write_json(path: Path, data: Any, mode: int = PRIVATE_FILE) -> None:
    atomic_write(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), mode)


class MachineHub:
    """The files of one agent machine."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.dir = root / name
        self._lock = SharedFileLock(root / f".{name}.lock", timeout=30)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        # Private to this user: the raw log an agent sends is kept here until collection masks it.
        self.dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.dir.parent.stat().st_mode & 0o077:
            os.chmod(self.dir.parent, 0o700)
        with self._lock:
            yield

    # -- the token ---------------------------------------------------------------
    def issue_token(self) -> str:
        """A new token for this machine's agent (the old one stops working); shown once, kept as a hash."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.locked():
            _write_json(self.dir / "token.json", {"sha256": token_digest(token), "issued": time.time()}, 0o600)
        return token

    def revoke_token(self) -> bool:
        with self.locked():
            try:
                (self.dir / "token.json").unlink()
                return True
            except FileNotFoundError:
                return False

    def has_token(self) -> bool:
        return (self.dir / "token.json").is_file()

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is this machine's agent token (constant-time compare of the hashes)."""
        record = _read_json(self.dir / "token.json") or {}
        expected = str(record.get("sha256", ""))
        # Compared even when no token is issued, so timing does not tell which machines have one.
        return hmac.compare_digest(token_digest(token), expected or "0" * 64) and bool(expected)

    # -- the agent ---------------------------------------------------------------
    def seen(self, every: float = 0.0, **facts: Any) -> None:
        """The agent called now; ``facts`` (what it reported on connecting) are kept with the time.

        With ``every``, the time is written only if the last one is older (heartbeats come each second).
        """
        record = _read_json(self.dir / "seen.json") or {}
        if every and not facts and time.time() - float(record.get("last_seen") or 0) < every:
            return
        record.update(facts)
        record["last_seen"] = time.time()
        private_dir(self.dir)
        _write_json(self.dir / "seen.json", record)

    def presence(self) -> dict[str, Any]:
        """``{online, last_seen, connected, token}``: what the panel and ``check`` show."""
        record = _read_json(self.dir / "seen.json") or {}
        last = record.get("last_seen")
        return {
            "online": bool(last) and time.time() - float(last) < ONLINE_WINDOW,
            "last_seen": last,
            "connected": last is not None,
            "token": self.has_token(),
        }

    def facts_text(self) -> str | None:
        return (_read_json(self.dir / "seen.json") or {}).get("facts")

    def offline_reason(self) -> str | None:
        """Why no agent will take a job now, or None while the agent is online."""
        presence = self.presence()
        if presence["online"]:
            return None
        if not presence["connected"]:
            return f"the agent of {self.name} has never connected; start it on that machine"
        ago = time.time() - float(presence["last_seen"])
        return f"the agent of {self.name} is offline (last seen {_ago(ago)} ago)"

    # -- jobs --------------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise UnknownJob(job_id)
        return self.dir / "jobs" / job_id

    def state(self, job_id: str) -> dict[str, Any] | None:
        return _read_json(self.job_dir(job_id) / "state.json")

    def _state(self, job_id: str) -> dict[str, Any]:
        state = self.state(job_id)
        if state is None:
            raise UnknownJob(job_id)
        return state

    def _save(self, job_id: str, state: dict[str, Any]) -> None:
        _write_json(self.job_dir(job_id) / "state.json", state)

    def prepare(self, job_id: str) -> Path:
        path = self.job_dir(job_id)
        return private_dir(path)

    def set_inputs(self, job_id: str, inputs: list[dict[str, Any]]) -> None:
        _write_json(self.job_dir(job_id) / "inputs.json", inputs)

    def inputs(self, job_id: str) -> list[dict[str, Any]]:
        return _read_json(self.job_dir(job_id) / "inputs.json") or []

    def launch(self, job_id: str) -> dict[str, Any]:
        return _read_json(self.job_dir(job_id) / "launch.json") or {}

    def enqueue(self, job_id: str, key: str, launch: dict[str, Any]) -> dict[str, Any]:
        """Queue the job for the agent (idempotent: a job queued or claimed already stays as it is)."""
        with self.locked():
            state = self.state(job_id)
            if state is None:
                _write_json(self.job_dir(job_id) / "launch.json", launch)
                # A job queued again (its retry policy's next attempt) numbers its attempts on from the last
                # one an agent was given: an agent back from a stall acting on that one is answered 409.
                before = self._retired().get(job_id, 0)
                state = {"job_id": job_id, "key": key, "state": "queued", "attempt": before, "queued_at": time.time()}
                self._retire(job_id, None)
                self._save(job_id, state)
            private_dir(self.dir)
            (self.dir / "queue.stamp").touch()
        return state

    def queue_stamp(self) -> int:
        """Changes whenever a job is queued here (a waiting claim looks at it, cheaply, many times a second)."""
        try:
            return os.stat(self.dir / "queue.stamp").st_mtime_ns
        except FileNotFoundError:
            return 0

    def job_ids(self) -> list[str]:
        try:
            return sorted(p.name for p in (self.dir / "jobs").iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def claim(self, agent: str) -> dict[str, Any] | None:
        """Hand the oldest queued job to the agent: a lease on a new attempt. None when none is queued."""
        with self.locked():
            queued = []
            for job_id in self.job_ids():
                state = self.state(job_id)
                if state and state.get("state") == "queued":
                    queued.append((state.get("queued_at", 0), job_id, state))
            if not queued:
                return None
            _, job_id, state = min(queued)
            now = time.time()
            state.update(state="claimed", attempt=int(state.get("attempt", 0)) + 1, claimed_at=now, renewed_at=now)
            state["agent"] = agent
            self._save(job_id, state)
            return state

    def heartbeat(
        self, job_id: str, attempt: int, report: dict[str, Any], log: bytes, log_offset: int
    ) -> dict[str, Any]:
        """The agent's report on one attempt: renew the lease, take new log bytes, record its state.

        Log bytes arrive by offset: bytes already held are skipped, a gap is refused (the answer's
        ``log_size`` says where to resume), so a reconnect never duplicates or loses a byte.
        """
        with self.locked():
            state = self._state(job_id)
            if int(state.get("attempt", 0)) != attempt or state.get("state") not in ("claimed", "running", "ended"):
                raise StaleAttempt(job_id)
            log_path = self.job_dir(job_id) / "log"
            size = log_path.stat().st_size if log_path.exists() else 0
            if log and log_offset <= size < log_offset + len(log):
                fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with open(fd, "ab") as f:
                    f.write(log[size - log_offset :])
                size = log_path.stat().st_size
            now = time.time()
            state["renewed_at"] = now
            state["log_size"] = size
            reported = report.get("state")
            if state["state"] != "ended":
                if reported == "running" and state["state"] == "claimed":
                    state["state"] = "running"
                    state["started_at"] = float(report.get("started_at") or now)
                if reported == "running":
                    state["building"] = _building(report.get("building"))
                elif reported == "ended":
                    state["state"] = "ended"
                    state["how"] = str(report.get("how") or "exited")
                    state["exit_code"] = report.get("exit_code")
                    state["detail"] = str(report.get("detail") or "")[:2000]
                    state["ended_at"] = now
                    state.setdefault("started_at", report.get("started_at"))
            self._save(job_id, state)
            return {"log_size": size, "cancel": state.get("cancel"), "state": state["state"]}

    def request_cancel(self, job_id: str, grace: float) -> dict[str, Any]:
        """Ask the agent to stop the job (the answer to its next heartbeat); a job no agent took ends here."""
        with self.locked():
            state = self._state(job_id)
            state["cancel"] = grace
            if state["state"] == "queued":
                state.update(state="ended", how="cancelled", detail="cancelled before an agent took it")
                state["ended_at"] = time.time()
            self._save(job_id, state)
            return state

    def outputs_landed(self, job_id: str, attempt: int, tmp: Path, manifest: str, declared: list[str]) -> None:
        """An upload of the attempt's outputs is complete: it becomes the job's ``outputs.tar``."""
        with self.locked():
            state = self._state(job_id)
            if int(state.get("attempt", 0)) != attempt or state.get("state") not in ("claimed", "running"):
                raise StaleAttempt(job_id)
            os.replace(tmp, self.job_dir(job_id) / "outputs.tar")
            state["outputs"] = {"attempt": attempt, "manifest": manifest, "declared": declared}
            self._save(job_id, state)

    def expire(self, lease: float, since: float) -> list[str]:
        """End attempts whose lease ran out (counted from ``since`` at the earliest: the server's start).

        One that never started goes back to the queue; a started one is lost. Returns the job ids changed.
        """
        changed = []
        now = time.time()
        with self.locked():
            for job_id in self.job_ids():
                state = self.state(job_id)
                if not state or state.get("state") not in ("claimed", "running"):
                    continue
                quiet = now - max(float(state.get("renewed_at") or 0), since)
                if quiet <= lease:
                    continue
                if state["state"] == "claimed":
                    state["state"] = "queued"
                    (self.dir / "queue.stamp").touch()
                else:
                    state["state"] = "lost"
                    state["detail"] = (
                        f"the agent of {self.name} stopped reporting: no heartbeat for {quiet:.0f} s "
                        f"(its lease is {lease:.0f} s)"
                    )
                self._save(job_id, state)
                changed.append(job_id)
        return changed

    def remove_job(self, job_id: str) -> None:
        with self.locked():
            state = self.state(job_id) or {}
            if state.get("state") in ("claimed", "running", "lost"):
                self._retire(job_id, int(state.get("attempt") or 0))  # an agent may still hold that attempt
            shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def _retired(self) -> dict[str, int]:
        """Jobs removed while an agent may still have held their last attempt: job id -> that attempt."""
        return _read_json(self.dir / "retired.json") or {}

    def _retire(self, job_id: str, attempt: int | None) -> None:
        retired = self._retired()
        if attempt is None and job_id not in retired:
            return
        if attempt is None:
            del retired[job_id]
        else:
            retired[job_id] = attempt
        private_dir(self.dir)
        _write_json(self.dir / "retired.json", retired)


class AgentHub:
    """Every agent machine of one workspace."""

    def __init__(self, punica_dir: Path) -> None:
        self.root = Path(punica_dir) / AGENTS_DIR

    def machine(self, name: str) -> MachineHub:
        if not name or "/" in name or name.startswith("."):
            raise UnknownJob(name)
        return MachineHub(self.root, name)

    def machines(self) -> list[MachineHub]:
        try:
            return [MachineHub(self.root, p.name) for p in sorted(self.root.iterdir()) if p.is_dir()]
        except FileNotFoundError:
            return []


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def agent_command(machine: str, server_url: str = "SERVER_URL") -> str:
    """What to run on the far machine, once the token is saved in ~/.config/jrc-agent.token (mode 600).

    The token never reaches a command line: printf is the shell's own, and curl reads the header on stdin.
    """
    token_file = "~/.config/jrc-agent.token"
    return (
        f"printf 'Authorization: Bearer %s\\n' \"$(cat {token_file})\" | "
        f"curl -fsS -H @- {server_url}/remote-compute/agent/agent.pyz -o agent.pyz && "
        f"python3 agent.pyz --server {server_url} --machine {machine} --token-file {token_file}"
    )


def welcome(punica_dir: Path, machine: str, server_url: str = "SERVER_URL") -> dict[str, str]:
    """A new agent token for ``machine`` and the command to run there: shown once, kept only as a hash."""
    token = AgentHub(punica_dir).machine(machine).issue_token()
    return {"agent_token": token, "agent_command": agent_command(machine, server_url)}


def with_presence(punica_dir: Path, machine: dict[str, Any]) -> dict[str, Any]:
    """A machine's JSON, with ``agent: {online, last_seen, connected, token}`` for an agent machine."""
    if machine.get("kind") == "agent":
        return {**machine, "agent": AgentHub(punica_dir).machine(machine["name"]).presence()}
    return machine


def _building(reported: Any) -> dict[str, Any] | None:
    """An agent's report of the environment its job is building (status.sh's "building" line), checked."""
    if not isinstance(reported, dict):
        return None
    tool, packages = reported.get("tool"), reported.get("packages")
    if tool not in ("uv", "pip") or not isinstance(packages, int) or isinstance(packages, bool) or packages < 0:
        return None
    return {"tool": tool, "packages": packages}
