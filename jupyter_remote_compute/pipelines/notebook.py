"""Notebooks as jobs: the spec of a job that executes a notebook on its machine with nbclient.

The engines stay as they are: the job sends the notebook (and the files it names) and its command
runs the product's far-side runner (``farside/run_notebook.py``, package data) with the far side's
python. The runner travels inside the command (``python -c``), since the far side has no copy of
this package and the input set holds workspace files only. The executed notebook is an output.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from importlib.resources import files
from typing import Any

from ..environments.environment import Environment
from ..errors import InvalidSettings
from ..jobs.spec import JobSpec, check_relative_path, parse_duration

NOTEBOOK_STEP = "run-notebook-on-remote-machine"

#: The notebook step's settings; ``wait`` is the step's own, the rest make the job's spec.
SETTINGS = (
    "machine",
    "notebook",
    "parameters",
    "executed",
    "python",
    "kernel",
    "send",
    "bring_back",
    "env",
    "timeout",
    "wait",
    "name",
    "resources",
    "environment",
)


def runner_source() -> str:
    return files(__package__).joinpath("farside/run_notebook.py").read_text(encoding="utf-8")


def typed_parameter(value: str) -> Any:
    """A ``-p name=value`` value typed as papermill types it: an int, a float, a bool, None, else the string."""
    if value in ("True", "true"):
        return True
    if value in ("False", "false"):
        return False
    if value == "None":
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def parse_parameters(pairs: Sequence[str]) -> dict[str, Any]:
    """``name=value`` pairs (the CLI's ``-p``) as typed parameters; the name must be a Python identifier."""
    parameters: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise InvalidSettings(f"parameters: {pair!r}: write NAME=VALUE with NAME a Python name", field="parameters")
        parameters[name] = typed_parameter(value)
    return parameters


def executed_path(settings: Mapping[str, Any]) -> str:
    """Where the executed notebook comes back: ``executed``, else ``<name>.executed.ipynb`` beside it."""
    executed = settings.get("executed")
    if isinstance(executed, str) and executed:
        return executed
    notebook = str(settings.get("notebook", ""))
    stem = notebook[: -len(".ipynb")] if notebook.endswith(".ipynb") else notebook
    return stem + ".executed.ipynb"


#: What the runner needs beside the notebook's own imports: added to a notebook job's environment, so
#: a notebook runs on a machine that has neither (nbformat comes with nbclient).
RUNNER_PACKAGES = ("nbclient", "ipykernel")


def with_runner_packages(environment: Any) -> Any:
    """``environment`` with the runner's packages added to its ``packages``, but for one it names
    already (the job's own requirement wins). No environment, an image alone (its Python is what the
    image has: a notebook image's own nbclient is not installed again), or one of a wrong shape, is
    left as it is: the spec refuses the latter naming the field."""
    try:
        asked = Environment.from_json(environment)
    except InvalidSettings:
        return environment
    if asked is None or not asked.builds:
        return environment
    packages = environment.get("packages") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
        return environment
    named = {re.split(r"[\s\[<>=!~;@]", p.strip(), maxsplit=1)[0].lower().replace("_", "-") for p in packages}
    return {**environment, "packages": [*packages, *(p for p in RUNNER_PACKAGES if p not in named)]}


def notebook_spec(settings: Mapping[str, Any]) -> tuple[JobSpec, float | None]:
    """The job that runs ``settings['notebook']`` with its parameters, and how long a step waits for it."""
    from ..steps.executor import check_setting_names

    check_setting_names(settings, SETTINGS)
    notebook = settings.get("notebook")
    if not isinstance(notebook, str) or not notebook.endswith(".ipynb"):
        raise InvalidSettings("notebook: give the workspace path of a .ipynb file, e.g. train.ipynb", field="notebook")
    notebook = check_relative_path(notebook, "notebook")
    executed = check_relative_path(executed_path(settings), "executed")
    if executed == notebook:
        raise InvalidSettings("executed: must differ from the notebook, which is never overwritten", field="executed")
    parameters = settings.get("parameters") or {}
    if not isinstance(parameters, Mapping) or not all(isinstance(k, str) and k.isidentifier() for k in parameters):
        raise InvalidSettings("parameters: expected an object of Python names to values", field="parameters")
    try:
        parameters_json = json.dumps(dict(parameters), sort_keys=True)
    except TypeError:
        raise InvalidSettings(
            "parameters: values must be numbers, strings, booleans or null", field="parameters"
        ) from None
    python = settings.get("python") or "python3"
    kernel = settings.get("kernel") or ""
    if not isinstance(python, str) or not isinstance(kernel, str):
        raise InvalidSettings("python, kernel: expected strings", field="python")
    send = [notebook, *[s for s in settings.get("send") or [] if s != notebook]]
    bring_back = [executed, *[b for b in settings.get("bring_back") or [] if b != executed]]
    spec = JobSpec.from_json(
        {
            "machine": settings.get("machine", "local"),
            "command": [python, "-c", runner_source(), notebook, executed, parameters_json, kernel],
            "send": send,
            "bring_back": bring_back,
            "env": settings.get("env") or {},
            "timeout": settings.get("timeout"),
            "name": settings.get("name") or f"notebook {posixpath.basename(notebook)}",
            "resources": settings.get("resources") or {},
            "environment": with_runner_packages(settings.get("environment")),
        }
    )
    return spec, parse_duration(settings.get("wait"), "wait")
