"""Fuzz the REST API longer than the test does, with a random seed: schemathesis against a live server.

    python benchmarks/bench_api_fuzz.py --cases 5000 [--seed N] [--max-time 600]

The same run as tests/test_api_fuzz.py (every operation and phase, the same checks, the server
under loopback_only.py so no made-up machine address is ever reached), with a fresh seed each time
unless one is given, so repeated runs explore new inputs. ``--cases`` is the number of cases to
aim for (it sets schemathesis' cases per operation); a run still going at ``--max-time`` seconds is
stopped. It prints the seed (to replay a failure with --seed), the cases generated, the failures and
the time, and exits non-zero on a failure or a stopped run.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from api_fuzzing import FuzzTarget, fuzz

#: Cases one unit of --max-examples yields across 16 operations and four phases (measured: 40 → ~1,270).
CASES_PER_EXAMPLE = 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000, help="cases to aim for (default 5000)")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: a random seed)")
    parser.add_argument("--max-time", type=float, default=900, help="stop after this many seconds (default 900)")
    args = parser.parse_args(argv)
    if args.cases < 1 or args.max_time <= 0:
        parser.error("--cases and --max-time must be positive")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyrings.alt.file.PlaintextKeyring")
    with tempfile.TemporaryDirectory(prefix="bench-api-fuzz-") as tmp:
        base = Path(tmp)
        target = FuzzTarget(base / "server")
        target.start()
        report = base / "report"
        report.mkdir()
        started = time.monotonic()
        try:
            max_examples = max(1, args.cases // CASES_PER_EXAMPLE)
            result = fuzz(target, seed=seed, max_examples=max_examples, report_dir=report, timeout=args.max_time)
        finally:
            target.stop()
        elapsed = time.monotonic() - started
    print(f"seed {seed}: {result.cases} cases, {result.failures} failures in {elapsed:.0f} s")
    if result.failures or result.returncode:
        print(result.output[-20000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
