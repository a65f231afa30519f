"""Thin REST handlers under ``/remote-compute/``: parse, call the service off the loop, serialise.

Errors of the domain (``errors.RemoteComputeError``) become ``{code, message, field?}``
JSON with their 4xx/5xx status in one place, ``RemoteComputeHandler.call``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from http.client import responses
from typing import Any, TypeVar

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from . import people
from .engines.organization.client import job_machine
from .errors import InvalidSettings, NotFound, RemoteComputeError
from .jobs.job import Job
from .jobs.listing import JobQuery
from .jobs.service import JobService
from .json_routes import JsonRoute
from .schema.openapi import FORMS, form_schema
from .schema.spec import JobRequest

T = TypeVar("T")
PREFIX = r"/remote-compute"
JOB_ID = r"(?P<job_id>[A-Za-z0-9_-]+)"
MACHINE = r"(?P<name>[A-Za-z0-9_.-]+)"


class TransferPool:
    """Sending and collecting, one job at a time each, off the request pool.

    Collections have threads of their own: behind a few long sends, a job that has ended would
    otherwise wait minutes to bring its outputs back and record its run.
    """

    def __init__(self, service: JobService, workers: int) -> None:
        self.service = service
        self._sends = ThreadPoolExecutor(workers, thread_name_prefix="remote-compute-send")
        self._collections = ThreadPoolExecutor(workers, thread_name_prefix="remote-compute-collect")
        self._scheduled: set[str] = set()
        self._lock = threading.Lock()

    def advance(self, job: Job) -> None:
        with self._lock:
            if job.id in self._scheduled:
                return
            self._scheduled.add(job.id)
        pool = self._collections if job.state == "collecting" else self._sends
        pool.submit(self._run, job.id)

    def _run(self, job_id: str) -> None:
        try:
            self.service.advance(job_id)
        finally:
            with self._lock:
                self._scheduled.discard(job_id)

    def shutdown(self) -> None:
        for pool in (self._sends, self._collections):
            pool.shutdown(wait=False, cancel_futures=True)


class Wakeups:
    """Long-polled reads (a log, live metrics) sleep here until news of their job, never blocking the IOLoop.

    ``wake`` runs on the IOLoop's thread (``wake_threadsafe`` from any other); every wake counts, so a
    reader that took ``generation`` before reading never sleeps through news that came meanwhile.
    """

    def __init__(self) -> None:
        self._generation: dict[str, int] = {}
        self._sleepers: dict[str, set[asyncio.Future[None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def generation(self, job_id: str) -> int:
        return self._generation.get(job_id, 0)

    def wake(self, job_id: str) -> None:
        self._generation[job_id] = self._generation.get(job_id, 0) + 1
        for sleeper in self._sleepers.pop(job_id, ()):
            if not sleeper.done():
                sleeper.set_result(None)

    def wake_threadsafe(self, job_id: str) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the server is stopping
                loop.call_soon_threadsafe(self.wake, job_id)

    async def sleep(self, job_id: str, seen: int, timeout: float) -> None:
        """Until the job's next news after generation ``seen``, or ``timeout`` seconds."""
        if self._generation.get(job_id, 0) != seen or timeout <= 0:
            return
        sleeper = asyncio.get_running_loop().create_future()
        self._sleepers.setdefault(job_id, set()).add(sleeper)
        try:
            await asyncio.wait_for(sleeper, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            waiting = self._sleepers.get(job_id)
            if waiting is not None:
                waiting.discard(sleeper)
                if not waiting:
                    del self._sleepers[job_id]


@dataclasses.dataclass(frozen=True)
class RemoteComputeContext:
    service: JobService
    executor: ThreadPoolExecutor
    transfers: TransferPool
    wakeups: Wakeups = dataclasses.field(default_factory=Wakeups)


class RemoteComputeHandler(JsonRoute, APIHandler):
    #: jupyter_server's Authorizer sees every call as read/write on this resource (submitting a job
    #: is "execute"), so a deployment can let some users watch jobs without running anything.
    auth_resource = "remote-compute"

    @property
    def context(self) -> RemoteComputeContext:
        return self.settings["remote_compute"]

    @property
    def service(self) -> JobService:
        return self.context.service

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking service code in the worker pool, never on the IOLoop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.context.executor, lambda: fn(*args, **kwargs))

    def person(self) -> str:
        """Who is asking, the name their jobs are kept under (submitter, ``mlflow.user``): ``people.login``."""
        return people.login(self.current_user)

    def person_shown(self) -> str:
        """Who is asking, as a sentence names them ("cancelled by …"): ``people.shown``."""
        return people.shown(self.current_user)

    def fail(self, error: RemoteComputeError) -> None:
        self.reply(error.to_json(), error.status)

    def server_url(self) -> str:
        """This server's address as the request reached it, base URL included (for a command shown to run)."""
        base = self.settings.get("base_url", "/").rstrip("/")
        return f"{self.request.protocol}://{self.request.host}{base}"

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error tornado or jupyter_server raises here (403, 404, 405, 500) as the documented ``Error``."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, tornado.web.HTTPError):
            # jupyter_server's own messages (auth, XSRF) name no secret; fall back to the status phrase.
            message = exc.log_message % exc.args if exc.log_message and exc.args else exc.log_message
            message = message or responses.get(status_code, "error")
        else:
            # An unexpected exception: its text may hold anything, so the client sees only that it happened.
            message = "internal error of the server; its log has the details"
        if status_code == 405:
            # The verbs this route does serve, as RFC 9110 asks of a 405.
            verbs = [m for m in self.SUPPORTED_METHODS if m.lower() in vars(type(self))]
            self.set_header("Allow", ", ".join(verbs))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"code": HTTP_ERROR_CODES.get(status_code, "error"), "message": message}))


