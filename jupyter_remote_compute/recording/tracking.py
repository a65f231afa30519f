"""One MLflow run per finished job, in the workspace's own tracking store.

The job wrote its own records (params, metrics with steps, tags, artifacts)
into a file store inside its job directory; collection brought that store back
and ``record_job`` replays it into the local run (``replay``), so a run
trained elsewhere reads like one trained here and the far side never reaches
this store. Here: the run itself (found or made, its tags, the job's artifacts
and usage figures, its end); ``record_job`` runs in the workspace's recorder
process (``recording/recorder.py``), where MLflow is loaded.

Exactly once: the run is looked up by its job-id tag (in every experiment) before
one is created, under a file lock beside a sqlite store, so a crash between
creating and recording never yields a second run, and two recorders that race
find the same one.

The run lands where a local run of the same script would: in the experiment the
script set on the far side (by name), else ``MLFLOW_EXPERIMENT_NAME`` as it was set
where the job was submitted (the far side got the same value), else MLflow's
default experiment. It keeps the script's run name, else it takes the job's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..environments.image import log_image
from ..fsutil import SharedFileLock
from ..people import local_person
from .environment import log_environment
from .local_store import DEFAULT_EXPERIMENT_ID, prepare_local_store
from .replay import far_runs, find_tagged_run, hide, main_run, replay

log = logging.getLogger(__name__)
TAG_JOB_ID = "remote_compute.job_id"
TAG_MACHINE = "remote_compute.machine"
TAG_ENGINE = "remote_compute.engine"
TAG_HOST = "remote_compute.host"
#: A pool's job: the pool it named and why it was placed where it ran (jobs/placement.py).
TAG_POOL = "remote_compute.pool"
TAG_PLACEMENT = "remote_compute.placement"
TAG_KEY = "remote_compute.key"
TAG_REPLAYED = "remote_compute.replayed"
TAG_NOT_REPLAYED = "remote_compute.not_replayed"
#: A job of several attempts: how many its run holds so far, and up to which one their far stores are
#: replayed (``remote_compute.attempt.<n>.machine`` and ``.end`` say where each ran and how it ended).
TAG_ATTEMPTS = "remote_compute.attempts"
TAG_REPLAYED_ATTEMPTS = "remote_compute.replayed_attempts"
STORE_LOCK_TIMEOUT = 300.0  # seconds to wait for another process recording into the same sqlite store

DEFAULT_EXPERIMENT_NAME = "Default"
#: Usage figures every job's run carries as metrics (``usage/ledger.py`` computes them).
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
    #: The size of every output as it landed (workspace-relative path -> bytes): the workspace's copy is
    #: the person's from then on, and may be changed or removed before the run is recorded.
    sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: Where it ran: the machine's address as it was at submit (``remote_compute.host``).
    host: str | None = None
    #: What the machine is (its check's ``os``, ``kernel``, ``python``, ``cpus``, ``gpu_names``): tags.
    machine_facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: The pool the job named and why it was placed on its machine (``remote_compute.pool``, ``.placement``).
    pool: str | None = None
    placement: str | None = None
    #: Which attempt of the job this record is (its far store, its log); 1 for a job of one.
    attempt: int = 1
    #: Whether the job ends with this attempt: only then is its run ended (and its usage logged).
    ends: bool = True
    #: The job's attempts up to this one, each ``{"machine": …, "end": …}``: the run's attempt tags
    #: (none for a job that had one attempt and no retry policy).
    attempts: tuple[Mapping[str, str], ...] = ()
    #: The tracking server the job's run goes to instead of the face's store (the organization's, for a
    #: job on one of its machines); None: the face's.
    tracking_uri: str | None = None

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
        for name in _ADDED_FIELDS:
            if data[name] is None:  # a job that names no pool writes the to-do an earlier version read
                del data[name]
        return data

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> JobRecord:
        return cls(
            **{
                # A field a later version added is left out: its to-do is recorded without it.
                **{key: value for key, value in raw.items() if key in _RECORD_FIELDS},
                "log_path": Path(raw["log_path"]) if raw["log_path"] else None,
                "outputs": {name: Path(path) for name, path in raw["outputs"].items()},
                "inputs_manifest": Path(raw["inputs_manifest"]) if raw["inputs_manifest"] else None,
                "far_store": Path(raw["far_store"]) if raw["far_store"] else None,
                "mask_values": tuple(raw.get("mask_values", ())),
                "attempts": tuple(raw.get("attempts", ())),
            }
        )


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(JobRecord))
#: Fields added after the to-do's first shape, left out while unset.
_ADDED_FIELDS = ("pool", "placement", "tracking_uri")

WITHHELD_FAR_RECORDS = "far-side MLflow records withheld: a secret this job used could not be read to mask them"


def without_far_records(record: JobRecord) -> JobRecord:
    """The record minus the far side's MLflow store, for when a secret the job saw cannot be read to mask
    it: nothing the script logged there may carry the value into this store (fail closed, like the log)."""
    reason = f"{record.reason} ({WITHHELD_FAR_RECORDS})" if record.reason else WITHHELD_FAR_RECORDS
    return dataclasses.replace(record, far_store=None, reason=reason)


def tracking_uri(workspace: Path, settings: TrackingSettings) -> str:
    return settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{workspace / 'mlflow.db'}"


def is_folder_store(uri: str) -> bool:
    """Whether ``uri`` is MLflow's folder store (``file:``, or a path, which MLflow opens as one; not the
    names MLflow gives Databricks' stores)."""
    if uri in ("databricks", "databricks-uc", "uc"):
        return False
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1  # one letter: a Windows drive


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


