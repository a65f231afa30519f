"""One MLflow run per finished job, in the workspace's own tracking store.

The job wrote its own records (params, metrics with steps, tags, artifacts)
into a file store inside its job directory; collection brought that store back
and ``record_job`` replays it into the local run, so a run trained elsewhere
reads like one trained here and the far side never reaches this store.

Exactly once: the run is looked up by its job-id tag (in every experiment) before
one is created, so a crash between creating and recording never yields a second
run. Collection is exclusive (the lifecycle's lease), so two processes never
record concurrently.

The run lands where a local run of the same script would: in the experiment the
script set on the far side (by name), else ``MLFLOW_EXPERIMENT_NAME`` as it was set
where the job was submitted (the far side got the same value), else MLflow's
default experiment. It keeps the script's run name, else it takes the job's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .environment_record import log_environment
from .fsutil import SharedFileLock
from .secrets import mask

log = logging.getLogger(__name__)
TAG_JOB_ID = "remote_compute.job_id"
TAG_MACHINE = "remote_compute.machine"
TAG_ENGINE = "remote_compute.engine"
TAG_HOST = "remote_compute.host"
TAG_KEY = "remote_compute.key"
TAG_SOURCE_RUN = "remote_compute.source_run_id"
TAG_REPLAYED = "remote_compute.replayed"
TAG_SOURCE_MODEL = "remote_compute.source_model_id"
TAG_SOURCE_VERSION = "remote_compute.source_model_version"
TAG_NOT_REPLAYED = "remote_compute.not_replayed"
BATCH = 1000
STORE_LOCK_TIMEOUT = 300.0  # seconds to wait for another process recording into the same sqlite store

#: MLflow's own default experiment (every store has it): where a run goes when nobody named one.
DEFAULT_EXPERIMENT_ID = "0"
DEFAULT_EXPERIMENT_NAME = "Default"
#: Usage figures every job's run carries as metrics (``jobs/usage.py`` computes them).
USAGE_METRICS = (
    "remote_compute.wall_s",
    "remote_compute.gpu_s",
    "remote_compute.queue_s",
    "remote_compute.bytes_sent",
    "remote_compute.bytes_fetched",
)
STATUS_BY_STATE = {"succeeded": "FINISHED", "failed": "FAILED", "lost": "FAILED", "cancelled": "KILLED"}


@dataclasses.dataclass(frozen=True)
class TrackingSettings:
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else sqlite:///<workspace>/mlflow.db
    # MLflow's own variable, so the server, a kernel, the CLI and a pipeline runner agree when it is set;
    # None: MLflow's default experiment, as a local run would use. Submit passes it to the far side.
    experiment: str | None = dataclasses.field(default_factory=lambda: os.environ.get("MLFLOW_EXPERIMENT_NAME") or None)
    artifact_size_cap: int = 100 * 1024 * 1024  # outputs larger than this in total are not copied
    # Record in a short-lived child process: MLflow and its SQLAlchemy store add ~200 MiB to whoever
    # imports them, which a long-running server should not keep for ever. Faces that exit anyway
    # (CLI, a pipeline run) record in-process.
    isolated: bool = False


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """What the lifecycle knows about a finished job, for its run."""

    job_id: str
    key: str
    name: str
    machine: str
    engine: str
    state: str
    reason: str | None
    command: str
    started: float | None  # epoch seconds
    ended: float
    log_path: Path | None
    outputs: Mapping[str, Path]  # workspace-relative path -> file as landed
    inputs_manifest: Path | None
    far_store: Path | None  # the job's brought-back mlruns/
    mask_values: tuple[str, ...] = ()  # secret values the job saw: hidden in replayed params and tags
    #: MLFLOW_EXPERIMENT_NAME as the job's far side saw it (None: unset); the script's own choice wins.
    experiment: str | None = None
    #: Usage figures (``USAGE_METRICS``), logged once with the replay.
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: Who submitted the job (``mlflow.user``, as a run they trained here would say); None: this process's user.
    user: str | None = None
    #: The sha256 of every output brought back (workspace-relative path -> digest), for outputs.json.
    digests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Where it ran: the machine's address as it was at submit (``remote_compute.host``).
    host: str | None = None

    def to_json(self, *, with_secrets: bool = True) -> dict[str, Any]:
        """As JSON; ``with_secrets=False`` leaves out ``mask_values`` (for anything written to disk)."""
        data = dataclasses.asdict(self)
        data.update(
            log_path=str(self.log_path) if self.log_path else None,
            outputs={name: str(path) for name, path in self.outputs.items()},
            inputs_manifest=str(self.inputs_manifest) if self.inputs_manifest else None,
            far_store=str(self.far_store) if self.far_store else None,
            mask_values=list(self.mask_values) if with_secrets else [],
        )
        return data

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> JobRecord:
        return cls(
            **{
                **raw,
                "log_path": Path(raw["log_path"]) if raw["log_path"] else None,
                "outputs": {name: Path(path) for name, path in raw["outputs"].items()},
                "inputs_manifest": Path(raw["inputs_manifest"]) if raw["inputs_manifest"] else None,
                "far_store": Path(raw["far_store"]) if raw["far_store"] else None,
                "mask_values": tuple(raw.get("mask_values", ())),
            }
        )


WITHHELD_FAR_RECORDS = "far-side MLflow records withheld: a secret this job used could not be read to mask them"


def without_far_records(record: JobRecord) -> JobRecord:
    """The record minus the far side's MLflow store, for when a secret the job saw cannot be read to mask
    it: nothing the script logged there may carry the value into this store (fail closed, like the log)."""
    reason = f"{record.reason} ({WITHHELD_FAR_RECORDS})" if record.reason else WITHHELD_FAR_RECORDS
    return dataclasses.replace(record, far_store=None, reason=reason)


def tracking_uri(workspace: Path, settings: TrackingSettings) -> str:
    return settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{workspace / 'mlflow.db'}"


def _is_local_store(uri: str) -> bool:
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


def _git_commit(workspace: Path) -> str | None:
    # Generous: recording runs in a detached process, so a slow git (a network filesystem) delays
    # only the run's appearance; the limit is for a git that hangs.
    try:
        out = subprocess.run(
            ["git", "-C", str(workspace), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _experiment_id(client: Any, workspace: Path, uri: str, name: str | None) -> str:
    from mlflow.exceptions import MlflowException

    if name is None or name == DEFAULT_EXPERIMENT_NAME:
        return DEFAULT_EXPERIMENT_ID
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    # A local store would otherwise put artifacts under the *process's* working directory.
    location = (workspace / "mlartifacts").as_uri() if _is_local_store(uri) else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:
        # Another process created it meanwhile.
        return client.get_experiment_by_name(name).experiment_id


def find_job_run(client: Any, job_id: str) -> str | None:
    """The run of a job in any experiment of the store (the rule may have put it anywhere)."""
    from mlflow.entities import ViewType

    ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    for start in range(0, len(ids), 100):  # search_runs takes a bounded list of experiments
        found = find_tagged_run(client, ids[start : start + 100], TAG_JOB_ID, job_id)
        if found:
            return found
    return None


def find_tagged_run(client: Any, experiment_ids: list[str], tag: str, value: str) -> str | None:
    from mlflow.entities import ViewType

    runs = client.search_runs(
        experiment_ids, filter_string=f"tags.`{tag}` = '{value}'", run_view_type=ViewType.ALL, max_results=1
    )
    return runs[0].info.run_id if runs else None


def _prepare_local_store(workspace: Path, uri: str) -> None:
    """A sqlite store made here gets its Default experiment's artifacts under the workspace.

    MLflow puts them under the creating process's working directory otherwise (the server's,
    wherever it was started); a store that exists already is left as it is.
    """
    if not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).exists():
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(uri, (workspace / "mlartifacts").as_uri()).engine.dispose()


def _store_lock(uri: str) -> contextlib.AbstractContextManager[object]:
    """For a sqlite store, a lock beside it: MLflow creates and migrates a new database without one,
    and two processes doing it at once (two servers, a CLI) leave it half made for everyone after."""
    if not uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    return SharedFileLock(uri.removeprefix("sqlite:///") + ".lock", timeout=STORE_LOCK_TIMEOUT)


def record_job(workspace: Path, settings: TrackingSettings, job: JobRecord) -> str:
    """Create (or find) the job's run, replay what the job logged, attach artifacts, close it."""
    if settings.isolated:
        return _record_in_child(workspace, settings, job)
    uri = tracking_uri(workspace, settings)
    with _store_lock(uri), _default_uri(uri):
        return _record_job(workspace, uri, settings, job)


