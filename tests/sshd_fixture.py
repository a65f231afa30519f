"""Real OpenSSH parts on loopback for the ssh engine's tests and its benchmark.

A session builds one test bed: temporary ed25519 host and user keys, a
dedicated unprivileged user with ``/bin/sh`` (created when missing and we are
root; otherwise the current user), a real ``sshd`` on 127.0.0.1, a second one
to jump through, a real ``ssh-agent`` holding the user key, a known_hosts
file and an ssh config with aliases. Everything is stopped at the end.

The plain functions (``build_testbed``) are also used by
``benchmarks/bench_ssh_transfer.py``; pytest fixtures are at the bottom.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from far_python import far_python_bin
from ports import free_port
from procs import proc_stats
from required import require
from waiting import wait_for

SSHD = "/usr/sbin/sshd"
TEST_USER = "jrc-ssh-test"


def keygen(path: Path, comment: str, passphrase: str = "") -> str:
    """Make an ed25519 key pair; return the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return Path(str(path) + ".pub").read_text().strip()


def ensure_user(name: str = TEST_USER) -> tuple[str, Path]:
    """A login user with /bin/sh: the dedicated test user if it exists or can be made, else ourselves."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = None
        if os.geteuid() == 0 and shutil.which("useradd"):
            made = subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], capture_output=True)
            if made.returncode == 0:
                entry = pwd.getpwnam(name)
    if entry is not None:
        if os.geteuid() == 0:
            # With UsePAM off, sshd refuses a user whose password field says "locked".
            subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        return entry.pw_name, Path(entry.pw_dir)
    me = pwd.getpwuid(os.geteuid())
    return me.pw_name, Path(me.pw_dir)


def terminate(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """TERM a process we started, KILL it if it does not go within 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclasses.dataclass
class SSHServer:
    """One running sshd, on 127.0.0.1 unless it was started elsewhere (a network namespace's address)."""

    port: int
    host_key: Path
    host_pub: str  # "ssh-ed25519 AAAA..."
    config: Path
    log: Path
    proc: subprocess.Popen
    address: str = "127.0.0.1"
    argv: tuple[str, ...] = ()  # how it was started (in its namespace, say), to start it again

    @property
    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {self.host_pub}\n"

    def session_pids(self) -> list[int]:
        """Per-connection sshd processes: the listener's children and theirs (not detached jobs)."""
        parents = {pid: int(fields[1]) for pid, fields in proc_stats()}
        found: list[int] = []
        frontier = [self.proc.pid]
        while frontier:
            parent = frontier.pop()
            children = [pid for pid, ppid in parents.items() if ppid == parent]
            found.extend(children)
            frontier.extend(children)
        return found

    def cut_sessions(self) -> list[int]:
        """Kill every sshd process serving a connection: the network drops under the client.

        A session process may end between the listing and the kill (its parent went first): fine.
        """
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def start_again(self) -> None:
        """After ``stop``: the same sshd (its config, host key and address) listening again."""
        self.proc = subprocess.Popen(list(self.argv), stdin=subprocess.DEVNULL)
        wait_for(lambda: _banner(self.port, self.address), 20, f"sshd on {self.address}:{self.port} again")

    def stop(self) -> None:
        # Session processes are our own children's children: end them too, by pid (listed before the
        # listener goes: then they are no longer its children).
        sessions = self.session_pids()
        terminate(self.proc)
        for pid in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _banner(port: int, address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def start_sshd(
    workdir: Path,
    name: str,
    authorized_keys: Path,
    extra: str = "",
    *,
    address: str = "127.0.0.1",
    port: int | None = None,
    wrap: Callable[[list[str]], list[str]] | None = None,
) -> SSHServer:
    """Start ``sshd -D`` on a free loopback port and wait until it answers with its banner; elsewhere with
    ``address`` and ``port``, run as ``wrap`` makes its argv (inside a network namespace, say)."""
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation dir
    host_key = workdir / f"{name}_host_ed25519"
    host_pub = keygen(host_key, f"{name}-host")
    host_pub = " ".join(host_pub.split()[:2])
    port = port or free_port()
    config = workdir / f"{name}_sshd_config"
    log = workdir / f"{name}_sshd.log"
    config.write_text(
        f"""Port {port}
ListenAddress {address}
HostKey {host_key}
PidFile {workdir / f"{name}_sshd.pid"}
UsePAM no
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile {authorized_keys}
Subsystem sftp internal-sftp
PermitRootLogin prohibit-password
MaxSessions 32
MaxStartups 50:30:100
LogLevel DEBUG1
{extra}
"""
    )
    argv = [SSHD, "-D", "-f", str(config), "-E", str(log)]
    argv = wrap(argv) if wrap else argv
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    server = SSHServer(port, host_key, host_pub, config, log, proc, address, tuple(argv))

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text() if log.exists() else ''}")
        return _banner(port, address)

    try:
        wait_for(ready, 20, f"sshd {name} on port {port}")
    except BaseException:
        server.stop()
        raise
    return server


