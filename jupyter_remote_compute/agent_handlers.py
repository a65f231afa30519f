"""The endpoints pull agents call, under ``/remote-compute/agent/``, and the token actions of people.

An agent authenticates with its machine's token (``Authorization: Bearer <token>``), checked here
against the hash ``agent_hub`` keeps, in constant time. It is not a Jupyter identity: these
handlers are open to jupyter_server (``@allow_unauthenticated``, so they work with
``allow_unauthenticated_access=False``) and refuse anything without the machine's token. They read
no cookie, so they need no XSRF token. Every route names the machine, and a token opens only that
machine's routes and jobs: another machine's job is "not found", a stale attempt a 409.

    GET  agent/agent.pyz                                  the agent as one zipapp (any agent token)
    POST agent/<machine>/hello                            facts in; the far-side scripts and timings out
    POST agent/<machine>/claim                            held ~25 s until a job is ready (204: none)
    POST agent/<machine>/jobs/<id>/heartbeat              renew the lease, log bytes by offset; cancel back
    GET  agent/<machine>/jobs/<id>/inputs/<sha256>        one input, by digest
    PUT  agent/<machine>/jobs/<id>/outputs                the outputs' tar stream, streamed to disk
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import io
import os
import secrets
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import allow_unauthenticated

from .engines import farside
from .engines.agent_hub import CLAIM_HOLD, AgentHub, MachineHub, StaleAttempt, UnknownJob, welcome
from .engines.launcher import LAUNCH_SH, RUN_SH, launch_input
from .errors import Conflict, InvalidSettings, NotFound, RemoteComputeError
from .handlers import JOB_ID, MACHINE, PREFIX, RemoteComputeHandler, api
from .jobs.logs import secret_env
from .json_routes import BodyToFile

AGENT = rf"{PREFIX}/agent"
SHA = r"(?P<sha>[0-9a-f]{64})"
#: How often an agent sends its heartbeat, and so new log bytes.
HEARTBEAT_SECONDS = 1.0
INPUT_CHUNK = 1 << 20
#: While a claim is held, the agent's "last seen" is written this often (seconds).
SEEN_EVERY = 5.0


class AgentUnauthorized(RemoteComputeError):
    status = 403
    code = "forbidden"


def agent_api(method: Callable[..., Any]) -> Any:
    """Open to jupyter_server, closed to anyone without this machine's agent token; errors as JSON."""

    @functools.wraps(method)
    async def handle(self: AgentHandler, *args: Any, **kwargs: Any) -> None:
        try:
            await method(self, *args, **kwargs)
        except RemoteComputeError as e:
            self.fail(e)

    return allow_unauthenticated(handle)


