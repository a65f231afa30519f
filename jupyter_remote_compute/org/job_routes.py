"""The routes of users' jobs on the organization's machines (``jobs.py`` does the work).

Each is the call of an engine method a user's server makes (``engines/organization/engine.py``), on the
caller's own jobs only: another's id is "not found". ``service.py`` lists them in ``API_ROUTES``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading

import tornado.web

from ..engines.organization.wire import metrics_json
from ..errors import Forbidden, InvalidSettings, RemoteComputeError
from ..json_routes import BodyToFile
from . import scopes
from .handler import OrgHandler, all_users, body_list, count_argument, is_count, is_number, route
from .jobs import check_sha

log = logging.getLogger(__name__)


class JobsHandler(OrgHandler):
    @route
    async def get(self) -> None:
        user = self.require(scopes.USE)
        if all_users(self):
            self.require(scopes.ADMIN, "see every user's jobs")
            self.reply({"jobs": await self.call(self.jobs.list)})
            return
        self.reply({"jobs": await self.call(self.jobs.list, user)})


class JobHandler(OrgHandler):
    @route
    async def put(self, job_id: str) -> None:
        user = self.require(scopes.USE)
        body = self.body()
        member = self.member()
        machine = body.get("machine")
        if isinstance(machine, str) and machine:  # else prepare names what is wrong with it
            await self.call(self.organization.check_use, machine, member)
        job = await self.call(self.jobs.prepare, user, job_id, machine, body.get("key"), list(member.groups))
        self.reply({**job.summary(), "dir": job.handle.get("dir")})

    @route
    async def get(self, job_id: str) -> None:
        user = self.require(scopes.USE)
        job = await self.call(self.jobs.get, user, job_id)
        self.reply({**job.summary(), "dir": job.handle.get("dir")})

    @route
    async def delete(self, job_id: str) -> None:
        user = self.require(scopes.USE)
        await self.call(self.jobs.cleanup, user, job_id)
        self.set_status(204)
        self.finish()


class JobActionHandler(OrgHandler):
    """``send``, ``start``, ``cancel`` and ``fetch`` of one of the caller's jobs."""

    @route
    async def post(self, job_id: str, action: str) -> None:
        user = self.require(scopes.USE)
        body = self.body()
        if action == "send":
            self.reply(await self.call(self.jobs.send, user, job_id, body_list(body, "files")))
        elif action == "start":
            # Its machine's list again: an admin may have taken the user off it since the job was prepared.
            job = await self.call(self.jobs.get, user, job_id)
            await self.call(lambda: self.organization.check_use(job.machine, self.member(), removed_ok=True))
            await self.call(self.jobs.start, user, job_id, body)
            self.set_status(204)
            self.finish()
        elif action == "cancel":
            grace = body.get("grace", 10)
            if not is_number(grace) or grace < 0:
                raise InvalidSettings("grace: expected seconds", field="grace")
            await self.call(self.jobs.cancel, user, job_id, float(grace))
            self.set_status(204)
            self.finish()
        else:
            self.reply(await self.call(self.jobs.fetch, user, job_id, body_list(body, "outputs")))


class PollHandler(OrgHandler):
    @route
    async def post(self) -> None:
        user = self.require(scopes.USE)
        body = self.body()
        ids = body_list(body, "jobs")
        if not all(isinstance(i, str) for i in ids):
            raise InvalidSettings("jobs: expected job ids", field="jobs")
        watched = body.get("watched", {})
        valid = isinstance(watched, dict) and all(
            isinstance(o, dict) and all(is_count(n) for n in o.values()) for o in watched.values()
        )
        if not valid:
            raise InvalidSettings("watched: expected byte offsets by job and metric file", field="watched")
        statuses, metrics = await self.call(self.jobs.poll, user, ids, watched)
        self.reply({"statuses": statuses, "metrics": metrics_json(metrics)})


class LogHandler(OrgHandler):
    @route
    async def get(self, job_id: str) -> None:
        user = self.require(scopes.USE)
        offset, limit = count_argument(self, "offset", 0), count_argument(self, "limit", 1 << 20)
        data = await self.call(self.jobs.read_log, user, job_id, offset, min(limit, 16 << 20))
        self.set_header("Content-Type", "application/octet-stream")
        self.finish(data)


class OutputsHandler(OrgHandler):
    """The outputs ``fetch`` brought, streamed as one tar: written by a thread into a pipe, sent as it comes."""

    @route
    async def get(self, job_id: str) -> None:
        user = self.require(scopes.USE)
        manifest = self.get_argument("manifest", "")
        await self.call(self.jobs.get, user, job_id)
        read_end, write_end = os.pipe()
        failure: list[BaseException] = []

        def produce() -> None:
            try:
                with open(write_end, "wb") as out:
                    try:
                        self.jobs.write_outputs(user, job_id, manifest, out)
                    except BrokenPipeError:
                        raise
                    except BaseException as e:  # kept before the pipe closes: the reader sees it at the end
                        failure.append(e)
            except BrokenPipeError:
                pass  # the reader went away: nothing to send to

        # A thread of its own, not the pool's: it blocks on the pipe until this handler reads.
        threading.Thread(target=produce, name=f"outputs-{job_id}", daemon=True).start()
        self.set_header("Content-Type", "application/x-tar")
        with open(read_end, "rb") as source:
            first = True
            while chunk := await self.call(source.read, OUTPUT_CHUNK):
                self.write(chunk)
                await self.flush()
                first = False
            if first and failure and isinstance(failure[0], RemoteComputeError):
                raise failure[0]  # nothing was sent yet: the error is the answer
        if failure:
            log.warning("job %s: the outputs' stream ended early: %s", job_id, failure[0])
        self.finish()


@tornado.web.stream_request_body
class InputHandler(BodyToFile, OrgHandler):
    """One input, by its sha256: streamed to a temporary file and hashed as it comes, kept once it matches."""

    async def prepare(self) -> None:
        try:
            if not self.current_user:
                raise Forbidden("sign in through the hub (a token of yours, or its login)")
            user = self.require(scopes.USE)
            self.blob = self.jobs.blob(user, check_sha(self.path_args[0]))
        except RemoteComputeError as e:
            self.reply(e.to_json(), e.status)
            return
        self.request.connection.set_max_body_size(1 << 40)
        self.hasher = hashlib.sha256()
        self._tmp = self.blob.with_name(f".{self.blob.name}.part-{secrets.token_hex(6)}")
        self._file = await self.call(open, self._tmp, "wb")

    def _take(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self.hasher.update(chunk)

    async def data_received(self, chunk: bytes) -> None:
        if self._file is not None:
            await self.call(self._take, chunk)

    @route
    async def put(self, sha: str) -> None:
        self.body_came()
        await self.call(self._file.close)
        self._file = None
        if self.hasher.hexdigest() != sha:
            raise InvalidSettings(f"the upload's sha256 is {self.hasher.hexdigest()}, not {sha}: send it again")
        os.chmod(self._tmp, 0o600)
        os.replace(self._tmp, self.blob)
        self._tmp = None
        self.set_status(204)
        self.finish()


class MissingInputsHandler(OrgHandler):
    @route
    async def post(self) -> None:
        user = self.require(scopes.USE)
        self.reply({"missing": await self.call(self.jobs.missing, user, body_list(self.body(), "digests"))})


OUTPUT_CHUNK = 1 << 20
JOB = r"([A-Za-z0-9][A-Za-z0-9._-]{0,127})"
