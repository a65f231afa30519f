"""Schemathesis hooks for fuzzing the organization service (loaded through SCHEMATHESIS_HOOKS).

The service runs under ``loopback_only.py``: a machine the fuzzer adds at an address it made up cannot
be reached, and the service says so as the machine's failure, a 502/503 ``engine_error``. That answer
reports the world, not a fault of the service; every other server error is kept.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from fuzz_failures import kept

UPSTREAM_ERRORS = {(502, "engine_error"), (503, "engine_error")}


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure except a server error that is a documented failure of a machine."""
    return kept(failure, response, UPSTREAM_ERRORS)
