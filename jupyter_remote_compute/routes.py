"""Every route the server extension registers, gathered in one place and in the order tornado tries them.

Each area keeps its handlers and its route table in its own module; none adds to another's table, so
importing a module registers nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .handlers import FALLBACK_HANDLER, HANDLERS
from .machine_handlers import MACHINE_HANDLERS
from .mlflow_ui_handlers import MLFLOW_HANDLERS, MLFLOW_UI_PROXY
from .org_handlers import ORG_HANDLERS
from .pipelines.handlers import PIPELINE_HANDLERS

Route = tuple[str, Any]

#: The documented API (``openapi.yaml``): machines and pools; jobs, secrets and usage; MLflow's; the pipelines';
#: the organization's, passed on to its service.
API_ROUTES: list[Route] = [*MACHINE_HANDLERS, *HANDLERS, *MLFLOW_HANDLERS, *PIPELINE_HANDLERS, *ORG_HANDLERS]


def server_routes(kind_routes: Sequence[Route]) -> list[Route]:
    """The extension's whole table: the API, what the kinds add, MLflow's UI page, then the prefix's fallback."""
    return [*API_ROUTES, *kind_routes, MLFLOW_UI_PROXY, FALLBACK_HANDLER]
