"""The layers of docs/architecture.md hold: each imports only the layers below it.

The contract is import-linter's in pyproject.toml, with no import ignored: none climbs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_each_layer_imports_only_the_layers_below_it() -> None:
    # In a process of its own: import-linter configures logging with dictConfig, which disables every
    # logger that exists already, and the rest of this worker's tests would capture no warning of ours.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command as c; c()",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--no-cache",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"an import climbs a layer: move it down, or its type to schema/\n{done.stdout}{done.stderr}"
    )
