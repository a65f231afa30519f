"""Replaying a job's own MLflow file store into its local run, as MLflow would have logged it here.

The far side's runs (the main one becomes the job's run, the others its children, each tagged with its
far run's id), then what MLflow 3 keeps beside them: each logged model (artifacts with an ``MLmodel``
naming the local store, params, model-linked metrics with every step, tags, status), each run's
dataset and model inputs and its model outputs, and the registry's versions of those models.
Each step finds its earlier result before it makes one, so a replay cut short and run again makes
nothing twice. What the far store holds that is not carried (traces, prompts, versions of models the
job did not log) is counted for the run to say (``tracking._say_not_replayed``).

Called by ``tracking.record_job`` in the workspace's recorder process, where MLflow is loaded.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..people import local_person
from ..secrets import mask

TAG_SOURCE_RUN = "remote_compute.source_run_id"
TAG_SOURCE_MODEL = "remote_compute.source_model_id"
TAG_SOURCE_VERSION = "remote_compute.source_model_version"
BATCH = 1000


def find_tagged_run(client: Any, experiment_ids: list[str], tag: str, value: str) -> str | None:
    from mlflow.entities import ViewType

    runs = client.search_runs(
        experiment_ids, filter_string=f"tags.`{tag}` = '{value}'", run_view_type=ViewType.ALL, max_results=1
    )
    return runs[0].info.run_id if runs else None


def far_runs(far_store: Path) -> list[Any]:
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


def hide(value: str, secrets: tuple[str, ...]) -> str:
    return mask(value.encode(), secrets).decode(errors="replace")


def main_run(far: list[Any]) -> tuple[Any, Any] | None:
    """The far side's run that becomes the job's run: the first top-level one (else the first)."""
    roots = [(store, r) for store, r in far if "mlflow.parentRunId" not in r.data.tags]
    return roots[0] if roots else (far[0] if far else None)


def replay(
    client: Any,
    experiment_id: str,
    job_run_id: str,
    far: list[Any],
    far_store: Path,
    secrets: tuple[str, ...],
    *,
    job_id: str = "",
    user: str | None = None,
    attempt: int = 1,
) -> list[str]:
    """The main run becomes the job's run; every other run becomes its child, in the job run's experiment.

    ``attempt``: which attempt of the job the far store is. A later attempt's main run continues the job's
    run: a param it has already keeps its value, and a metric's step it has already (logged by an
    attempt whose work was lost after its last checkpoint, and done again) keeps its first point.

    Then what MLflow 3 keeps beside the runs: the logged models (with their artifacts, params, metrics
    and tags), each run's dataset and model inputs and its model outputs, and the registry's versions of
    those models. Returns what the far store held that could not be carried (said on the run)."""
    main_pair = main_run(far)
    if main_pair is None:
        return _not_replayed(far_store)
    main = main_pair[1]
    mapping = {main.info.run_id: job_run_id}
    # A child says where it came from as the job's run does, as a child run here says what its parent says.
    job_tags = client.get_run(job_run_id).data.tags
    inherited = {k: job_tags[k] for k in _TAGS_CHILDREN_INHERIT if k in job_tags}
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
                        **inherited,
                        TAG_SOURCE_RUN: source_id,
                        "mlflow.parentRunId": parent,
                        "mlflow.runName": run.info.run_name or source_id,
                    },
                ).info.run_id
            mapping[source_id] = existing
        earlier = client.get_run(job_run_id) if attempt > 1 and source_id == main.info.run_id else None
        _copy_run(client, store, run, mapping[source_id], far_store, secrets, earlier)
    store = main_pair[0]
    run_params = {run.info.run_id: run.data.params for _store, run in far}
    models = _replay_models(client, experiment_id, store, far_store, mapping, run_params, job_run_id, secrets, user)
    for _store, run in far:
        _replay_lineage(client, run, mapping[run.info.run_id], models)
    for _store, run in far:
        if run.info.run_id != main.info.run_id:
            end = run.info.end_time or int(time.time() * 1000)
            client.set_terminated(mapping[run.info.run_id], status=run.info.status, end_time=end)
    # A later attempt's far registry numbers its versions from 1 again.
    _replay_registry(client, far_store, models, mapping, job_id if attempt == 1 else f"{job_id}/{attempt}", secrets)
    return _not_replayed(far_store)


#: MLflow's tags (``mlflow.utils.mlflow_tags``) that say what the script did, not where: carried as
#: they are. The others name the far side (its user, paths, git) or its run ids, and are made here.
_TAGS_CARRIED = ("mlflow.note.content", "mlflow.autologging")
#: What the job's run says of where it came from (``tracking._record_job``), and a child run here says too.
_TAGS_CHILDREN_INHERIT = (
    "mlflow.user",
    "mlflow.source.name",
    "mlflow.source.type",
    "mlflow.source.git.commit",
)


#: Metrics MLflow logs on a clock, not per training step: every attempt's points are kept.
_TIMED_METRICS = "system/"


def _copy_run(
    client: Any,
    store: Any,
    run: Any,
    target: str,
    far_store: Path,
    secrets: tuple[str, ...],
    earlier: Any | None = None,
) -> None:
    """``run`` into ``target``; ``earlier``: ``target`` as earlier attempts left it, whose params and
    metric steps are kept (MLflow refuses a param logged again with another value)."""
    from mlflow.entities import Metric, Param, RunTag

    # A job may log a value it was given as a secret: it is hidden here like in the log.
    kept = earlier.data.params if earlier is not None else {}
    params = [Param(k, hide(v, secrets)) for k, v in run.data.params.items() if k not in kept]
    tags = [
        RunTag(k, hide(v, secrets))
        for k, v in run.data.tags.items()
        if not k.startswith(("mlflow.", "remote_compute.")) or k in _TAGS_CARRIED
    ]
    # The far run's id, on the main run too: the id the job's log printed finds the job's run here.
    tags.append(RunTag(TAG_SOURCE_RUN, run.info.run_id))
    metrics: dict[tuple[str, int, int, float], Metric] = {}
    for key in run.data.metrics:
        done: set[int] = set()
        if earlier is not None and key in earlier.data.metrics and not key.startswith(_TIMED_METRICS):
            done = {m.step for m in client.get_metric_history(target, key)}
        for m in store.get_metric_history(run.info.run_id, key):
            if m.step in done:
                continue
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
    run_params: Mapping[str, Mapping[str, str]],
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
            tags = {k: hide(str(v), secrets) for k, v in far_model.tags.items() if k not in _MODEL_TAGS_NOT_COPIED}
            tags["mlflow.user"] = user or local_person()
            tags[TAG_SOURCE_MODEL] = far_id
            local = client.create_logged_model(
                experiment_id,
                name=far_model.name,
                source_run_id=run_id,
                tags=tags,
                params={k: hide(v, secrets) for k, v in _model_params(far_model, run_params).items()},
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
                for m in _far_model_metrics(far_store, far_model)
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


def _model_params(far_model: Any, run_params: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """A far model's params, where one the far store shows empty has its source run's value.

    MLflow gives a model its run's params as they are when the model is logged, read back from the
    store; autolog logs those params from a thread of its own while the estimator trains. A file store
    writes a param by making its file, then filling it, so that read can find one empty (a database
    store commits the batch whole): the run's param, read when the job has ended, is the value."""
    source = run_params.get(far_model.source_run_id or "", {})
    return {k: str(v) if v != "" else source.get(k, "") for k, v in far_model.params.items()}


