"""Schemathesis against a live server: every operation and the links between them, with a fixed seed.

What it holds the API to (issue 16): no 5xx (but a 502 machine_error from a machine the fuzzer
made up: loopback_only.py refuses every address outside this host), every response as
openapi.yaml documents it (status and schema), and every request that breaks the schema refused.
Jobs the fuzzer submits run ``true`` on the built-in ``local`` machine (schemathesis_hooks.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from api_fuzzing import FuzzTarget, fuzz

SEED = 16
#: Per operation and phase; with the coverage and stateful phases this is well over 1,000 cases.
MAX_EXAMPLES = 40
MIN_CASES = 1000


@pytest.mark.timeout(900)
def test_the_api_survives_fuzzing_and_keeps_its_contract(tmp_path: Path) -> None:
    target = FuzzTarget(tmp_path)
    target.start()
    report = tmp_path / "report"
    report.mkdir()
    started = time.monotonic()
    try:
        result = fuzz(target, seed=SEED, max_examples=MAX_EXAMPLES, report_dir=report)
    finally:
        target.stop()
    print(f"schemathesis: {result.cases} cases, {result.failures} failures in {time.monotonic() - started:.0f} s")
    assert result.returncode == 0 and result.failures == 0, result.output[-20000:]
    assert result.cases >= MIN_CASES, result.output[-3000:]
    assert "Stateful" in result.output and "API Links" in result.output, "the stateful phase did not run"
