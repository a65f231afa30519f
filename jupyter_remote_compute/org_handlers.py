"""The panel's Organization section: the organization service's admin routes, asked through this server.

A browser cannot call the service itself with the user's hub identity (its API refuses a cookie
alone), so the user's server asks it with its own hub token, as the CLI does
(``engines/organization/client.py``). The service decides what the user may do (its ``admin`` scope);
this server only passes the request on, and the service's refusal back as the same ``Error``. Outside a
hub, or on one without the service, every route is a 404 ``no_organization``.
"""

from __future__ import annotations

from .engines.organization.client import OrganizationClient, organization
from .errors import InvalidSettings, NotFound
from .handlers import MACHINE, PREFIX, RemoteComputeHandler, api, secret_value

ORG = rf"{PREFIX}/organization"
#: The service's usage keys a panel groups by (``usage/ledger.py``'s ``ORG_GROUP_KEYS``).
USAGE_KEYS = ("user", "group", "machine", "month", "kind", "state")


class NoOrganization(NotFound):
    code = "no_organization"


def _client() -> OrganizationClient:
    client = organization()
    if client is None:
        raise NoOrganization("no organization service here: this server was not started by a hub that runs one")
    return client


class OrgMachinesHandler(RemoteComputeHandler):
    @api
    async def post(self) -> None:
        body = self.body()
        self.reply(await self.call(lambda: _client().add_machine(body)), 201)


class OrgMachineHandler(RemoteComputeHandler):
    @api
    async def patch(self, name: str) -> None:
        body = self.body()
        self.reply(await self.call(lambda: _client().update_machine(name, body)))

    @api
    async def delete(self, name: str) -> None:
        await self.call(lambda: _client().remove_machine(name))
        self.set_status(204)
        self.finish()


class OrgMachineCheckHandler(RemoteComputeHandler):
    @api
    async def post(self, name: str) -> None:
        self.reply(await self.call(lambda: _client().check_machine(name)))


class OrgJobsHandler(RemoteComputeHandler):
    """Every job on the organization's machines, with its user (admin)."""

    @api
    async def get(self) -> None:
        self.reply({"jobs": await self.call(lambda: _client().jobs(all_users=True))})


class OrgUsageHandler(RemoteComputeHandler):
    """Every user's usage of the organization's machines, summed per group (admin)."""

    @api
    async def get(self) -> None:
        group_by = self.get_argument("group_by", None) or "user,month"
        unknown = [k for k in group_by.split(",") if k not in USAGE_KEYS]
        if unknown:
            raise InvalidSettings(f"group_by: {unknown[0]!r} is not one of {', '.join(USAGE_KEYS)}", field="group_by")
        params = {"all_users": "1", "group_by": group_by}
        params.update({k: v for k in ("since", "until") if (v := self.get_argument(k, None))})
        self.reply(await self.call(lambda: _client().usage(params)))


class OrgDefaultMachineHandler(RemoteComputeHandler):
    """The organization's default machine (admin): where a job, a step or a run that names none runs."""

    @api
    async def put(self) -> None:
        machine = self.body().get("machine")
        if not isinstance(machine, str) or not machine:
            raise InvalidSettings("machine: give the name of one of the organization's machines", field="machine")
        self.reply(await self.call(lambda: _client().set_default_machine(machine)))

    @api
    async def delete(self) -> None:
        await self.call(lambda: _client().clear_default_machine())
        self.set_status(204)
        self.finish()


class OrgTrackingHandler(RemoteComputeHandler):
    """The organization's MLflow tracking server: every member reads it, an admin sets or clears it."""

    @api
    async def get(self) -> None:
        self.reply(await self.call(lambda: _client().tracking()))

    @api
    async def put(self) -> None:
        uri = self.body().get("uri")
        if not isinstance(uri, str) or not uri:
            raise InvalidSettings("uri: give the tracking server's http(s) URL", field="uri")
        self.reply(await self.call(lambda: _client().set_tracking(uri)))

    @api
    async def delete(self) -> None:
        await self.call(lambda: _client().clear_tracking())
        self.set_status(204)
        self.finish()


class OrgSecretsHandler(RemoteComputeHandler):
    """The service's own secrets (admin): what its machines name, e.g. a ``registry_secret``; names only."""

    @api
    async def get(self) -> None:
        self.reply(await self.call(lambda: _client().secrets()))


class OrgSecretHandler(RemoteComputeHandler):
    @api
    async def put(self, secret_name: str) -> None:
        value = secret_value(self.body())
        self.reply(await self.call(lambda: _client().set_secret(secret_name, value)))

    @api
    async def delete(self, secret_name: str) -> None:
        await self.call(lambda: _client().remove_secret(secret_name))
        self.set_status(204)
        self.finish()


class OrgQuotasHandler(RemoteComputeHandler):
    """The quotas binding the user, with what is used and left (an admin: every quota)."""

    @api
    async def get(self) -> None:
        self.reply({"quotas": await self.call(lambda: _client().quotas())})


class OrgQuotaHandler(RemoteComputeHandler):
    @api
    async def put(self, who: str, name: str) -> None:
        body = self.body()
        self.reply(await self.call(lambda: _client().set_quota(who, name, body)))

    @api
    async def delete(self, who: str, name: str) -> None:
        await self.call(lambda: _client().remove_quota(who, name))
        self.set_status(204)
        self.finish()


ORG_HANDLERS: list[tuple[str, type[RemoteComputeHandler]]] = [
    (rf"{ORG}/machines", OrgMachinesHandler),
    (rf"{ORG}/machines/{MACHINE}", OrgMachineHandler),
    (rf"{ORG}/machines/{MACHINE}/check", OrgMachineCheckHandler),
    (rf"{ORG}/default-machine", OrgDefaultMachineHandler),
    (rf"{ORG}/tracking", OrgTrackingHandler),
    (rf"{ORG}/secrets", OrgSecretsHandler),
    (rf"{ORG}/secrets/(?P<secret_name>.+)", OrgSecretHandler),
    (rf"{ORG}/jobs", OrgJobsHandler),
    (rf"{ORG}/usage", OrgUsageHandler),
    (rf"{ORG}/quotas", OrgQuotasHandler),
    (rf"{ORG}/quotas/(?P<who>user|group)/(?P<name>[^/]+)", OrgQuotaHandler),
]
