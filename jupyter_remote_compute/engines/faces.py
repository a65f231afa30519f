"""What a kind of machine adds to the faces besides its engine: routes, CLI commands, periodic tasks, hooks.

The server (``extension.py``), the CLI (``cli/``) and the machine admin (``machines/admin.py``) know no
kind: each reads every kind's ``KindFaces`` from here and uses what it declares. A kind's faces are
found by kind, as its engine is: this package's own in ``BUILT_IN_FACES``, a plugin's through the
entry point group ``jupyter_remote_compute.faces``::

    [project.entry-points."jupyter_remote_compute.faces"]
    mykind = "my_package.faces:FACES"

A ``KindFaces`` is read on every CLI start, so its module imports little: routes, settings and
commands reach their heavy modules (tornado, traitlets, the engine) only when called.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FACES_ENTRY_POINT_GROUP = "jupyter_remote_compute.faces"

#: This package's kinds that add faces of their own (``module:attribute`` of their ``KindFaces``).
BUILT_IN_FACES = {"agent": "jupyter_remote_compute.agent_faces:FACES"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CliCommand:
    """One command of ``jupyter remote-compute`` that a kind brings."""

    name: str
    help: str
    #: Runs the parsed command; its return value is the exit status.
    run: Callable[[argparse.Namespace], int]
    #: Adds the command's own arguments to its parser (a ``raw`` command has none: it parses the rest itself).
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    #: None: a command of its own (``jupyter remote-compute NAME``); "machines": an action of ``machines``.
    group: str | None = None
    #: Handed the rest of argv as it is, before anything is parsed (own options, no workspace read).
    raw: bool = False


@dataclass(frozen=True)
class ServerView:
    """What a periodic task sees of the server that runs it."""

    punica_dir: Path
    #: The values of every kind's server settings, by name (e.g. ``agent_lease``).
    settings: Mapping[str, Any]
    #: When this server started (time.time()).
    started_at: float
    log: logging.Logger


@dataclass(frozen=True)
class PeriodicTask:
    """Work the server does before each poll pass, in a worker thread; a failure is logged and the poll goes on."""

    #: Said in the log when it fails: "remote-compute: <what> failed".
    what: str
    run: Callable[[ServerView], None]


def _no_routes() -> list[tuple[str, type]]:
    return []


def _no_settings() -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class KindFaces:
    """Everything a kind adds beyond its engine; every field may be left out."""

    #: Server routes ``(pattern, handler class)``, registered before the catch-all of the prefix.
    #: A callable, so that reading the faces does not import tornado.
    routes: Callable[[], list[tuple[str, type]]] = _no_routes
    #: Config traits of ``RemoteComputeApp`` (name -> traitlets trait), also in the tornado settings
    #: as ``remote_compute_<name>`` for the kind's handlers. A callable, so that traitlets loads lazily.
    server_settings: Callable[[], dict[str, Any]] = _no_settings
    periodic: tuple[PeriodicTask, ...] = ()
    cli: tuple[CliCommand, ...] = ()
    #: The machine's address may be left out when adding it (the CLI then uses its name): nothing dials it.
    address_optional: bool = False
    #: A machine of this kind was just added by a face that shows the answer once (the panel, the CLI):
    #: ``(punica_dir, machine name, this server's URL) -> fields to add to the answer``.
    on_added: Callable[[Path, str, str], dict[str, Any]] | None = None
    #: How the CLI words what ``on_added`` returned, after its "added" line.
    added_text: Callable[[dict[str, Any]], str] | None = None
    #: A machine of this kind was removed from the registry: ``(punica_dir, machine name)``.
    on_removed: Callable[[Path, str], None] | None = None
    #: A machine's JSON as the machine list shows it: ``(punica_dir, machine JSON) -> machine JSON``.
    describe: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None


NO_FACES = KindFaces()


def _load(kind: str, target: str) -> KindFaces | None:
    module, _, attribute = target.partition(":")
    try:
        faces = functools.reduce(getattr, attribute.split("."), importlib.import_module(module))
    except ImportError as e:
        # One broken plugin must not take the CLI or the server down with it.
        log.warning("cannot load the faces of kind %r (%s): %s", kind, target, e)
        return None
    if not isinstance(faces, KindFaces):
        raise TypeError(f"entry point {target!r} does not name a KindFaces")
    return faces


@functools.cache
def _built_in() -> dict[str, KindFaces]:
    return {kind: faces for kind, target in BUILT_IN_FACES.items() if (faces := _load(kind, target)) is not None}


@functools.cache
def _with_plugins() -> dict[str, KindFaces]:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=FACES_ENTRY_POINT_GROUP)}
    plugins = {
        kind: faces
        for kind, target in found.items()
        if kind not in BUILT_IN_FACES and (faces := _load(kind, target)) is not None
    }
    return {**_built_in(), **plugins}


def all_faces(*, plugins: bool = True) -> dict[str, KindFaces]:
    """Every kind's faces, by kind. ``plugins=False``: this package's only, without reading any metadata
    (the CLI's ``run`` and ``jobs`` need no plugin's command, and the scan costs 0.1-0.4 s here)."""
    return _with_plugins() if plugins else _built_in()


def faces_of(kind: str) -> KindFaces:
    """The faces of one kind (nothing at all for a kind that adds none)."""
    if kind in BUILT_IN_FACES:
        return _built_in().get(kind, NO_FACES)
    return _with_plugins().get(kind, NO_FACES)


def forget_loaded() -> None:
    """Read the kinds' faces again on next use (after installing a plugin in a running process)."""
    _built_in.cache_clear()
    _with_plugins.cache_clear()