#: The ``code`` of an ``Error`` raised outside the domain (by tornado or jupyter_server), by status.
HTTP_ERROR_CODES = {
    400: "invalid",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    500: "internal",
}


def api(method: Callable[..., Any] | None = None, *, action: str | None = None) -> Any:
    """Authenticated and authorized (action from the HTTP verb unless given); domain errors answered as JSON."""

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def handle(self: RemoteComputeHandler, *args: Any, **kwargs: Any) -> None:
            try:
                await method(self, *args, **kwargs)
            except RemoteComputeError as e:
                self.fail(e)

        return tornado.web.authenticated(authorized(action)(handle) if action else authorized(handle))

    return decorate(method) if method is not None else decorate


# -- jobs -------------------------------------------------------------------
JOB_QUERY_ARGUMENTS = ("limit", "cursor", "machine", "state", "name", "since", "until")


def _jobs_page(service: JobService, query: JobQuery) -> tuple[bytes, str]:
    """A page of the job list as the answer's bytes, and its ETag (blocking: the worker pool's)."""
    page = service.list_page(query).to_json()
    set_aside = service.store.set_aside()
    if set_aside:  # a damaged state file was moved aside: every list says so until it is dealt with
        page["set_aside"] = set_aside
    body = json.dumps(page, default=str).encode()
    # A strong validator of the answer itself: any change to a listed job changes the page's bytes.
    return body, '"' + hashlib.sha1(body, usedforsecurity=False).hexdigest() + '"'


class JobsHandler(RemoteComputeHandler):
    @api
    async def get(self) -> None:
        """A page of job summaries, newest first; an unchanged page is a 304 to a matching If-None-Match."""
        query = JobQuery.parse(**{name: self.get_argument(name, None) for name in JOB_QUERY_ARGUMENTS})
        # One trip to the worker pool for the whole answer: during a transfer each trip waits its turn.
        body, etag = await self.call(_jobs_page, self.service, query)
        self.set_header("ETag", etag)
        self.set_header("Cache-Control", "no-cache")
        if self.check_etag_header():
            self.set_status(304)
            self.finish()
            return
        self.set_header("Content-Type", "application/json")
        self.finish(body)

    @api(action="execute")
    async def post(self) -> None:
        body = self.body()
        if not body.get("machine"):  # none named: the organization's default on a hub that has one
            body["machine"] = await self.call(job_machine, None)
        request = JobRequest.from_json(body)
        result = await self.call(self.service.submit, request.spec, new=bool(request.new), user=self.person())
        if not result.attached:
            # Start sending now; the poller would pick it up too, a little later.
            self.context.transfers.advance(result.job)
        self.reply({"job": result.job.public_json(), "attached": result.attached}, 200 if result.attached else 201)


