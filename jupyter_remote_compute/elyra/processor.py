"""The "Remote Compute" runtime processor (entry point ``elyra.pipeline.processors``).

``process`` writes the product's pipeline document beside the Elyra file and starts a run of it on the
server's runner, then returns: Elyra's ``/schedule`` request waits for ``process``, and the run goes on
in the runner's threads. The response's run URL is the pipeline run's REST address.
"""

from __future__ import annotations

import posixpath
import time
from pathlib import Path
from typing import Any

from elyra.metadata.manager import MetadataManager
from elyra.metadata.schemaspaces import Runtimes
from elyra.pipeline.processor import RuntimePipelineProcessor, RuntimePipelineProcessorResponse
from elyra.pipeline.runtime_type import RuntimeProcessorType

from ..errors import InvalidSettings
from ..fsutil import atomic_write
from ..pipelines.document import SUFFIX, Pipeline, dump_pipeline
from . import RUNTIME_NAME, SERVER
from .convert import to_document


class RemoteComputeResponse(RuntimePipelineProcessorResponse):
    _type = RuntimeProcessorType.LOCAL
    _name = RUNTIME_NAME


def document_path(pipeline: Any) -> str:
    """Where the product's document of an Elyra pipeline is written (Elyra-root relative): beside its
    ``.pipeline`` file when Elyra says which, named ``<stem>.elyra.rcpipeline`` so no user file is replaced."""
    source = pipeline.source or ""
    stem = Path(source).stem if source else (pipeline.name or "untitled")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in stem).strip(".") or "untitled"
    return posixpath.join(posixpath.dirname(source), f"{safe}.elyra{SUFFIX}")


class RemoteComputeProcessor(RuntimePipelineProcessor):
    """Runs each node of an Elyra pipeline as a job on the machine its runtime configuration names."""

    _type = RuntimeProcessorType.LOCAL
    _name = RUNTIME_NAME

    def _runner(self) -> Any:
        runner = SERVER.get("runner")
        if runner is None:
            raise RuntimeError(
                "Remote Compute is not running in this server: enable the jupyter_remote_compute server extension"
            )
        return runner

    def machine_of(self, runtime_config: str | None) -> str:
        if not runtime_config:
            raise InvalidSettings("runtime_config: choose a Remote Compute runtime configuration (a machine)")
        config = MetadataManager(schemaspace=Runtimes.RUNTIMES_SCHEMASPACE_NAME).get(runtime_config)
        machine = config.metadata.get("machine")
        if not machine:
            raise InvalidSettings(f"runtime configuration {runtime_config}: metadata.machine is empty", field="machine")
        return str(machine)

    def process(self, pipeline: Any) -> RemoteComputeResponse:
        t0 = time.time()
        runner = self._runner()
        root, workspace = Path(self.root_dir), Path(runner.workspace.root)
        document = to_document(pipeline, self.machine_of(pipeline.runtime_config), root, workspace)
        target = (root / document_path(pipeline)).resolve()
        try:
            rel = target.relative_to(workspace.resolve()).as_posix()
        except ValueError:
            raise InvalidSettings(f"{target} is not inside the workspace {workspace}", field="source") from None
        checked = Pipeline.from_json(document, rel)  # a shape error is named before anything is written
        atomic_write(target, dump_pipeline(checked).encode("utf-8"), mode=0o644)  # the user's, beside theirs
        run, _attached = runner.start(rel)
        self.log_pipeline_info(pipeline.name, f"started as pipeline run {run.id}", duration=time.time() - t0)
        base = str(SERVER.get("base_url") or "/")
        return RemoteComputeResponse(
            run_url=f"{base.rstrip('/')}/remote-compute/pipelines/runs/{run.id}",
            object_storage_url=None,
            object_storage_path=None,
        )

    def export(self, pipeline: Any, pipeline_export_format: str, pipeline_export_path: str, overwrite: bool) -> str:
        raise NotImplementedError(
            "Remote Compute does not export Elyra pipelines; run them, or draw them in a .rcpipeline document"
        )
