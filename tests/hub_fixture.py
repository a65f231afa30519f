"""A real multi-user JupyterHub on loopback, for the organization service of "Teams on JupyterHub".

What it starts: JupyterHub with configurable-http-proxy, the shared-password authenticator and the
local-process spawner, so each user's single-user server runs as that Linux user; users made here with
``useradd`` (homes 0700), a hub group ``rcteam`` (rcalice, rcbob) granted ``custom:remote-compute:use``
and rcadmin granted ``custom:remote-compute:admin``, rceve outside both; and one managed service,
``remote-compute``, whose command the caller gives (``HubBed.start``), so the organization service can be
plugged in where ``tests/data/hub_probe_service.py`` stands now.

Its venv (JupyterHub, JupyterLab, this package's dependencies) and proxy are built once per machine,
outside the clone (``hub_build.py``). This package itself is the clone's: every process the hub starts
gets the clone on ``PYTHONPATH`` (a copy of its package when the users cannot read the clone) and a
session folder (world-readable) with a ``jupyter-remote-compute`` command, the server extension's config
and the built front end, so the cached venv never changes and two clones can run hubs from it at once.
A service command may name ``jupyter remote-compute …`` or ``python``: they are looked up on that ``PATH``.

Machine-wide, so its tests are the serial group ``hub`` (``conftest.py``): the Linux users and their
homes. Everything else is the session's: ports from the OS, the hub's files in a temp folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import grp
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import requests
from hub_build import CACHE, DEBIAN_PYTHON, HubBuild, build_hub
from ports import free_port
from procs import proc_stats
from required import require
from waiting import wait_for

from jupyter_remote_compute.org import scopes

REPO = Path(__file__).resolve().parent.parent

SERVICE = "remote-compute"
USE, ADMIN = scopes.USE, scopes.ADMIN
GROUP = "rcteam"
ADMIN_USER = "rcadmin"
MEMBERS = ("rcalice", "rcbob")
OUTSIDER = "rceve"
USERS = (ADMIN_USER, *MEMBERS, OUTSIDER)
CUSTOM_SCOPES = scopes.custom_scopes()
#: What a single-user server's own token (JUPYTERHUB_API_TOKEN, which its kernels inherit) asks for; the hub
#: gives it the subset its user holds. Without the service's access scope and the custom ones (the default
#: is activity and the server alone) the service answers that token with 403.
SERVER_TOKEN_SCOPES = ["users:activity!user", "access:servers!server", f"access:services!service={SERVICE}", USE, ADMIN]
#: The bed's own token (``Hub.admin_token``): users, servers and their state, tokens, groups, services.
BED_ADMIN_SCOPES = ["admin:users", "admin:servers", "admin:server_state", "tokens", "admin:groups", "read:roles",
                    "list:services", "read:services"]  # fmt: skip


# -- the users, once per machine ----------------------------------------------


def ensure_users() -> None:
    """The test users, their Linux group and their homes (0700; Debian's ``useradd -m`` leaves 0755).

    Idempotent, and one session at a time (a lock in the cache folder): a later one finds them made."""
    CACHE.mkdir(mode=0o755, exist_ok=True)
    with open(CACHE / "users.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            grp.getgrnam(GROUP)
        except KeyError:
            subprocess.run(["groupadd", GROUP], check=True, capture_output=True)
        for name in USERS:
            try:
                pwd.getpwnam(name)
            except KeyError:
                extra = ["-G", GROUP] if name in MEMBERS else []
                subprocess.run(["useradd", "-m", "-s", "/bin/sh", *extra, name], check=True, capture_output=True)
            os.chmod(pwd.getpwnam(name).pw_dir, 0o700)


def environment_of(pid: int) -> dict[str, str]:
    """A process's environment as it started, from /proc (root reads anyone's)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in environ if b"=" in e)


def processes_of(hub_url: str) -> list[int]:
    """What one hub started and left: the users' servers and kernels, the service and its children (each
    carries the hub's API URL), and its proxy (named by its pid file, read by the caller)."""
    found = []
    for pid, _fields in proc_stats():
        with contextlib.suppress(OSError):
            if environment_of(pid).get("JUPYTERHUB_API_URL", "").startswith(hub_url):
                found.append(pid)
    return found