class JobsPruneHandler(RemoteComputeHandler):
    @api
    async def post(self) -> None:
        """Forget finished jobs older than ``older_than`` (never an active one); MLflow runs stay."""
        body = self.body()
        unknown = sorted(set(body) - {"older_than", "state", "keep_newest", "dry_run"})
        if unknown:
            raise InvalidSettings(f"{unknown[0]}: unknown setting", field=unknown[0])
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise InvalidSettings("dry_run: expected true or false", field="dry_run")
        result = await self.call(
            self.service.prune,
            older_than=body.get("older_than"),
            states=body.get("state"),
            keep_newest=body.get("keep_newest"),
            dry_run=dry_run,
        )
        self.reply(result.to_json())


class JobHandler(RemoteComputeHandler):
    @api
    async def get(self, job_id: str) -> None:
        job = await self.call(self.service.get, job_id)
        data = job.public_json()
        progress = self.service.progress.get(job_id)
        if progress:
            data["progress"] = {"done": progress[0], "total": progress[1]}
        self.reply(data)

    @api
    async def delete(self, job_id: str) -> None:
        await self.call(self.service.delete, job_id)
        self.set_status(204)
        self.finish()


class JobCancelHandler(RemoteComputeHandler):
    @api(action="execute")
    async def post(self, job_id: str) -> None:
        job = await self.call(self.service.cancel, job_id, by=self.person_shown())
        self.reply(job.public_json())


#: The largest log offset asked for: past any real log (1 TiB) and below what a file system can seek to.
MAX_LOG_OFFSET = 1 << 40
MAX_LOG_LIMIT = 4 << 20
#: The longest a long-polled read (``wait``) is held, in seconds: below common proxies' idle timeouts.
MAX_WAIT = 30


class JobLogHandler(RemoteComputeHandler):
    def whole_number(self, name: str, default: int, low: int, high: int) -> int:
        text = self.get_argument(name, None)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not text.strip().isdigit() or not low <= value <= high:
            raise InvalidSettings(f"{name}: expected a whole number from {low} to {high}", field=name)
        return value

    @api
    async def get(self, job_id: str) -> None:
        """Log bytes from ``offset``; with ``wait``, held (off the IOLoop) until some exist or the job ends."""
        offset = self.whole_number("offset", 0, 0, MAX_LOG_OFFSET)
        limit = self.whole_number("limit", 1 << 20, 1, MAX_LOG_LIMIT)
        wait = self.whole_number("wait", 0, 0, MAX_WAIT)
        wakeups = self.context.wakeups
        deadline = time.monotonic() + wait
        while True:
            seen = wakeups.generation(job_id)
            chunk = await self.call(self.service.read_log, job_id, offset, limit)
            left = deadline - time.monotonic()
            if chunk.data or chunk.complete or left <= 0:
                break
            # The poller wakes us when the job's log grows or its state changes.
            await wakeups.sleep(job_id, seen, left)
        self.reply(
            {
                "data": chunk.data.decode("utf-8", errors="replace"),
                "offset": chunk.offset,
                "next_offset": chunk.next_offset,
                "complete": chunk.complete,
            }
        )


class JobMetricsHandler(JobLogHandler):
    @api
    async def get(self, job_id: str) -> None:
        """Live metrics past cursor ``since``; marks the job watched; ``wait`` holds the answer for new points."""
        since = self.get_argument("since", None) or None
        wait = self.whole_number("wait", 0, 0, MAX_WAIT)
        wakeups = self.context.wakeups
        deadline = time.monotonic() + wait
        while True:
            seen = wakeups.generation(job_id)
            page, active = await self.call(self.service.read_metrics, job_id, since)
            left = deadline - time.monotonic()
            if page.points or page.reset or not active or left <= 0:
                break
            await wakeups.sleep(job_id, seen, left)
        self.reply(page.to_json(watching=active, complete=not active))


# -- pipeline steps ------------------------------------------------------------
class StepsHandler(RemoteComputeHandler):
    @api
    async def get(self) -> None:
        """The pipeline steps of this and other installed packages; ours limit the machine to enabled ones."""
        from .steps import describe_steps

        machines = await self.call(self.service.admin.list)
        # Other packages' steps come from installed metadata: read off the loop.
        enabled = [m.name for m in machines if m.enabled]
        self.reply({"steps": await self.call(describe_steps, enabled, installed=True)})


