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


def test_the_schemas_are_those_the_models_generate() -> None:
    """The boundary types' schemas are written from jupyter_remote_compute/schema/: a model changed
    without ``python -m jupyter_remote_compute.schema.openapi --write`` fails here (and the front end's
    types, generated from this file, would drift with it)."""
    from jupyter_remote_compute.schema import openapi

    text = SPEC.read_text(encoding="utf-8")
    assert openapi.MARKER in text
    assert openapi.render(text) == text, "run: python -m jupyter_remote_compute.schema.openapi --write"


def test_the_job_request_schema_reads_what_the_server_reads() -> None:
    """Every setting the schema names is one ``POST /jobs`` takes, and what it writes back is what it reads."""
    from jupyter_remote_compute.schema.spec import JobRequest, JobSpec

    properties = _spec()["components"]["schemas"]["JobRequest"]["properties"]
    asked = {name: None for name in properties if name != "command"}
    request = JobRequest.from_json({"command": "true", **asked})
    assert request.spec == JobSpec.from_json({"command": "true"})
    spec = JobSpec.from_json(
        {
            "command": ["python", "t.py"],
            "resources": {"memory": 1536},
            "environment": {"image": "python:3", "runtime": "podman"},
        }
    )
    assert JobSpec.from_json(spec.to_json()) == spec


async def test_the_forms_are_served_the_schemas_the_server_reads(jp_fetch) -> None:
    """The New Job and machine forms draw the very schema a request is validated against."""
    import json

    from pydantic import TypeAdapter
    from tornado.httpclient import HTTPClientError

    from jupyter_remote_compute.schema.machine import MachineInput
    from jupyter_remote_compute.schema.spec import JobRequest

    for name, type_ in (("JobRequest", JobRequest), ("MachineInput", MachineInput)):
        body = json.loads((await jp_fetch("remote-compute", "schemas", name)).body)
        assert body == {"schema": TypeAdapter(type_).json_schema(mode="validation")}, name
    try:
        await jp_fetch("remote-compute", "schemas", "Job")
        raise AssertionError("a type no form draws was served")
    except HTTPClientError as e:
        assert e.code == 404
        assert "JobRequest, MachineInput" in json.loads(e.response.body)["message"]


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


def test_the_api_names_the_new_job_form_as_the_panel_does() -> None:
    """One name on every face: the panel's button and form say "New Job", and so does the API's text."""
    assert "New Job form" in SPEC.read_text(encoding="utf-8")
    assert not re.search(r"New job\b", SPEC.read_text(encoding="utf-8"))
