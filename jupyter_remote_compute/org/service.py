"""The organization service: a JupyterHub-managed service that holds the organization's machines.

Started by the hub (``jupyter remote-compute organization``, see ``README.md``), it listens where
``JUPYTERHUB_SERVICE_URL`` says and serves under ``JUPYTERHUB_SERVICE_PREFIX``. Every request is a
JupyterHub identity: a browser's through the hub's OAuth, a user's server's or CLI's through its hub
token (``Authorization: token …``). The hub's ``access:services!service=<name>`` lets a caller in;
the custom scopes (``scopes.py``) say what it may do: ``use`` reads the machines, ``admin`` changes
them. Blocking work (compute.yaml, the Secret Manager) runs in a thread pool, never on the IOLoop.

Routes, under the prefix:

- ``GET api/me``: who is asking and what they may do.
- ``GET api/machines`` (use): the organization's machines the caller may use (``access``), each with
  ``owner: organization`` and the admin who set it; ``POST api/machines`` (admin) adds one.
- ``GET``/``PATCH``/``DELETE api/machines/<name>`` (use to read, admin to change).
- ``POST api/machines/<name>/check`` and ``…/admit`` (use): the machine's facts; whether it gives the
  resources a job asks for.
- ``GET api/default-machine`` (use): the organization's default machine (``machine``: described, or
  null) and the admin who chose it; ``PUT`` (admin, ``{machine}``) names it; ``DELETE`` (admin) clears it.
  ``GET api/machines`` lists it apart, as ``default``.

Jobs on those machines (use; ``jobs.py``), each the call of an engine method a user's server makes
(``engines/organization/engine.py``), on the caller's own jobs only (another's id is "not found"):

- ``GET api/jobs``: the caller's jobs; ``?all_users=1`` (admin) every user's, each with its user.
- ``PUT api/jobs/<id>`` (``{machine, key}``) binds the id to the caller and prepares it; ``GET`` reads the
  record; ``DELETE`` removes it there and here.
- ``POST api/inputs/missing`` (``{digests}``): which the caller has not uploaded; ``PUT api/inputs/<sha256>``:
  one input, streamed to disk and checked against its digest.
- ``POST api/jobs/<id>/send``, ``…/start``, ``…/cancel``, ``…/fetch``; ``POST api/poll`` (``{jobs, watched}``:
  the states, and what watched jobs logged to MLflow since the offsets given, base64);
  ``GET api/jobs/<id>/log?offset=&limit=``; ``GET api/jobs/<id>/outputs?manifest=`` (the fetched outputs
  as one tar stream).

The organization's usage and quotas (``jobs.py``, ``quotas.py``):

- ``GET api/usage?group_by=&since=&until=&format=`` (use): the caller's attempts summed per group
  (user, group, machine, month, kind, state; default user,machine), JSON or CSV; ``all_users=1`` (admin)
  everyone's.
- ``GET api/quotas`` (use): the quotas binding the caller, each with ``used`` and ``left`` (an admin: every
  quota); ``PUT``/``DELETE api/quotas/user/<name>`` and ``…/group/<name>`` (admin) set and remove one.

An engine's failure is ``{code: "engine_error", message, transient, details}``: 503 when trying again
later may work, 502 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import tornado.web
from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join

from ..engines.base import EngineError
from ..engines.organization.wire import metrics_json
from ..engines.resources import Resources
from ..errors import Forbidden, InvalidSettings, RemoteComputeError
from ..json_routes import BodyToFile, JsonRoute
from ..usage.ledger import ORG_GROUP_KEYS, parse_group_by, parse_instant, summarize, summary_csv
from . import scopes
from .jobs import OrgJobs, check_sha
from .organization import Member, Organization

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Where the service keeps its machines, secrets and ledger unless ``--state-dir`` says otherwise.
DEFAULT_STATE_DIR = "/var/lib/jupyter-remote-compute"


class OrgHandler(HubOAuthenticated, JsonRoute):  # type: ignore[misc]
    """A JSON route of the service: the caller is a hub identity; errors are the documented ``Error``."""

    @property
    def organization(self) -> Organization:
        return self.settings["organization"]

    @property
    def hub_user(self) -> dict[str, Any]:
        return self.current_user

    @property
    def jobs(self) -> OrgJobs:
        return self.settings["jobs"]

    def member(self) -> Member:
        """The caller (who holds the use scope: ``require`` first) as the machines' access lists see them."""
        user = self.hub_user
        held = user.get("scopes") or ()
        return Member(str(user["name"]), tuple(sorted(user.get("groups") or ())), scopes.grants(held, scopes.ADMIN))

    def require(self, scope: str, what: str | None = None) -> str:
        """The caller's name, if their token holds ``scope``; else a 403 that names the scope."""
        user = self.hub_user
        if not scopes.grants(user.get("scopes") or (), scope):
            if what is None:
                admin = scope == scopes.ADMIN
                what = "change the organization's machines" if admin else "use the organization's machines"
            raise Forbidden(f"{user['name']} may not {what}: ask a hub admin for the {scope} scope")
        return str(user["name"])

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.settings["executor"], lambda: fn(*args))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        else:
            message = "internal error of the service; its log has the details" if status_code >= 500 else "refused"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"code": "forbidden" if status_code == 403 else "error", "message": message}))