class AgentHandler(RemoteComputeHandler):
    #: The machine whose token this request carries, once ``prepare`` checked it.
    machine: MachineHub

    def check_xsrf_cookie(self) -> None:
        """No cookie is read here (the token comes in a header only), so there is no cross-site request to stop."""

    @property
    def hub(self) -> AgentHub:
        return AgentHub(self.service.workspace.punica_dir)

    def bearer(self) -> str:
        scheme, _, token = self.request.headers.get("Authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""

    async def prepare(self) -> None:
        await super().prepare()
        token = self.bearer()
        name = self.path_kwargs.get("name")
        if name is None:
            return  # agent.pyz: checked by its handler against every machine
        try:
            machine = self.hub.machine(name)
        except UnknownJob:
            machine = None
        if not token or machine is None or not await self.call(machine.accepts, token):
            self.fail(AgentUnauthorized("an agent token of this machine is required (Authorization: Bearer ...)"))
            return
        self.machine = machine

    def job_dir(self, job_id: str) -> Path:
        """The job's folder on this side, if the job is this machine's; else "not found" (never "not yours")."""
        try:
            path = self.machine.job_dir(job_id)
        except UnknownJob:
            path = None
        if path is None or not (path / "state.json").is_file():
            raise NotFound(f"no job {job_id!r} for {self.machine.name}")
        return path

    async def scoped(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A hub call answered as 404 (unknown to this machine) or 409 (a stale attempt)."""
        try:
            return await self.call(fn, *args)
        except UnknownJob:
            raise NotFound(f"no job {args[0]!r} for {self.machine.name}") from None
        except StaleAttempt:
            raise Conflict(f"job {args[0]}: this attempt is no longer the job's; drop it") from None


def _attempt(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidSettings("attempt: expected the attempt number of the claim", field="attempt") from None


class HelloHandler(AgentHandler):
    @agent_api
    async def post(self, name: str) -> None:
        body = self.body()
        facts = body.get("facts")
        await self.call(
            self.machine.seen,
            facts=facts if isinstance(facts, str) else None,
            agent={k: str(body.get(k))[:200] for k in ("version", "host", "pid", "python") if k in body},
        )
        self.reply(
            {
                "machine": name,
                "scripts": {
                    **{n: farside.script(n) for n in farside.SCRIPTS},
                    "launch": LAUNCH_SH,
                    "run": RUN_SH,
                },
                "heartbeat_seconds": HEARTBEAT_SECONDS,
                "claim_hold_seconds": CLAIM_HOLD,
                "lease_seconds": self.settings.get("remote_compute_agent_lease"),
            }
        )


class ClaimHandler(AgentHandler):
    @agent_api
    async def post(self, name: str) -> None:
        """Held until a job for this machine is queued (then claimed: a lease on a new attempt) or ~25 s pass."""
        body = self.body()
        agent = str(body.get("agent") or "agent")[:200]
        try:
            hold = min(float(body.get("hold", CLAIM_HOLD)), CLAIM_HOLD)
        except (TypeError, ValueError):
            raise InvalidSettings("hold: expected seconds", field="hold") from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold
        stamp: int | None = None
        seen = -SEEN_EVERY
        while True:
            if loop.time() - seen >= SEEN_EVERY:
                seen = loop.time()
                await self.call(self.machine.seen)
            # A stat is the whole cost of looking: the queue is read only when something was queued.
            current = self.machine.queue_stamp()
            if current != stamp:
                stamp = current
                while (claimed := await self.call(self.machine.claim, agent)) is not None:
                    payload = await self.call(self._payload, claimed)
                    if payload is not None:
                        self.reply({"job": payload})
                        return
            if loop.time() >= deadline or self.request.connection.stream.closed():
                self.set_status(204)
                self.finish()
                return
            await asyncio.sleep(0.05)

    def _payload(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """What the agent needs to run the claimed attempt; a job that cannot be run ends here with why."""
        job_id = state["job_id"]
        try:
            job = self.service.get(job_id)
            launch = self.machine.launch(job_id)
            values = secret_env(self.service.secrets, job)
            stdin = launch_input(launch.get("env") or {}, values)
            days, size = farside.cache_limits((job.machine_snapshot or {}).get("options") or {})
        except (RemoteComputeError, ValueError) as e:
            message = getattr(e, "message", str(e))
            with contextlib.suppress(StaleAttempt, UnknownJob):
                self.machine.heartbeat(
                    job_id, state["attempt"], {"state": "ended", "how": "failed", "detail": message}, b"", 0
                )
            return None
        return {
            "job_id": job_id,
            "attempt": state["attempt"],
            "command": launch.get("command", ""),
            "launch_stdin": base64.b64encode(stdin).decode("ascii"),
            "inputs": [{k: f[k] for k in ("path", "sha256", "size", "mode")} for f in self.machine.inputs(job_id)],
            "bring_back": list(job.spec.bring_back),
            "gpus": launch.get("gpus"),
            "cache": {"max_age_days": days, "max_bytes": size},
        }


class HeartbeatHandler(AgentHandler):
    @agent_api
    async def post(self, name: str, job_id: str) -> None:
        body = self.body()
        try:
            log = base64.b64decode(body.get("log") or "", validate=True)
        except (binascii.Error, ValueError):
            raise InvalidSettings("log: expected base64", field="log") from None
        offset = body.get("log_offset", 0)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidSettings("log_offset: expected a byte offset", field="log_offset")
        report = {k: body.get(k) for k in ("state", "how", "exit_code", "detail", "started_at", "building")}
        self.job_dir(job_id)
        # An agent busy with its jobs claims nothing, but its heartbeats say it is there.
        await self.call(self.machine.seen, SEEN_EVERY)
        answer = await self.scoped(self.machine.heartbeat, job_id, _attempt(body.get("attempt")), report, log, offset)
        self.reply(answer)


class InputHandler(AgentHandler):
    @agent_api
    async def get(self, name: str, job_id: str, sha: str) -> None:
        self.job_dir(job_id)
        attempt = _attempt(self.get_argument("attempt", None))
        source = await self.scoped(self._source, job_id, attempt, sha)
        f = await self.call(open, source, "rb")
        try:
            size = await self.call(lambda: os.fstat(f.fileno()).st_size)
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Content-Length", str(size))
            while chunk := await self.call(f.read, INPUT_CHUNK):
                self.write(chunk)
                await self.flush()
        finally:
            f.close()
        self.finish()

    def _source(self, job_id: str, attempt: int, sha: str) -> Path:
        state = self.machine.state(job_id)
        if state is None:
            raise UnknownJob(job_id)
        if int(state.get("attempt", 0)) != attempt or state.get("state") not in ("claimed", "running"):
            raise StaleAttempt(job_id)
        root = self.service.workspace.root.resolve()
        for entry in self.machine.inputs(job_id):
            if entry["sha256"] == sha:
                path = Path(entry["source"]).resolve()
                # Only a workspace file declared as this job's input ever leaves through here.
                if root in path.parents and path.is_file():
                    return path
        raise UnknownJob(job_id)


@tornado.web.stream_request_body
class OutputsHandler(BodyToFile, AgentHandler):
    """The outputs' tar stream (manifest.sh's), written to disk as it arrives, never held in memory."""

    async def prepare(self) -> None:
        await super().prepare()
        if self._finished:
            return
        try:
            job_dir = self.job_dir(self.path_kwargs["job_id"])
            self.attempt = _attempt(self.get_argument("attempt", None))
            self.manifest = self.get_argument("manifest", "")
            if not self.manifest or "/" in self.manifest or not self.manifest.startswith(".fetch-"):
                raise InvalidSettings("manifest: expected the name of the stream's first entry", field="manifest")
            self.declared = self.get_arguments("output")
            state = await self.call(self.machine.state, self.path_kwargs["job_id"])
            if state is None:
                raise NotFound(f"no job {self.path_kwargs['job_id']!r} for {self.machine.name}")
            if int(state.get("attempt", 0)) != self.attempt or state.get("state") not in ("claimed", "running"):
                raise Conflict("this attempt is no longer the job's; drop it")
        except RemoteComputeError as e:
            self.fail(e)
            return
        self.request.connection.set_max_body_size(1 << 40)
        self._tmp = job_dir / f"outputs.tar.part-{secrets.token_hex(6)}"
        self._file = await self.call(open, self._tmp, "wb")

    async def data_received(self, chunk: bytes) -> None:
        if self._file is not None:
            await self.call(self._file.write, chunk)

    @agent_api
    async def put(self, name: str, job_id: str) -> None:
        self.body_came()
        await self.call(self._file.close)
        self._file = None
        try:
            await self.scoped(
                self.machine.outputs_landed, job_id, self.attempt, self._tmp, self.manifest, self.declared
            )
        finally:
            self._tmp.unlink(missing_ok=True)
        self.set_status(204)
        self.finish()


class AgentAppHandler(AgentHandler):
    @agent_api
    async def get(self) -> None:
        """The agent as one file for ``python3 agent.pyz``; any machine's agent token may fetch it."""
        token = self.bearer()
        hubs = await self.call(self.hub.machines)
        if not token or not any([await self.call(m.accepts, token) for m in hubs]):
            raise AgentUnauthorized("an agent token is required (Authorization: Bearer ...)")
        self.set_header("Content-Type", "application/zip")
        self.set_header("Content-Disposition", 'attachment; filename="agent.pyz"')
        self.finish(await self.call(agent_zipapp))


class AgentTokenHandler(RemoteComputeHandler):
    """People rotate or revoke a machine's agent token (the panel, the CLI): one action each."""

    @api
    async def post(self, name: str) -> None:
        action = self.body().get("action")
        if action not in ("rotate", "revoke"):
            raise InvalidSettings("action: expected 'rotate' or 'revoke'", field="action")
        machine = await self.call(self.service.admin.get, name)
        if machine.kind != "agent":
            raise InvalidSettings(f"{name} is a {machine.kind} machine: only agent machines have an agent token")
        punica = self.service.workspace.punica_dir
        if action == "revoke":
            await self.call(AgentHub(punica).machine(name).revoke_token)
            self.reply({"name": name, "revoked": True})
            return
        self.reply({"name": name, **await self.call(welcome, punica, name, self.server_url())})


#: The agent's modules as the zipapp carries them (its ``__main__.py`` is the zipapp's own).
AGENT_MODULES = ("__init__.py", "server.py", "client.py", "command.py")


@functools.cache
def agent_zipapp() -> bytes:
    """The agent/ package as a zipapp: stdlib only, so a bare Python ≥ 3.9 runs it."""
    package = Path(__file__).parent / "agent"
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for module in AGENT_MODULES:
            archive.writestr(f"jrc_agent/{module}", (package / module).read_text(encoding="utf-8"))
        archive.writestr("__main__.py", "import sys\nfrom jrc_agent.command import main\n\nsys.exit(main())\n")
    return buffer.getvalue()


AGENT_HANDLERS: list[tuple[str, type[RemoteComputeHandler]]] = [
    (rf"{AGENT}/agent\.pyz", AgentAppHandler),
    (rf"{AGENT}/{MACHINE}/hello", HelloHandler),
    (rf"{AGENT}/{MACHINE}/claim", ClaimHandler),
    (rf"{AGENT}/{MACHINE}/jobs/{JOB_ID}/heartbeat", HeartbeatHandler),
    (rf"{AGENT}/{MACHINE}/jobs/{JOB_ID}/inputs/{SHA}", InputHandler),
    (rf"{AGENT}/{MACHINE}/jobs/{JOB_ID}/outputs", OutputsHandler),
    (rf"{PREFIX}/machines/{MACHINE}/agent-token", AgentTokenHandler),
]