class FormSchemaHandler(RemoteComputeHandler):
    @api
    async def get(self, type_name: str) -> None:
        """The JSON Schema of a type a form draws (``JobRequest``, ``MachineInput``): the one the server reads."""
        schema = form_schema(type_name)
        if schema is None:
            raise NotFound(f"no form schema {type_name!r}; these are: {', '.join(FORMS)}")
        self.reply({"schema": schema})


# -- secrets ------------------------------------------------------------------
class SecretsHandler(RemoteComputeHandler):
    @api
    async def get(self) -> None:
        """Where secrets live: the store new ones go to and each secret's place; names only, never values."""
        store = self.service.secrets
        entries = await self.call(store.entries)
        status = await self.call(store.status)
        self.reply({"store": status, "secrets": [e.to_json() for e in entries]})


def secret_value(body: Mapping[str, Any]) -> str:
    """The ``value`` of a body that stores a secret (this server's or the organization service's)."""
    value = body.get("value")
    if not isinstance(value, str) or not value:
        raise InvalidSettings("value: the secret's value must be non-empty text", field="value")
    return value


class SecretHandler(RemoteComputeHandler):
    @api
    async def put(self, secret_name: str) -> None:
        """Store or replace one secret of the user's store; the answer names it and where it went, never the value."""
        value = secret_value(self.body())
        store = self.service.secrets
        await self.call(store.set, secret_name, value)
        self.reply({"name": secret_name, "where": await self.call(store.where)})

    @api
    async def delete(self, secret_name: str) -> None:
        """Delete one secret, refused (409 ``secret_in_use``) while a machine or an unfinished job needs it."""
        await self.call(self.service.delete_secret, secret_name)
        self.set_status(204)
        self.finish()


# -- usage ---------------------------------------------------------------------
class UsageHandler(RemoteComputeHandler):
    @api
    async def get(self) -> None:
        """Usage summed per group, as JSON or (``format=csv``) CSV."""
        form = self.get_argument("format", "json")
        if form not in ("json", "csv"):
            raise InvalidSettings("format: expected json or csv", field="format")
        summary = await self.call(
            self.service.usage,
            self.get_argument("group_by", None),
            self.get_argument("since", None),
            self.get_argument("until", None),
        )
        if form == "json":
            self.reply(summary)
            return
        from .usage.ledger import summary_csv

        self.set_header("Content-Disposition", 'attachment; filename="usage.csv"')
        self.finish(summary_csv(summary), set_content_type="text/csv; charset=utf-8")


class UnknownRouteHandler(RemoteComputeHandler):
    """Any other path under the prefix: a 404 ``Error`` (once authenticated), whatever the verb."""

    async def prepare(self) -> None:
        await super().prepare()
        if not self.current_user:
            raise tornado.web.HTTPError(403)
        raise tornado.web.HTTPError(404, "no such route under /remote-compute/; see openapi.yaml")


HANDLERS: list[tuple[str, type[RemoteComputeHandler]]] = [
    (rf"{PREFIX}/jobs", JobsHandler),
    (rf"{PREFIX}/jobs/prune", JobsPruneHandler),  # before jobs/{id}, which would take "prune" for an id
    (rf"{PREFIX}/jobs/{JOB_ID}", JobHandler),
    (rf"{PREFIX}/jobs/{JOB_ID}/cancel", JobCancelHandler),
    (rf"{PREFIX}/jobs/{JOB_ID}/log", JobLogHandler),
    (rf"{PREFIX}/jobs/{JOB_ID}/metrics", JobMetricsHandler),
    (rf"{PREFIX}/steps", StepsHandler),
    (rf"{PREFIX}/schemas/(?P<type_name>[A-Za-z]+)", FormSchemaHandler),
    (rf"{PREFIX}/usage", UsageHandler),
    (rf"{PREFIX}/secrets", SecretsHandler),
    # Names may hold "/" (compute/lab): the rest of the path is the name, checked by the Secret Manager.
    (rf"{PREFIX}/secrets/(?P<secret_name>.+)", SecretHandler),
]

#: Registered after every other handler of the extension (``routes.py``): catches the rest of the prefix.
FALLBACK_HANDLER: tuple[str, type[RemoteComputeHandler]] = (rf"{PREFIX}/.*", UnknownRouteHandler)
