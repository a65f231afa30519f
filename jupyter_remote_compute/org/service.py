"""The organization service: a JupyterHub-managed service that holds the organization's machines.

Started by the hub (``jupyter remote-compute organization``, see ``README.md``), it listens where
``JUPYTERHUB_SERVICE_URL`` says and serves under ``JUPYTERHUB_SERVICE_PREFIX``. Every request is a
JupyterHub identity: a browser's through the hub's OAuth, a user's server's or CLI's through its hub
token (``Authorization: token …``). The hub's ``access:services!service=<name>`` lets a caller in;
the custom scopes (``scopes.py``) say what it may do: ``use`` reads the machines, ``admin`` changes
them. Blocking work (compute.yaml, the Secret Manager) runs in a thread pool, never on the IOLoop.

Routes, under the prefix:

- ``GET api/me``: who is asking and what they may do.
- ``GET api/machines`` (use): the organization's machines, each with ``owner: organization`` and the
  name of the admin who set it; ``POST api/machines`` (admin) adds one.
- ``GET``/``PATCH``/``DELETE api/machines/<name>`` (use to read, admin to change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import tornado.web
from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join

from ..errors import Forbidden, RemoteComputeError
from ..json_routes import JsonRoute
from . import scopes
from .organization import Organization

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

    def require(self, scope: str) -> str:
        """The caller's name, if their token holds ``scope``; else a 403 that names the scope."""
        user = self.hub_user
        if not scopes.grants(user.get("scopes") or (), scope):
            what = "change the organization's machines" if scope == scopes.ADMIN else "use the organization's machines"
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
        self.reply(await self.call(self.organization.machines))

    @route
    async def post(self) -> None:
        admin = self.require(scopes.ADMIN)
        self.reply(await self.call(self.organization.add, admin, self.body()), 201)


class MachineHandler(OrgHandler):
    @route
    async def get(self, name: str) -> None:
        self.require(scopes.USE)
        self.reply(await self.call(self.organization.machine, name))

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


def make_app(organization: Organization, prefix: str) -> tornado.web.Application:
    # One HubOAuth for the process: the OAuth callback handler finds it as the routes do, by its instance().
    HubOAuth.instance(cache_max_age=60)
    return tornado.web.Application(
        [
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
            (url_path_join(prefix, "api/me"), MeHandler),
            (url_path_join(prefix, "api/machines"), MachinesHandler),
            (url_path_join(prefix, r"api/machines/([^/]+)"), MachineHandler),
        ],
        organization=organization,
        executor=ThreadPoolExecutor(max_workers=8, thread_name_prefix="organization"),
        cookie_secret=secrets.token_bytes(32),
        xsrf_cookies=False,  # API routes: a browser's cookie alone is refused by HubOAuth's own XSRF check
    )


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
        await stop.wait()
        server.stop()
        await server.close_all_connections()

    try:
        asyncio.run(serve())
    finally:
        organization.close()
    return 0
