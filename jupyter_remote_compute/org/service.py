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
- ``GET api/tracking`` (use): the organization's MLflow tracking server (``uri``, or null) and the admin
  who set it, where the runs of jobs on its machines are recorded; ``PUT`` (admin, ``{uri}``: http(s),
  no user or password in it) sets it; ``DELETE`` (admin) clears it (each user's own store again).
- ``GET api/secrets`` (admin): the service's own Secret Manager, names and places only;
  ``PUT api/secrets/<name>`` (admin, ``{value}``) stores one, ``DELETE`` removes one no machine names.
  Its machines name them (``registry_secret``); no route gives a value back.

Jobs on those machines (use; ``jobs.py``, their routes ``job_routes.py``), each the call of an engine
method a user's server makes (``engines/organization/engine.py``), on the caller's own jobs only
(another's id is "not found"):

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
import logging
import os
import secrets
import signal
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import tornado.web
from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join

from ..engines.resources import Resources
from ..errors import InvalidSettings
from ..usage.ledger import ORG_GROUP_KEYS, parse_group_by, parse_instant, summarize, summary_csv
from . import scopes
from .handler import OrgHandler, UnknownRoute, all_users, route
from .job_routes import (
    JOB,
    InputHandler,
    JobActionHandler,
    JobHandler,
    JobsHandler,
    LogHandler,
    MissingInputsHandler,
    OutputsHandler,
    PollHandler,
)
from .organization import Organization

log = logging.getLogger(__name__)

#: Where the service keeps its machines, secrets and ledger unless ``--state-dir`` says otherwise.
DEFAULT_STATE_DIR = "/var/lib/jupyter-remote-compute"


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


class TrackingHandler(OrgHandler):
    """The organization's MLflow tracking server: every member reads it (their jobs' runs go there)."""

    @route
    async def get(self) -> None:
        self.require(scopes.USE)
        self.reply(await self.call(self.organization.tracking))

    @route
    async def put(self) -> None:
        admin = self.require(scopes.ADMIN, "set the organization's tracking server")
        self.reply(await self.call(self.organization.set_tracking, admin, self.body().get("uri")))

    @route
    async def delete(self) -> None:
        self.require(scopes.ADMIN, "set the organization's tracking server")
        await self.call(self.organization.clear_tracking)
        self.set_status(204)
        self.finish()


class SecretsHandler(OrgHandler):
    """The service's own secrets (admin): names and places only, as a user's Secret Manager lists them."""

    @route
    async def get(self) -> None:
        self.require(scopes.ADMIN, "manage the organization's secrets")
        self.reply(await self.call(self.organization.secrets))


class SecretHandler(OrgHandler):
    @route
    async def put(self, name: str) -> None:
        self.require(scopes.ADMIN, "manage the organization's secrets")
        self.reply(await self.call(self.organization.set_secret, name, self.body().get("value")))

    @route
    async def delete(self, name: str) -> None:
        self.require(scopes.ADMIN, "manage the organization's secrets")
        await self.call(self.organization.remove_secret, name)
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


class UsageHandler(OrgHandler):
    """The organization's ledger summed: the caller's own attempts, or (``all_users=1``, admin) everyone's."""

    @route
    async def get(self) -> None:
        user = self.require(scopes.USE)
        form = self.get_argument("format", "json")
        if form not in ("json", "csv"):
            raise InvalidSettings("format: expected json or csv", field="format")
        everyone = all_users(self)
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


#: The service's API under its prefix, as ``org/openapi.yaml`` describes it (``tests/test_org_openapi.py``).
API_ROUTES: list[tuple[str, type[OrgHandler]]] = [
    ("api/me", MeHandler),
    ("api/machines", MachinesHandler),
    ("api/default-machine", DefaultMachineHandler),
    ("api/tracking", TrackingHandler),
    ("api/secrets", SecretsHandler),
    (r"api/secrets/([^/]+)", SecretHandler),
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
