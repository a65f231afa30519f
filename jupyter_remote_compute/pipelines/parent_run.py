"""One MLflow parent run per pipeline run, with its nodes' job runs as children.

Recorded in a detached child process (``python -m jupyter_remote_compute.pipelines.parent_run``),
as job runs are: MLflow never loads into the process that drives the pipeline, and a run (a reused
one takes a fraction of a second) ends without waiting seconds for MLflow to load. The
parent goes to the experiment of the first node's run and is found again by its tag before one is
made, so recording twice (a resumed run) makes one parent. A job run that already has a parent (a
node reused from an earlier pipeline run) keeps it; the parent names it in a tag instead.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TAG_PIPELINE_RUN = "remote_compute.pipeline_run_id"
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def record_parent(uri: str, run: Mapping[str, Any], children: Mapping[str, str], runs_folder: Path) -> bool:
    """Start recording the parent run in a detached child process; False when no node has a run.

    ``children``: node id -> its job's MLflow run. The child writes the parent's id into the run's
    record (``runs_folder``) once made, so a pipeline run ends without waiting for MLflow to load.
    """
    if not children:
        return False
    request = {"uri": uri, "run": dict(run), "children": dict(children), "runs": str(runs_folder)}
    child = subprocess.Popen(
        [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True, cwd=str(runs_folder.parent.parent),
    )  # fmt: skip
    assert child.stdin is not None
    child.stdin.write(json.dumps(request).encode())
    child.stdin.close()
    # Reaped by a thread of its own: a long-lived server keeps no zombie, and nothing waits for it.
    threading.Thread(target=child.wait, name=f"mlflow-parent-{run['id']}", daemon=True).start()
    return True


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
    from .runner import RunStore

    request = json.loads(sys.stdin.read())
    parent = _record(request["uri"], request["run"], request["children"])

    def keep(run: Any) -> None:
        run.mlflow_run_id = parent

    RunStore(Path(request["runs"])).change(request["run"]["id"], keep)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
