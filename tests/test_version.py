"""One version for the Python package, the labextension and the REST API description."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

import jupyter_remote_compute

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
