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

``server.py`` is the connection to the server, ``command.py`` the agent's command line.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .server import NETWORK_ERRORS, Refused, Server, backoff, log

VERSION = "1"
LOG_CHUNK = 1 << 20
CLAIM_TIMEOUT = 60.0  # the server holds a claim ~25 s; past this the connection is taken as dead


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
        # An earlier attempt of the same job, which the server ended while this agent was away (its lease
        # ran out), may still run here: stopped before its folder goes.
        self._stop(jobdir, 0)
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
