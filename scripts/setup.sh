#!/usr/bin/env bash
# Set up a fresh clone: system packages the tests use (sshd for SSH machines, Debian's python3 and
# venv for the far side's MLflow, Chromium's headless shell for the UI tests, gnome-keyring for a real
# Secret Service, munge and Slurm for the single-node cluster tests/slurm_fixture.py starts, podman and
# mmdebstrap for the container tests, npm and useradd for the JupyterHub bed), a virtualenv in .venv,
# and the extension installed into it in editable mode (this builds the JupyterLab front end). Only
# what the product needs goes into .venv: scripts/test.sh adds the test extras itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt_packages=(openssh-server openssh-client rsync git chromium-headless-shell python3 python3-venv)
  # gnome-keyring, libsecret-tools and dbus: a headless Secret Service for the keyring tests.
  apt_packages+=(gnome-keyring libsecret-tools dbus)
  # Slurm's controller, node daemon and user commands; no systemd needed (the tests start them).
  apt_packages+=(munge slurmctld slurmd slurm-client)
  # Podman (root, and rootless for the ssh test user: uidmap, slirp4netns, fuse-overlayfs; catatonit
  # is its --init) and mmdebstrap, which makes the container tests' image offline. The tests write
  # podman's settings for this kind of machine into a private containers.conf, not /etc. docker.io:
  # the tests start their own dockerd on a private socket (no bridge, no firewall rules).
  apt_packages+=(podman runc catatonit uidmap slirp4netns fuse-overlayfs containers-storage mmdebstrap docker.io docker-registry apache2-utils)
  # The front-end build needs Node.js; Debian's will do where the machine has none of its own.
  command -v node >/dev/null 2>&1 || apt_packages+=(nodejs npm)
  # The JupyterHub bed (tests/hub_fixture.py): npm installs configurable-http-proxy, useradd (passwd)
  # makes its users. A NodeSource nodejs carries its own npm, which Debian's npm package would conflict with.
  command -v npm >/dev/null 2>&1 || apt_packages+=(npm)
  apt_packages+=(passwd)
  missing=()
  for p in "${apt_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# The lockfiles are committed: a CI install must not change them.
if [ -n "${CI:-}" ]; then export YARN_ENABLE_IMMUTABLE_INSTALLS=1; fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip uv
# uv (one of the product's dependencies) installs the rest: it links from its cache where pip unpacks
# every wheel again. With their bytecode, as pip writes it: where PYTHONDONTWRITEBYTECODE is set, every
# process would otherwise compile Jupyter's packages from source. The system's certificates, as pip's.
.venv/bin/uv pip install --quiet --system-certs --compile-bytecode --python .venv/bin/python -e .
# keyrings.alt is a test-only keyring (it keeps secrets in a plain file); a venv that ran the tests
# before may hold it, and the product's environment should not.
if .venv/bin/python -m pip show -q keyrings.alt >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall -q -y keyrings.alt
fi
echo "set up: .venv ($(.venv/bin/python --version)), jupyter-remote-compute installed in editable mode"
