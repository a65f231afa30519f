"""The ``agent`` kind: a machine nothing may reach, whose agent pulls its jobs from this server.

The server never connects to the machine. ``start`` queues the job on this side
(``agent_hub``); the agent (``jupyter_remote_compute/agent/``) claims it through the agent
endpoints (``agent_handlers.py``), downloads its inputs by digest, runs it with the shared
launcher, sends its log in heartbeats and uploads its outputs (manifest.sh's tar stream, with
every file's sha256). ``poll`` reads what the agent reported, ``cancel`` leaves a request for
its next heartbeat and waits for it to be confirmed, ``fetch`` reads the uploaded stream under
the one extraction policy; the lifecycle verifies the digests as for every other kind.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from . import farside
from .agent_hub import AgentHub, MachineHub
from .base import (
    WORK_DIR,
    Engine,
    EngineError,
    Features,
    FetchResult,
    InputFile,
    LaunchSpec,
    OptionField,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from .launcher import command_script
from .ssh_transfer import ArchiveCut

#: How long ``cancel`` and ``fetch`` wait for the agent's confirmation before trying again later.
CONFIRM_WAIT = 30.0


class AgentEngine(Engine):
    kind = "agent"
    label = "Pull agent (the machine connects to this server)"
    # The agent reports when it runs a job, not what the job logs meanwhile: no live metrics.
    features = Features(pending=True, live_metrics=False)
    options: ClassVar[dict[str, OptionField]] = dict(farside.CACHE_OPTIONS)

    @classmethod
    def validate_address(cls, address: str) -> str:
        # Nothing is ever dialled: the address only says where the machine is, for people.
        if not address or any(c in address for c in "\r\n\t\0"):
            raise ValueError("address: describe where the machine is (e.g. 'lab-gpu-1'), on one line")
        return address

    @property
    def hub(self) -> MachineHub:
        if self.context.punica_dir is None:
            raise EngineError(f"{self.name}: an agent machine needs a workspace to keep its queue in")
        return AgentHub(self.context.punica_dir).machine(self.name)

    def check(self) -> dict[str, Any]:
        hub = self.hub
        presence = hub.presence()
        text = hub.facts_text()
        if text is None:
            raise EngineError(
                f"{self.name}: the agent has never connected; run it on that machine: "
                f"jupyter remote-compute agent --server URL --machine {self.name}"
            )
        facts = farside.parse_facts(text, 0.0, online=presence["online"], last_seen=presence["last_seen"])
        return facts.to_json()

    gpus_chosen_per_job = True

    def image_runtimes(self) -> tuple[str, ...]:
        return ("podman", "docker")  # the agent runs command.sh (container.sh for an image) like the others

    def image_pins(self) -> str:
        # The agent's state folder (<state>/jobs/<id>/ is the job's, container_command's $jobdir).
        return '"${jobdir%/*/*}"/images'

    def admit(self, resources: Any) -> None:
        if self.hub.facts_text() is None and not resources.partition and not (resources.nodes or 0) > 1:
            return  # nothing known of the machine yet: the agent refuses what it cannot give
        super().admit(resources)

    def prepare(self, job: RemoteJob) -> RemoteJob:
        path = self.hub.prepare(job.job_id)
        return RemoteJob(job.job_id, job.key, {**job.handle, "dir": str(path)})

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        # Nothing moves now: the agent downloads by digest what its cache lacks once it claims the job.
        self.hub.set_inputs(
            job.job_id,
            [
                {"path": f.relpath, "sha256": f.sha256, "size": f.size, "mode": f.mode, "source": str(f.source)}
                for f in files
            ],
        )
        return SendStats()

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        # Secret values are not written here: the server reads them when the agent claims the job.
        record = {
            "command": command_script(launch.command),
            "env": dict(launch.env),
            "secret_names": sorted(launch.secret_env),
            "timeout": launch.timeout,
            "gpus": launch.resources.gpus if launch.resources else None,
        }
        self.hub.enqueue(job.job_id, job.key, record)
        return RemoteJob(job.job_id, job.key, {**job.handle, "queued": True})

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        hub = self.hub
        return {job.job_id: self._status(hub, job) for job in jobs}

    def _status(self, hub: MachineHub, job: RemoteJob) -> RemoteStatus:
        state = hub.state(job.job_id)
        if state is None:
            return RemoteStatus("gone", detail=f"its record on this side is missing for {self.name}")
        times = {f"{k}_at": state.get(f"{k}_at") for k in ("queued", "started", "ended")}
        size = state.get("log_size")
        now = state["state"]
        if now == "queued":
            why = hub.offline_reason() or f"waiting for the agent of {self.name} to take it"
            return RemoteStatus("pending", detail=why, **times)
        if now == "claimed":
            return RemoteStatus("pending", log_size=size, detail=f"the agent of {self.name} is preparing it", **times)
        if now == "running":
            building = state.get("building")  # the agent's report of env.sh's build (agent_hub._building)
            detail = farside.building_reason(building["tool"], building["packages"]) if building else ""
            return RemoteStatus("running", log_size=size, detail=detail, **times)
        if now == "lost":
            # Its agent stopped renewing the lease: the machine's fault, which a retry policy's ``lost`` names.
            detail = state.get("detail") or "its lease ran out"
            return RemoteStatus("gone", log_size=size, detail=detail, cause="lost", **times)
        how = state.get("how")
        if how == "exited":
            return RemoteStatus("exited", exit_code=state.get("exit_code"), log_size=size, **times)
        if how == "failed":
            return RemoteStatus("failed", log_size=size, detail=state.get("detail") or "", **times)
        if how == "cancelled":
            return RemoteStatus("gone", log_size=size, detail="cancelled", **times)
        return RemoteStatus("gone", log_size=size, detail=state.get("detail") or "process vanished", **times)

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        try:
            with open(self.hub.job_dir(job.job_id) / "log", "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def _wait(self, job_id: str, done: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + CONFIRM_WAIT
        while True:
            state = self.hub.state(job_id) or {}
            if done(state):
                return state
            if time.monotonic() > deadline:
                reason = self.hub.offline_reason() or f"the agent of {self.name} has not {what} yet"
                raise EngineError(f"{self.name}: {reason}; trying again", transient=True)
            time.sleep(0.2)

    def cancel(self, job: RemoteJob, grace: float) -> None:
        if self.hub.state(job.job_id) is None:
            return
        self.hub.request_cancel(job.job_id, grace)
        # The agent stops the group (TERM, grace, KILL, verify), uploads what there is, and says so.
        self._wait(job.job_id, lambda s: s.get("state") in ("ended", "lost"), "confirmed the cancel")

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        state = self.hub.state(job.job_id) or {}
        never_ran = state.get("how") == "failed" or not state.get("started_at")
        if not state.get("outputs") and (state.get("state") == "lost" or never_ran):
            # Nothing will come: the command never started, or its agent is gone.
            return FetchResult(missing=list(outputs))
        state = self._wait(job.job_id, lambda s: bool(s.get("outputs")), "uploaded the outputs")
        uploaded = state["outputs"]
        declared = list(uploaded["declared"])
        try:
            result = farside.extract_archive(
                self.hub.job_dir(job.job_id) / "outputs.tar", declared, dest, uploaded["manifest"], self.name
            )
        except ArchiveCut as e:
            # The upload is stored here whole: a stream that stops short inside it is the agent's packing
            # failing midway (an unreadable output, say), which reading it again would never change.
            raise EngineError(f"{self.name}: the agent's upload of the outputs is incomplete: {e}") from None
        # The agent sends every declared output whatever the outcome; keep only what was asked for now.
        wanted = set(outputs)
        for name in declared:
            if name not in wanted:
                shutil.rmtree(Path(dest) / WORK_DIR / name, ignore_errors=True)
                (Path(dest) / WORK_DIR / name).unlink(missing_ok=True)

        def asked(rel: str) -> bool:
            return any(rel == o or rel.startswith(o + "/") for o in wanted)

        return FetchResult(
            digests={rel: digest for rel, digest in result.digests.items() if asked(rel)},
            missing=[m for m in result.missing if m in wanted] + [o for o in outputs if o not in declared],
        )

    def cleanup(self, job: RemoteJob) -> None:
        # The agent learns on its next heartbeat (404) and removes its own folder.
        self.hub.remove_job(job.job_id)
