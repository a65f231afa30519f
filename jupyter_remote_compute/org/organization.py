"""The organization's machines, as the service keeps them: compute.yaml in a folder of its own.

The service's state folder is a workspace like a user's (``<state>/.punica/compute.yaml``, comments
kept on every save), so machines are added, checked and changed by the same ``MachineAdmin`` a user's
panel uses; their tokens go to the service's own Secret Manager (``SERVICE``), never to a user. Who set
each machine is kept beside compute.yaml in ``admins.json``, a name per machine, written whole.

An admin may name one of them the organization's *default* (``default.json``: the machine and who set
it): what ``local`` is for a single user. It is not listed among the machines but beside them, and a
job that names no machine runs there (the user's server asks, ``engines/organization/client.py``).

A machine may say who may use it (``access``: hub users and groups, kept on its entry in compute.yaml).
A member off a machine's list does not see it (nor as the default: theirs is then none, so their jobs
that name no machine run on ``local``), and is refused it by name (``Forbidden``). An admin sees and
may use every machine: the admins keep the lists.

An admin may name the organization's MLflow tracking server (``tracking.json``: its URI and who set it):
the runs of the jobs on the organization's machines are recorded there instead of each user's own store.
Only an http(s) URI without credentials in it is taken: the credentials are each user's environment's.

The service's own Secret Manager holds what its machines name but no member may hold: a machine's
``registry_secret`` (the ``user:password`` its jobs' images are pulled with). Admins set and remove
those secrets by name; nobody reads one back, and the service adds it to a job's launch itself
(``jobs.py``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import Forbidden, InvalidSettings, NotFound
from ..fsutil import SharedFileLock, atomic_write
from ..jobs.service import JobService, ServiceSettings
from ..machines.registry import Machine
from ..secrets import SecretStore
from ..workspace import Workspace
from .jobs import OrgJobs

#: The service's Secret Manager entries are apart from any user's (the keyring's service name).
SERVICE = "jupyter-remote-compute-organization"
OWNER = "organization"


@dataclasses.dataclass(frozen=True)
class Member:
    """Who asks, as the hub said: their name, hub groups, and whether they hold the admin scope."""

    name: str
    groups: tuple[str, ...] = ()
    admin: bool = False

    def may_use(self, machine: Machine) -> bool:
        return self.admin or machine.access is None or machine.access.admits(self.name, self.groups)


class Organization:
    """The organization's machines and who set each; every method blocks (call it off the IOLoop)."""

    def __init__(self, state_dir: Path, secrets: SecretStore | None = None) -> None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.workspace = Workspace(state_dir)
        self.workspace.punica_dir.mkdir(exist_ok=True, mode=0o700)
        self.jobs = JobService(self.workspace, ServiceSettings(), secrets=secrets or SecretStore(SERVICE))
        self.admin = self.jobs.admin
        #: Users' jobs on these machines (``jobs.py``).
        self.org_jobs = OrgJobs(self.workspace.punica_dir, self.admin)
        self._admins_file = self.workspace.punica_dir / "admins.json"
        self._default_file = self.workspace.punica_dir / "default.json"
        self._tracking_file = self.workspace.punica_dir / "tracking.json"
        self._lock = SharedFileLock(self.workspace.punica_dir / "admins.lock", timeout=30)

    def machines(self, member: Member) -> dict[str, Any]:
        """Every machine of the organization's (not the service's own ``local``) that ``member`` may use,
        the default apart from the others, and the file's version."""
        version = self.admin.version()
        admins = self._admins()
        default = self.default_name()
        machines = [m for m in self.admin.list() if not m.builtin and member.may_use(m)]
        shown = [self.describe(m, admins, member) for m in machines if m.name != default]
        chosen = [self.describe(m, admins, member) for m in machines if m.name == default]
        return {"machines": shown, "default": chosen[0] if chosen else None, "version": version}

    def default(self, member: Member) -> dict[str, Any]:
        """The default machine (described, with the admin who chose it), or ``machine: None``: also for a
        member off its access list, whose jobs that name no machine then run on their own ``local``."""
        name = self.default_name()
        if name is None or not member.may_use(self._organizations(name)):
            return {"machine": None, "set_by": None}
        return {"machine": self.machine(name, member), "set_by": self._read(self._default_file).get("admin")}

    def default_name(self) -> str | None:
        """The default machine's name; one removed since is no default."""
        name = self._read(self._default_file).get("machine")
        if not name:
            return None
        try:
            return self._organizations(name).name
        except NotFound:
            return None

    def set_default(self, admin_name: str, name: Any) -> dict[str, Any]:
        if not isinstance(name, str) or not name:
            raise InvalidSettings("machine: expected the name of one of the organization's machines", field="machine")
        self._organizations(name)  # NotFound names it
        with self._lock:
            atomic_write(self._default_file, json.dumps({"machine": name, "admin": admin_name}).encode(), mode=0o600)
        return self.default(Member(admin_name, admin=True))

    def clear_default(self) -> None:
        with self._lock:
            self._default_file.unlink(missing_ok=True)

    def tracking(self) -> dict[str, Any]:
        """The organization's tracking server (``uri``: None where the admins set none) and who set it."""
        kept = self._read(self._tracking_file)
        return {"uri": kept.get("uri"), "set_by": kept.get("admin") if kept.get("uri") else None}

    def set_tracking(self, admin_name: str, uri: Any) -> dict[str, Any]:
        checked = tracking_server_uri(uri)
        with self._lock:
            atomic_write(self._tracking_file, json.dumps({"uri": checked, "admin": admin_name}).encode(), mode=0o600)
        return self.tracking()

    def clear_tracking(self) -> None:
        with self._lock:
            self._tracking_file.unlink(missing_ok=True)

    # -- the service's own secrets: what its machines name (a registry_secret), set by an admin --------
    def secrets(self) -> dict[str, Any]:
        """The service's Secret Manager: where new secrets go and every secret's name and place, never a value."""
        store = self.jobs.secrets
        return {"store": store.status(), "secrets": [entry.to_json() for entry in store.entries()]}

    def set_secret(self, name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, str) or not value:
            raise InvalidSettings("value: the secret's value must be non-empty text", field="value")
        self.jobs.secrets.set(name, value)
        return {"name": name, "where": self.jobs.secrets.where()}

    def remove_secret(self, name: str) -> None:
        """Refused (``secret_in_use``) while one of the organization's machines names it."""
        self.jobs.delete_secret(name)

    def machine(self, name: str, member: Member | None = None) -> dict[str, Any]:
        """One machine, described; for ``member`` only if they may use it."""
        machine = self._organizations(name)
        if member is not None:
            self.check_use(machine, member)
        return self.describe(machine, self._admins(), member)

    def check_use(self, machine: Machine | str, member: Member, *, removed_ok: bool = False) -> None:
        """A 403 naming the machine when ``member`` is off its access list (``removed_ok``: a machine
        removed since is no refusal here; what asks goes on with its own snapshot of it)."""
        if isinstance(machine, str):
            try:
                machine = self._organizations(machine)
            except NotFound:
                if removed_ok:
                    return
                raise
        if not member.may_use(machine):
            raise Forbidden(
                f"{member.name} may not use the organization's machine {machine.name!r}: only the users and groups "
                "on its access list may; an admin of the organization grants access"
            )

    def add(self, admin_name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        machine = self.admin.add_from(body, shared=True)
        self._set_admin(machine.name, admin_name)
        return self.describe(machine, self._admins())

    def update(self, admin_name: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._organizations(name)
        machine = self.admin.update_from(name, body, shared=True)
        self._set_admin(name, admin_name)
        return self.describe(machine, self._admins())

    def remove(self, name: str, expected_version: str | None) -> None:
        self._organizations(name)
        self.admin.remove(name, expected_version=expected_version)
        self._set_admin(name, None)
        if self._read(self._default_file).get("machine") == name:
            self.clear_default()  # a machine of that name added later is not the default by chance

    def describe(self, machine: Machine, admins: Mapping[str, str], member: Member | None = None) -> dict[str, Any]:
        """A machine as the service shows it; its access list to the admins only (it names other members)."""
        described = {**self.admin.describe(machine), "owner": OWNER, "admin": admins.get(machine.name)}
        if member is not None and not member.admin:
            described.pop("access", None)
        return described

    def close(self) -> None:
        self.jobs.close()

    def _organizations(self, name: str) -> Machine:
        machine = self.admin.get(name)  # NotFound names the machine
        if machine.builtin:
            raise NotFound(f"{name!r} is not one of the organization's machines")
        return machine

    def _admins(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._read(self._admins_file).items()}

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def _set_admin(self, machine: str, admin_name: str | None) -> None:
        with self._lock:
            admins = self._admins()
            if admin_name is None:
                admins.pop(machine, None)
            else:
                admins[machine] = admin_name
            atomic_write(self._admins_file, json.dumps(admins, indent=1, sort_keys=True).encode(), mode=0o600)


def tracking_server_uri(value: Any) -> str:
    """``value`` as the organization's tracking server: an http(s) URL of a host, without a user or
    password in it (every member reads it); else ``InvalidSettings`` naming the field ``uri``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidSettings("uri: expected the tracking server's URL (https://mlflow.example.org)", field="uri")
    uri = value.strip()
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - a port that is no number raises here
    except ValueError as e:
        raise InvalidSettings(f"uri: not a URL ({e})", field="uri") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # Not echoed: what was pasted may hold a credential.
        raise InvalidSettings(
            "uri: expected the http(s) URL of an MLflow tracking server (https://mlflow.example.org); another store "
            "(a folder, sqlite, databricks) is each member's own",
            field="uri",
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidSettings(
            "uri: no user or password in the URL (every member reads it); members give the server's credentials "
            "in their own environment (MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and _PASSWORD)",
            field="uri",
        )
    if parts.query or parts.fragment:
        raise InvalidSettings("uri: no query or fragment in a tracking server's URL", field="uri")
    return uri.rstrip("/")