def warm_up(workspace: Path, settings: TrackingSettings) -> None:
    """Import what recording needs and open the store's client once (a recorder started before its
    job ends does this while the job runs): what makes recording a small job slow is this, not the replay."""
    from mlflow.store.tracking.file_store import FileStore  # noqa: F401 - the far store's reader
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: F401
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(workspace, settings)
    if not uri.startswith("sqlite:///"):
        return
    with _store_lock(uri):  # never while another process makes or migrates it
        if Path(uri.removeprefix("sqlite:///")).exists():
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def _default_uri(uri: str) -> contextlib.AbstractContextManager[object]:
    """MLflow's registry looks a ``models:/`` source up through a client of the *default* store: this one."""
    try:
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    except ImportError:  # a later MLflow moved it: the default store is then whatever MLflow picks
        return contextlib.nullcontext()
    return _use_tracking_uri(uri)


def _record_job(workspace: Path, uri: str, settings: TrackingSettings, job: JobRecord) -> str:
    from mlflow.tracking import MlflowClient

    _prepare_local_store(workspace, uri)
    client = MlflowClient(tracking_uri=uri)
    far = _far_runs(job.far_store) if job.far_store is not None and job.far_store.is_dir() else []
    main = _main_run(far)

    run_id = find_job_run(client, job.job_id)
    if run_id is None:
        if main is not None:
            store, run = main
            experiment_name = store.get_experiment(run.info.experiment_id).name
            run_name = job.name if _generated_name(run.info.run_name) else run.info.run_name
        else:
            experiment_name, run_name = job.experiment, job.name
        experiment_id = _experiment_id(client, workspace, uri, experiment_name)
        tags = {
            TAG_JOB_ID: job.job_id,
            TAG_KEY: job.key,
            TAG_MACHINE: job.machine,
            TAG_ENGINE: job.engine,
            "mlflow.runName": run_name[:250],
            "mlflow.source.name": _source_name(job.command, main[1] if main else None)[:500],
            "mlflow.source.type": "JOB",
            "mlflow.user": job.user or getpass.getuser(),
        }
        if job.host:
            tags[TAG_HOST] = job.host[:500]
        commit = _git_commit(workspace)
        if commit:
            tags["mlflow.source.git.commit"] = commit
        start_ms = int((job.started or job.ended) * 1000)
        run_id = client.create_run(experiment_id, start_time=start_ms, tags=tags).info.run_id

    run = client.get_run(run_id)
    if run.data.tags.get(TAG_REPLAYED) != "true":
        left: list[str] = []
        if job.far_store is not None and job.far_store.is_dir():
            left = _replay(
                client,
                run.info.experiment_id,
                run_id,
                far,
                job.far_store,
                job.mask_values,
                job_id=job.job_id,
                user=job.user,
            )
        if left:
            _say_not_replayed(client, run_id, job, left)
        _attach_artifacts(client, run_id, job, settings.artifact_size_cap)
        _log_usage(client, run_id, job)
        log_environment(client, run_id, job.log_path, int(job.ended * 1000))
        client.set_tag(run_id, TAG_REPLAYED, "true")
    if job.reason:
        client.set_tag(run_id, "remote_compute.reason", _hide(job.reason, job.mask_values)[:5000])
    client.set_terminated(run_id, status=STATUS_BY_STATE[job.state], end_time=int(job.ended * 1000))
    return run_id


