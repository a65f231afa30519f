#!/usr/bin/env bash
# Run every check: lint, then the test suite (real sshd, real Jupyter servers, real MLflow).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check jupyter_remote_compute tests benchmarks examples
.venv/bin/ruff format --check jupyter_remote_compute tests benchmarks examples
.venv/bin/python -m pytest "$@"
