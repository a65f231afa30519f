"""Machines as every face changes them: add, edit, remove, check, trust, and the engines built for them.

The panel, the CLI, the magic and a pipeline step all come through ``MachineAdmin``, so a rule
written here holds everywhere. The rule that matters most: a write the registry refuses
(a duplicate name, a stale version, a bad option) never reaches the Secret Manager. Every
change is validated and written to compute.yaml first; the token is stored last, and if
storing it fails the file is put back as it was.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engines import engine_class, engine_kinds
from ..engines.base import Engine, EngineContext, EngineError
from ..engines.faces import faces_of
from ..environments.environment import builder
from ..errors import InvalidSettings, MachineError, MachineUnreachable, NotFound, RemoteComputeError
from ..schema.machine import MachineAccess, MachineInput, MachinePatch
from ..schema.pool import Pool, PoolInput
from ..secrets import SecretStore
from ..workspace import default_scratch_dir
from .facts import remember_facts
from .registry import Machine, MachineRegistry

log = logging.getLogger(__name__)


class HostKeyNotConfirmed(MachineError):
    """Trusting was asked without the fingerprint the user compared, or with one the machine does not present."""

    code = "host_key_not_confirmed"


def snapshot_of(machine: Machine) -> dict[str, Any]:
    """What a job keeps of its machine at submit: enough to rebuild its engine after the machine is edited."""
    return {"kind": machine.kind, "address": machine.address, "options": dict(machine.options)}


class MachineAdmin:
    def __init__(self, registry: MachineRegistry, secrets: SecretStore, scratch_dir: Path | None = None) -> None:
        self.registry = registry
        self.secrets = secrets
        self.scratch_dir = scratch_dir
        self._engines: dict[tuple[str, str], Engine] = {}
        self._engines_lock = threading.Lock()

    # -- reading ------------------------------------------------------------
    def get(self, name: str) -> Machine:
        return self.registry.get(name)

    def list(self) -> list[Machine]:
        return self.registry.list()

    def version(self) -> str:
        return self.registry.version()

    # -- pools (machines/pools.py; placing their jobs is jobs/placement.py's) --------------------
    def pools(self) -> list[Pool]:
        return self.registry.pools()

    def put_pool_from(self, name: str, body: Mapping[str, Any]) -> Pool:
        """Make or replace a pool from a REST ``PoolInput`` (``PUT /pools/{name}``)."""
        given = PoolInput.from_json(body)
        return self.registry.put_pool(name, given, expected_version=given.version)

    def remove_pool(self, name: str, *, expected_version: str | None = None) -> None:
        """Remove a pool; its jobs still waiting say so, and wait until it is back or they are cancelled."""
        self.registry.remove_pool(name, expected_version=expected_version)

    def resolve(self, name: str) -> Machine:
        """The machine a job names: this workspace's own; else, on a hub, the organization's, named
        ``org:NAME`` always and ``NAME`` where this workspace has no machine of that name (one's own wins)."""
        from ..engines.organization.client import ORG_PREFIX, organization, shared_machine

        if not name.startswith(ORG_PREFIX):
            try:
                return self.registry.get(name)
            except NotFound as e:
                shared = shared_machine(name)
                if shared is None:
                    raise NotFound(e.message + (", nor among the organization's" if organization() else "")) from None
                return shared
        shared = shared_machine(name)
        if shared is None:
            raise NotFound(
                f"no machine {name!r}: {ORG_PREFIX}NAME names a machine of the organization, which is reached only "
                "from a JupyterHub server whose hub runs the organization service, and it must have that machine"
            )
        return shared

    # -- engines --------------------------------------------------------------
    def engine(self, machine_name: str, snapshot: Mapping[str, Any] | None = None) -> Engine:
        """The cached engine of a machine (built from a job's snapshot once the machine is gone)."""
        if snapshot is None:
            snapshot = snapshot_of(self.resolve(machine_name))
        # Keyed by configuration too: a job started before an edit keeps the engine it started with.
        cache_key = (machine_name, json.dumps(snapshot, sort_keys=True, default=str))
        with self._engines_lock:
            cached = self._engines.get(cache_key)
            if cached is not None:
                return cached
            context = EngineContext(
                get_secret=self.secrets.get,
                scratch_dir=self.scratch_dir or default_scratch_dir(),
                punica_dir=self.registry.path.parent,
            )
            cls = engine_class(snapshot["kind"])
            options = dict(snapshot.get("options") or {})
            try:
                # What the form refuses at save, a hand-written compute.yaml can still hold (an ssh host
                # list's hosts): said at first use, naming the machine and the file.
                cls.check_settings(snapshot["address"], options)
            except InvalidSettings as e:
                raise InvalidSettings(
                    f"machine {machine_name!r} in {self.registry.path}: {e.message}; correct it there", field=e.field
                ) from None
            engine = cls(machine_name, snapshot["address"], options, context)
            self._engines[cache_key] = engine
            return engine

    def close(self) -> None:
        with self._engines_lock:
            for engine in self._engines.values():
                engine.close()
            self._engines.clear()

    # -- changing ---------------------------------------------------------------
    def add_from(self, body: Mapping[str, Any], *, shared: bool = False) -> Machine:
        """``add`` with a REST ``MachineInput`` (the panel's server and the organization service take one);
        only an organization's (``shared``) machine takes an access list."""
        given = MachineInput.from_json(body)
        _check_access(given.access, shared)
        return self.add(
            given.name,
            given.kind,
            given.address,
            given.options or {},
            enabled=given.enabled,
            token=given.token,
            access=given.access,
            expected_version=given.version,
        )

    def update_from(self, name: str, body: Mapping[str, Any], *, shared: bool = False) -> Machine:
        """``update`` with a REST ``MachinePatch``: only the fields it holds change."""
        given = MachinePatch.from_json(body)
        _check_access(given.access, shared)
        return self.update(
            name,
            address=given.address,
            options=given.options,
            enabled=given.enabled,
            token=given.token,
            access=given.access,
            expected_version=given.version,
        )

    def add(
        self,
        name: Any,
        kind: Any,
        address: Any,
        options: Mapping[str, Any] | None = None,
        *,
        enabled: bool = True,
        token: str | None = None,
        access: MachineAccess | None = None,
        expected_version: str | None = None,
    ) -> Machine:
        """Add a machine; a token goes to the Secret Manager (last) and the file keeps only its name."""
        for field, value in (("name", name), ("kind", kind), ("address", address)):
            if not isinstance(value, str) or not value:
                raise InvalidSettings(f"{field}: required", field=field)
        if options is not None and not isinstance(options, Mapping):
            raise InvalidSettings("options: expected a mapping of option names to values", field="options")
        options = dict(options or {})
        secret_name = None
        if _given(token):
            self._check_token(kind, token)
            secret_name = options.get("token_secret") or f"compute/{name}"
            options["token_secret"] = secret_name
        machine = self.registry.add(
            name, kind, address, options, enabled=enabled, access=access, expected_version=expected_version
        )
        if secret_name is not None:
            try:
                self.secrets.set(secret_name, token)  # type: ignore[arg-type]
            except BaseException:
                self._undo(f"adding {name}", lambda: self.registry.remove(name))
                raise
        return machine

    def update(
        self,
        name: str,
        *,
        address: str | None = None,
        options: Mapping[str, Any] | None = None,
        enabled: bool | None = None,
        token: str | None = None,
        access: MachineAccess | None = None,
        expected_version: str | None = None,
    ) -> Machine:
        """Change a machine; a new token is stored only once the file took the change."""
        if not _given(token):
            return self.registry.update(
                name,
                address=address,
                options=options,
                enabled=enabled,
                access=access,
                expected_version=expected_version,
            )
        before = self.registry.get(name)
        self._check_token(before.kind, token)
        changing = dict(options or {})
        secret_name = changing.get("token_secret") or before.options.get("token_secret") or f"compute/{name}"
        changing["token_secret"] = secret_name
        machine = self.registry.update(
            name, address=address, options=changing, enabled=enabled, access=access, expected_version=expected_version
        )
        try:
            self.secrets.set(secret_name, token)  # type: ignore[arg-type]
        except BaseException:
            # Put back what this call changed (an option that was absent is removed again).
            restore = {key: before.options.get(key) for key in changing}
            self._undo(
                f"editing {name}",
                lambda: self.registry.update(name, address=before.address, options=restore, enabled=before.enabled),
            )
            raise
        return machine

    def remove(self, name: str, *, expected_version: str | None = None) -> None:
        kind = self.registry.get(name).kind
        self.registry.remove(name, expected_version=expected_version)
        on_removed = faces_of(kind).on_removed
        if on_removed is not None:
            on_removed(self.registry.path.parent, name)

    def introduce(self, machine: Machine, server_url: str) -> dict[str, Any]:
        """What a face that just added ``machine`` shows once with it (its kind's ``on_added``)."""
        on_added = faces_of(machine.kind).on_added
        return {} if on_added is None else on_added(self.registry.path.parent, machine.name, server_url)

    def describe(self, machine: Machine) -> dict[str, Any]:
        """A machine's JSON as the machine list shows it, with what its kind adds (``describe``)."""
        data = machine.to_json()
        describe = faces_of(machine.kind).describe
        return data if describe is None else describe(self.registry.path.parent, data)

    def set_enabled(self, name: str, enabled: bool, *, expected_version: str | None = None) -> Machine:
        return self.registry.set_enabled(name, enabled, expected_version=expected_version)

    def _check_token(self, kind: Any, token: Any) -> None:
        if not isinstance(token, str):
            raise InvalidSettings("token: expected a string", field="token")
        if kind in engine_kinds() and "token_secret" not in engine_class(kind).options:
            raise InvalidSettings(f"token: machines of kind {kind!r} do not take a token", field="token")

    @staticmethod
    def _undo(what: str, undo: Any) -> None:
        try:
            undo()
        except RemoteComputeError as e:  # the first error is the one to report; this one goes to the log
            log.error("undoing %s after the token could not be stored failed: %s", what, e.message)

    # -- reaching the machine -------------------------------------------------------
    def check(self, name: str) -> dict[str, Any]:
        engine = self.engine(name)
        try:
            facts = engine.check()
        except EngineError as e:
            raise _machine_error(name, e) from e
        # What the machine holds, for metering jobs that asked for no GPUs (they hold the machine).
        try:
            remember_facts(self.registry.path.parent, name, facts)
        except OSError as e:  # a read-only workspace still gets its answer
            log.warning("could not keep %s's facts for usage: %s", name, e)
        # What a job's environment will be built with there: the machine's uv, the one this side sends, or pip.
        tool = builder(engine.kind, facts)
        return {**facts, "environments": tool} if tool else facts

    def presented_host_key(self, name: str) -> dict[str, str] | None:
        """The host key the machine presents while it is not yet known (type, fingerprint); None once known.

        An unknown key fails ``check`` before anything is sent, with the key in the error's details.
        Any other failure comes after the key was accepted, or is reported again by ``trust``.
        """
        try:
            self.engine(name).check()
        except EngineError as e:
            host_key = e.details.get("host_key")
            if isinstance(host_key, Mapping):
                return {"type": str(host_key.get("type")), "fingerprint": str(host_key.get("fingerprint"))}
        return None

    def trust(self, name: str, fingerprint: str | None = None) -> dict[str, Any]:
        """Record the machine's host key as known (an explicit user action).

        With ``fingerprint``, only when the machine presents a key with exactly that fingerprint: the
        one the user compared with the machine's own (the CLI's --fingerprint, the panel's dialog). The
        engine compares it on the connection that records the key, so no other key can slip in between.
        """
        engine = self.engine(name)
        if not engine.features.host_keys:
            # Asking is the caller's mistake (a 400), not a machine that failed (a 502).
            raise InvalidSettings(f"{name}: a {engine.kind} machine has no host key to trust", field="name")
        try:
            recorded = engine.trust_host(fingerprint)
        except EngineError as e:
            if e.details.get("mismatch"):
                raise HostKeyNotConfirmed(f"{name}: {e}", details={"host_key": e.details["host_key"]}) from e
            raise _machine_error(name, e) from e
        return {"name": name, "fingerprint": recorded, "trusted": True}


def _machine_error(name: str, e: EngineError) -> MachineError:
    """What a check or a trust that failed reports: unreachable when trying again later may answer
    (a refused or timed-out connection, a name not resolved); else what the machine said, with its details."""
    if e.transient and not e.details:
        return MachineUnreachable(f"{name}: {e}", reason=str(e))
    return MachineError(f"{name}: {e}", details=e.details)


def _check_access(access: MachineAccess | None, shared: bool) -> None:
    if access is not None and not shared:
        raise InvalidSettings(
            "access: only the organization's machines say who may use them (an admin sets it on one of theirs); "
            "your own machines are yours alone",
            field="access",
        )


def _given(token: Any) -> bool:
    return token not in (None, "")