#: MLflow 3's UI shows an experiment of unknown kind as a GenAI app's ("Evaluation runs"); a job trains.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"


def _mark_training(client: Any, experiment_id: str) -> None:
    """Say the experiment holds training runs, so MLflow's UI opens its runs as training runs; a kind
    someone chose is kept."""
    if EXPERIMENT_KIND_TAG not in client.get_experiment(experiment_id).tags:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)


def find_job_run(client: Any, job_id: str) -> str | None:
    """The run of a job in any experiment of the store (the rule may have put it anywhere)."""
    from mlflow.entities import ViewType

    ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    for start in range(0, len(ids), 100):  # search_runs takes a bounded list of experiments
        found = find_tagged_run(client, ids[start : start + 100], TAG_JOB_ID, job_id)
        if found:
            return found
    return None


def _store_lock(uri: str) -> contextlib.AbstractContextManager[object]:
    """For a sqlite store, a lock beside it: MLflow creates and migrates a new database without one,
    and two processes doing it at once (two servers, a CLI) leave it half made for everyone after."""
    if not uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    return SharedFileLock(uri.removeprefix("sqlite:///") + ".lock", timeout=STORE_LOCK_TIMEOUT)


def record_job(workspace: Path, settings: TrackingSettings, job: JobRecord) -> str:
    """Create (or find) the job's run, replay what the job logged, attach artifacts, close it.

    Called in the workspace's recorder process (``recording/recorder.py``), where MLflow is loaded. A job
    that names its own tracking server (the organization's) is recorded there, not in the face's store."""
    uri = job.tracking_uri or tracking_uri(workspace, settings)
    with _store_lock(uri), _default_uri(uri):
        return _record_job(workspace, uri, settings, job)


def load_mlflow() -> None:
    """Import what recording needs: what makes recording a small job slow is this, not the replay."""
    from mlflow.store.tracking.file_store import FileStore  # noqa: F401 - the far store's reader
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: F401
    from mlflow.tracking import MlflowClient  # noqa: F401


def warm_up(workspace: Path, settings: TrackingSettings) -> None:
    """Import what recording needs and open the store's client once (the recorder does this while a
    face waits for its job to end)."""
    from mlflow.tracking import MlflowClient

    load_mlflow()
    uri = tracking_uri(workspace, settings)
    if not uri.startswith("sqlite:///"):
        return
    with _store_lock(uri):  # never while another process makes or migrates it
        if Path(uri.removeprefix("sqlite:///")).exists():
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def close_stores() -> None:
    """Close MLflow's pooled connections to every database store (a store used again reconnects).

    A recorder serves all of a user's workspaces and lives on between their jobs, and MLflow never closes
    a store's connections by itself: a connection kept to a workspace's ``mlflow.db`` that was deleted and
    made again at the same path reads and writes the deleted file ("readonly database", "no such table").
    """
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    for store in (TrackingStore, RegistryStore):  # each caches one engine per database, apart
        engines = getattr(store, "_engine_map", None)
        for engine in list(engines.values()) if isinstance(engines, dict) else ():
            engine.dispose()


def _default_uri(uri: str) -> contextlib.AbstractContextManager[object]:
    """MLflow's registry looks a ``models:/`` source up through a client of the *default* store: this one."""
    try:
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    except ImportError:  # a later MLflow moved it: the default store is then whatever MLflow picks
        return contextlib.nullcontext()
    return _use_tracking_uri(uri)


