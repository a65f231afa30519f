"""The pull agent: runs on a machine nothing may reach, and pulls its jobs from a Jupyter Server.

Standard library only, Python >= 3.9: the server serves this file as ``agent.pyz``. It listens on
no port; it only makes HTTP(S) requests to the server, with its machine's token:

- **claim** (held by the server ~25 s until a job is ready): a lease on one attempt of a job;
- **inputs** by sha256 into its own content-addressed cache (``<state>/cache``, the far-side
  ``cache.sh``): only digests it lacks travel, each verified before it is used;
- the job runs under the shared launcher (``launch.sh``: its own session and process group, the
  environment with its secrets on stdin, never in a file);
- **heartbeats** renew the lease, carry new log bytes by offset and the job's state; the answer
  may ask to cancel (``cancel.sh``: TERM, grace, KILL, verify);
- **outputs** go back as manifest.sh's tar stream, every file with its sha256, ``mlruns/`` with them.

Everything about a job lives in ``<state>/jobs/<id>/`` (the far-side layout plus ``agent.json``),
so a restarted agent re-adopts the jobs it was running. SIGTERM stops claiming and leaves
running jobs alone.

The token comes from ``--token-file`` (mode 600), ``--token-stdin`` or the environment variable
``JUPYTER_REMOTE_COMPUTE_AGENT_TOKEN``, never from the command line.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import hashlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

VERSION = "1"
TOKEN_ENV = "JUPYTER_REMOTE_COMPUTE_AGENT_TOKEN"
LOG_CHUNK = 1 << 20
IO_CHUNK = 1 << 20
CLAIM_TIMEOUT = 60.0  # the server holds a claim ~25 s; past this the connection is taken as dead
NETWORK_ERRORS = (OSError, http.client.HTTPException)


class Refused(Exception):
    """The server answered with an error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


class Stop(BaseException):
    """SIGTERM: stop claiming now."""


def log(message: str) -> None:
    sys.stderr.write(time.strftime("%Y-%m-%dT%H:%M:%S ") + message + "\n")
    sys.stderr.flush()


def backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row: doubling up to 30 s, with jitter."""
    return min(30.0, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)


class Server:
    """The server's agent endpoints for one machine; one kept-alive connection per thread."""

    def __init__(self, url: str, machine: str, token: str, cafile: str | None = None) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise SystemExit(f"--server: expected http(s)://host[:port][/base], not {url!r}")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port
        self.base = parsed.path.rstrip("/") + "/remote-compute/agent/" + urllib.parse.quote(machine)
        self.token = token
        self.tls = ssl.create_default_context(cafile=cafile) if self.scheme == "https" else None
        self._local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.tls is not None:
                conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=timeout, context=self.tls, blocksize=IO_CHUNK
                )
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout, blocksize=IO_CHUNK)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        timeout: float = 60.0,
        raw: Any = None,
        length: int | None = None,
        sink: Any = None,
    ) -> tuple[int, Any]:
        """(status, JSON answer or None); with ``sink``, a 200's body is written there instead."""
        url = self.base + "/" + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        headers = {"Authorization": "Bearer " + self.token}
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if length is not None:
            headers["Content-Length"] = str(length)
        conn = self._connection(timeout)
        try:
            conn.request(method, url, body=data, headers=headers)
            response = conn.getresponse()
            if sink is not None and response.status == 200:
                while True:
                    chunk = response.read(IO_CHUNK)
                    if not chunk:
                        break
                    sink(chunk)
                return 200, None
            payload = response.read()
        except BaseException:
            self.drop()
            raise
        if response.status >= 400:
            raise Refused(response.status, payload)
        return response.status, json.loads(payload) if payload else None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")


def _script(scripts: dict[str, str], name: str, *args: str) -> list[str]:
    return ["sh", "-c", scripts[name], "sh", *args]


#: What a job's own thread decides while starting it; everything else in agent.json is the heartbeats'.
STARTING_FIELDS = ("phase", "how", "detail", "started_at", "gpus")