@dataclasses.dataclass
class Agent:
    sock: Path
    proc: subprocess.Popen

    def stop(self) -> None:
        terminate(self.proc)


def start_agent(workdir: Path, keys: list[Path]) -> Agent:
    sock = workdir / "agent.sock"
    # -D: stay in the foreground, so the process we hold is the agent itself.
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    agent = Agent(sock, proc)
    try:
        wait_for(lambda: sock.exists() or proc.poll() is not None, 10, "ssh-agent socket")
        if proc.poll() is not None:
            raise RuntimeError(f"ssh-agent exited with {proc.returncode}")
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}

        def answers() -> bool:
            # The socket is bound before the agent listens: on a busy machine a first client can be
            # refused. `ssh-add -l` says 1 (no identities) once it is connected, 2 while it cannot be.
            listed = subprocess.run(["ssh-add", "-l"], env=env, capture_output=True)
            return listed.returncode != 2 or proc.poll() is not None

        wait_for(answers, 10, "ssh-agent to answer")
        for key in keys:
            subprocess.run(["ssh-add", "-q", str(key)], check=True, env=env, capture_output=True)
    except BaseException:
        agent.stop()
        raise
    return agent


@dataclasses.dataclass
class TestBed:
    """Everything a test needs to reach the loopback sshd."""

    __test__ = False  # not a test class, despite its name

    workdir: Path
    user: str
    home: Path
    user_key: Path  # unencrypted, also loaded in the agent
    locked_key: Path  # encrypted with a passphrase, not in the agent
    agent: Agent
    sshd: SSHServer
    jump: SSHServer
    known_hosts: Path
    ssh_config: Path
    base_dir: str  # far-side base dir for this session, under the user's home ("~/...")
    # a key in no authorized_keys file, with an OpenSSH certificate (<key>-cert.pub) from the CA the main sshd trusts
    cert_key: Path | None = None

    def options(self, **over) -> dict:
        """Machine options for a direct connection to the main sshd (address 127.0.0.1)."""
        opts = {
            "user": self.user,
            "port": self.sshd.port,
            "known_hosts": str(self.known_hosts),
            "ssh_config": str(self.ssh_config),
            "base_dir": self.base_dir,
        }
        opts.update(over)
        return opts

    def far_path(self, relative: str) -> Path:
        """Where ``~/<relative>`` of the test user is, seen from this side (same machine)."""
        return self.home / relative

    def stop(self) -> None:
        for part in (self.agent, self.jump, self.sshd):
            with contextlib.suppress(Exception):
                part.stop()
        base = self.base_dir.removeprefix("~/")
        shutil.rmtree(self.home / base, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def build_testbed(rekey_limit: str | None = None) -> TestBed:
    """Start sshd (main + jump), the agent, and write known_hosts and an ssh config.

    The main sshd keeps OpenSSH's default re-key limit (64 GiB with AES), so only the client could
    re-key at paramiko's 512 MiB; ``rekey_limit`` applies to the jump sshd.
    """
    workdir = Path(tempfile.mkdtemp(prefix="jrc-sshd-"))
    os.chmod(workdir, 0o755)  # sshd (as root) and the test user read from here
    user, home = ensure_user()
    user_key = workdir / "id_user"
    user_pub = keygen(user_key, "jrc-test-user")
    locked_key = workdir / "id_locked"
    keygen(locked_key, "jrc-locked", passphrase="not-asked-for")
    authorized = workdir / "authorized_keys"
    authorized.write_text(user_pub + "\n" + Path(str(locked_key) + ".pub").read_text())
    os.chmod(authorized, 0o644)
    # A user CA the main sshd trusts (TrustedUserCAKeys), and a key that signs in only by its certificate.
    user_ca = workdir / "user_ca"
    keygen(user_ca, "jrc-user-ca")
    cert_key = workdir / "id_cert"
    keygen(cert_key, "jrc-cert-user")
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(user_ca), "-I", "jrc-test-cert", "-n", user, "-V", "-5m:+1d", f"{cert_key}.pub"],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    for key in (user_key, locked_key, cert_key):
        # The client (root) reads them; keep them private as ssh expects.
        os.chmod(key, 0o600)
    # The far side's Python has MLflow, as a training machine's would (scripts log to it there).
    path = f"SetEnv PATH={far_python_bin()}:/usr/local/bin:/usr/bin:/bin"
    sshd = start_sshd(workdir, "main", authorized, f"{path}\nTrustedUserCAKeys {user_ca}.pub")
    try:
        # The jump sshd re-keys often by itself, so tests can see server-initiated re-keys at work.
        rekey = f"RekeyLimit {rekey_limit}" if rekey_limit else ""
        jump = start_sshd(workdir, "jump", authorized, f"{path}\n{rekey}")
    except BaseException:
        sshd.stop()
        raise
    try:
        agent = start_agent(workdir, [user_key])
    except BaseException:
        sshd.stop()
        jump.stop()
        raise
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line + jump.known_hosts_line)
    ssh_config = workdir / "ssh_config"
    ssh_config.write_text(
        f"""# aliases for the engine tests
Host testbox
    HostName 127.0.0.1
    User {user}
    Port {sshd.port}
    IdentityFile {user_key}
    IdentitiesOnly yes
    ServerAliveInterval 5

Host lockedbox
    HostName 127.0.0.1
    User {user}
    Port {sshd.port}
    IdentityFile {locked_key}
    IdentitiesOnly yes

Host jumpbox
    HostName 127.0.0.1
    User {user}
    Port {jump.port}
    IdentityFile {user_key}

Host viajump
    HostName 127.0.0.1
    User {user}
    Port {sshd.port}
    IdentityFile {user_key}
    ProxyJump jumpbox

Host viatwojumps
    HostName 127.0.0.1
    User {user}
    Port {sshd.port}
    IdentityFile {user_key}
    ProxyJump jumpbox,{user}@127.0.0.1:{jump.port}

# Through a command (OpenSSH transport only): ssh -W through the jump sshd, so its log shows the route.
Host viaproxycommand
    HostName 127.0.0.1
    User {user}
    Port {sshd.port}
    IdentityFile {user_key}
    IdentitiesOnly yes
    ProxyCommand ssh -F {workdir / "ssh_config"} -o UserKnownHostsFile={known_hosts} -o BatchMode=yes -W %h:%p jumpbox

# The key is in an agent the config names (no SSH_AUTH_SOCK needed), and in no key file.
Host agentbox
    HostName 127.0.0.1
    User {user}
    Port {sshd.port}
    IdentityAgent {agent.sock}

# A key the sshd knows only through its certificate.
Host certbox
    HostName 127.0.0.1
    User {user}
    Port {sshd.port}
    IdentityFile {cert_key}
    CertificateFile {cert_key}-cert.pub
    IdentitiesOnly yes
"""
    )
    base_dir = f"~/.jrc-test-{uuid.uuid4().hex[:8]}"
    return TestBed(
        workdir, user, home, user_key, locked_key, agent, sshd, jump, known_hosts, ssh_config, base_dir, cert_key
    )


# -- pytest fixtures ---------------------------------------------------------


@pytest.fixture(scope="session")
def sshd_bed() -> Iterator[TestBed]:
    require(os.path.exists(SSHD), f"{SSHD} (apt-get install openssh-server openssh-client)")
    bed = build_testbed(rekey_limit="64M")
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture(params=["openssh", "paramiko"])
def ssh_transport(request: pytest.FixtureRequest) -> str:
    """The ssh engine's transport (machine option ``ssh_transport``): a test taking it runs once with each."""
    return request.param


@pytest.fixture
def ssh_agent_env(sshd_bed: TestBed, monkeypatch: pytest.MonkeyPatch) -> TestBed:
    """The test bed, with SSH_AUTH_SOCK pointing at its agent for this test only."""
    monkeypatch.setenv("SSH_AUTH_SOCK", str(sshd_bed.agent.sock))
    return sshd_bed
