#!/usr/bin/env bash
# Run every check: lint (Python and TypeScript), the Galata UI tests in Debian's Chromium, then the
# Python suite (real sshd, real Jupyter servers, real MLflow, real kernels), whose summary ends the run.
# Arguments go to pytest; set SKIP_UI_TESTS=1 to leave the browser tests out.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ruff check jupyter_remote_compute tests benchmarks examples
ruff format --check jupyter_remote_compute tests benchmarks examples
jlpm lint:check
if [ -z "${SKIP_UI_TESTS:-}" ]; then
  bash ui-tests/run.sh
fi
python -m pytest "$@"
