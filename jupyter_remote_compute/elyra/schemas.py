"""The runtime schema of "Remote Compute" in Elyra's ``runtimes`` schemaspace: a configuration names a machine."""

from __future__ import annotations

from typing import Any

from elyra.metadata.schema import SchemasProvider
from elyra.metadata.schemaspaces import Runtimes

from . import RUNTIME_NAME, RUNTIME_TITLE


def runtime_schema() -> dict[str, Any]:
    return {
        "$schema": "https://raw.githubusercontent.com/elyra-ai/elyra/main/elyra/metadata/schemas/meta-schema.json",
        "title": RUNTIME_TITLE,
        "name": RUNTIME_NAME,
        "schemaspace": Runtimes.RUNTIMES_SCHEMASPACE_NAME,
        "schemaspace_id": Runtimes.RUNTIMES_SCHEMASPACE_ID,
        # Elyra's enum of runtime types is closed: LOCAL is the one that asks for no object storage.
        "runtime_type": "LOCAL",
        "uihints": {"title": "Remote Compute machines", "icon": "elyra:runtimes"},
        "properties": {
            "schema_name": {"title": "Schema Name", "type": "string", "const": RUNTIME_NAME},
            "display_name": {"title": "Display Name", "type": "string", "minLength": 1},
            "metadata": {
                "type": "object",
                "properties": {
                    "runtime_type": {"type": "string", "const": "LOCAL", "uihints": {"hidden": True}},
                    "machine": {
                        "title": "Machine",
                        "description": "The machine's name in compute.yaml; each node runs as a job on it.",
                        "type": "string",
                        "minLength": 1,
                    },
                    "description": {"title": "Description", "type": "string"},
                    "tags": {"title": "Tags", "type": "array", "items": {"type": "string"}, "uniqueItems": True},
                },
                "required": ["runtime_type", "machine"],
            },
        },
        "required": ["schema_name", "display_name", "metadata"],
    }


class RemoteComputeSchemas(SchemasProvider):
    """Entry point ``metadata.schemas_providers``: the "Remote Compute" runtime schema."""

    def get_schemas(self) -> list[dict[str, Any]]:
        return [runtime_schema()]
