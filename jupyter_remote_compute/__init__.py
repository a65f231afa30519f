"""jupyter-remote-compute: run a training job on a named machine and record an MLflow run.

Importing this package is cheap on purpose: the server extension, the IPython magic and the
engines are imported only when Jupyter (or IPython) asks for them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"

__all__ = [
    "__version__",
    "_jupyter_labextension_paths",
    "_jupyter_server_extension_points",
    "load_ipython_extension",
]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the prebuilt front end (used by `jupyter labextension develop`)."""
    return [{"src": "labextension", "dest": "jupyter-remote-compute"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The jupyter_server extension: one ExtensionApp, imported only when the server loads it."""
    from .extension import RemoteComputeApp

    return [{"module": "jupyter_remote_compute", "app": RemoteComputeApp}]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext jupyter_remote_compute` registers the `%remote_train` magic."""
    from .magics import load_ipython_extension as _load

    _load(ipython)