def _record_job(workspace: Path, uri: str, settings: TrackingSettings, job: JobRecord) -> str:
    from mlflow.tracking import MlflowClient

    prepare_local_store(workspace, uri)
    client = MlflowClient(tracking_uri=uri)
    far = far_runs(job.far_store) if job.far_store is not None and job.far_store.is_dir() else []
    main = main_run(far)

    run_id = find_job_run(client, job.job_id)
    if run_id is None:
        if main is not None:
            store, run = main
            experiment_name = store.get_experiment(run.info.experiment_id).name
            run_name = job.name if _generated_name(run.info.run_name) else run.info.run_name
        else:
            experiment_name, run_name = job.experiment, job.name
        experiment_id = _experiment_id(client, workspace, uri, experiment_name)
        _mark_training(client, experiment_id)
        tags = {
            TAG_JOB_ID: job.job_id,
            TAG_KEY: job.key,
            TAG_MACHINE: job.machine,
            TAG_ENGINE: job.engine,
            "mlflow.runName": run_name[:250],
            "mlflow.source.name": _source_name(job.command, main[1] if main else None)[:500],
            "mlflow.source.type": "JOB",
            "mlflow.user": job.user or local_person(),
        }
        if job.host:
            tags[TAG_HOST] = job.host[:500]
        if job.pool:
            tags[TAG_POOL] = job.pool
        if job.placement:
            tags[TAG_PLACEMENT] = job.placement[:500]
        tags.update(machine_tags(job.machine_facts))
        commit = _git_commit(workspace)
        if commit:
            tags["mlflow.source.git.commit"] = commit
        start_ms = int((job.started or job.ended) * 1000)
        run_id = client.create_run(experiment_id, start_time=start_ms, tags=tags).info.run_id

    run = client.get_run(run_id)
    if not _replayed(run.data.tags, job):
        left: list[str] = []
        if job.far_store is not None and job.far_store.is_dir():
            left = replay(
                client,
                run.info.experiment_id,
                run_id,
                far,
                job.far_store,
                job.mask_values,
                job_id=job.job_id,
                user=job.user,
                attempt=job.attempt,
            )
        if left:
            _say_not_replayed(client, run_id, job, left)
        _attach_artifacts(client, run_id, job, settings.artifact_size_cap)
        if job.ends:
            _log_usage(client, run_id, job)
        log_environment(client, run_id, job.log_path, int(job.ended * 1000))
        log_image(client, run_id, job.log_path)
        _tag_attempts(client, run_id, job)
        if job.ends:
            client.set_tag(run_id, TAG_REPLAYED, "true")
        else:
            client.set_tag(run_id, TAG_REPLAYED_ATTEMPTS, str(job.attempt))
    if not job.ends:
        return run_id  # the run goes on with the job's next attempt
    if job.reason:
        client.set_tag(run_id, "remote_compute.reason", hide(job.reason, job.mask_values)[:5000])
    client.set_terminated(run_id, status=STATUS_BY_STATE[job.state], end_time=int(job.ended * 1000))
    return run_id


def _replayed(tags: Mapping[str, str], job: JobRecord) -> bool:
    """Whether the run holds this record's attempt already (a record done again after a crash, or an
    attempt's to-do carried into the next one's and recorded by both)."""
    if tags.get(TAG_REPLAYED) == "true":
        return True
    try:
        return int(tags.get(TAG_REPLAYED_ATTEMPTS) or 0) >= job.attempt
    except ValueError:
        return False


def _tag_attempts(client: Any, run_id: str, job: JobRecord) -> None:
    """How many attempts the run holds, each one's machine and how it ended; the machine tag is where
    the job ran last."""
    if not job.attempts:
        return
    from mlflow.entities import RunTag

    tags = [RunTag(TAG_ATTEMPTS, str(len(job.attempts)))]
    tags += [RunTag(TAG_MACHINE, job.machine), RunTag(TAG_ENGINE, job.engine)]
    for number, attempt in enumerate(job.attempts, 1):
        tags.append(RunTag(f"remote_compute.attempt.{number}.machine", str(attempt.get("machine", ""))[:500]))
        tags.append(RunTag(f"remote_compute.attempt.{number}.end", str(attempt.get("end", ""))[:500]))
    for i in range(0, len(tags), 100):
        client.log_batch(run_id, tags=tags[i : i + 100])


def machine_tags(facts: Mapping[str, Any]) -> dict[str, str]:
    """The machine's facts as the run's ``remote_compute.*`` tags (none for facts nobody read)."""
    tags = {}
    for fact in ("os", "kernel", "python", "cpus"):
        if facts.get(fact) not in (None, ""):
            tags[f"remote_compute.{fact}"] = str(facts[fact])[:500]
    names = facts.get("gpu_names")
    if isinstance(names, list):
        tags["remote_compute.gpus"] = str(len(names))
        if names:
            tags["remote_compute.gpu_names"] = ", ".join(map(str, names))[:500]
    return tags


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
    now = {rel: _size_now(path) for rel, path in sorted(job.outputs.items())}
    # Each output as it landed: its size then (a record from before sizes were kept: now, if it is there).
    landed = {rel: job.sizes.get(rel, size) for rel, size in now.items()}
    if job.outputs:
        # Every output brought back, as verified against the far side's sha256 (also those too big to copy).
        listing = {rel: {"sha256": job.digests.get(rel), "size": size} for rel, size in landed.items()}
        client.log_dict(run_id, listing, "remote_compute/outputs.json")
    total = 0
    skipped = []
    changed = []
    for rel, path in sorted(job.outputs.items()):
        size = now[rel]
        if size is None or size != landed[rel]:
            # Removed or rewritten in the workspace since it landed: not the file the job wrote.
            changed.append(rel)
            continue
        if total + size > cap:
            skipped.append(rel)
            continue
        total += size
        parent = os.path.dirname(rel)
        client.log_artifact(run_id, str(path), "outputs/" + parent if parent else "outputs")
    if skipped:
        client.set_tag(run_id, "remote_compute.outputs_not_copied", json.dumps(skipped)[:5000])
    if changed:
        client.set_tag(run_id, "remote_compute.outputs_changed", json.dumps(changed)[:5000])


def _size_now(path: Path) -> int | None:
    """The file's size in the workspace now; None once it is gone."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None
