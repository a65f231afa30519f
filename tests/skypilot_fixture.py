"""SkyPilot driving the single-node Slurm test bed, as a team with a Slurm cluster would use it.

SkyPilot 0.14 manages Slurm clusters over ssh: it reads ``$HOME/.slurm/config`` (one ``Host`` per
cluster), submits one long sbatch allocation per SkyPilot cluster and runs every step in it with
``srun --overlap``. Here the cluster is ``slurm_fixture``'s, its login node the loopback sshd.

Test-bed adaptations, none of them in the product:

- The SkyPilot client (and the local API server it starts) gets a private ``HOME`` holding
  ``.slurm/config``, so nothing of the tester's own ``~/.sky`` is read or changed.
- The node user is a dedicated one with ``/bin/bash`` as its login shell (SkyPilot runs
  ``bash --login -c``); the ssh test user keeps ``/bin/sh``.
- This machine has no open internet beyond PyPI. At its first launch SkyPilot fetches uv's
  installer from astral.sh and asks uv for a Python 3.10 that uv downloads from GitHub. The node
  user's ``~/bin/curl`` (first on PATH under Debian's ``.profile``) answers that one installer URL
  with a script placing a ``uv`` taken from PyPI's ``uv`` wheel, wrapped so ``--python 3.10``
  means the system's 3.11 and uv never downloads a Python; every other URL goes to the real curl.
  SkyPilot itself is unmodified; its runtime (~90 MB) is installed from PyPI as usual.
- SkyPilot's job runner on the node (``sky.skylet.executor.slurm``) resolves each name in
  ``SLURM_JOB_NODELIST`` with ``gethostbyname`` (for ``SKYPILOT_NODE_IPS``) and ends the job
  ``FAILED_SETUP`` when one does not resolve ("RuntimeError: Failed to get IP for hostname:
  jrcnode…"). On a real cluster node names are host names; the Slurm bed's node has a name of its
  own per session (``NodeAddr=127.0.0.1``, which SkyPilot does not read), so for the session
  ``/etc/hosts`` maps that name to 127.0.0.1, one line added and removed under a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from far_python import far_python_bin
from ports import reserved_port
from required import require
from slurm_fixture import SlurmBed
from waiting import wait_for

#: The node user SkyPilot signs in as on the login node (bash login shell).
NODE_USER = "jrc-sky-test"
#: uv from PyPI, kept between sessions like the far-side Python.
UV_ROOT = Path("/var/tmp/jrc-sky-uv")
UV_VERSION = "0.13.9"
INSTALLER_URL = "https://astral.sh/uv/install.sh"
HOSTS = Path("/etc/hosts")
#: Held while /etc/hosts is rewritten, so two sessions' beds never lose each other's line.
HOSTS_LOCK = Path("/tmp/jrc-sky-etc-hosts.lock")
#: Where SkyPilot's client finds its local API server, and where that server listens (default 46580).
API_PORT_VARIABLE = "SKYPILOT_API_SERVER_LOCAL_PORT"
# This test process's own port, set before SkyPilot is first imported (its client caches the server's URL
# for the process): another test run on this machine, whose server listens on SkyPilot's default port or
# on one of its own, is never talked to nor stopped by this one. The server binds it minutes later, when
# the first SkyPilot test runs: from the ephemeral range, the run's other sockets could hold it by then.
os.environ.setdefault(API_PORT_VARIABLE, str(reserved_port()))


def skypilot_installed() -> bool:
    try:
        import sky
    except ImportError:
        return False
    return hasattr(sky, "launch") and hasattr(sky, "Resources")


def _uv_binary() -> Path:
    """A ``uv`` executable from PyPI's wheel (downloaded once per machine)."""
    target = UV_ROOT / UV_VERSION / "uv"
    if target.exists():
        return target
    UV_ROOT.mkdir(mode=0o755, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=UV_ROOT) as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux_2_17_x86_64",
                f"uv=={UV_VERSION}",
                "-d",
                tmp,
            ],
            check=True,
            capture_output=True,
        )
        wheel = next(Path(tmp).glob("uv-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith("/scripts/uv"))
            staged = Path(tmp) / "uv"
            staged.write_bytes(z.read(name))
        staged.chmod(0o755)
        target.parent.mkdir(mode=0o755, exist_ok=True)
        os.replace(staged, target)
    return target


def _node_user(far_bin: Path) -> tuple[str, Path]:
    """The node user, made when missing, with the test bed's curl and a PATH that reaches MLflow."""
    try:
        entry = pwd.getpwnam(NODE_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", NODE_USER], check=True, capture_output=True)
        # With UsePAM off, sshd refuses a user whose password field says "locked".
        subprocess.run(["usermod", "-p", "*", NODE_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(NODE_USER)
    home = Path(entry.pw_dir)
    bindir = home / "bin"
    bindir.mkdir(exist_ok=True)
    uv = _uv_binary()
    installer = bindir / "uv-install.sh"
    installer.write_text(
        f"""#!/bin/sh
# Test bed only: stands in for {INSTALLER_URL} on a machine that cannot reach it.
set -e
dir=${{UV_INSTALL_DIR:-$HOME/.local/bin}}
mkdir -p "$dir"
cp {uv} "$dir/uv.real"
cat > "$dir/uv" <<'EOF'
#!/bin/sh
# Test bed only: no Python downloads; SkyPilot's "--python 3.10" becomes the system's 3.11.
export UV_PYTHON_DOWNLOADS=never SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
n=$#
prev=
for a in "$@"; do
  if [ "$prev" = --python ] && [ "$a" = 3.10 ]; then a=3.11; fi
  set -- "$@" "$a"
  prev=$a
done
shift "$n"
exec "$(dirname "$0")/uv.real" "$@"
EOF
chmod 755 "$dir/uv"
"""
    )
    curl = bindir / "curl"
    curl.write_text(
        f"""#!/bin/sh
# Test bed only: uv's installer URL is answered locally; everything else goes to the real curl.
for a in "$@"; do
  if [ "$a" = {INSTALLER_URL} ]; then exec cat {installer}; fi
done
exec /usr/bin/curl "$@"
"""
    )
    curl.chmod(0o755)
    profile = home / ".profile"
    line = f'PATH="{far_bin}:$PATH"  # jrc test bed: a Python with MLflow\n'
    text = profile.read_text() if profile.exists() else ""
    if line not in text:
        profile.write_text(text + line)
    subprocess.run(["chown", "-R", f"{NODE_USER}:{NODE_USER}", str(home)], check=True)
    return NODE_USER, home


@contextlib.contextmanager
def _hosts_file_lock() -> Iterator[None]:
    with open(HOSTS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def node_name_resolves(node: str) -> Iterator[None]:
    """``node`` resolves to 127.0.0.1 (an /etc/hosts line) while this lasts: SkyPilot looks node names up."""
    line = f"127.0.0.1 {node}  # jupyter-remote-compute SkyPilot test bed\n"
    with _hosts_file_lock():
        text = HOSTS.read_text()
        # Written in place: /etc/hosts may be a bind mount that a rename would not replace.
        HOSTS.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line)
    try:
        yield
    finally:
        with _hosts_file_lock():
            HOSTS.write_text("".join(kept for kept in HOSTS.read_text().splitlines(True) if kept != line))


@dataclass
class SkyBed:
    """SkyPilot's client home, the Slurm infra it can launch on, and the one cluster the session shares."""

    slurm: SlurmBed
    home: Path
    infra: str
    node_user: str
    node_home: Path
    cluster: str

    def machine_options(self, **over: object) -> dict[str, object]:
        """Options of a ``skypilot`` machine on this bed: the session's cluster, one CPU and 1 GB of the node."""
        options: dict[str, object] = {
            "cluster": self.cluster,
            "known_hosts": str(self.slurm.known_hosts),
            "autostop": 30,
            "resources": {"cpus": 1, "memory": "1G"},
        }
        options.update(over)
        return options


@contextlib.contextmanager
def client_home(home: Path) -> Iterator[Path]:
    """SkyPilot's client (and the API server it starts) see ``home`` as HOME while this lasts."""
    saved = {k: os.environ.get(k) for k in ("HOME", "SKYPILOT_DISABLE_USAGE_COLLECTION")}
    os.environ.update(HOME=str(home), SKYPILOT_DISABLE_USAGE_COLLECTION="1")
    try:
        yield home
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: The one SkyPilot home and bed of this test process. pytest gives every module that names these
#: fixtures a session fixture of its own; a second home would talk to the API server the first one
#: started (one port), which knows only the first Slurm bed. Shared here: one server, one launch.
#: ``release_bed`` and ``release_home`` stop them, once (``release``).
_SHARED: dict[str, Any] = {}


def release() -> None:
    """The session's cluster torn down (``sky down``), then its API server stopped; nothing when none runs.

    Called after the serial group ``skypilot``'s last test (conftest), not at the session's end: until then
    the idle cluster would cost CPU for the rest of the run, its Slurm allocation's skylet and the API
    server's status check of it every minute (ssh, srun and SkyPilot's Python on the node each time).
    """
    for key in ("release_bed", "release_home"):
        stop = _SHARED.pop(key, None)
        if stop is not None:
            stop()


@pytest.fixture(scope="session")
def sky_home() -> Iterator[Path]:
    """A private HOME for SkyPilot's client for the whole session; its API server is stopped at the end."""
    require(skypilot_installed(), "SkyPilot (pip install 'jupyter-remote-compute[skypilot]')")
    if "home" in _SHARED:
        yield _SHARED["home"]  # another module's: its owner stops the server
        return
    home = Path(tempfile.mkdtemp(prefix="jrc-sky-home-"))
    _SHARED["home"] = home

    def stop() -> None:
        _SHARED.pop("home", None)
        with client_home(home), contextlib.suppress(Exception):
            from sky.client import sdk

            sdk.api_stop()
        shutil.rmtree(home, ignore_errors=True)

    _SHARED["release_home"] = stop
    try:
        with client_home(home):
            # SkyPilot reads paths under HOME when it is imported: import it under the private one.
            import sky.server.common

            # On a loaded 2-core machine the API server took 95 s to start; SkyPilot waits 60 s.
            sky.server.common.WAIT_APISERVER_START_TIMEOUT_SEC = 600
        yield home
    finally:
        release()


@pytest.fixture
def sky_client(sky_home: Path) -> Iterator[Path]:
    """HOME is SkyPilot's private one for this test."""
    if "home" not in _SHARED:
        raise RuntimeError("SkyPilot's test bed was released before this test: is it in the serial group skypilot?")
    with client_home(sky_home):
        yield sky_home


@pytest.fixture(scope="session")
def skypilot_bed(slurm_bed: SlurmBed, sky_home: Path) -> Iterator[SkyBed]:
    """SkyPilot pointed at the Slurm bed; the session's cluster is torn down (``sky down``) at the end."""
    require(shutil.which("bash") is not None and shutil.which("rsync") is not None, "bash and rsync")
    if "bed" in _SHARED:
        yield _SHARED["bed"]  # another module's, on its Slurm bed: its owner tears the cluster down
        return
    user, node_home = _node_user(far_python_bin())
    (sky_home / ".slurm").mkdir(exist_ok=True)
    (sky_home / ".slurm" / "config").write_text(
        f"""Host {slurm_bed.cluster}
  HostName 127.0.0.1
  Port {slurm_bed.login.port}
  User {user}
  IdentityFile {slurm_bed.user_key}
  IdentitiesOnly yes
"""
    )
    bed = SkyBed(slurm_bed, sky_home, f"slurm/{slurm_bed.cluster}", user, node_home, f"jrc-t{uuid.uuid4().hex[:6]}")
    resolving = contextlib.ExitStack()
    resolving.enter_context(node_name_resolves(slurm_bed.node))  # until after `sky down`, which also runs on the node
    _SHARED["bed"] = bed

    def down() -> None:
        _SHARED.pop("bed", None)
        with resolving:
            with client_home(sky_home), contextlib.suppress(Exception):
                from sky.client import sdk

                start = time.monotonic()
                sdk.get(sdk.down(bed.cluster))
                timed("sky down", start)
            _close_sky_ssh_masters(sky_home)
            # The node keeps SkyPilot's runtime between sessions, as a real cluster's home would.
            shutil.rmtree(node_home / ".jupyter-remote-compute", ignore_errors=True)

    _SHARED["release_bed"] = down
    try:
        yield bed
    finally:
        stop = _SHARED.pop("release_bed", None)
        if stop is not None:
            stop()


def _close_sky_ssh_masters(home: Path) -> None:
    """End the ssh master connections SkyPilot left to the node (they persist for minutes after use).

    SkyPilot keeps their sockets in ``/tmp/sky_ssh_<user hash>/``, the hash being the one in this
    session's private home, so only this session's masters are ended.
    """
    hash_file = home / ".sky" / "user_hash"
    if not hash_file.is_file():
        return
    folder = Path(f"/tmp/sky_ssh_{hash_file.read_text().strip()}")
    for socket in (p for p in folder.rglob("*") if p.is_socket()):
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # a master already gone is fine
            subprocess.run(
                ["ssh", "-O", "exit", "-o", f"ControlPath={socket}", "jrc-sky-node"],
                capture_output=True,
                timeout=30,
                check=False,
            )
    shutil.rmtree(folder, ignore_errors=True)


def ensure_up(engine: object, timeout: float = 1800) -> None:
    """The machine's cluster is UP (launched now if needed, through the engine, as a first job would)."""
    request_id = engine.launch_cluster()  # type: ignore[attr-defined]
    if request_id is None:
        return
    start = time.monotonic()

    def done() -> bool:
        return engine.request_state(request_id)[0] in ("SUCCEEDED", "FAILED", "CANCELLED", "UNKNOWN")  # type: ignore[attr-defined]

    wait_for(done, timeout, "SkyPilot to launch the test cluster", interval=1.0)
    state, words = engine.request_state(request_id)  # type: ignore[attr-defined]
    timed("launch", start)
    if state != "SUCCEEDED":
        raise RuntimeError(f"SkyPilot could not launch the test cluster: {words}")


def timed(what: str, start: float) -> None:
    """Print a measured duration (the test log keeps it for the README's numbers)."""
    print(f"[skypilot bed] {what}: {time.monotonic() - start:.1f} s")
