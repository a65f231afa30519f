#!/usr/bin/env bash
# Set up a fresh clone: system packages the tests use (sshd for SSH machines, Chromium for
# the UI tests, gnome-keyring for a real Secret Service), a virtualenv in .venv, and the extension
# installed into it in editable mode (this builds the JupyterLab front end). Only what the product
# needs goes into .venv: scripts/test.sh adds the test extras itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  # gnome-keyring, libsecret-tools and dbus: a headless Secret Service for the keyring tests.
  apt_packages=(openssh-server openssh-client rsync git chromium gnome-keyring libsecret-tools dbus)
  # The front-end build needs Node.js; Debian's will do where the machine has none of its own.
  command -v node >/dev/null 2>&1 || apt_packages+=(nodejs npm)
  missing=()
  for p in "${apt_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
# keyrings.alt is a test-only keyring (it keeps secrets in a plain file); a venv that ran the tests
# before may hold it, and the product's environment should not.
if .venv/bin/python -m pip show -q keyrings.alt >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall -q -y keyrings.alt
fi
echo "set up: .venv ($(.venv/bin/python --version)), jupyter-remote-compute installed in editable mode"
