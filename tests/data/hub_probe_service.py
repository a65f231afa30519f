"""A tiny JupyterHub-managed service for tests/test_hub_bed.py: who is asking, and may they use it.

It stands where the organization service will: the hub starts it (``tests/hub_fixture.py``) with
JUPYTERHUB_SERVICE_URL and JUPYTERHUB_SERVICE_PREFIX set, users reach it through the proxy by OAuth (a
browser's cookie) or with a token (a server's JUPYTERHUB_API_TOKEN), as they will reach that one.

- ``GET PREFIX/whoami``: the user's name, groups and scopes, as the hub resolved them for this request.
- ``GET PREFIX/use``: the same, only with ``custom:remote-compute:use`` (403 otherwise).
"""

from __future__ import annotations

import asyncio
import os
import signal
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web

USE = "custom:remote-compute:use"


class WhoAmI(HubOAuthenticated, web.RequestHandler):
    @web.authenticated
    def get(self) -> None:
        self.write(_who(self.current_user))


class Use(HubOAuthenticated, web.RequestHandler):
    @web.authenticated
    def get(self) -> None:
        if not self.hub_auth.check_scopes({USE}, self.current_user):
            raise web.HTTPError(403, f"{self.current_user['name']} lacks {USE}")
        self.write(_who(self.current_user))


def _who(user: dict) -> dict:  # type: ignore[type-arg]
    return {"name": user["name"], "groups": sorted(user.get("groups", [])), "scopes": sorted(user.get("scopes", []))}


async def main() -> None:
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app = web.Application(
        [
            (prefix + "whoami", WhoAmI),
            (prefix + "use", Use),
            (prefix + "oauth_callback", HubOAuthCallbackHandler),
        ],
        cookie_secret=os.urandom(32),
    )
    server = app.listen(url.port, url.hostname)
    # The hub stops a service with SIGINT, then SIGTERM; a service started with SIGINT ignored (a hub run
    # from a shell without job control) must still stop on it, or the hub waits out its timeout.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()


if __name__ == "__main__":
    asyncio.run(main())