def _log_usage(client: Any, run_id: str, job: JobRecord) -> None:
    """The job's usage figures as metrics at its end (once: with the replay)."""
    from mlflow.entities import Metric

    stamp = int(job.ended * 1000)
    metrics = [Metric(key, float(value), stamp, 0) for key, value in job.metrics.items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)


def _source_name(command: str, main: Any | None) -> str:
    """The script the command ran, as a local run names it (``train.py``), not the far side's path to it."""
    import shlex

    far = main.data.tags.get("mlflow.source.name") if main is not None else None
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    scripts = [w for w in words if w.endswith((".py", ".ipynb", ".sh", ".R"))]
    if far and not os.path.isabs(far):
        return far
    if scripts:
        return scripts[0]
    if far:
        return os.path.basename(far)
    return command


def _say_not_replayed(client: Any, run_id: str, job: JobRecord, left: list[str]) -> None:
    """On the run (a tag) and at the end of the job's log (which the run carries): never dropped silently."""
    client.set_tag(run_id, TAG_NOT_REPLAYED, json.dumps(left)[:5000])
    log.warning("job %s: not replayed into MLflow run %s: %s", job.job_id, run_id, ", ".join(left))
    line = f"[remote-compute] not replayed into the local MLflow run: {', '.join(left)}\n"
    if job.log_path and job.log_path.exists():
        data = line.encode()
        with open(job.log_path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - len(data) - 1))
            tail = f.read()
            if data not in tail:  # a replay after a crash says it once
                f.write(data if not tail or tail.endswith(b"\n") else b"\n" + data)


