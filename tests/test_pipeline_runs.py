"""A pipeline run's record (``.punica/pipelines/<run id>.json``) read and written through its model
(``schema/pipeline.py``): records earlier versions wrote still load, and the API shows what openapi.yaml says.

The store is the real one, on a folder of the test's own.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft4Validator

import jupyter_remote_compute
from jupyter_remote_compute.errors import RemoteComputeError
from jupyter_remote_compute.pipelines.runs import NodeRun, PipelineRun, RunStore
from jupyter_remote_compute.schema.pipeline import run_started, sweep_started

SPEC = yaml.safe_load((Path(jupyter_remote_compute.__file__).parent / "openapi.yaml").read_text(encoding="utf-8"))
DOCUMENT = {"version": 1, "nodes": [], "edges": []}
NODE = {"state": "succeeded", "job_id": "j1", "reason": None, "outputs": {}, "started": "t0", "ended": "t1"}
#: A run as the version before ``user`` wrote it (every field it had, each written).
BEFORE_USER: dict[str, Any] = {
    "id": "20260101-000000-abcdef",
    "file": "train.rcpipeline",
    "pipeline": DOCUMENT,
    "state": "succeeded",
    "reason": None,
    "created": "2026-01-01T00:00:00.000Z",
    "updated": "2026-01-01T00:01:00.000Z",
    "cancel_requested": None,
    "mlflow_run_id": None,
    "mlflow_experiment_id": None,
    "driver": {"host": "h", "pid": 1, "start": 2.0},
    "nodes": {"prepare": NODE, "train": {**NODE, "state": "not_run", "job_id": None}},
    "sweep": None,
}
#: A sweep's run from before sweeps followed a metric (no metric, goal, early_stop; no experiment id).
OLD_SWEEP: dict[str, Any] = {
    **{k: v for k, v in BEFORE_USER.items() if k != "mlflow_experiment_id"},
    "id": "20260101-000001-abcdef",
    "file": "",
    "nodes": {"t1": NODE},
    "sweep": {"name": "lr", "max_parallel": 2, "parameters": {"t1": {"lr": "0.1"}}},
}


def json_schema(node: Any) -> Any:
    """OpenAPI 3.0's schema as JSON Schema reads it, as the fuzz test's schemathesis does: ``nullable``
    admits null whatever else the node says (an ``allOf`` of a reference included)."""
    if isinstance(node, list):
        return [json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: json_schema(v) for k, v in node.items() if k != "example"}
    return {"anyOf": [node, {"type": "null"}]} if node.pop("nullable", False) else node


def schema_of(name: str) -> Draft4Validator:
    """The validator of one of openapi.yaml's schemas, its references resolved within the file."""
    components = json_schema(SPEC["components"])
    return Draft4Validator({**components["schemas"][name], "components": components})


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    for record in (BEFORE_USER, OLD_SWEEP):
        (folder / f"{record['id']}.json").write_text(json.dumps(record), encoding="utf-8")
    return RunStore(folder)


def test_a_record_from_before_user_loads_and_is_written_back_with_user_null(store: RunStore) -> None:
    run = store.get(BEFORE_USER["id"])
    assert run.user is None and run.driver == BEFORE_USER["driver"]
    assert run.nodes["train"] == NodeRun(state="not_run", job_id=None, started="t0", ended="t1")
    assert run.to_json() == {**BEFORE_USER, "user": None}
    store.put(run)
    written = json.loads(store.path(run.id).read_text(encoding="utf-8"))
    assert written == {**BEFORE_USER, "user": None, "updated": written["updated"]}


def test_a_sweep_from_before_metrics_loads_as_it_was_written(store: RunStore) -> None:
    run = store.get(OLD_SWEEP["id"])
    assert run.label == "sweep lr" and run.mlflow_experiment_id is None
    assert run.to_json()["sweep"] == OLD_SWEEP["sweep"]  # nothing it never had is added
    assert [r.id for r in store.runs()] == [OLD_SWEEP["id"], BEFORE_USER["id"]]


def test_the_api_shows_runs_without_their_driver_as_openapi_yaml_describes_them(store: RunStore) -> None:
    run = store.get(OLD_SWEEP["id"])
    run.sweep = {**OLD_SWEEP["sweep"], "metric": "loss", "goal": "min", "early_stop": None, "latest": {"t1": [3, 0.5]}}
    shown = run.public_json()
    assert "driver" not in shown and shown["sweep"]["latest"] == {"t1": [3, 0.5]}
    schema_of("PipelineRun").validate(shown)
    assert not schema_of("PipelineRun").is_valid(run.to_json())  # the record's driver is not the API's
    schema_of("PipelineRun").validate(store.get(BEFORE_USER["id"]).public_json())
    started = run_started(run, attached=True)
    assert started == {"run": shown, "attached": True}
    schema_of("PipelineRunStarted").validate(started)
    schema_of("SweepStarted").validate(sweep_started(run, attached=False, warnings=["lr is never used"]))


def test_a_record_the_model_refuses_names_its_file_and_field_and_the_list_skips_it(
    store: RunStore, caplog: pytest.LogCaptureFixture
) -> None:
    bad = {**BEFORE_USER, "id": "20260101-000002-abcdef", "nodes": {"prepare": {**NODE, "state": "done"}}}
    store.path(bad["id"]).write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(RemoteComputeError, match=r"20260101-000002-abcdef\.json: .*nodes\.prepare\.state"):
        store.get(bad["id"])
    with caplog.at_level(logging.WARNING):
        assert bad["id"] not in [r.id for r in store.runs()]
    assert "nodes.prepare.state" in caplog.text


def test_a_new_run_is_written_whole() -> None:
    run = PipelineRun(id="r", file="a.rcpipeline", pipeline=DOCUMENT, nodes={"a": NodeRun()}, user="ann")
    assert PipelineRun.from_json(run.to_json()) == run
    assert run.to_json()["nodes"]["a"] == {
        "state": "waiting",
        "job_id": None,
        "reason": None,
        "outputs": {},
        "started": None,
        "ended": None,
    }
