#!/usr/bin/env bash
# Run every check: lint (Python and TypeScript), the Python suite (real sshd, real Jupyter
# servers, real MLflow, real kernels), then the Galata UI tests in Debian's Chromium.
# Arguments go to pytest; set SKIP_UI_TESTS=1 to leave the browser tests out.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ruff check jupyter_remote_compute tests benchmarks examples
ruff format --check jupyter_remote_compute tests benchmarks examples
jlpm lint:check
python -m pytest "$@"
if [ -z "${SKIP_UI_TESTS:-}" ]; then
  bash ui-tests/run.sh
fi