class Agent:
    def __init__(self, server: Server, state: Path, max_jobs: int, gpu_ids: list[str], gpus_per_job: int) -> None:
        self.server = server
        self.state = state
        self.jobs = state / "jobs"
        self.max_jobs = max_jobs
        self.gpu_ids = gpu_ids
        self.gpus_per_job = gpus_per_job
        self.scripts: dict[str, str] = {}
        self.heartbeat_seconds = 1.0
        self.preparing: set = set()
        self.cancelling: set = set()
        self.lock = threading.Lock()
        # A job's agent.json is written by its own thread and by the heartbeats: each writes only the
        # fields it owns, onto what is on disk, so neither puts back what the other replaced.
        self.meta_lock = threading.Lock()
        self.kick = threading.Event()
        self.ident = f"{socket.gethostname()}:{os.getpid()}"

    # -- connecting ----------------------------------------------------------------
    def hello(self) -> None:
        failures = 0
        while True:
            try:
                facts = ""
                if self.scripts:
                    facts = self._run("facts", str(self.state)).stdout.decode("utf-8", "replace")
                _, answer = self.server.request(
                    "POST",
                    "hello",
                    {
                        "version": VERSION,
                        "host": socket.gethostname(),
                        "pid": os.getpid(),
                        "python": sys.version.split()[0],
                        **({"facts": facts} if facts else {}),
                    },
                )
                first = not self.scripts
                self.scripts = answer["scripts"]
                self.heartbeat_seconds = float(answer.get("heartbeat_seconds") or 1.0)
                if first:
                    continue  # now that the far-side scripts are here, report the facts they find
                log(f"connected to {self.server.host} as the agent of {answer['machine']}")
                return
            except Refused as e:
                if e.status in (401, 403):
                    log(f"the server refuses this agent's token ({e}); waiting for a valid one")
                else:
                    log(f"hello failed: {e}")
            except NETWORK_ERRORS as e:
                log(f"cannot reach the server: {e}")
            failures += 1
            time.sleep(backoff(failures))

    def _run(self, name: str, *args: str, stdin: bytes = b"", timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(_script(self.scripts, name, *args), input=stdin, capture_output=True, timeout=timeout)

    # -- claiming --------------------------------------------------------------------
    def capacity(self) -> int:
        limit = self.max_jobs
        if self.gpus_per_job:
            limit = min(limit, len(self.gpu_ids) // self.gpus_per_job)
        return limit - len(self._job_dirs())

    def run(self) -> int:
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.hello()
        threading.Thread(target=self.heartbeats, name="heartbeats", daemon=True).start()
        failures = 0
        while True:
            if self.capacity() <= 0:
                time.sleep(0.2)
                continue
            try:
                status, answer = self.server.request(
                    "POST", "claim", {"agent": self.ident, "hold": 25}, timeout=CLAIM_TIMEOUT
                )
                failures = 0
            except Refused as e:
                failures += 1
                log(f"claim refused: {e}")
                time.sleep(backoff(failures))
                continue
            except NETWORK_ERRORS as e:
                failures += 1
                log(f"claim failed: {e}; trying again")
                time.sleep(backoff(failures))
                continue
            if status == 200 and answer and answer.get("job"):
                job = answer["job"]
                self._prepare_dir(job)
                threading.Thread(target=self.take, args=(job,), name=f"job-{job['job_id']}", daemon=True).start()

    # -- one job ---------------------------------------------------------------------
    def _job_dirs(self) -> list[Path]:
        try:
            return sorted(p for p in self.jobs.iterdir() if (p / "agent.json").is_file())
        except FileNotFoundError:
            return []

    @staticmethod
    def _meta(jobdir: Path) -> dict[str, Any]:
        return json.loads((jobdir / "agent.json").read_text())

    def _save(self, jobdir: Path, meta: dict[str, Any], *fields: str) -> None:
        """Write ``fields`` of ``meta`` into the job's agent.json (all of it when none are named)."""
        with self.meta_lock:
            saved = dict(meta)
            if fields:
                with contextlib.suppress(OSError, ValueError):  # else not written yet: all of ``meta`` goes
                    saved = self._meta(jobdir)
                saved.update({f: meta[f] for f in fields if f in meta})
            tmp = jobdir / "agent.json.tmp"
            tmp.write_text(json.dumps(saved))
            os.replace(tmp, jobdir / "agent.json")

    def _prepare_dir(self, job: dict[str, Any]) -> None:
        jobdir = self.jobs / job["job_id"]
        shutil.rmtree(jobdir, ignore_errors=True)
        (jobdir / "work").mkdir(parents=True)
        (jobdir / "job.json").write_text(json.dumps({"job_id": job["job_id"], "attempt": job["attempt"]}) + "\n")
        with self.lock:
            self.preparing.add(job["job_id"])
        meta = {
            "job_id": job["job_id"],
            "attempt": job["attempt"],
            "bring_back": job.get("bring_back") or [],
            "phase": "preparing",
            "log_sent": 0,
            "gpus": [],
        }
        self._save(jobdir, meta)

    def take(self, job: dict[str, Any]) -> None:
        """Inputs into the cache and the work tree, then the launcher; a failure is reported as the job's."""
        jobdir = self.jobs / job["job_id"]
        meta = self._meta(jobdir)
        try:
            self._inputs(job, jobdir)
            if job["job_id"] in self.cancelling:
                meta.update(phase="failed", how="cancelled", detail="cancelled before it started")
                return
            self._reserve_gpus(job, jobdir, meta)
            self._launch(job, jobdir, meta["gpus"])
            meta.update(phase="running", started_at=time.time())
        except Exception as e:  # anything that stops the job from starting ends it, with why
            log(f"job {job['job_id']} could not start: {e}")
            meta.update(phase="failed", how="failed", detail=f"could not start on the agent: {e}")
        finally:
            self._save(jobdir, meta, *STARTING_FIELDS)
            with self.lock:
                self.preparing.discard(job["job_id"])
            self.kick.set()  # tell the server at once: pickup is measured to this report
        cache = job.get("cache") or {}
        self._run(
            "cache", "evict", str(self.state), str(cache.get("max_age_days", 14)), str(cache.get("max_bytes", 20 << 30))
        )

    def _inputs(self, job: dict[str, Any], jobdir: Path) -> None:
        inputs = job.get("inputs") or []
        if not inputs:
            return
        wanted = "\n".join(sorted({f["sha256"] for f in inputs})) + "\n\n"
        have = self._run("cache", "have", str(self.state), stdin=wanted.encode())
        held = {line.split()[0] for line in have.stdout.decode().splitlines() if len(line.split()) == 2}
        for entry in {f["sha256"]: f for f in inputs}.values():
            if entry["sha256"] not in held:
                self._download(job, entry)
        lines = "".join(f"{f['sha256']} {int(f['mode']) & 0o7777:o} {_b64(f['path'])}\n" for f in inputs)
        linked = self._run("cache", "link", str(self.state), str(jobdir), stdin=lines.encode())
        if linked.returncode != 0 or b"missing " in linked.stdout:
            raise RuntimeError("inputs could not be linked: " + (linked.stderr or linked.stdout).decode()[-300:])

    def _download(self, job: dict[str, Any], entry: dict[str, Any]) -> None:
        cache = self.state / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".incoming-{uuid.uuid4().hex}"
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:

                def sink(chunk: bytes) -> None:
                    digest.update(chunk)
                    f.write(chunk)

                self.server.request(
                    "GET",
                    f"jobs/{job['job_id']}/inputs/{entry['sha256']}",
                    query={"attempt": job["attempt"]},
                    sink=sink,
                )
            if digest.hexdigest() != entry["sha256"] or tmp.stat().st_size != entry["size"]:
                raise RuntimeError(f"input {entry['path']} arrived damaged (sha256 differs)")
            os.chmod(tmp, 0o444)
            os.replace(tmp, cache / entry["sha256"])
        finally:
            if tmp.exists():
                tmp.unlink()

    def _reserve_gpus(self, job: dict[str, Any], jobdir: Path, meta: dict[str, Any]) -> None:
        """Pick free GPUs and write them into the job's agent.json before letting go of the lock.

        Jobs start in their own threads; the choice is only seen by the next job once it is on disk."""
        wanted = job.get("gpus") or self.gpus_per_job
        if not wanted:
            return
        with self.lock:
            used = set()
            for other in self._job_dirs():
                if other == jobdir:
                    continue
                try:
                    used.update(self._meta(other).get("gpus") or [])
                except (OSError, ValueError):
                    continue
            free = [g for g in self.gpu_ids if g not in used]
            if len(free) < wanted:
                raise RuntimeError(f"{wanted} GPUs asked, {len(free)} free on this machine")
            meta["gpus"] = free[:wanted]
            self._save(jobdir, meta, "gpus")

    def _launch(self, job: dict[str, Any], jobdir: Path, gpus: list[str]) -> None:
        (jobdir / "launch.sh").write_text(self.scripts["launch"])
        (jobdir / "run.sh").write_text(self.scripts["run"])
        (jobdir / "command.sh").write_text(job["command"])
        stdin = base64.b64decode(job["launch_stdin"])
        if gpus:
            stdin += b"CUDA_VISIBLE_DEVICES=" + base64.b64encode(",".join(gpus).encode()) + b"\n"
        proc = subprocess.run(
            ["sh", str(jobdir / "launch.sh"), str(jobdir)], input=stdin, capture_output=True, timeout=60
        )
        if proc.returncode != 0:
            raise RuntimeError(f"launcher exit {proc.returncode}: {proc.stderr.decode('utf-8', 'replace')[-300:]}")

    # -- heartbeats ------------------------------------------------------------------
    def heartbeats(self) -> None:
        failures = 0
        while True:
            self.kick.wait(backoff(failures) if failures else self.heartbeat_seconds)
            self.kick.clear()
            try:
                self.beat_all()
                failures = 0
            except NETWORK_ERRORS as e:
                failures += 1
                log(f"heartbeat failed: {e}; trying again")
            except Refused as e:
                failures += 1
                log(f"heartbeat refused: {e}")

    def beat_all(self) -> None:
        dirs = self._job_dirs()
        metas = {}
        for jobdir in dirs:
            try:
                metas[jobdir] = self._meta(jobdir)
            except (OSError, ValueError):
                continue
        running = [d for d, m in metas.items() if m.get("phase") == "running"]
        states: dict[Path, tuple[str, str]] = {}
        building: dict[Path, dict[str, Any]] = {}
        if running:
            out = self._run("status", *map(str, running), timeout=60).stdout.decode("utf-8", "replace")
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0].isdigit() and int(parts[0]) < len(running):
                    states[running[int(parts[0])]] = (parts[1], parts[2])
                elif len(parts) == 4 and parts[0] == "building" and parts[1].isdigit() and parts[3].isdigit():
                    # env.sh building the job's environment: the server makes it the job's reason
                    at = int(parts[1])
                    if at < len(running):
                        building[running[at]] = {"tool": parts[2], "packages": int(parts[3])}
        for jobdir, meta in metas.items():
            self.beat(jobdir, meta, states.get(jobdir), building.get(jobdir))

    def _post(self, jobdir: Path, meta: dict[str, Any], report: dict[str, Any]) -> dict[str, Any] | None:
        """One heartbeat with the next log bytes; None when the attempt is no longer ours (then dropped)."""
        data = b""
        log_path = jobdir / "log"
        if log_path.exists():
            with open(log_path, "rb") as f:
                f.seek(meta["log_sent"])
                data = f.read(LOG_CHUNK)
        body = {"attempt": meta["attempt"], "log_offset": meta["log_sent"], "log": base64.b64encode(data).decode()}
        body.update(report)
        try:
            _, answer = self.server.request("POST", f"jobs/{meta['job_id']}/heartbeat", body)
        except Refused as e:
            if e.status in (404, 409):
                # Cleaned up, or the lease ran out and the job moved on: stop what is left and forget it.
                why = "unknown to the server" if e.status == 404 else "its attempt is stale"
                log(f"job {meta['job_id']}: {why}; dropping it")
                self._stop(jobdir, 0)
                shutil.rmtree(jobdir, ignore_errors=True)
                return None
            raise
        meta["log_sent"] = int(answer.get("log_size", meta["log_sent"]))
        self._save(jobdir, meta, "log_sent")
        return answer

    def beat(
        self,
        jobdir: Path,
        meta: dict[str, Any],
        status: tuple[str, str] | None,
        building: dict[str, Any] | None = None,
    ) -> None:
        job_id = meta["job_id"]
        phase = meta.get("phase")
        if phase == "preparing":
            with self.lock:
                mine = job_id in self.preparing
            if not mine:
                try:
                    # Its thread may have finished starting it since this beat read agent.json; that thread
                    # saves before it lets go of the job, so a fresh read tells.
                    if self._meta(jobdir).get("phase") != "preparing":
                        return
                except (OSError, ValueError):
                    pass
                # This agent restarted while preparing it: the server queues it again once the lease ends.
                shutil.rmtree(jobdir, ignore_errors=True)
                return
            answer = self._post(jobdir, meta, {"state": "claimed"})
            if answer and answer.get("cancel") is not None:
                self.cancelling.add(job_id)
            return
        if phase == "failed":
            if self._post(
                jobdir, meta, {"state": "ended", "how": meta.get("how", "failed"), "detail": meta.get("detail")}
            ):
                shutil.rmtree(jobdir, ignore_errors=True)
            return
        if status is None:
            return
        state, code = status
        report = {"state": "running", "started_at": meta.get("started_at")}
        if state == "running":
            answer = self._post(jobdir, meta, {**report, "building": building})
            if answer and answer.get("cancel") is not None and job_id not in self.cancelling:
                self.cancelling.add(job_id)
                grace = float(answer["cancel"])
                threading.Thread(target=self._cancel, args=(jobdir, grace), daemon=True).start()
            return
        # It ended: the whole log first, then the outputs, then the end itself.
        size = (jobdir / "log").stat().st_size if (jobdir / "log").exists() else 0
        while meta["log_sent"] < size:
            before = meta["log_sent"]
            if self._post(jobdir, meta, report) is None:
                return
            if meta["log_sent"] <= before:
                break
        if not meta.get("uploaded"):
            if not self._upload(jobdir, meta):
                return
            meta["uploaded"] = True
            self._save(jobdir, meta, "uploaded")
        how = {"exited": "exited", "cancelled": "cancelled"}.get(state, "gone")
        end = {"state": "ended", "how": how, "started_at": meta.get("started_at")}
        if how == "exited":
            end["exit_code"] = int(code) if code.lstrip("-").isdigit() else None
        elif how == "gone":
            end["detail"] = f"the process vanished on {socket.gethostname()}"
        if self._post(jobdir, meta, end) is not None:
            shutil.rmtree(jobdir, ignore_errors=True)
            self.cancelling.discard(job_id)
            log(f"job {job_id} ended ({how} {code})")

    def _upload(self, jobdir: Path, meta: dict[str, Any]) -> bool:
        """The declared outputs and mlruns/ as manifest.sh's stream, with their sha256; False if refused."""
        name = f".fetch-{uuid.uuid4().hex}"
        archive = jobdir / "outputs.tar"
        with open(archive, "wb") as out:
            proc = subprocess.run(
                _script(self.scripts, "manifest", str(jobdir), name, *meta["bring_back"]),
                stdout=out,
                stderr=subprocess.PIPE,
                timeout=3600,
            )
        if proc.returncode != 0:
            log(f"job {meta['job_id']}: packing outputs failed: {proc.stderr.decode('utf-8', 'replace')[-300:]}")
        try:
            with open(archive, "rb") as f:
                self.server.request(
                    "PUT",
                    f"jobs/{meta['job_id']}/outputs",
                    query={"attempt": meta["attempt"], "manifest": name, "output": meta["bring_back"]},
                    raw=f,
                    length=archive.stat().st_size,
                    timeout=600,
                )
        except Refused as e:
            if e.status in (404, 409):
                self._stop(jobdir, 0)
                shutil.rmtree(jobdir, ignore_errors=True)
                return False
            raise
        finally:
            archive.unlink(missing_ok=True)
        return True

    def _cancel(self, jobdir: Path, grace: float) -> None:
        self._stop(jobdir, grace)
        self.kick.set()

    def _stop(self, jobdir: Path, grace: float) -> None:
        if (jobdir / "pid").exists():
            proc = self._run("cancel", str(jobdir), str(max(0, int(grace * 10))), timeout=grace + 60)
            if proc.returncode != 0:
                log(f"cancel of {jobdir.name}: {proc.stderr.decode('utf-8', 'replace')[-300:]}")


# -- the command line ------------------------------------------------------------------
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