def _generated_name(name: str | None) -> bool:
    """Whether a run name is one MLflow made up (``adjective-noun-123``), not one the script gave."""
    if not name:
        return True
    try:
        from mlflow.utils.name_utils import _GENERATOR_NOUNS, _GENERATOR_PREDICATES
    except ImportError:  # a later MLflow moved them: take every name as the script's
        return False
    parts = name.split("-")
    return len(parts) == 3 and parts[0] in _GENERATOR_PREDICATES and parts[1] in _GENERATOR_NOUNS and parts[2].isdigit()


def _attach_artifacts(client: Any, run_id: str, job: JobRecord, cap: int) -> None:
    if job.log_path and job.log_path.exists():
        client.log_artifact(run_id, str(job.log_path), "remote_compute")
    if job.inputs_manifest and job.inputs_manifest.exists():
        client.log_artifact(run_id, str(job.inputs_manifest), "remote_compute")
    if job.outputs:
        # Every output brought back, as verified against the far side's sha256 (also those too big to copy).
        listing = {
            rel: {"sha256": job.digests.get(rel), "size": path.stat().st_size}
            for rel, path in sorted(job.outputs.items())
        }
        client.log_dict(run_id, listing, "remote_compute/outputs.json")
    total = 0
    skipped = []
    for rel, path in sorted(job.outputs.items()):
        size = path.stat().st_size
        if total + size > cap:
            skipped.append(rel)
            continue
        total += size
        parent = os.path.dirname(rel)
        client.log_artifact(run_id, str(path), "outputs/" + parent if parent else "outputs")
    if skipped:
        client.set_tag(run_id, "remote_compute.outputs_not_copied", json.dumps(skipped)[:5000])


# -- replaying the job's own file store ------------------------------------
def _far_runs(far_store: Path) -> list[Any]:
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # reading the job's file store only
    from mlflow.entities import ViewType
    from mlflow.store.tracking.file_store import FileStore

    store = FileStore(str(far_store))
    experiment_ids = [e.experiment_id for e in store.search_experiments(view_type=ViewType.ALL)]
    runs = []
    page_token = None
    while experiment_ids:
        page = store.search_runs(experiment_ids, "", ViewType.ALL, max_results=1000, page_token=page_token)
        runs.extend(page)
        page_token = page.token
        if not page_token:
            break
    runs.sort(key=lambda r: r.info.start_time or 0)
    return [(store, run) for run in runs]