def route(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Authenticated by the hub (a browser without a token is sent to the hub's login); domain errors as JSON."""

    async def handle(self: OrgHandler, *args: Any) -> None:
        try:
            await method(self, *args)
        except RemoteComputeError as e:
            self.reply(e.to_json(), e.status)
        except EngineError as e:
            answer = {"code": "engine_error", "message": str(e), "transient": e.transient, "details": e.details}
            self.reply(answer, 503 if e.transient else 502)

    return tornado.web.authenticated(handle)


class MeHandler(OrgHandler):
    @route
    async def get(self) -> None:
        user = self.hub_user
        held = user.get("scopes") or ()
        self.reply(
            {
                "name": user["name"],
                "groups": sorted(user.get("groups") or ()),
                "use": scopes.grants(held, scopes.USE),
                "admin": scopes.grants(held, scopes.ADMIN),
            }
        )


class MachinesHandler(OrgHandler):
    @route
    async def get(self) -> None:
        self.require(scopes.USE)
        self.reply(await self.call(self.organization.machines, self.member()))

    @route
    async def post(self) -> None:
        admin = self.require(scopes.ADMIN)
        self.reply(await self.call(self.organization.add, admin, self.body()), 201)


class MachineHandler(OrgHandler):
    @route
    async def get(self, name: str) -> None:
        self.require(scopes.USE)
        self.reply(await self.call(self.organization.machine, name, self.member()))

    @route
    async def patch(self, name: str) -> None:
        admin = self.require(scopes.ADMIN)
        self.reply(await self.call(self.organization.update, admin, name, self.body()))

    @route
    async def delete(self, name: str) -> None:
        self.require(scopes.ADMIN)
        await self.call(self.organization.remove, name, self.get_argument("version", None))
        self.set_status(204)
        self.finish()


class DefaultMachineHandler(OrgHandler):
    @route
    async def get(self) -> None:
        self.require(scopes.USE)
        self.reply(await self.call(self.organization.default, self.member()))

    @route
    async def put(self) -> None:
        admin = self.require(scopes.ADMIN, "set the organization's default machine")
        self.reply(await self.call(self.organization.set_default, admin, self.body().get("machine")))

    @route
    async def delete(self) -> None:
        self.require(scopes.ADMIN, "set the organization's default machine")
        await self.call(self.organization.clear_default)
        self.set_status(204)
        self.finish()


class CheckHandler(OrgHandler):
    @route
    async def post(self, name: str) -> None:
        self.require(scopes.USE)
        # One of the organization's (not the service's own), that the caller may use.
        await self.call(self.organization.machine, name, self.member())
        self.reply(await self.call(self.organization.admin.check, name))


class AdmitHandler(OrgHandler):
    @route
    async def post(self, name: str) -> None:
        self.require(scopes.USE)
        resources = Resources.from_json(self.body().get("resources"), "resources.")
        await self.call(self.organization.machine, name, self.member())
        engine = await self.call(self.organization.admin.engine, name)
        await self.call(engine.admit, resources)
        self.set_status(204)
        self.finish()


class JobsHandler(OrgHandler):
    @route
    async def get(self) -> None:
        user = self.require(scopes.USE)
        if _all_users(self):
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
            self.reply(await self.call(self.jobs.send, user, job_id, _list(body, "files")))
        elif action == "start":
            # Its machine's list again: an admin may have taken the user off it since the job was prepared.
            job = await self.call(self.jobs.get, user, job_id)
            await self.call(lambda: self.organization.check_use(job.machine, self.member(), removed_ok=True))
            await self.call(self.jobs.start, user, job_id, body)
            self.set_status(204)
            self.finish()
        elif action == "cancel":
            grace = body.get("grace", 10)
            if not _number(grace) or grace < 0:
                raise InvalidSettings("grace: expected seconds", field="grace")
            await self.call(self.jobs.cancel, user, job_id, float(grace))
            self.set_status(204)
            self.finish()
        else:
            self.reply(await self.call(self.jobs.fetch, user, job_id, _list(body, "outputs")))


class UsageHandler(OrgHandler):
    """The organization's ledger summed: the caller's own attempts, or (``all_users=1``, admin) everyone's."""

    @route
    async def get(self) -> None:
        user = self.require(scopes.USE)
        form = self.get_argument("format", "json")
        if form not in ("json", "csv"):
            raise InvalidSettings("format: expected json or csv", field="format")
        everyone = _all_users(self)
        if everyone:
            self.require(scopes.ADMIN, "see every user's usage")
        keys = parse_group_by(self.get_argument("group_by", None) or "user,machine", ORG_GROUP_KEYS)
        start = parse_instant(self.get_argument("since", None), "since")
        end = parse_instant(self.get_argument("until", None), "until")
        attempts = await self.call(self.jobs.attempts, None if everyone else user)
        summary = summarize(attempts, keys, since=start, until=end)
        if form == "json":
            self.reply(summary)
            return
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="organization-usage.csv"')
        self.finish(summary_csv(summary))


class QuotasHandler(OrgHandler):
    """The quotas binding the caller, with what is used and left; an admin's: every quota."""

    @route
    async def get(self) -> None:
        user = self.require(scopes.USE)
        if scopes.grants(self.hub_user.get("scopes") or (), scopes.ADMIN):
            self.reply({"quotas": await self.call(self.jobs.every_standing)})
            return
        groups = sorted(self.hub_user.get("groups") or ())
        self.reply({"quotas": await self.call(self.jobs.standing, user, groups)})


class QuotaHandler(OrgHandler):
    """``PUT``/``DELETE api/quotas/(user|group)/<name>`` (admin); another ``who`` is a 400 saying so."""

    @route
    async def put(self, who: str, name: str) -> None:
        self.require(scopes.ADMIN, "set the organization's quotas")
        self.reply(await self.call(self.jobs.quotas.set, who, name, self.body()))

    @route
    async def delete(self, who: str, name: str) -> None:
        self.require(scopes.ADMIN, "set the organization's quotas")
        await self.call(self.jobs.quotas.remove, who, name)
        self.set_status(204)
        self.finish()


class PollHandler(OrgHandler):
    @route
    async def post(self) -> None:
        user = self.require(scopes.USE)
        body = self.body()
        ids = _list(body, "jobs")
        if not all(isinstance(i, str) for i in ids):
            raise InvalidSettings("jobs: expected job ids", field="jobs")
        watched = body.get("watched", {})
        valid = isinstance(watched, dict) and all(
            isinstance(o, dict) and all(_count_of(n) for n in o.values()) for o in watched.values()
        )
        if not valid:
            raise InvalidSettings("watched: expected byte offsets by job and metric file", field="watched")
        statuses, metrics = await self.call(self.jobs.poll, user, ids, watched)
        self.reply({"statuses": statuses, "metrics": metrics_json(metrics)})


class LogHandler(OrgHandler):
    @route
    async def get(self, job_id: str) -> None:
        user = self.require(scopes.USE)
        offset, limit = _count(self, "offset", 0), _count(self, "limit", 1 << 20)
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
        assert self._file is not None and self._tmp is not None
        await self.call(self._file.close)
        self._file = None
        if self.hasher.hexdigest() != sha:
            raise InvalidSettings(f"the upload's sha256 is {self.hasher.hexdigest()}, not {sha}: send it again")
        os.chmod(self._tmp, 0o600)
        os.replace(self._tmp, self.blob)
        self._tmp = None
        self.set_status(204)
        self.finish()


class UnknownRoute(OrgHandler):
    """Any other path under the prefix: the documented ``Error``, not tornado's HTML page."""

    def prepare(self) -> None:
        self.reply({"code": "not_found", "message": "no such route of the organization service"}, 404)


class MissingInputsHandler(OrgHandler):
    @route
    async def post(self) -> None:
        user = self.require(scopes.USE)
        self.reply({"missing": await self.call(self.jobs.missing, user, _list(self.body(), "digests"))})


def _list(body: dict[str, Any], field: str) -> list[Any]:
    value = body.get(field)
    if not isinstance(value, list):
        raise InvalidSettings(f"{field}: expected a list", field=field)
    return value


def _all_users(handler: OrgHandler) -> bool:
    """``all_users=1`` (or ``true``) asks for every user's; absent, the caller's own; anything else is refused."""
    value = handler.get_argument("all_users", None)
    if value is None:
        return False
    if value not in ("1", "true"):
        raise InvalidSettings("all_users: expected 1 or true", field="all_users")
    return True


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)  # JSON's true is not 1


def _count_of(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(handler: OrgHandler, name: str, default: int) -> int:
    try:
        value = int(handler.get_argument(name, str(default)))
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidSettings(f"{name}: expected a byte count", field=name)
    return value


OUTPUT_CHUNK = 1 << 20
JOB = r"([A-Za-z0-9][A-Za-z0-9._-]{0,127})"


#: The service's API under its prefix, as ``org/openapi.yaml`` describes it (``tests/test_org_openapi.py``).
API_ROUTES: list[tuple[str, type[OrgHandler]]] = [
    ("api/me", MeHandler),
    ("api/machines", MachinesHandler),
    ("api/default-machine", DefaultMachineHandler),
    (r"api/machines/([^/]+)", MachineHandler),
    (r"api/machines/([^/]+)/check", CheckHandler),
    (r"api/machines/([^/]+)/admit", AdmitHandler),
    ("api/jobs", JobsHandler),
    (f"api/jobs/{JOB}", JobHandler),
    (f"api/jobs/{JOB}/(send|start|cancel|fetch)", JobActionHandler),
    (f"api/jobs/{JOB}/log", LogHandler),
    (f"api/jobs/{JOB}/outputs", OutputsHandler),
    ("api/poll", PollHandler),
    ("api/usage", UsageHandler),
    ("api/quotas", QuotasHandler),
    (r"api/quotas/([^/]+)/([^/]+)", QuotaHandler),
    ("api/inputs/missing", MissingInputsHandler),
    (r"api/inputs/([^/]+)", InputHandler),
]


def make_app(organization: Organization, prefix: str) -> tornado.web.Application:
    # One HubOAuth for the process: the OAuth callback handler finds it as the routes do, by its instance().
    HubOAuth.instance(cache_max_age=60)
    return tornado.web.Application(
        [
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
            *((url_path_join(prefix, pattern), handler) for pattern, handler in API_ROUTES),
        ],
        organization=organization,
        jobs=organization.org_jobs,
        executor=ThreadPoolExecutor(max_workers=8, thread_name_prefix="organization"),
        default_handler_class=UnknownRoute,
        cookie_secret=secrets.token_bytes(32),
        xsrf_cookies=False,  # API routes: a browser's cookie alone is refused by HubOAuth's own XSRF check
    )


#: How often the service looks at running jobs against the quotas (a stop comes this late after its grace).
ENFORCE_EVERY = 2.0


async def _enforce_quotas(organization: Organization, stop: asyncio.Event) -> None:
    """Notice and stop running jobs that used up a quota, every ``ENFORCE_EVERY`` seconds, off the loop."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            await loop.run_in_executor(None, organization.org_jobs.enforce)
        except Exception:  # one failed round (a machine that does not answer a cancel) is tried again next
            log.exception("enforcing the quotas failed; trying again")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ENFORCE_EVERY)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jupyter remote-compute organization",
        description="the organization's machines, as a JupyterHub-managed service (started by the hub)",
    )
    parser.add_argument("--state-dir", default=os.environ.get("REMOTE_COMPUTE_ORG_STATE", DEFAULT_STATE_DIR))
    args = parser.parse_args(argv)
    url = os.environ.get("JUPYTERHUB_SERVICE_URL")
    if not url or "JUPYTERHUB_API_TOKEN" not in os.environ:
        raise SystemExit("jupyter remote-compute organization: start it as a JupyterHub service (see README.md)")
    logging.basicConfig(level=logging.INFO, format="[organization %(levelname)s] %(message)s")
    organization = Organization(Path(args.state_dir))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    bind = urlparse(url)

    async def serve() -> None:
        server = make_app(organization, prefix).listen(bind.port or 80, bind.hostname or "127.0.0.1", xheaders=True)
        log.info("serving %s from %s", prefix, args.state_dir)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            # A hub started from a shell without job control passes SIGINT ignored: take both.
            loop.add_signal_handler(signum, stop.set)
        enforcing = asyncio.create_task(_enforce_quotas(organization, stop))
        await stop.wait()
        await enforcing
        server.stop()
        await server.close_all_connections()

    try:
        asyncio.run(serve())
    finally:
        organization.close()
    return 0
