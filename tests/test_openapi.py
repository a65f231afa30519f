"""The OpenAPI description shipped in the package matches the handlers that serve the API."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from openapi_spec_validator import validate

import jupyter_remote_compute
from jupyter_remote_compute.routes import API_ROUTES

SPEC = Path(jupyter_remote_compute.__file__).parent / "openapi.yaml"
VERBS = {"get", "post", "put", "patch", "delete"}


def _spec() -> dict:
    return yaml.safe_load(SPEC.read_text())


def test_the_description_is_valid_openapi() -> None:
    validate(_spec())


def test_every_route_and_verb_is_described_and_nothing_else() -> None:
    served = {}
    for pattern, handler in API_ROUTES:
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)
        served[path] = {verb for verb in VERBS if verb in vars(handler)}
    described = {path: {verb for verb in ops if verb in VERBS} for path, ops in _spec()["paths"].items()}
    assert described == served


def test_the_job_spec_schema_lists_every_setting_the_server_accepts() -> None:
    import dataclasses

    from jupyter_remote_compute.jobs.spec import JobSpec

    schema = _spec()["components"]["schemas"]["JobSpec"]["properties"]
    assert set(schema) == {f.name for f in dataclasses.fields(JobSpec)} | {"new"}


def test_the_job_schema_lists_every_field_the_api_shows() -> None:
    import dataclasses

    from jupyter_remote_compute.jobs.job import Job

    shown = {f.name for f in dataclasses.fields(Job)} - {"lease"} | {"name", "progress"}
    assert set(_spec()["components"]["schemas"]["Job"]["properties"]) == shown


def test_every_operation_documents_its_errors_and_the_token_is_required() -> None:
    spec = _spec()
    assert spec["security"] == [{"token": []}]
    assert spec["components"]["securitySchemes"]["token"] == {
        **spec["components"]["securitySchemes"]["token"],
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
    }
    for path, ops in spec["paths"].items():
        for verb, op in ops.items():
            if verb not in VERBS:
                continue
            statuses = set(op["responses"])
            assert {"400", "403", "default"} <= statuses, (path, verb)
            assert ("{" in path) == ("404" in statuses), (path, verb)
