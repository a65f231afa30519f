"""What every route of the organization service is: a hub identity's JSON request, errors as ``Error``.

``OrgHandler`` is the base of the routes of ``service.py`` and ``job_routes.py``: the caller as the
hub said (``member``, ``require`` for a scope), blocking work off the IOLoop (``call``), and the
documented errors; ``route`` wraps each verb.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import tornado.web
from jupyterhub.services.auth import HubOAuthenticated

from ..engines.base import EngineError
from ..errors import Forbidden, InvalidSettings, RemoteComputeError
from ..json_routes import JsonRoute
from . import scopes
from .jobs import OrgJobs
from .organization import Member, Organization

T = TypeVar("T")


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


class UnknownRoute(OrgHandler):
    """Any other path under the prefix: the documented ``Error``, not tornado's HTML page."""

    def prepare(self) -> None:
        self.reply({"code": "not_found", "message": "no such route of the organization service"}, 404)


def body_list(body: dict[str, Any], field: str) -> list[Any]:
    value = body.get(field)
    if not isinstance(value, list):
        raise InvalidSettings(f"{field}: expected a list", field=field)
    return value


def all_users(handler: OrgHandler) -> bool:
    """``all_users=1`` (or ``true``) asks for every user's; absent, the caller's own; anything else is refused."""
    value = handler.get_argument("all_users", None)
    if value is None:
        return False
    if value not in ("1", "true"):
        raise InvalidSettings("all_users: expected 1 or true", field="all_users")
    return True


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)  # JSON's true is not 1


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def count_argument(handler: OrgHandler, name: str, default: int) -> int:
    try:
        value = int(handler.get_argument(name, str(default)))
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidSettings(f"{name}: expected a byte count", field=name)
    return value
