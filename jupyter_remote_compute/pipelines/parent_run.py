"""One MLflow parent run per pipeline run, with its nodes' job runs as children.

Recorded in a short-lived child process (``python -m jupyter_remote_compute.pipelines.parent_run``),
as the server records job runs: MLflow never loads into the process that drives the pipeline. The
parent goes to the experiment of the first node's run and is found again by its tag before one is
made, so recording twice (a resumed run) makes one parent. A job run that already has a parent (a
node reused from an earlier pipeline run) keeps it; the parent names it in a tag instead.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TAG_PIPELINE_RUN = "remote_compute.pipeline_run_id"
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
RECORD_TIMEOUT = 300.0


def record_parent(uri: str, run: Mapping[str, Any], children: Mapping[str, str]) -> str | None:
    """The parent run's id (None when no node has a run); ``children``: node id -> its job's MLflow run."""
    if not children:
        return None
    request = {"uri": uri, "run": dict(run), "children": dict(children)}
    done = subprocess.run(
        [sys.executable, "-m", __name__], input=json.dumps(request), capture_output=True, text=True,
        timeout=RECORD_TIMEOUT, cwd=str(Path(run.get("workspace", ".")).resolve()),
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    return done.stdout.strip() or None


def _record(uri: str, run: Mapping[str, Any], children: Mapping[str, str]) -> str:
    from mlflow.entities import RunTag, ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    first = client.get_run(next(iter(children.values())))
    experiment = first.info.experiment_id
    found = client.search_runs(
        [experiment], filter_string=f"tags.`{TAG_PIPELINE_RUN}` = '{run['id']}'", run_view_type=ViewType.ALL
    )
    if found:
        parent = found[0].info.run_id
    else:
        tags = {TAG_PIPELINE_RUN: run["id"], "remote_compute.pipeline_file": run["file"]}
        parent = client.create_run(experiment, run_name=f"pipeline {run['file']}", tags=tags).info.run_id
    node_tags = []
    for node_id, child in children.items():
        existing = client.get_run(child).data.tags.get("mlflow.parentRunId")
        if existing is None:
            client.set_tag(child, "mlflow.parentRunId", parent)
        node = run["nodes"][node_id]
        node_tags.append(RunTag(f"remote_compute.node.{node_id}", f"{node['state']} run {child}"))
    client.log_batch(parent, tags=node_tags)
    client.set_terminated(parent, status=STATUS.get(run["state"], "FINISHED"))
    return parent


def _main() -> int:
    request = json.loads(sys.stdin.read())
    print(_record(request["uri"], request["run"], request["children"]))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
