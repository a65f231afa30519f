"""The layers of docs/architecture.md hold: each imports only the layers below it.

The contract is import-linter's in pyproject.toml, with no import ignored: none climbs.
"""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_each_layer_imports_only_the_layers_below_it() -> None:
    status = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert status == EXIT_STATUS_SUCCESS, (
        "an import climbs a layer (import-linter's report above): move it down, or its type to schema/"
    )