def _hide(value: str, secrets: tuple[str, ...]) -> str:
    return mask(value.encode(), secrets).decode(errors="replace")


def _main_run(far: list[Any]) -> tuple[Any, Any] | None:
    """The far side's run that becomes the job's run: the first top-level one (else the first)."""
    roots = [(store, r) for store, r in far if "mlflow.parentRunId" not in r.data.tags]
    return roots[0] if roots else (far[0] if far else None)


def _replay(
    client: Any,
    experiment_id: str,
    job_run_id: str,
    far: list[Any],
    far_store: Path,
    secrets: tuple[str, ...],
    *,
    job_id: str = "",
    user: str | None = None,
) -> list[str]:
    """The main run becomes the job's run; every other run becomes its child, in the job run's experiment.

    Then what MLflow 3 keeps beside the runs: the logged models (with their artifacts, params, metrics
    and tags), each run's dataset and model inputs and its model outputs, and the registry's versions of
    those models. Returns what the far store held that could not be carried (said on the run)."""
    main_pair = _main_run(far)
    if main_pair is None:
        return _not_replayed(far_store)
    main = main_pair[1]
    mapping = {main.info.run_id: job_run_id}
    for store, run in far:
        source_id = run.info.run_id
        if source_id not in mapping:
            existing = find_tagged_run(client, [experiment_id], TAG_SOURCE_RUN, source_id)
            if existing is None:
                parent = mapping.get(run.data.tags.get("mlflow.parentRunId", ""), job_run_id)
                existing = client.create_run(
                    experiment_id,
                    start_time=run.info.start_time,
                    tags={
                        TAG_SOURCE_RUN: source_id,
                        "mlflow.parentRunId": parent,
                        "mlflow.runName": run.info.run_name or source_id,
                    },
                ).info.run_id
            mapping[source_id] = existing
        _copy_run(client, store, run, mapping[source_id], far_store, secrets)
    store = main_pair[0]
    models = _replay_models(client, experiment_id, store, far_store, mapping, job_run_id, secrets, user)
    for _store, run in far:
        _replay_lineage(client, run, mapping[run.info.run_id], models)
    for _store, run in far:
        if run.info.run_id != main.info.run_id:
            end = run.info.end_time or int(time.time() * 1000)
            client.set_terminated(mapping[run.info.run_id], status=run.info.status, end_time=end)
    _replay_registry(client, far_store, models, mapping, job_id, secrets)
    return _not_replayed(far_store)


def _copy_run(client: Any, store: Any, run: Any, target: str, far_store: Path, secrets: tuple[str, ...]) -> None:
    from mlflow.entities import Metric, Param, RunTag

    # A job may log a value it was given as a secret: it is hidden here like in the log.
    params = [Param(k, _hide(v, secrets)) for k, v in run.data.params.items()]
    tags = [
        RunTag(k, _hide(v, secrets))
        for k, v in run.data.tags.items()
        if not k.startswith(("mlflow.", "remote_compute.")) or k in ("mlflow.note.content",)
    ]
    metrics: dict[tuple[str, int, int, float], Metric] = {}
    for key in run.data.metrics:
        for m in store.get_metric_history(run.info.run_id, key):
            # With their own timestamps (system metrics are a time series); the file store repeats a
            # point once per model it was linked to, the run keeps it once.
            metrics.setdefault((m.key, m.timestamp, m.step, m.value), Metric(m.key, m.value, m.timestamp, m.step))
    for chunk_params, chunk_metrics, chunk_tags in _batches(params, list(metrics.values()), tags):
        client.log_batch(target, metrics=chunk_metrics, params=chunk_params, tags=chunk_tags)
    artifacts = far_store / run.info.experiment_id / run.info.run_id / "artifacts"
    if artifacts.is_dir() and any(artifacts.iterdir()):
        client.log_artifacts(target, str(artifacts))


