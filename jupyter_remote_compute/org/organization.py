"""The organization's machines, as the service keeps them: compute.yaml in a folder of its own.

The service's state folder is a workspace like a user's (``<state>/.punica/compute.yaml``, comments
kept on every save), so machines are added, checked and changed by the same ``MachineAdmin`` a user's
panel uses; their tokens go to the service's own Secret Manager (``SERVICE``), never to a user. Who set
each machine is kept beside compute.yaml in ``admins.json``, a name per machine, written whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import NotFound
from ..fsutil import SharedFileLock, atomic_write
from ..jobs.service import JobService, ServiceSettings
from ..machines.registry import Machine
from ..secrets import SecretStore
from ..workspace import Workspace
from .jobs import OrgJobs

#: The service's Secret Manager entries are apart from any user's (the keyring's service name).
SERVICE = "jupyter-remote-compute-organization"
OWNER = "organization"


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
        self._lock = SharedFileLock(self.workspace.punica_dir / "admins.lock", timeout=30)

    def machines(self) -> dict[str, Any]:
        """Every machine the organization set (not the service's own ``local``), and the file's version."""
        version = self.admin.version()
        admins = self._admins()
        shown = [self.describe(m, admins) for m in self.admin.list() if not m.builtin]
        return {"machines": shown, "version": version}

    def machine(self, name: str) -> dict[str, Any]:
        return self.describe(self._organizations(name), self._admins())

    def add(self, admin_name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        machine = self.admin.add_from(body)
        self._set_admin(machine.name, admin_name)
        return self.describe(machine, self._admins())

    def update(self, admin_name: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._organizations(name)
        machine = self.admin.update_from(name, body)
        self._set_admin(name, admin_name)
        return self.describe(machine, self._admins())

    def remove(self, name: str, expected_version: str | None) -> None:
        self._organizations(name)
        self.admin.remove(name, expected_version=expected_version)
        self._set_admin(name, None)

    def describe(self, machine: Machine, admins: Mapping[str, str]) -> dict[str, Any]:
        return {**self.admin.describe(machine), "owner": OWNER, "admin": admins.get(machine.name)}

    def close(self) -> None:
        self.jobs.close()

    def _organizations(self, name: str) -> Machine:
        machine = self.admin.get(name)  # NotFound names the machine
        if machine.builtin:
            raise NotFound(f"{name!r} is not one of the organization's machines")
        return machine

    def _admins(self) -> dict[str, str]:
        try:
            data = json.loads(self._admins_file.read_text())
        except FileNotFoundError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _set_admin(self, machine: str, admin_name: str | None) -> None:
        with self._lock:
            admins = self._admins()
            if admin_name is None:
                admins.pop(machine, None)
            else:
                admins[machine] = admin_name
            atomic_write(self._admins_file, json.dumps(admins, indent=1, sort_keys=True).encode(), mode=0o600)
