"""A job's Python environment on its MLflow run, read from the head of the job's log.

``engines/farside/env.sh`` opens the log with two lines, which travel back with the log on every
kind (nothing else of the far side's environment folder comes back):

    environment 1a2b3c4d5e6f: built in 4 s (uv 0.13.9, Python 3.11.2)
    environment <full digest>: installed a==1.0 b==2.0
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

TAG = "remote_compute.environment"
METRIC = "remote_compute.environment_build_seconds"
ARTIFACT = "environment.txt"  # under remote_compute/
#: A job of several processes prefixes each line with its node and rank (farside/rank.sh): rank 0's are read.
_RANK0 = r"(?:\[[^\]]* rank 0\] )?"
_STATUS = re.compile(rf"^{_RANK0}environment [0-9a-f]{{12}}: (?:cached|built in (\d+) s) \((.*), Python ([^)]*)\)$")
_INSTALLED = re.compile(rf"^{_RANK0}environment ([0-9a-f]{{32}}): installed ?(.*)$")
#: env.sh prints its lines before the command starts: they are among the first of the log.
_HEAD_BYTES = 1 << 20


def parse_log_head(head: str) -> dict[str, Any] | None:
    """The environment's digest, build seconds (0 when cached), tool, Python and installed list."""
    found: dict[str, Any] = {}
    for line in head.splitlines()[:200]:
        if not found.get("tool") and (m := _STATUS.match(line)):
            found.update(seconds=int(m.group(1) or 0), tool=m.group(2), python=m.group(3))
        elif m := _INSTALLED.match(line):
            found.update(digest=m.group(1), installed=m.group(2).split())
            break
    return found if "digest" in found else None


def log_environment(client: Any, run_id: str, log_path: Path | None, stamp_ms: int) -> None:
    """Tag the run with the environment's digest, log its build time and what it held (if it had one)."""
    if log_path is None or not log_path.is_file():
        return
    with open(log_path, "rb") as f:
        found = parse_log_head(f.read(_HEAD_BYTES).decode("utf-8", "replace"))
    if found is None:
        return
    from mlflow.entities import Metric

    client.set_tag(run_id, TAG, found["digest"])
    client.log_batch(run_id, metrics=[Metric(METRIC, float(found.get("seconds", 0)), stamp_ms, 0)])
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp, ARTIFACT)
        header = f"# {found.get('tool', '')}, Python {found.get('python', '')}\n"
        listing.write_text(header + "".join(line + "\n" for line in found["installed"]))
        client.log_artifact(run_id, str(listing), "remote_compute")
