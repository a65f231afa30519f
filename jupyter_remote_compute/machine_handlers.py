"""``/remote-compute/kinds``, ``machines`` and ``pools``: the machines of a workspace and their pools
(thin, as ``handlers.py``: parse, call the service off the loop, serialise)."""

from __future__ import annotations

from typing import Any

from .engines import engine_class, engine_kinds
from .engines.organization.client import with_organization
from .errors import InvalidSettings, MachineUnreachable
from .handlers import MACHINE, PREFIX, RemoteComputeHandler, api
from .machines.options import COMMON_OPTIONS

#: Options every kind takes that the machine form offers beside the kind's own: its webhook. Its key's name
#: is typed as a name (``secret_name`` false here: the form asks no secret for it; ``secrets set`` stores it).
FORM_COMMON = {name: COMMON_OPTIONS[name] for name in ("notify", "notify_secret", "notify_events")}


def kinds_json() -> list[dict[str, Any]]:
    out = []
    for kind in engine_kinds():
        cls = engine_class(kind)
        unavailable = cls.features.unavailable  # what to install before the kind can be used
        out.append(
            {
                "kind": kind,
                "label": cls.label,
                "remote": cls.features.remote,
                **({"unavailable": unavailable} if unavailable else {}),
                "features": cls.features.to_json(),
                "options": {
                    name: {
                        "type": field.type.__name__,
                        "description": field.description,
                        "required": field.required,
                        "secret_name": field.secret_name and name not in FORM_COMMON,
                    }
                    for name, field in {**cls.options, **FORM_COMMON}.items()
                },
            }
        )
    return out


class KindsHandler(RemoteComputeHandler):
    """The kinds of machine this installation can use, with their options and what each can do."""

    @api
    async def get(self) -> None:
        self.reply({"kinds": kinds_json()})


# -- machines ---------------------------------------------------------------
class MachinesHandler(RemoteComputeHandler):
    @api
    async def get(self) -> None:
        admin = self.service.admin
        # Read the version first: a write carrying it fails if the file changed after this read.
        version = await self.call(admin.version)
        machines = await self.call(admin.list)
        # What a kind adds may read files (a machine's presence): off the IOLoop.
        shown = await self.call(lambda: [admin.describe(m) for m in machines])
        # On a hub with an organization service, its machines follow the user's own (off the IOLoop too).
        shown, organization = await self.call(with_organization, shown)
        body = {"machines": shown, "version": version, "kinds": kinds_json()}
        self.reply({**body, "organization": organization} if organization else body)

    @api
    async def post(self) -> None:
        machine = await self.call(self.service.admin.add_from, self.body())
        data = machine.to_json()
        # What the kind shows this once (a token and the command to run on the machine, say).
        data.update(await self.call(self.service.admin.introduce, machine, self.server_url()))
        self.reply(data, 201)


class MachineHandler(RemoteComputeHandler):
    @api
    async def get(self, name: str) -> None:
        machine = await self.call(self.service.admin.get, name)
        self.reply(machine.to_json())

    @api
    async def patch(self, name: str) -> None:
        machine = await self.call(self.service.admin.update_from, name, self.body())
        if machine.enabled:
            await self.call(self.service.place)  # a pool's waiting job takes a machine just enabled now
        self.reply(machine.to_json())

    @api
    async def delete(self, name: str) -> None:
        await self.call(self.service.admin.remove, name, expected_version=self.get_argument("version", None))
        self.set_status(204)
        self.finish()


class MachineCheckHandler(RemoteComputeHandler):
    @api
    async def post(self, name: str) -> None:
        """The check's answer: the facts, or that the machine could not be reached and why."""
        try:
            facts = await self.call(self.service.admin.check, name)
        except MachineUnreachable as e:
            self.reply({"name": name, "ok": False, "reachable": False, "reason": e.reason})
            return
        await self.call(self.service.place)  # a check that found more GPUs makes room in a pool at once
        self.reply({"name": name, "ok": True, "reachable": True, "facts": facts})


class MachineTrustHandler(RemoteComputeHandler):
    @api
    async def post(self, name: str) -> None:
        """Trust the SSH host key the machine presents, if it has the fingerprint the user saw."""
        fingerprint = self.body().get("fingerprint")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise InvalidSettings("fingerprint: must be a string like SHA256:...", field="fingerprint")
        try:
            trusted = await self.call(self.service.admin.trust, name, fingerprint)
        except MachineUnreachable as e:
            self.reply({"name": name, "trusted": False, "reachable": False, "reason": e.reason})
            return
        self.reply({**trusted, "reachable": True})


# -- pools ------------------------------------------------------------------
class PoolsHandler(RemoteComputeHandler):
    @api
    async def get(self) -> None:
        admin = self.service.admin
        version = await self.call(admin.version)  # first: a write carrying it fails if the file changed after
        pools = await self.call(admin.pools)
        self.reply({"pools": [pool.to_json() for pool in pools], "version": version})


class PoolHandler(RemoteComputeHandler):
    @api
    async def put(self, name: str) -> None:
        pool = await self.call(self.service.admin.put_pool_from, name, self.body())
        self.reply(pool.to_json())

    @api
    async def delete(self, name: str) -> None:
        await self.call(self.service.admin.remove_pool, name, expected_version=self.get_argument("version", None))
        self.set_status(204)
        self.finish()


#: Part of the API (openapi.yaml); ``routes.py`` registers them.
MACHINE_HANDLERS: list[tuple[str, type[RemoteComputeHandler]]] = [
    (rf"{PREFIX}/kinds", KindsHandler),
    (rf"{PREFIX}/machines", MachinesHandler),
    (rf"{PREFIX}/machines/{MACHINE}", MachineHandler),
    (rf"{PREFIX}/machines/{MACHINE}/check", MachineCheckHandler),
    (rf"{PREFIX}/machines/{MACHINE}/trust", MachineTrustHandler),
    (rf"{PREFIX}/pools", PoolsHandler),
    (rf"{PREFIX}/pools/{MACHINE}", PoolHandler),
]
