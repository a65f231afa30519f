#!/usr/bin/env bash
# Galata UI tests of the Compute panel, in Debian's chromium-headless-shell (nothing is downloaded).
#
#   ui-tests/run.sh [playwright args…]       e.g. ui-tests/run.sh -g "cancels"
#   ui-tests/run.sh --hub [playwright args…] only the spec through JupyterHub's login (hub/), on the
#                                            hub bed tests/hub_ui.py starts (root; the hub's users)
#
# With no arguments it runs both: the specs of tests/, then the hub's.
# Needs: the package installed in the venv (default <repo>/.venv, or $VENV) with the
# labextension built (`jlpm build` at the repo root), /usr/bin/chromium-headless-shell (or a
# Chromium of your own in $CHROMIUM_PATH, e.g. /usr/bin/chromium to run with --headed),
# and port 8888 free (with CI set, Playwright starts its own server and refuses a busy port).
# Exits non-zero when a test fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${VENV:-$repo/.venv}"
if [ -d "$venv/bin" ]; then
  export PATH="$venv/bin:$PATH"
fi
command -v jlpm >/dev/null || { echo "run.sh: jlpm not found (activate the venv or set VENV)" >&2; exit 2; }
export CHROMIUM_PATH="${CHROMIUM_PATH:-/usr/bin/chromium-headless-shell}"
[ -x "$CHROMIUM_PATH" ] || { echo "run.sh: no Chromium at $CHROMIUM_PATH (apt-get install -y chromium-headless-shell)" >&2; exit 2; }

hub=0
if [ "${1:-}" = "--hub" ]; then
  hub=1
  shift
elif [ "$#" = 0 ]; then
  hub=2
fi

if [ "$hub" != 1 ] && (exec 3<>/dev/tcp/127.0.0.1/8888) 2>/dev/null; then
  echo "run.sh: port 8888 is busy; stop the server using it first" >&2
  exit 2
fi

cd "$here"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
# The lockfile is committed: a CI install must not change it.
if [ -n "${CI:-}" ]; then immutable=1; else immutable=0; fi
YARN_ENABLE_IMMUTABLE_INSTALLS="${YARN_ENABLE_IMMUTABLE_INSTALLS:-$immutable}" jlpm install

tmp="$(mktemp -d -t remote-compute-ui-XXXXXX)"
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
export REMOTE_COMPUTE_UI_TMP="$tmp"
# Tokens typed in the form go to a real keyring backend, inside the temp dir.
export PYTHON_KEYRING_BACKEND=keyrings.alt.file.PlaintextKeyring
export XDG_DATA_HOME="$tmp/xdg-data"

start=$(date +%s)
status=0
if [ "$hub" != 1 ]; then
  jlpm playwright test "$@" || status=$?
fi
if [ "$hub" != 0 ]; then
  # Its own hub, users' servers and organization service; Playwright is run by it (its status is Playwright's).
  hub_status=0
  python "$repo/tests/hub_ui.py" "$@" || hub_status=$?
  [ "$hub_status" = 0 ] || status=$hub_status
fi
echo "run.sh: UI tests finished in $(( $(date +%s) - start )) s with status $status"
exit "$status"
