"""The idempotency key: the same work on the same machine has the same key.

Hashed from the machine, the command, env names with their non-secret values
(a ``secret:NAME`` reference counts by its name, never its value), the sha256
of every input's content, the outputs wanted, the resources asked for and the content of the
Python environment. Paths and digests, not mtimes: touching a file does not make new work, editing it does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from ..engines.base import InputFile
from .spec import JobSpec


def job_key(spec: JobSpec, inputs: Sequence[InputFile], environment: str | None = None) -> str:
    """``environment``: the digest of the job's resolved environment (its content, not how it was asked)."""
    material = {
        "machine": spec.machine,
        "command": spec.command if isinstance(spec.command, str) else list(spec.command),
        "env": sorted(spec.env.items()),
        "inputs": sorted((f.relpath, f.sha256) for f in inputs),
        "bring_back": sorted(spec.bring_back),
    }
    resources = spec.resources.to_json()
    if resources:  # only when asked for, so the keys of jobs that ask for nothing stay as they were
        material["resources"] = resources
    if environment:  # likewise
        material["environment"] = environment
    if spec.image:  # likewise
        material["image"] = spec.image.key_part()
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]
