"""One version for the Python package, the labextension and the REST API description."""

from __future__ import annotations

import json
import re
from importlib.metadata import distribution
from pathlib import Path

import yaml

import jupyter_remote_compute
from jupyter_remote_compute.engines import BUILT_IN_KINDS, ENTRY_POINT_GROUP, engine_class

ROOT = Path(__file__).resolve().parent.parent
RELEASE = "0.2.0"


def test_the_package_the_labextension_and_the_api_agree_on_the_release() -> None:
    versions = {
        "pyproject.toml": re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1],
        "__version__": jupyter_remote_compute.__version__,
        "package.json": json.loads((ROOT / "package.json").read_text())["version"],
        "openapi.yaml": str(
            yaml.safe_load((ROOT / "jupyter_remote_compute/openapi.yaml").read_text())["info"]["version"]
        ),
    }
    assert versions == dict.fromkeys(versions, RELEASE)


def test_the_built_in_kinds_are_the_ones_pyproject_declares() -> None:
    """engines.BUILT_IN_KINDS spares a no-op job the scan of every installed package's metadata; a
    kind added to pyproject.toml and not there (or the other way round) would load differently."""
    points = distribution("jupyter-remote-compute").entry_points
    assert {ep.name: ep.value for ep in points if ep.group == ENTRY_POINT_GROUP} == BUILT_IN_KINDS
    assert {kind: engine_class(kind).kind for kind in BUILT_IN_KINDS} == {kind: kind for kind in BUILT_IN_KINDS}
