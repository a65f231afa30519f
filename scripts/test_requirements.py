"""Print the requirements of the installed jupyter-remote-compute's ``test`` extra, one per line.

With an argument, that extra's instead (``skypilot``: installed by scripts/test.sh in its own step).

scripts/test.sh installs them without reinstalling the package itself (an editable reinstall would
build it again); the installed metadata is what scripts/setup.sh put there from pyproject.toml.
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

extra = sys.argv[1] if len(sys.argv) > 1 else "test"
for line in requires("jupyter-remote-compute") or []:
    requirement = Requirement(line)
    marker = requirement.marker
    # In the extra (and meant for this platform), but not a requirement of the package itself.
    if marker is not None and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""}):
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        print(f"{requirement.name}{extras}{requirement.specifier}")