def _far_model_metrics(far_store: Path, far_model: Any) -> list[Any]:
    """Every point a far model's metrics have: the file store keeps each one (``<key>`` holds lines of
    ``timestamp value step run_id [dataset_name dataset_digest]``) but reads back only each key's last."""
    from mlflow.entities import Metric

    folder = far_store / far_model.experiment_id / "models" / far_model.model_id / "metrics"
    if not folder.is_dir():
        return []
    points = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = path.relative_to(folder).as_posix()
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) < 4:
                continue
            dataset = (" ".join(parts[4:-1]), parts[-1]) if len(parts) >= 6 else (None, None)
            points.append(
                Metric(
                    key,
                    float(parts[1]),
                    int(parts[0]),
                    int(parts[2]),
                    model_id=far_model.model_id,
                    dataset_name=dataset[0],
                    dataset_digest=dataset[1],
                    run_id=parts[3],
                )
            )
    return points


def _upload_model_artifacts(client: Any, far_store: Path, far_model: Any, model_id: str, run_id: str) -> None:
    """The model's files, its ``MLmodel`` naming the local model, its place and its run, as a model
    logged here does (what loading it here reads)."""
    import tempfile

    source = far_store / far_model.experiment_id / "models" / far_model.model_id / "artifacts"
    if not source.is_dir():
        return
    with tempfile.TemporaryDirectory(prefix="jrc-model-") as tmp:
        copy = Path(tmp) / "artifacts"
        shutil.copytree(source, copy, symlinks=False)
        mlmodel = copy / "MLmodel"
        if mlmodel.is_file():
            mlmodel.write_text(
                _local_mlmodel(mlmodel.read_text(), far_model, client.get_logged_model(model_id), run_id)
            )
        client.log_model_artifacts(model_id, str(copy))


def _local_mlmodel(text: str, far_model: Any, local: Any, run_id: str) -> str:
    """An ``MLmodel`` as MLflow would have written it for ``local``: its ``artifact_path`` is the model's
    location (MLflow writes ``artifact_location`` there), its ids and run the local ones."""
    import yaml

    described = yaml.safe_load(text)
    if not isinstance(described, dict):
        return text
    far_ids = {far_model.model_id: local.model_id}
    if far_model.source_run_id:
        far_ids[far_model.source_run_id] = run_id
    for field in ("model_id", "model_uuid", "run_id"):
        if described.get(field) in far_ids:
            described[field] = far_ids[described[field]]
    if "artifact_path" in described:
        described["artifact_path"] = local.artifact_location
    # As MLflow writes it (``Model.save``: safe_dump, block style, keys sorted).
    return yaml.safe_dump(described, default_flow_style=False)


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
                tags={k: hide(str(v), secrets) for k, v in (far_rm.tags or {}).items()},
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
                tags = {k: hide(str(v), secrets) for k, v in (far_v.tags or {}).items()}
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
