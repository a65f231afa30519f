"""What each machine's last check found, kept in the workspace's ``.punica/machine-facts.json``.

A check's facts outlive it: metering counts the GPUs of a job that asked for none (it held the
machine), a job's MLflow run names the machine's OS, Python and GPUs, and a job's environment is made
for the machine's architecture and uv.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..fsutil import SharedFileLock, atomic_write

FACTS_FILE = "machine-facts.json"
LOCK_TIMEOUT = 30.0


def remember_facts(punica_dir: Path, machine: str, facts: Mapping[str, Any]) -> None:
    """Keep what a check found: the GPU count, for metering jobs that did not ask for GPUs, the OS,
    Python and GPUs that a job's MLflow run names (``known_facts``), and the architecture and uv a
    job's environment is made for."""
    path = punica_dir / FACTS_FILE
    gpus = facts.get("gpus") or []
    with SharedFileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT):
        known = _read(path)
        known[machine] = {
            "gpus": len(gpus),
            "checked": time.time(),
            # cpus and memory_bytes: what a pool's placement counts as the machine's room (jobs/placement.py)
            **{key: facts.get(key) for key in ("os", "kernel", "python", "cpus", "memory_bytes")},
            # what the job's environment needs to know (environments/environment.py): absent when not reported
            **{key: facts[key] for key in ("arch", "uv") if key in facts},
            "gpu_names": [str(gpu.get("name") or "") for gpu in gpus if isinstance(gpu, Mapping)],
        }
        atomic_write(path, json.dumps(known, indent=1).encode(), mode=0o600)


def known_facts(punica_dir: Path, machine: str, max_age: float | None = None) -> dict[str, Any] | None:
    """What the machine's last check found (``remember_facts``), if it was at most ``max_age`` seconds
    ago; None when it was never checked, or before the OS and Python were kept."""
    facts = _read(punica_dir / FACTS_FILE).get(machine)
    if not isinstance(facts, dict) or "gpu_names" not in facts:
        return None
    checked = facts.get("checked")
    if max_age is not None and not (isinstance(checked, (int, float)) and time.time() - checked <= max_age):
        return None
    return facts


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_facts(punica_dir: Path) -> dict[str, Any]:
    """Every machine's kept facts, by name, as the file holds them (empty when there is none)."""
    return _read(punica_dir / FACTS_FILE)
