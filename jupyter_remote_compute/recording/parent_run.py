"""One MLflow parent run per pipeline run (or sweep), with its nodes' (trials') job runs as children.

Recorded by the workspace's recorder (``recording/recorder.py``, its ``pipeline_parent_run`` call), as job runs are:
MLflow never loads into the process that drives the pipeline, and a run (a reused one takes a
fraction of a second) ends without waiting for MLflow. The
parent goes to the experiment of the first node's run and is found again by its tag before one is
made, so recording twice (a resumed run) makes one parent. A job run that already has a parent (a
node reused from an earlier pipeline run) keeps it; the parent names it in a tag instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..fsutil import atomic_write
from ..workspace import Workspace
from .recorder import Call, ask

log = logging.getLogger(__name__)

TAG_PIPELINE_RUN = "remote_compute.pipeline_run_id"
TAG_SWEEP = "remote_compute.sweep"
#: A sweep's trial run carries each of its parameters as ``remote_compute.sweep.param.<name>``.
TAG_SWEEP_PARAM = "remote_compute.sweep.param."
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def record_parent(
    program: Sequence[str],
    workspace: Workspace,
    uri: str,
    run: Mapping[str, Any],
    children: Mapping[str, str],
    parent_id_file: Path,
) -> bool:
    """Have the workspace's recorder (``program``) record the parent run; False when no node has a run.

    ``children``: node id -> its job's MLflow run. The recorder writes the parent's id and its
    experiment's to ``parent_id_file`` once made (the pipeline's run store names it and reads it), so a pipeline run
    ends without waiting for MLflow, and recording needs to know nothing of how runs are stored.
    """
    if not children:
        return False
    args = {"uri": uri, "run": dict(run), "children": dict(children), "parent_id_file": str(parent_id_file)}
    ask(program, workspace, {"op": "call", "call": Call.PIPELINE_PARENT_RUN.value, "args": args, "wait": False})
    return True


def _record(uri: str, run: Mapping[str, Any], children: Mapping[str, str]) -> tuple[str, str]:
    from mlflow.entities import RunTag, ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    first = client.get_run(next(iter(children.values())))
    experiment = first.info.experiment_id
    found = client.search_runs(
        [experiment], filter_string=f"tags.`{TAG_PIPELINE_RUN}` = '{run['id']}'", run_view_type=ViewType.ALL
    )
    sweep = run.get("sweep")
    who = {"mlflow.user": run["user"]} if run.get("user") else {}  # MLflow's Created by: who started it
    if found:
        parent = found[0].info.run_id
    elif sweep:
        tags = {TAG_PIPELINE_RUN: run["id"], TAG_SWEEP: sweep["name"], **who}
        parent = client.create_run(experiment, run_name=f"sweep {sweep['name']}", tags=tags).info.run_id
    else:
        tags = {TAG_PIPELINE_RUN: run["id"], "remote_compute.pipeline_file": run["file"], **who}
        parent = client.create_run(experiment, run_name=f"pipeline {run['file']}", tags=tags).info.run_id
    node_tags = []
    for node_id, child in children.items():
        existing = client.get_run(child).data.tags.get("mlflow.parentRunId")
        if existing is None:
            client.set_tag(child, "mlflow.parentRunId", parent)
        if sweep:
            # A trial's parameters as it was given them, beside whatever its script logged.
            params = sweep["parameters"].get(node_id, {})
            client.log_batch(child, tags=[RunTag(f"{TAG_SWEEP_PARAM}{k}", v) for k, v in params.items()])
        node = run["nodes"][node_id]
        node_tags.append(RunTag(f"remote_compute.node.{node_id}", f"{node['state']} run {child}"))
    client.log_batch(parent, tags=node_tags)
    client.set_terminated(parent, status=STATUS.get(run["state"], "FINISHED"))
    return parent, experiment


def record_request(args: Mapping[str, Any]) -> str:
    """The recorder's side: record the parent, then leave its id and its experiment's where the caller asked."""
    parent, experiment = _record(args["uri"], args["run"], args["children"])
    atomic_write(Path(args["parent_id_file"]), f"{parent} {experiment}".encode())
    return parent
