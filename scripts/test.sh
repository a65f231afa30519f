#!/usr/bin/env bash
# Run every check: lint (Python and TypeScript), then the Galata UI tests in Debian's Chromium beside the
# Python suite (real sshd, real Jupyter servers, real MLflow, real kernels); the UI tests' report ends the run.
# Arguments go to pytest; set SKIP_UI_TESTS=1 to leave the browser tests out. The suite runs on
# TEST_WORKERS pytest-xdist workers (default 2, the cores CI has; 0 runs it in this process), the
# modules that share a machine-wide part kept on one worker (tests/conftest.py: SERIAL_GROUPS).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
# The test extras (pytest, keyrings.alt, ...) are the tests' own: scripts/setup.sh leaves them out of
# the product's environment. pip returns quickly when they are already there.
mapfile -t test_requirements < <(python scripts/test_requirements.py)
if [ "${#test_requirements[@]}" = 0 ]; then
  echo "jupyter-remote-compute is not installed in .venv: run bash scripts/setup.sh first" >&2
  exit 1
fi
python -m pip install -q "${test_requirements[@]}"
# The skypilot kind's extra (SkyPilot and its Slurm support, heavy) in a step of its own: the rest of
# the suite never needs it, and its tests fail in CI (tests/required.py) if this step did not run.
mapfile -t skypilot_requirements < <(python scripts/test_requirements.py skypilot)
if [ "${#skypilot_requirements[@]}" != 0 ]; then
  python -m pip install -q "${skypilot_requirements[@]}"
fi
# jsonschema imports rfc3987-syntax whenever it is installed (jupyter-events asks for it, through
# jsonschema[format-nongpl]), and that builds a parser at import: 3 s of CPU in every process that imports
# jsonschema (each Jupyter server the tests start), for a format ("iri") nothing here checks.
python -m pip uninstall -q -y rfc3987-syntax 2>/dev/null || true
# Where the environment sets PYTHONDONTWRITEBYTECODE (this CI machine's does), no process writes the
# clone's bytecode, and every server, CLI, recorder and agent the suite starts (hundreds) compiled the
# package from source: 0.09 s of CPU each (a CLI's start 0.34 s, 0.24 s with it compiled). Compiled
# once here, every later process reads it.
python -m compileall -q jupyter_remote_compute tests
# The UI tests run beside the rest, their report printed after pytest's: each leaves about a fifth of the
# two cores idle while it waits on jobs, servers and the browser (tests/README.md), and together they fill
# it. They start before the builds and lint below, which keep one core busy and leave the other to them.
# Either failing fails the run.
ui_status=0
ui_pid=
ui_log=$(mktemp -t remote-compute-ui-log-XXXXXX)
# In a session of its own, so a lint failure below stops its JupyterLab and browser too, not only its shell.
trap 'rm -f "$ui_log"; [ -z "$ui_pid" ] || kill -- "-$ui_pid" 2>/dev/null || true' EXIT
if [ -z "${SKIP_UI_TESTS:-}" ]; then
  setsid bash ui-tests/run.sh > "$ui_log" 2>&1 &
  ui_pid=$!
fi
# Elyra's venv (tests/elyra_venv.py) is built once per machine, outside the clone: the whole suite
# builds or finds it here first, so no test waits on it; its tests say why when it could not be built.
if [ "$#" = 0 ]; then
  python tests/elyra_venv.py || echo "test.sh: the Elyra venv was not built; tests/test_elyra.py says why" >&2
  # The same for the JupyterHub bed's venv and proxy (tests/hub_fixture.py).
  python tests/hub_fixture.py || echo "test.sh: the JupyterHub bed was not built; tests/test_hub_bed.py says why" >&2
fi
ruff check jupyter_remote_compute tests benchmarks examples
ruff format --check jupyter_remote_compute tests benchmarks examples
# openapi.yaml's schemas as the models in schema/ say (then lint:check: src/openapi.d.ts as openapi.yaml says)
python -m jupyter_remote_compute.schema.openapi --check
jlpm lint:check
pytest_status=0
# The report lists the 30 slowest tests and set-ups: where the suite's time goes (tests/README.md).
python -m pytest -n "${TEST_WORKERS:-2}" --durations=30 "$@" || pytest_status=$?
if [ -n "$ui_pid" ]; then
  wait "$ui_pid" || ui_status=$?
  ui_pid=
  echo "== the UI tests (ui-tests/run.sh), run beside pytest =="
  cat "$ui_log"
fi
if [ "$ui_status" -ne 0 ]; then
  echo "test.sh: the UI tests failed (status $ui_status)" >&2
fi
[ "$ui_status" -eq 0 ] && exit "$pytest_status"
exit "$ui_status"
