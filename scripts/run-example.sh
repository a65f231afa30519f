#!/usr/bin/env bash
# Open JupyterLab with the extension on examples/quickstart (the built-in `local` machine works at once).
set -euo pipefail
cd "$(dirname "$0")/.."
args=(--ServerApp.root_dir=examples/quickstart)
[ "$(id -u)" = 0 ] && args+=(--allow-root)
exec .venv/bin/jupyter lab "${args[@]}" "$@"
