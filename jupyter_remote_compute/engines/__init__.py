"""Engines, one module per kind of machine, found by kind through an entry point group.

A package adds a kind by declaring, in its own pyproject.toml::

    [project.entry-points."jupyter_remote_compute.engines"]
    slurm = "my_package.slurm:SlurmEngine"
"""

from __future__ import annotations

import functools
import logging
from importlib.metadata import EntryPoint, entry_points

from ..errors import InvalidSettings
from .base import Engine, EngineContext, EngineError

ENTRY_POINT_GROUP = "jupyter_remote_compute.engines"

__all__ = ["Engine", "EngineContext", "EngineError", "engine_class", "engine_kinds"]


#: Kinds loaded so far. ``engine_class`` loads only the kind it is asked for: a job on the built-in
#: machine should not import paramiko, or a plugin that is broken.
_loaded: dict[str, type[Engine]] = {}


def _load(ep: EntryPoint) -> type[Engine] | None:
    try:
        cls = ep.load()
    except ImportError as e:
        # One broken plugin must not take every other kind down with it.
        logging.getLogger(__name__).warning("cannot load engine %r (%s): %s", ep.name, ep.value, e)
        return None
    if not (isinstance(cls, type) and issubclass(cls, Engine)) or cls.kind != ep.name:
        raise TypeError(f"entry point {ep.value!r} does not name an Engine of kind {ep.name!r}")
    return cls


@functools.cache
def _registry() -> dict[str, type[Engine]]:
    """Every kind installed, loaded (the same dict ``engine_class`` fills one kind at a time)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _loaded and (cls := _load(ep)) is not None:
            _loaded[ep.name] = cls
    return _loaded


def engine_kinds() -> list[str]:
    """Every kind of machine this installation can use."""
    return sorted(_registry())


def engine_class(kind: str) -> type[Engine]:
    if kind not in _loaded:
        for ep in entry_points(group=ENTRY_POINT_GROUP, name=kind):
            if (cls := _load(ep)) is not None:
                _loaded[kind] = cls
    try:
        return _loaded[kind]
    except KeyError:
        known = ", ".join(engine_kinds()) or "none"
        raise InvalidSettings(f"kind: unknown kind {kind!r} (known: {known})", field="kind") from None