@contextlib.contextmanager
def users_held(wait_s: float = 1200.0) -> Iterator[None]:
    """The test users' homes and servers for this process alone, while it lasts (a lock in the cache folder).

    Held by a pytest session's ``hub_bed`` and by the Galata hub run (``hub_ui.py``), which ``scripts/test.sh``
    runs beside each other: each spawns rcalice's and rcbob's servers in the same homes, whose job lists,
    workspaces and MLflow stores the other's tests read. Taken again by the process that holds it, it is
    already held. Waits up to ``wait_s``
    for the other holder, then names it."""
    if _HELD:
        _HELD.append(True)
        try:
            yield
        finally:
            _HELD.pop()
        return
    CACHE.mkdir(mode=0o755, exist_ok=True)
    with open(CACHE / "bed.lock", "a+") as lock:

        def taken() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        if not taken():
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            wait_for(taken, timeout=wait_s, message=f"the hub bed's users, held by {holder}", interval=0.5)
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} ({' '.join(sys.argv[:2])})")
        lock.flush()
        _HELD.append(True)
        try:
            yield
        finally:
            _HELD.pop()


@contextlib.contextmanager
def timeout_paused() -> Iterator[None]:
    """pytest-timeout's clock (its signal method: the process's real-time timer) stopped meanwhile.

    For the wait on the users while the Galata hub run holds them: minutes that are not the test's."""
    left, _interval = signal.getitimer(signal.ITIMER_REAL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if left:
            signal.setitimer(signal.ITIMER_REAL, left)


#: How many holders of ``users_held`` this process has (the lock is the first's).
_HELD: list[bool] = []


# -- one hub -------------------------------------------------------------------


@dataclasses.dataclass
class Server:
    """A user's running single-user server."""

    user: str
    url: str  # through the proxy: http://127.0.0.1:P/user/NAME/
    pid: int
    environment: dict[str, str]  # the process's own, read from /proc (JUPYTERHUB_API_TOKEN, JUPYTERHUB_API_URL, …)

    @property
    def token(self) -> str:
        """The server's own ``JUPYTERHUB_API_TOKEN``, which its kernels inherit."""
        return self.environment["JUPYTERHUB_API_TOKEN"]


@dataclasses.dataclass
class Hub:
    """A running hub, its proxy and its ``remote-compute`` service, and how to act as each user."""

    workdir: Path  # the session's folder: public/ (world-readable) and hub/ (root's only)
    url: str  # the proxy's public URL, http://127.0.0.1:P/
    hub_url: str  # the hub's own bind URL (what servers and services see as JUPYTERHUB_API_URL's base)
    service_url: str  # the service's own listening URL, http://127.0.0.1:S
    admin_token: str  # a token (the ``bed-admin`` service's) for the REST API: users, servers, tokens, groups
    password: str  # every test user's (SharedPasswordAuthenticator)
    proc: subprocess.Popen  # type: ignore[type-arg]
    log: Path
    build: HubBuild
    started: set[str] = dataclasses.field(default_factory=set)

    def api(
        self, method: str, path: str, token: str | None = None, timeout: float = 30, **kwargs: object
    ) -> requests.Response:
        """The hub's REST API (``/hub/api/`` + path), as the bed's admin unless another token is given."""
        headers = {"Authorization": f"token {token or self.admin_token}"}
        return loopback_session().request(
            method, f"{self.url}hub/api/{path}", headers=headers, timeout=timeout, **kwargs
        )  # type: ignore[arg-type]

    def service(self, path: str = "") -> str:
        """A URL of the ``remote-compute`` service through the proxy, as browsers and servers reach it."""
        return f"{self.url}services/{SERVICE}/{path}"

    def start_server(self, user: str, timeout: float = 90) -> Server:
        """Start ``user``'s default server (as a browser's spawn would) and return it once it answers."""
        started = self.api("POST", f"users/{user}/server")
        if started.status_code not in (201, 202, 400):  # 400: it is already running
            raise RuntimeError(f"spawn of {user}: {started.status_code} {started.text}")
        self.started.add(user)

        def ready() -> dict | None:  # type: ignore[type-arg]
            self._check_alive()
            model = self.api("GET", f"users/{user}").json()
            server = model.get("servers", {}).get("")
            return server if server and server.get("ready") else None

        server = wait_for(ready, timeout, f"{user}'s server to be ready")
        pid = int(server["state"]["pid"])
        return Server(user, f"{self.url}user/{user}/", pid, environment_of(pid))

    def stop_server(self, user: str, timeout: float = 60) -> None:
        """Stop ``user``'s default server and wait until the hub says it is gone."""
        self.api("DELETE", f"users/{user}/server")

        def gone() -> bool:
            return "" not in self.api("GET", f"users/{user}").json().get("servers", {})

        wait_for(gone, timeout, f"{user}'s server to stop")

    def user_token(self, user: str, scopes: Sequence[str] | None = None, note: str = "test") -> str:
        """A new API token of ``user``'s with ``scopes`` (what the user holds of them; None: all they hold)."""
        body: dict[str, object] = {"note": note, "expires_in": 3600}
        if scopes is not None:
            body["scopes"] = list(scopes)
        made = self.api("POST", f"users/{user}/tokens", json=body)
        made.raise_for_status()
        return made.json()["token"]

    def login(self, user: str, password: str | None = None) -> requests.Session:
        """A browser-like session logged in as ``user`` through the hub's login form (cookies kept).

        ``session.get(hub.service("…"))`` then follows the OAuth redirects to the service, as a browser
        would: the hub's authorize, the service's ``oauth_callback``, back to the page asked for."""
        session = loopback_session()
        form = session.get(f"{self.url}hub/login", timeout=30)
        form.raise_for_status()
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form.text)
        action = re.search(r'<form action="([^"]+)"', form.text)
        if not xsrf or not action:
            raise RuntimeError(f"the hub's login page has no form: {form.text[:500]}")
        target = requests.compat.urljoin(form.url, action.group(1).replace("&amp;", "&"))
        body = {"_xsrf": xsrf.group(1), "username": user, "password": password or self.password}
        # Not followed: the hub's next stop after a login is the user's server, which it would spawn.
        done = session.post(target, data=body, timeout=30, allow_redirects=False)
        if done.status_code != 302 or "jupyterhub-hub-login" not in session.cookies:
            raise PermissionError(f"{user} could not log in: {done.status_code} {done.text[:300]}")
        return session

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            log = self.log.read_text(errors="replace")
            # Why it ended first (its proxy goes on logging after it): the hub's lines on its service.
            why = [line for line in log.splitlines() if re.search(r"Service \S+ exited|exited with status", line)]
            said = "\n".join([*why, "… the log ends:", log[-3000:]])
            raise HubExited(self, f"the hub exited with {self.proc.returncode}:\n{said}")

    def stop(self) -> None:
        """Stop the servers it started, the hub (which stops its proxy and service), then anything of
        its still running; remove the session's folder."""
        if self.proc.poll() is None:
            for user in sorted(self.started):
                with contextlib.suppress(Exception):
                    self.stop_server(user, timeout=30)
        # The hub stops its service (SIGINT, then SIGTERM) and its proxy on SIGTERM.
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(45)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        # A hub that exited on its own (its service died) leaves its proxy and may leave the rest.
        leftovers = processes_of(self.hub_url)
        with contextlib.suppress(OSError, ValueError):
            proxy = int((self.workdir / "hub" / "proxy.pid").read_text())
            if str(self.build.proxy) in Path(f"/proc/{proxy}/cmdline").read_text():
                leftovers.append(proxy)
        # Its proxy also by what it was told (a hub that died early may not have written the pid file).
        error_target = f"--error-target {self.hub_url}hub/error"
        leftovers += [pid for pid, _ in proc_stats() if error_target in cmdline_of(pid)]
        for pid in set(leftovers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # Stopped means gone: a killed process is listed until the kernel has taken it down.
        wait_for(lambda: not [pid for pid in set(leftovers) if _running(pid)], 30, "the hub's processes to end")
        shutil.rmtree(self.workdir, ignore_errors=True)


def cmdline_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Listed and not a zombie (one nobody reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class HubExited(RuntimeError):
    """The hub ended while a test waited on it (its service exiting ends it); ``hub`` says which."""

    def __init__(self, hub: Hub, message: str) -> None:
        super().__init__(message)
        self.hub = hub


def loopback_session() -> requests.Session:
    """A requests session for the bed's loopback URLs."""
    session = requests.Session()
    session.trust_env = False  # loopback only: never through a proxy the environment names
    return session


def _public_folder(public: Path, build: HubBuild) -> dict[str, str]:
    """The clone's package for every process the hub starts, without touching the cached venv.

    ``bin/jupyter-remote-compute`` (so ``jupyter remote-compute …`` finds this clone's command),
    the server extension enabled as an install would (``etc/jupyter``), its built front end
    (``share/jupyter/labextensions``; none where the clone has not built it), and the environment that
    points at them. The package is imported from the clone, or from a copy here when the test users
    could not read the clone (one under root's 0700 home)."""
    (public / "bin").mkdir(parents=True)
    command = public / "bin" / "jupyter-remote-compute"
    command.write_text(f"#!{build.python}\nimport sys\nfrom jupyter_remote_compute.cli import main\nsys.exit(main())\n")
    command.chmod(0o755)
    config = public / "etc" / "jupyter" / "jupyter_server_config.d"
    config.mkdir(parents=True)
    shutil.copy(REPO / "jupyter-config" / "server-config" / "jupyter_remote_compute.json", config)
    # The front end, where JupyterLab looks for prebuilt extensions (JUPYTER_PATH's labextensions/): a
    # copy, so JupyterLab in the cached venv shows the clone's Compute panel whoever may read the clone.
    labextension = REPO / "jupyter_remote_compute" / "labextension"
    if (labextension / "package.json").exists():
        shutil.copytree(labextension, public / "share" / "jupyter" / "labextensions" / "jupyter-remote-compute")
    package = REPO
    if not readable_by_all(REPO / "jupyter_remote_compute" / "__init__.py"):
        package = public / "python"
        ignore = shutil.ignore_patterns("__pycache__", "labextension")
        shutil.copytree(REPO / "jupyter_remote_compute", package / "jupyter_remote_compute", ignore=ignore)
    subprocess.run(["chmod", "-R", "a+rX", str(public)], check=True)
    return {
        "PATH": f"{public / 'bin'}:{build.bin}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": str(package),
        "JUPYTER_CONFIG_PATH": str(public / "etc" / "jupyter"),
        "JUPYTER_PATH": str(public / "share" / "jupyter"),
        "LANG": "C.UTF-8",
    }


def readable_by_all(path: Path) -> bool:
    """Whether any user can read the file ``path``: it is world-readable, every folder above searchable."""
    return bool(path.stat().st_mode & 0o004) and searchable_by_all(path.parent)


def searchable_by_all(folder: Path) -> bool:
    """Whether any user can reach what is in ``folder`` (it and every folder above it are o+x)."""
    return all(p.stat().st_mode & 0o001 for p in (folder, *folder.parents))


def _config(
    hub_dir: Path,
    build: HubBuild,
    environment: dict[str, str],
    ports: dict[str, int],
    password: str,
    admin_token: str,
    service: dict[str, object],
    service_scopes: Sequence[str],
) -> str:
    """``jupyterhub_config.py`` for one hub; every value is written as a Python literal."""
    v = repr
    roles = [
        # The default ``user`` role, and the service's door: without it no user reaches the service.
        {"name": "user", "scopes": ["self", f"access:services!service={SERVICE}"]},
        {"name": "remote-compute-users", "scopes": [USE], "groups": [GROUP]},
        {"name": "remote-compute-admins", "scopes": [ADMIN], "users": [ADMIN_USER]},
        {
            "name": "bed-admin",
            "scopes": BED_ADMIN_SCOPES,
            "services": ["bed-admin"],
        },
    ]
    if service_scopes:
        roles.append({"name": "remote-compute-service", "scopes": list(service_scopes), "services": [SERVICE]})
    return f"""# Written by tests/hub_fixture.py for one test session.
c = get_config()  # noqa
c.JupyterHub.bind_url = {v(f"http://127.0.0.1:{ports['proxy']}/")}
c.JupyterHub.hub_bind_url = {v(f"http://127.0.0.1:{ports['hub']}")}
c.ConfigurableHTTPProxy.api_url = {v(f"http://127.0.0.1:{ports['proxy_api']}")}
c.ConfigurableHTTPProxy.command = [{v(str(build.proxy))}]
c.ConfigurableHTTPProxy.pid_file = {v(str(hub_dir / "proxy.pid"))}
c.JupyterHub.pid_file = {v(str(hub_dir / "hub.pid"))}
c.JupyterHub.db_url = {v(f"sqlite:///{hub_dir / 'jupyterhub.sqlite'}")}
c.JupyterHub.cookie_secret_file = {v(str(hub_dir / "cookie_secret"))}
c.JupyterHub.cleanup_servers = True

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {v(password)}
c.Authenticator.allowed_users = {v(set(USERS))}

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{v(str(build.bin / "jupyterhub-singleuser"))}]
c.Spawner.ip = "127.0.0.1"
c.Spawner.environment = {v(environment)}
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
c.Spawner.server_token_scopes = {v(SERVER_TOKEN_SCOPES)}

c.JupyterHub.custom_scopes = {v(CUSTOM_SCOPES)}
c.JupyterHub.load_groups = {v({GROUP: {"users": list(MEMBERS)}})}
c.JupyterHub.load_roles = {v(roles)}
c.JupyterHub.services = {v([service, {"name": "bed-admin", "api_token": admin_token}])}
"""


def start_hub(
    build: HubBuild,
    service_command: Sequence[str],
    service_environment: dict[str, str] | None = None,
    service_scopes: Sequence[str] = (),
    oauth_scopes: Sequence[str] = (USE, ADMIN),
    service_options: dict[str, object] | None = None,
    timeout: float = 60,
) -> Hub:
    """Start a hub whose ``remote-compute`` service runs ``service_command`` and wait until it answers.

    The service's environment is the clone's (``PYTHONPATH``, ``PATH`` with ``jupyter-remote-compute``)
    plus ``service_environment``; ``service_scopes`` are what the service's own token may do in the hub's
    API; ``oauth_scopes`` what users' OAuth tokens for it may carry; ``service_options`` any other keys
    of its ``c.JupyterHub.services`` entry (``user``, ``cwd``, …)."""
    # The spawned users read its public/: under the TMPDIR unless that is closed to them.
    tmp = Path(tempfile.gettempdir())
    workdir = Path(tempfile.mkdtemp(prefix="jrc-hub-", dir=tmp if searchable_by_all(tmp) else "/tmp"))
    try:
        os.chmod(workdir, 0o755)  # the spawned users read public/
        environment = _public_folder(workdir / "public", build)
        hub_dir = workdir / "hub"
        hub_dir.mkdir(mode=0o700)  # the config (passwords, tokens), the database, the cookie secret
        ports = {name: free_port() for name in ("proxy", "hub", "proxy_api", "service")}
        password = secrets.token_urlsafe(12)
        admin_token = secrets.token_hex(32)
        service_url = f"http://127.0.0.1:{ports['service']}"
        service = {
            "name": SERVICE,
            "url": service_url,
            "command": list(service_command),
            "environment": {**environment, **(service_environment or {})},
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": list(oauth_scopes),
            **(service_options or {}),
        }
        config = hub_dir / "jupyterhub_config.py"
        # Users' servers find the service as the README's configuration tells them to.
        servers = {**environment, "REMOTE_COMPUTE_ORG_URL": f"{service_url}/services/{SERVICE}/"}
        config.write_text(_config(hub_dir, build, servers, ports, password, admin_token, service, service_scopes))
        log = hub_dir / "jupyterhub.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                # SIGINT at its default, whatever this process inherited: the hub stops its service with
                # SIGINT first, and a service started with SIGINT ignored holds the hub's stop up.
                [str(build.python), "-c", _DEFAULT_SIGINT, str(build.bin / "jupyterhub"), "-f", str(config)],
                cwd=hub_dir,
                env={"PATH": environment["PATH"], "LANG": "C.UTF-8", "HOME": str(hub_dir)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    hub = Hub(workdir, f"http://127.0.0.1:{ports['proxy']}/", f"http://127.0.0.1:{ports['hub']}/", service_url,
              admin_token, password, proc, log, build)  # fmt: skip

    def up() -> bool:
        hub._check_alive()
        with contextlib.suppress(requests.RequestException):
            return hub.api("GET", "services", timeout=2).ok and _answers(service_url)
        return False

    try:
        wait_for(up, timeout, f"the hub on {hub.url} and its service on {service_url}")
    except TimeoutError as e:
        said = log.read_text(errors="replace")[-4000:]
        hub.stop()
        raise TimeoutError(f"{e}; the hub's log ends:\n{said}") from None
    except BaseException:
        hub.stop()
        raise
    return hub


def organization_service(state: Path) -> dict[str, object]:
    """``start_hub``'s service arguments for this package's organization service, its state in ``state``:
    the command the README's configuration names, its secrets in a file there (no keyring on the bed)."""
    return {
        "service_command": ["jupyter-remote-compute", "organization", "--state-dir", str(state)],
        "service_environment": {
            "JUPYTER_REMOTE_COMPUTE_SECRETS_STORE": "file",
            "JUPYTER_REMOTE_COMPUTE_SECRETS_FILE": str(state / "secrets.json"),
        },
    }


_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)


def _answers(url: str) -> bool:
    try:
        loopback_session().get(url, timeout=2, allow_redirects=False)
    except requests.RequestException:
        return False
    return True


# -- pytest fixtures -----------------------------------------------------------


class HubBed:
    """Starts hubs for a module's tests and stops every one at its end."""

    def __init__(self, build: HubBuild) -> None:
        self.build = build
        self.hubs: list[Hub] = []

    def start(self, service_command: Sequence[str], **options: object) -> Hub:
        """``start_hub`` with this machine's build (its keyword arguments as there)."""
        hub = start_hub(self.build, service_command, **options)  # type: ignore[arg-type]
        self.hubs.append(hub)
        return hub

    def stop(self) -> None:
        for hub in self.hubs:
            hub.stop()


def _bed_prerequisites() -> HubBuild:
    """What every hub of the bed needs (root, useradd, node, Debian's Python, the cached build), its
    users made: the build, or the test skipped saying what is missing."""
    require(os.geteuid() == 0, "root, to add the hub's Linux users and spawn their servers")
    require(shutil.which("useradd") is not None, "useradd (apt-get install passwd)")
    # configurable-http-proxy runs on node; npm is needed only for a build (build_hub says so then).
    require(shutil.which("node") is not None, "node, for configurable-http-proxy (apt-get install nodejs npm)")
    # uv makes the venv itself: Debian's python3 is needed, its venv module (python3-venv) is not.
    require(os.path.exists(DEBIAN_PYTHON), f"Debian's {DEBIAN_PYTHON} (apt-get install python3)")
    build, how = build_hub()
    require(build is not None, f"the hub's venv and proxy ({how})")
    assert build is not None
    ensure_users()
    return build


@pytest.fixture(scope="module")
def hub_bed() -> Iterator[HubBed]:
    """Test users and the cached build; ``hub_bed.start(service_command=[…])`` starts a hub.

    A module's: the users are released between modules, so the Galata hub run waits for one module at
    most, not for the whole session."""
    build = _bed_prerequisites()
    with contextlib.ExitStack() as held:
        with timeout_paused():
            held.enter_context(users_held())
        bed = HubBed(build)
        try:
            yield bed
        finally:
            bed.stop()


class _SharedOrganization:
    """One hub with the organization service for every module of the serial group ``hub`` that asks for
    it (``shared_organization``), instead of one per module: its start and its users' spawns are 30-45 s.

    It holds the users from its start until ``release`` (conftest's teardown hook, once the next test is
    outside the group, and at the session's end), so the Galata hub run waits for the group, not for the
    rest of the session. Each module resets what it changes on it (its machines, the tracking server,
    quotas, the default machine)."""

    def __init__(self) -> None:
        self.running: tuple[Hub, Path] | None = None
        self._held = contextlib.ExitStack()

    def get(self, tmp_path_factory: pytest.TempPathFactory) -> tuple[Hub, Path]:
        if self.running is not None and self.running[0].proc.poll() is None:
            return self.running
        self.release()
        build = _bed_prerequisites()
        with timeout_paused():
            self._held.enter_context(users_held())
        try:
            state = tmp_path_factory.mktemp("organization")
            hub = start_hub(build, **organization_service(state))  # type: ignore[arg-type]
        except BaseException:
            self._held.close()
            raise
        self.running = (hub, state)
        return self.running

    def release(self) -> None:
        running, self.running = self.running, None
        try:
            if running is not None:
                running[0].stop()
        finally:
            self._held.close()


_SHARED = _SharedOrganization()


def shared_organization(tmp_path_factory: pytest.TempPathFactory) -> tuple[Hub, Path]:
    """The group's hub with the organization service and the folder of its state, started if none runs."""
    return _SHARED.get(tmp_path_factory)


def release_shared_organization() -> None:
    """Stop the group's hub, if one runs, and let the users go."""
    _SHARED.release()


if __name__ == "__main__":
    built, how = build_hub()
    print(f"JupyterHub for tests/test_hub_bed.py: {how}")
    sys.exit(0 if built else 1)