#: A logged model's tags that say something about the far side's store only (the registry's own
#: bookkeeping, remade here when the version is).
_MODEL_TAGS_NOT_COPIED = ("mlflow.modelVersions",)


def _far_models(store: Any) -> list[Any]:
    from mlflow.entities import ViewType

    ids = [e.experiment_id for e in store.search_experiments(view_type=ViewType.ALL)]
    models: list[Any] = []
    token = None
    while ids:
        page = store.search_logged_models(ids, max_results=100, page_token=token)
        models.extend(page)
        token = page.token
        if not token:
            break
    models.sort(key=lambda m: m.creation_timestamp or 0)
    return models


def _replay_models(
    client: Any,
    experiment_id: str,
    store: Any,
    far_store: Path,
    mapping: Mapping[str, str],
    job_run_id: str,
    secrets: tuple[str, ...],
    user: str | None,
) -> dict[str, str]:
    """Each far logged model made again here, its source run the local run; far model id -> local id.

    Found by its source tag before one is made (a replay after a crash makes none twice); one whose
    artifacts did not all arrive (not READY here yet) gets them again and is finalized."""
    from mlflow.entities import LoggedModelStatus, Metric

    models: dict[str, str] = {}
    for far_model in _far_models(store):
        far_id = far_model.model_id
        run_id = mapping.get(far_model.source_run_id or "", job_run_id)
        # This run's copy of that model (a store may hold another job's replay of the same far store).
        found = client.search_logged_models(
            [experiment_id],
            filter_string=f"source_run_id = '{run_id}' AND tags.`{TAG_SOURCE_MODEL}` = '{far_id}'",
            max_results=1,
        )
        if found:
            local = found[0]
        else:
            tags = {k: _hide(str(v), secrets) for k, v in far_model.tags.items() if k not in _MODEL_TAGS_NOT_COPIED}
            tags["mlflow.user"] = user or getpass.getuser()
            tags[TAG_SOURCE_MODEL] = far_id
            local = client.create_logged_model(
                experiment_id,
                name=far_model.name,
                source_run_id=run_id,
                tags=tags,
                params={k: _hide(str(v), secrets) for k, v in far_model.params.items()},
                model_type=far_model.model_type,
            )
        models[far_id] = local.model_id
        if local.status != LoggedModelStatus.READY:
            _upload_model_artifacts(client, far_store, far_model, local.model_id, run_id)
            metrics = [
                Metric(
                    m.key,
                    m.value,
                    m.timestamp,
                    m.step,
                    model_id=local.model_id,
                    dataset_name=m.dataset_name,
                    dataset_digest=m.dataset_digest,
                    run_id=mapping.get(m.run_id or "", run_id),
                )
                for m in far_model.metrics or []
            ]
            by_run: dict[str, list[Any]] = {}
            for m in metrics:
                by_run.setdefault(m.run_id, []).append(m)
            for target, chunk in by_run.items():
                for i in range(0, len(chunk), BATCH):
                    client.log_batch(target, metrics=chunk[i : i + BATCH])
            status = far_model.status
            if status != LoggedModelStatus.PENDING:
                client.finalize_logged_model(local.model_id, status)
    return models


def _upload_model_artifacts(client: Any, far_store: Path, far_model: Any, model_id: str, run_id: str) -> None:
    """The model's files, its ``MLmodel`` naming the local run and model (what loading it here reads)."""
    import tempfile

    source = far_store / far_model.experiment_id / "models" / far_model.model_id / "artifacts"
    if not source.is_dir():
        return
    with tempfile.TemporaryDirectory(prefix="jrc-model-") as tmp:
        copy = Path(tmp) / "artifacts"
        shutil.copytree(source, copy, symlinks=False)
        mlmodel = copy / "MLmodel"
        if mlmodel.is_file():
            text = mlmodel.read_text()
            text = text.replace(far_model.model_id, model_id)
            if far_model.source_run_id:
                text = text.replace(far_model.source_run_id, run_id)
            mlmodel.write_text(text)
        client.log_model_artifacts(model_id, str(copy))


