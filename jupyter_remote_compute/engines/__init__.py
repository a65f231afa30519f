"""Engines, one module per kind of machine, found by kind through an entry point group.

This package's own kinds are looked up in ``BUILT_IN_KINDS`` first, without reading any metadata.

A package adds a kind by declaring, in its own pyproject.toml::

    [project.entry-points."jupyter_remote_compute.engines"]
    slurm = "my_package.slurm:SlurmEngine"
"""

from __future__ import annotations

import functools
import importlib
import logging

from ..errors import InvalidSettings
from .base import Engine, EngineContext, EngineError

ENTRY_POINT_GROUP = "jupyter_remote_compute.engines"

#: The kinds this package ships, exactly as its pyproject.toml declares them (a test holds the two
#: equal). They load without reading every installed distribution's metadata: that costs 0.1-0.4 s
#: here, a good part of a no-op job run from the CLI. Other kinds still come from entry points.
BUILT_IN_KINDS = {
    "local": "jupyter_remote_compute.engines.local:LocalEngine",
    "ssh": "jupyter_remote_compute.engines.ssh:SSHEngine",
    "jupyter": "jupyter_remote_compute.engines.jupyter:JupyterEngine",
    "slurm": "jupyter_remote_compute.engines.slurm:SlurmEngine",
    "agent": "jupyter_remote_compute.engines.agent:AgentEngine",
    "skypilot": "jupyter_remote_compute.engines.skypilot:SkyPilotEngine",
}

#: Kinds a job's machine may have but no one adds to a compute.yaml: its machine is someone else's, reached
#: through them (``organization``: a machine of the hub's organization service, ``engines/organization/``). They load
#: as the built-in kinds do, and are neither listed among the kinds nor accepted for a new machine.
ROUTED_KINDS = {"organization": "jupyter_remote_compute.engines.organization.engine:OrganizationEngine"}

__all__ = ["Engine", "EngineContext", "EngineError", "engine_class", "engine_kinds"]


#: Kinds loaded so far. ``engine_class`` loads only the kind it is asked for: a job on the built-in
#: machine should not import paramiko, or a plugin that is broken.
_loaded: dict[str, type[Engine]] = {}


def _load(kind: str, target: str) -> type[Engine] | None:
    """The class an entry point's ``module:attribute`` names; None if its module cannot be imported."""
    module, _, attribute = target.partition(":")
    try:
        cls = functools.reduce(getattr, attribute.split("."), importlib.import_module(module))
    except ImportError as e:
        # One broken plugin must not take every other kind down with it.
        logging.getLogger(__name__).warning("cannot load engine %r (%s): %s", kind, target, e)
        return None
    if not (isinstance(cls, type) and issubclass(cls, Engine)) or cls.kind != kind:
        raise TypeError(f"entry point {target!r} does not name an Engine of kind {kind!r}")
    return cls


def _declared(kind: str | None = None) -> dict[str, str]:
    """Kinds declared by entry points (every installed package's): kind -> ``module:attribute``."""
    from importlib.metadata import entry_points

    found = entry_points(group=ENTRY_POINT_GROUP) if kind is None else entry_points(group=ENTRY_POINT_GROUP, name=kind)
    return {ep.name: ep.value for ep in found}


@functools.cache
def _registry() -> dict[str, type[Engine]]:
    """Every kind installed, loaded (the same dict ``engine_class`` fills one kind at a time)."""
    for kind, target in {**_declared(), **BUILT_IN_KINDS}.items():
        if kind not in _loaded and (cls := _load(kind, target)) is not None:
            _loaded[kind] = cls
    return _loaded


def engine_kinds() -> list[str]:
    """Every kind of machine this installation can add (the routed kinds are not added: see ``ROUTED_KINDS``)."""
    return sorted(kind for kind in _registry() if kind not in ROUTED_KINDS)


def engine_class(kind: str) -> type[Engine]:
    if kind not in _loaded:
        target = BUILT_IN_KINDS.get(kind) or ROUTED_KINDS.get(kind) or _declared(kind).get(kind)
        if target is not None and (cls := _load(kind, target)) is not None:
            _loaded[kind] = cls
    try:
        return _loaded[kind]
    except KeyError:
        known = ", ".join(engine_kinds()) or "none"
        raise InvalidSettings(f"kind: unknown kind {kind!r} (known: {known})", field="kind") from None
