"""The organization service's OpenAPI description (``org/openapi.yaml``) matches the routes it serves.

The service needs JupyterHub, which the hub bed's venv holds (``hub_fixture.py``): its route table is
read there.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import hub_fixture
import yaml
from hub_fixture import REPO, HubBed
from openapi_spec_validator import validate

import jupyter_remote_compute

hub_bed = hub_fixture.hub_bed
#: The service's routes and the verbs each handler serves, as its own Python imports them.
_ROUTES = """
import json
from jupyter_remote_compute.org.service import API_ROUTES
verbs = ("get", "post", "put", "patch", "delete")
print(json.dumps([[p, [v for v in verbs if v in vars(h)]] for p, h in API_ROUTES]))
"""

SPEC = Path(jupyter_remote_compute.__file__).parent / "org" / "openapi.yaml"
VERBS = {"get", "post", "put", "patch", "delete"}
#: A value of each path parameter, to find the route a described path is served by.
EXAMPLES = {"name": "gpu-box", "job_id": "j-1", "action": "send", "who": "user", "sha256": "a" * 64}


def _spec() -> dict:
    return yaml.safe_load(SPEC.read_text())


def test_the_services_description_is_valid_openapi() -> None:
    validate(_spec())


def test_every_route_and_verb_of_the_service_is_described_and_nothing_else(hub_bed: HubBed) -> None:
    read = subprocess.run(
        [str(hub_bed.build.python), "-c", _ROUTES], env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert read.returncode == 0, read.stderr
    routes = {pattern: set(verbs) for pattern, verbs in json.loads(read.stdout)}
    described: dict[str, set[str]] = {}
    for path, operations in _spec()["paths"].items():
        url = re.sub(r"\{(\w+)\}", lambda m: EXAMPLES[m.group(1)], path).lstrip("/")
        served = [pattern for pattern in routes if re.fullmatch(pattern, url)]
        assert served, f"{path} is described but not served"
        pattern = served[0]  # tornado's first match, as it routes
        assert pattern not in described, f"{path}: a second description of {pattern}"
        described[pattern] = {verb for verb in operations if verb in VERBS}
        assert described[pattern] == routes[pattern], path
    assert set(described) == set(routes)
