"""A workspace's new sqlite store: made by MLflow once per schema, then copied, and the same either way.

MLflow makes a store by running every schema migration since its first (~2 s of CPU). The recorder
keeps the first store it made, empty, in the process and in the user's cache folder, and makes the next
ones from it; these tests read what it made with MLflow's own client and sqlite's schema, against a
store MLflow made itself.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from jupyter_remote_compute.recording import local_store, tracking


def _record(workspace: Path, job_id: str) -> str:
    workspace.mkdir()
    record = tracking.JobRecord(
        job_id=job_id, key=job_id, name="plain", machine="local", engine="local", state="succeeded", reason=None,
        command="true", started=None, ended=time.time(), log_path=None, outputs={}, inputs_manifest=None,
        far_store=None,
    )  # fmt: skip
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    return tracking.record_job(workspace, tracking.TrackingSettings(uri, None), record)


def _schema(db: Path) -> dict[str, object]:
    """Tables with their columns, indexes and the schema's revision. (Not the SQL text: MLflow's migrations
    write a table's constraints in an order that differs from one process to the next.)"""
    with contextlib.closing(sqlite3.connect(db)) as c:
        tables = [row[0] for row in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            "tables": {t: sorted(tuple(col) for col in c.execute(f'PRAGMA table_info("{t}")')) for t in tables},
            "indexes": {row[0] for row in c.execute("SELECT name FROM sqlite_master WHERE type = 'index'")},
            "revision": c.execute("SELECT version_num FROM alembic_version").fetchall(),
        }


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's cache folder, empty, and a process that has made no store yet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(local_store, "_empty_store", None)
    return tmp_path / "cache"


def test_a_second_new_store_is_a_copy_that_reads_as_one_mlflow_made(tmp_path: Path, cache: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _record(first, "job-1")
    assert local_store._empty_store is not None  # kept: the next store is copied from it
    before = int(time.time() * 1000)
    run_id = _record(second, "job-2")

    client = MlflowClient(f"sqlite:///{second / 'mlflow.db'}")
    default = client.get_experiment("0")
    assert default.name == "Default" and default.lifecycle_stage == "active"
    assert default.artifact_location == f"{(second / 'mlartifacts').as_uri()}/0"
    assert default.creation_time >= before and default.last_update_time >= before
    # Only its own job's run, recorded into it; the first store kept its own.
    assert [r.info.run_id for r in client.search_runs(["0"])] == [run_id]
    assert client.get_run(run_id).info.artifact_uri.startswith((second / "mlartifacts").as_uri())
    assert len(MlflowClient(f"sqlite:///{first / 'mlflow.db'}").search_runs(["0"])) == 1
    # The schema MLflow itself makes, at the revision it expects (it refuses a store it would migrate).
    made_by_mlflow = tmp_path / "mlflow-made.db"
    SqlAlchemyStore(f"sqlite:///{made_by_mlflow}", (tmp_path / "art").as_uri()).engine.dispose()
    assert _schema(second / "mlflow.db") == _schema(made_by_mlflow)
    SqlAlchemyStore(f"sqlite:///{second / 'mlflow.db'}", (second / "mlartifacts").as_uri()).engine.dispose()
    assert not list(second.glob(".mlflow.db*"))  # no partial copy left beside it


def test_a_copy_that_cannot_be_made_leaves_nothing_and_mlflow_makes_the_store(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not a store: the copy fails its check, and the store is made the slow way, whole.
    monkeypatch.setattr(local_store, "_empty_store", b"SQLite format 3\x00" + bytes(84))
    workspace = tmp_path / "workspace"
    run_id = _record(workspace, "job-1")
    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    assert [r.info.run_id for r in client.search_runs(["0"])] == [run_id]
    assert client.get_experiment("0").artifact_location == f"{(workspace / 'mlartifacts').as_uri()}/0"
    assert not list(workspace.glob(".mlflow.db*"))


def test_a_process_that_starts_again_copies_the_store_kept_in_the_users_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record(tmp_path / "first", "job-1")
    kept = local_store.kept_store_path()
    assert kept is not None and kept.parent == cache / "jupyter-remote-compute"
    assert kept.stat().st_mode & 0o777 == 0o600 and kept.parent.stat().st_mode & 0o077 == 0
    assert _schema(kept)["revision"] == _schema(tmp_path / "first" / "mlflow.db")["revision"]
    # A recorder started again holds no store in memory; it copies the kept one, running no migration.
    monkeypatch.setattr(local_store, "_empty_store", None)
    import mlflow.store.db.utils

    def migrations(*_: object) -> None:
        raise AssertionError("MLflow made the store: the kept one was not copied")

    with monkeypatch.context() as m:
        m.setattr(mlflow.store.db.utils, "_initialize_tables", migrations)
        run_id = _record(tmp_path / "second", "job-2")
    client = MlflowClient(f"sqlite:///{tmp_path / 'second' / 'mlflow.db'}")
    assert [r.info.run_id for r in client.search_runs(["0"])] == [run_id]
    assert client.get_experiment("0").artifact_location == f"{(tmp_path / 'second' / 'mlartifacts').as_uri()}/0"


def test_a_kept_store_that_is_not_one_is_made_again_by_mlflow(tmp_path: Path, cache: Path) -> None:
    kept = local_store.kept_store_path()
    assert kept is not None
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"not a store")
    run_id = _record(tmp_path / "workspace", "job-1")
    client = MlflowClient(f"sqlite:///{tmp_path / 'workspace' / 'mlflow.db'}")
    assert [r.info.run_id for r in client.search_runs(["0"])] == [run_id]
    assert _schema(kept) == _schema(tmp_path / "workspace" / "mlflow.db")  # replaced by the one MLflow made