def _replay_lineage(client: Any, run: Any, target: str, models: Mapping[str, str]) -> None:
    """A run's dataset inputs, model inputs and model outputs, as MLflow would have logged them here.

    Datasets MLflow itself keeps once per (name, digest); model inputs and outputs are added only
    where the local run does not have them yet (a replay after a crash)."""
    from mlflow.entities import LoggedModelInput, LoggedModelOutput

    here = client.get_run(target)
    have_inputs = {m.model_id for m in (here.inputs.model_inputs or [])}
    have_outputs = {m.model_id for m in (here.outputs.model_outputs or [])} if here.outputs else set()
    datasets = list(run.inputs.dataset_inputs or []) if run.inputs else []
    model_inputs = [
        LoggedModelInput(models[m.model_id])
        for m in (run.inputs.model_inputs or [] if run.inputs else [])
        if m.model_id in models and models[m.model_id] not in have_inputs
    ]
    if datasets or model_inputs:
        client.log_inputs(target, datasets=datasets or None, models=model_inputs or None)
    outputs = [
        LoggedModelOutput(models[m.model_id], m.step)
        for m in (run.outputs.model_outputs or [] if run.outputs else [])
        if m.model_id in models and models[m.model_id] not in have_outputs
    ]
    if outputs:
        client.log_outputs(target, outputs)


def _far_registry(far_store: Path) -> Any:
    from mlflow.store.model_registry.file_store import FileStore as RegistryFileStore

    return RegistryFileStore(str(far_store))


def _replay_registry(
    client: Any, far_store: Path, models: Mapping[str, str], mapping: Mapping[str, str], job_id: str, secrets: tuple
) -> None:
    """A version registered there (of a model this job logged) is registered here once: same name, a new
    version whose source is the replayed model, with its tags and aliases. The version carries the far
    version as a tag, set in the same call that creates it, so a replay after a crash finds it."""
    if not (far_store / "models").is_dir():
        return
    from mlflow.exceptions import MlflowException

    registry = _far_registry(far_store)
    for far_rm in _far_registered_models(registry):
        if _is_prompt(far_rm):
            continue
        versions = [v for v in _far_versions(registry, far_rm.name) if _version_model(v, models)]
        if not versions:
            continue
        try:
            client.create_registered_model(
                far_rm.name,
                tags={k: _hide(str(v), secrets) for k, v in (far_rm.tags or {}).items()},
                description=far_rm.description or None,
            )
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        here = {
            v.tags.get(TAG_SOURCE_VERSION): v.version
            for v in client.search_model_versions(f"name = '{_quote(far_rm.name)}'")
            if v.tags.get(TAG_SOURCE_VERSION)
        }
        numbers: dict[str, str] = {}
        for far_v in sorted(versions, key=lambda v: int(v.version)):
            source_key = f"{job_id}/{far_v.version}"
            if source_key not in here:
                model_id = _version_model(far_v, models)
                tags = {k: _hide(str(v), secrets) for k, v in (far_v.tags or {}).items()}
                tags[TAG_SOURCE_VERSION] = source_key
                here[source_key] = client.create_model_version(
                    far_rm.name,
                    source=f"models:/{model_id}",
                    run_id=mapping.get(far_v.run_id or ""),
                    tags=tags,
                    description=far_v.description or None,
                    model_id=model_id,
                ).version
            numbers[str(far_v.version)] = str(here[source_key])
        for alias in far_rm.aliases or {}:
            far_version = str(far_rm.aliases[alias])
            if far_version in numbers:
                client.set_registered_model_alias(far_rm.name, alias, numbers[far_version])


def _quote(value: str) -> str:
    return value.replace("'", "\\'")


