"""Each machine of compute.yaml as an Elyra runtime configuration, kept in step with the file.

A configuration is named ``rc-<machine>`` (machine names already fit Elyra's), holds the machine's name and
is created, updated or removed when the machine list changes: ``RuntimeSync`` runs before each poll
pass of the server and does work only when compute.yaml's content changed. Configurations of this
runtime whose machine is gone (or disabled) are removed; others' configurations are never touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..machines.registry import Machine, MachineRegistry
from . import RUNTIME_NAME, RUNTIME_TITLE

log = logging.getLogger(__name__)


def runtime_config_name(machine: str) -> str:
    """The configuration's name for a machine: lower-case letters, digits and '-' are Elyra's names too."""
    return f"rc-{machine}"


def _wanted(machines: list[Machine]) -> dict[str, dict[str, object]]:
    wanted: dict[str, dict[str, object]] = {}
    for m in machines:
        if not m.enabled:
            continue
        wanted[runtime_config_name(m.name)] = {
            "display_name": f"{RUNTIME_TITLE}: {m.name}",
            "metadata": {
                "runtime_type": "LOCAL",
                "machine": m.name,
                "description": f"Each node runs as a job on {m.name} ({m.kind}, {m.address})",
            },
        }
    return wanted


def sync_runtimes(registry: MachineRegistry) -> dict[str, list[str]]:
    """Make this runtime's configurations match the machines; returns the names created, updated and removed."""
    from elyra.metadata.manager import MetadataManager
    from elyra.metadata.metadata import Metadata
    from elyra.metadata.schemaspaces import Runtimes

    manager = MetadataManager(schemaspace=Runtimes.RUNTIMES_SCHEMASPACE_NAME)
    wanted = _wanted(registry.list())
    ours = {m.name: m for m in manager.get_all() if m.schema_name == RUNTIME_NAME}
    changes: dict[str, list[str]] = {"created": [], "updated": [], "removed": []}
    for name, body in wanted.items():
        existing = ours.get(name)
        if existing is None:
            manager.create(name, Metadata(name=name, schema_name=RUNTIME_NAME, **body))
            changes["created"].append(name)
        elif existing.display_name != body["display_name"] or existing.metadata != body["metadata"]:
            manager.update(name, Metadata(name=name, schema_name=RUNTIME_NAME, **body))
            changes["updated"].append(name)
    for name in sorted(set(ours) - set(wanted)):
        manager.remove(name)
        changes["removed"].append(name)
    return changes


@dataclass
class RuntimeSync:
    """Runs ``sync_runtimes`` when compute.yaml's content is not what it was at the last sync."""

    registry: MachineRegistry
    _synced: str | None = field(default=None, init=False)

    def run(self, _view: object = None) -> None:
        version = self.registry.version()
        if version == self._synced:
            return
        # Taken as seen before the sync: a failure is logged once per content of the file, not every pass.
        self._synced = version
        changes = sync_runtimes(self.registry)
        if any(changes.values()):
            log.info("remote-compute: Elyra runtime configurations %s", changes)
