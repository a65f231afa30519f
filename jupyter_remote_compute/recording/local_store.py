"""A workspace's own sqlite store, made where its runs go: private, its artifacts under the workspace.

MLflow makes a store by running every schema migration since its first (~2 s of CPU). The recorder
keeps an empty store, as MLflow made it, and makes each new store as a copy of it with its Default
experiment pointed at the new workspace: the same store, made in milliseconds. The empty store is kept
in the process and in the user's cache folder (``kept_store_path``), named after the schema revision
MLflow expects, so a recorder that starts again (after its idle time, a kill, a new version of the
package) copies it too, and only a new MLflow's schema makes a new one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path

from ..fsutil import PRIVATE_FILE, atomic_write, private_dir, tighten

log = logging.getLogger(__name__)

#: MLflow's own default experiment (every store has it): where a run goes when nobody named one.
DEFAULT_EXPERIMENT_ID = "0"
#: An empty store as MLflow made it (its Default experiment only): kept, in this process, once read or made.
_empty_store: bytes | None = None


def prepare_local_store(workspace: Path, uri: str) -> None:
    """A sqlite store made here gets its Default experiment's artifacts under the workspace, and is
    this user's only (the file 0600, ``mlartifacts/`` 0700, made so before MLflow writes in them).

    MLflow puts the artifacts under the creating process's working directory otherwise (the server's,
    wherever it was started); a store that exists already is left as it is, but for its modes
    (``keep_store_private``). Called under the store's lock (``tracking._store_lock``).
    """
    if not uri.startswith("sqlite:///"):
        return
    if Path(uri.removeprefix("sqlite:///")).exists():
        keep_store_private(workspace, uri)
        return
    global _empty_store
    path, artifacts = Path(uri.removeprefix("sqlite:///")), (workspace / "mlartifacts").as_uri()
    private_dir(workspace / "mlartifacts")
    kept = kept_store_path()
    if _empty_store is None and kept is not None:
        _empty_store = _read_kept(kept)
    if _empty_store is not None:
        try:
            _copy_empty_store(_empty_store, path, artifacts)
            return
        except (OSError, sqlite3.Error) as e:
            log.warning("a copy of an empty MLflow store could not be made at %s (%s): MLflow makes it", path, e)
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))  # sqlite takes it as new
    SqlAlchemyStore(uri, artifacts).engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as made:
        _empty_store = made.serialize()
    if kept is not None:
        try:
            atomic_write(kept, _empty_store)
        except OSError as e:  # a cache folder that cannot be written: the next recorder makes its own
            log.info("the empty MLflow store is not kept at %s: %s", kept, e)


def kept_store_path() -> Path | None:
    """Where the empty store of the schema MLflow expects is kept for the next process:
    ``$XDG_CACHE_HOME/jupyter-remote-compute/mlflow-empty-<revision>.db`` (``~/.cache`` by default);
    None when this MLflow does not say its revision."""
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision

        revision = str(_get_latest_schema_revision())
    except Exception:  # an MLflow that moved it: each process makes its first store itself
        return None
    if not revision.isalnum():
        return None
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "jupyter-remote-compute" / f"mlflow-empty-{revision}.db"


def _read_kept(kept: Path) -> bytes | None:
    """The kept store's bytes if it is an MLflow store at the revision its name says, else None."""
    try:
        data = kept.read_bytes()
    except OSError:
        return None
    try:
        with contextlib.closing(sqlite3.connect(":memory:")) as store:
            store.deserialize(data)
            (revision,) = store.execute("SELECT version_num FROM alembic_version").fetchone()
    except (sqlite3.Error, TypeError, ValueError):
        return None
    return data if kept.name == f"mlflow-empty-{revision}.db" else None


def keep_store_private(workspace: Path, uri: str) -> None:
    """The workspace's default store (``mlflow.db``, its journal) and ``mlartifacts/`` are this user's
    only: what MLflow or an earlier version made open to other local users is tightened. Imports no
    MLflow (the server calls it for the UI's store)."""
    default = workspace / "mlflow.db"
    if uri != f"sqlite:///{default}":
        return
    for path in (default, *(default.with_name(default.name + end) for end in ("-journal", "-wal", "-shm"))):
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(path).st_mode
            if mode & 0o077:
                os.chmod(path, mode & 0o700)
    artifacts = workspace / "mlartifacts"
    if not artifacts.exists():
        private_dir(artifacts)  # before MLflow makes it with the umask's mode
    elif os.stat(artifacts).st_mode & 0o077:
        tighten(artifacts)


def _copy_empty_store(empty: bytes, path: Path, artifacts: str) -> None:
    """Write ``empty`` at ``path`` with its Default experiment's artifacts under ``artifacts`` and its
    times now, as MLflow would have made it; all or nothing (a half-made store would be used)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as store:
        store.deserialize(empty)
        now = int(time.time() * 1000)
        changed = store.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ?"
            " WHERE experiment_id = 0",
            (f"{artifacts}/{DEFAULT_EXPERIMENT_ID}", now, now),
        ).rowcount
        if changed != 1:
            raise sqlite3.DatabaseError("its Default experiment is not where MLflow kept it")
        store.commit()
        atomic_write(path, store.serialize())