def _far_registered_models(registry: Any) -> list[Any]:
    found: list[Any] = []
    token = None
    while True:
        page = registry.search_registered_models(max_results=1000, page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            return found


def _far_versions(registry: Any, name: str) -> list[Any]:
    found: list[Any] = []
    token = None
    while True:
        page = registry.search_model_versions(f"name = '{_quote(name)}'", max_results=1000, page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            return found


def _version_model(version: Any, models: Mapping[str, str]) -> str | None:
    """The local model a far version points at (its model id, else a ``models:/<id>`` source)."""
    far_id = getattr(version, "model_id", None)
    if not far_id and (version.source or "").startswith("models:/"):
        far_id = version.source.removeprefix("models:/").split("/", 1)[0]
    return models.get(far_id or "")


def _is_prompt(registered: Any) -> bool:
    return (registered.tags or {}).get("mlflow.prompt.is_prompt") == "true"


def _not_replayed(far_store: Path) -> list[str]:
    """What the far store holds that this replay does not carry: traces, prompts, registered versions of
    models the job did not log. Counted, so the run can say so instead of dropping them silently."""
    left: list[str] = []
    traces = sum(1 for _ in far_store.glob("*/traces/*/"))
    if traces:
        left.append(f"{traces} trace{'s' if traces != 1 else ''}")
    if (far_store / "models").is_dir():
        registry = _far_registry(far_store)
        prompts = 0
        foreign = 0
        logged = {p.name for p in far_store.glob("*/models/*/")}
        for rm in _far_registered_models(registry):
            if _is_prompt(rm):
                prompts += 1
                continue
            for v in _far_versions(registry, rm.name):
                far_id = getattr(v, "model_id", None) or (v.source or "").removeprefix("models:/").split("/", 1)[0]
                if far_id not in logged:
                    foreign += 1
        if prompts:
            left.append(f"{prompts} prompt{'s' if prompts != 1 else ''}")
        if foreign:
            left.append(
                f"{foreign} registered model version{'s' if foreign != 1 else ''} of models not logged by the job"
            )
    return left


def _batches(params: list, metrics: list, tags: list) -> Iterable[tuple[list, list, list]]:
    # MLflow caps a batch at 1000 entries in all and 100 params.
    for i in range(0, len(params), 100):
        yield params[i : i + 100], [], []
    for i in range(0, len(metrics), BATCH):
        yield [], metrics[i : i + BATCH], []
    for i in range(0, len(tags), 100):
        yield [], [], tags[i : i + 100]


# -- recording in a child process (settings.isolated) -------------------------------------------
RECORD_TIMEOUT = 1800.0  # artifacts up to artifact_size_cap are copied: generous, but never for ever


def _record_in_child(workspace: Path, settings: TrackingSettings, job: JobRecord) -> str:
    """``record_job`` in ``python -m jupyter_remote_compute.tracking``; the request (secrets to hide
    included) travels on its standard input, never in argv or a file."""
    request = {
        "workspace": str(workspace),
        "settings": {**dataclasses.asdict(settings), "isolated": False},
        "job": job.to_json(),
    }
    child = subprocess.run(
        [sys.executable, "-m", "jupyter_remote_compute.tracking"],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=RECORD_TIMEOUT,
        check=False,
        cwd=workspace,  # as the detached recorder: a local store it creates keeps artifacts in the workspace
    )
    if child.returncode != 0:
        lines = child.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
        raise RuntimeError(lines[-1])  # the caller masks secrets before showing it
    return child.stdout.decode().strip()


def _exit_with_parent() -> None:
    """End this recorder as soon as the process that started it is gone (it was SIGKILLed, say).

    Recording in-process died with the server; a child must too, or an orphan could go on writing
    while the next server records the same job. Exactly once still holds either way: the next
    collector finds the run by its job tag, under the store's lock.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _main() -> int:
    _exit_with_parent()
    request = json.loads(sys.stdin.buffer.read())
    job = JobRecord.from_json(request["job"])
    settings = TrackingSettings(**request["settings"])
    print(record_job(Path(request["workspace"]), settings, job))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
