"""Elyra's pipeline editor runs its generic pipelines here: a runtime "Remote Compute" (optional extra ``[elyra]``).

Only Elyra's public entry points are used:

- ``elyra.pipeline.processors``: ``processor.RemoteComputeProcessor`` turns an Elyra pipeline (notebook and
  script nodes, their dependencies, outputs and env vars) into this product's pipeline document, written
  beside the Elyra file as ``<name>.elyra.rcpipeline``, and starts a run of it on the product's runner;
- ``metadata.schemas_providers``: ``schemas.RemoteComputeSchemas`` adds the runtime schema, and
  ``runtimes.sync_runtimes`` keeps one runtime configuration per machine of compute.yaml.

Elyra's runtime types are a closed enum, so the runtime poses as ``LOCAL``; Elyra's validation requires a
``runtime_image`` on every node of a non-local runtime (it is ignored here: a node runs as a job on the
configuration's machine). Nothing outside this package imports it unless Elyra is installed.
"""

from __future__ import annotations

import importlib.util

#: The processor's entry point name, the runtime schema's name and its configurations' ``schema_name``.
RUNTIME_NAME = "remote_compute"
RUNTIME_TITLE = "Remote Compute"


def elyra_installed() -> bool:
    """Whether Elyra's server part is importable (without importing it: it is heavy)."""
    return importlib.util.find_spec("elyra") is not None


#: The running server's pipeline runner and base URL, set by the extension when Elyra is installed:
#: Elyra makes its processor itself, so the processor finds the runner here.
SERVER: dict[str, object] = {}


def bind_server(runner: object, base_url: str) -> None:
    SERVER.update(runner=runner, base_url=base_url)
