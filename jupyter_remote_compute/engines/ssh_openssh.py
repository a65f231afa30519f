"""The ssh engine's OpenSSH transport: the user's own ``ssh`` client, over one master this process owns.

One master connection per machine (``ControlMaster``, its ``ControlPath`` in a
private 0700 directory, ``ControlPersist`` off) signs in the way the user's
``ssh`` would: ProxyJump, ProxyCommand, certificates, IdentityAgent, Match,
whatever the ssh config says. Every call is then one multiplexed session: a
short-lived ``ssh`` mux client whose stdin, stdout and stderr are pipes of
this process, so bulk data moves through OpenSSH's own packet loop, with the
cipher the user's config chooses.

The master's own session runs ``cat >/dev/null`` with its stdin a pipe of
this process: when this process ends, however it ends, that pipe closes, the
session ends and the master goes with it. ``close`` ends it at once.

Both transports read the same files: ``ssh`` is given a generated config
(``-F``) that sets ``BatchMode`` for every hop, includes the ssh config the
product resolved (``~`` from $HOME, where OpenSSH would take the passwd
entry's home) and the system one, and names the known_hosts files the
product resolved (``UserKnownHostsFile``). Host keys are checked by OpenSSH
itself, strictly unless the user's own config says otherwise; an unknown key
is fetched with a throw-away known_hosts file only to show its fingerprint,
and recorded only by ``trust_host``. Nothing is ever prompted for: BatchMode,
no ``SSH_ASKPASS``, no controlling terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from . import ssh_config
from .base import EngineError
from .ssh_connection import CONNECT_TIMEOUT, AuthenticationFailed, Connection, HostKeyChanged, host_key_error
from .transport import Dropped, ProcessChannel, popen, sh_script, wait_fd

SSH = "ssh"
MASTER_READY = b"JRC-MASTER-READY"
# Variables that could make ssh ask for something, or reach for a display: never passed on.
_DROPPED_ENV = ("SSH_ASKPASS", "SSH_ASKPASS_REQUIRE", "DISPLAY", "WAYLAND_DISPLAY")


def available() -> bool:
    """Whether an OpenSSH client is on PATH."""
    return shutil.which(SSH) is not None


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}


def _option_value(value: str) -> str:
    """A value for ``-o Key=value`` or a config line: quoted when it holds a space (ssh's own rule)."""
    return f'"{value}"' if any(c.isspace() for c in value) else value


class _Master:
    """The master ssh process: ``is_active`` is what paramiko's ``Transport.is_active`` says."""

    def __init__(self, proc: subprocess.Popen[bytes], control_path: str) -> None:
        self.proc = proc
        self.control_path = control_path

    def is_active(self) -> bool:
        return self.proc.poll() is None

    def ends_within(self, seconds: float) -> bool:
        """Whether the master has exited, or does within ``seconds``."""
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            return False
        return True


class OpenSSHConnection(Connection):
    """The machine reached through the ``ssh`` client, over one master connection owned by this object."""

    transport_name = "openssh"
    runs_proxy_command = True

    def __init__(self, name: str, address: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, address, options)
        self._dir: str | None = None
        self._dir_finalizer: weakref.finalize | None = None
        self._master: _Master | None = None
        self._finalizer: weakref.finalize | None = None

    # -- files ssh reads --------------------------------------------------------------

    def _private_dir(self) -> str:
        if self._dir is None or not os.path.isdir(self._dir):
            if self._dir_finalizer is not None:
                self._dir_finalizer.detach()  # that dir was removed under us
            # A socket path must stay under ~100 bytes: a long TMPDIR falls back to /tmp.
            parent = tempfile.gettempdir()
            if len(parent) > 60:
                parent = "/tmp"
            self._dir = tempfile.mkdtemp(prefix="jrc-ssh-", dir=parent)  # mode 0700
            os.chmod(self._dir, 0o700)
            # Removed by close(), else with this object or the interpreter: a connection whose sign-in
            # failed has no master to end but has written its config and log here.
            self._dir_finalizer = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        return self._dir

    def _known_hosts_files(self) -> str:
        return " ".join(_option_value(p) for p in self.hop().known_hosts)

    def _config_file(self) -> str:
        """The config ssh reads (``-F``): BatchMode and known_hosts for every hop, then the user's and the system's."""
        opts = self.machine_options
        lines = ["# written by jupyter-remote-compute for one connection; removed when it closes", "BatchMode yes"]
        if opts.get("known_hosts"):
            # A chosen known_hosts file is the machine's trust store for the whole route (jump hosts too).
            path = str(Path(opts["known_hosts"]).expanduser())
            lines.append(f"UserKnownHostsFile {_option_value(path)}")
        user_config = self.config_path()
        if os.path.isfile(user_config):
            lines.append(f"Include {_option_value(user_config)}")
        if os.path.isfile(ssh_config.SYSTEM_CONFIG):
            lines.append(f"Include {ssh_config.SYSTEM_CONFIG}")
        # Defaults where the user's config says nothing (the first value ssh finds wins): the product's.
        home_known = str(Path("~/.ssh/known_hosts").expanduser())
        lines += [
            f"UserKnownHostsFile {_option_value(home_known)}",
            f"ConnectTimeout {int(CONNECT_TIMEOUT)}",
            "ServerAliveInterval 30",
        ]
        path = os.path.join(self._private_dir(), "config")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def _target_args(self, known_hosts: str | None = None) -> list[str]:
        """ssh's options for the target (what ``ssh -l/-p/-i`` would say); on ssh's command line the first wins."""
        opts = self.machine_options
        known = known_hosts or self._known_hosts_files()
        args = ["-F", self._config_file(), "-o", f"UserKnownHostsFile={known}"]
        if opts.get("user"):
            args += ["-l", str(opts["user"])]
        if opts.get("port"):
            args += ["-p", str(opts["port"])]
        if opts.get("identity_file"):
            args += ["-i", str(Path(opts["identity_file"]).expanduser()), "-o", "IdentitiesOnly=yes"]
        return args

    # -- the master -------------------------------------------------------------------

    def _start_master(self) -> _Master:
        control = os.path.join(self._private_dir(), "master")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(control)
        log_path = os.path.join(self._private_dir(), "master.log")
        argv = [
            SSH,
            *self._target_args(),
            "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR",
            "-o", "ControlMaster=yes",
            "-o", f"ControlPath={control}",
            "-o", "ControlPersist=no",
            # A job runner's connection: no forwardings the user's config may ask for elsewhere.
            "-o", "ClearAllForwardings=yes",
            "-o", "ForwardAgent=no",
            "-o", "ForwardX11=no",
            "-o", "RemoteCommand=none",
            "-o", "RequestTTY=no",
            "-o", "PermitLocalCommand=no",
            "-e", "none",
            "--",
            self.address,
            sh_script(f"echo {MASTER_READY.decode()}; exec cat >/dev/null"),
        ]  # fmt: skip
        with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=_env(),
                start_new_session=True,  # no controlling terminal: nothing can be prompted for
            )
        assert proc.stdout is not None
        hop = self.hop()
        deadline = time.monotonic() + 2 * hop.connect_timeout + 30
        line = b""
        try:
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not wait_fd(proc.stdout.fileno(), select.POLLIN, left):
                    raise EngineError(
                        f"timed out after {2 * hop.connect_timeout + 30:.0f}s signing in to {hop.label}",
                        transient=True,
                    )
                data = os.read(proc.stdout.fileno(), 256)
                if not data:
                    break
                line += data
        except BaseException:
            self._end(proc)
            raise
        if MASTER_READY not in line:
            self._end(proc)
            said = Path(log_path).read_text(errors="replace")
            raise self._sign_in_error(said, proc.returncode)
        proc.stdout.close()
        master = _Master(proc, control)
        # Ended with this object or with the interpreter, whichever comes first.
        self._finalizer = weakref.finalize(self, _end_master, proc)
        return master

    @staticmethod
    def _end(proc: subprocess.Popen[bytes]) -> None:
        _end_master(proc)

    def master(self) -> _Master:
        with self._lock:
            if self._master is not None and self._master.is_active():
                return self._master
            if self._master is not None:
                self._drop_master()
            self._master = self._start_master()
            self.connections_made += 1
            return self._master

    def _drop_master(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._master is not None:
            _end_master(self._master.proc)
            self._master = None

    def discard(self, master: _Master) -> None:
        with self._lock:
            if self._master is master:
                self._drop_master()

    def active(self) -> bool:
        return self._master is not None and self._master.is_active()

    def close(self) -> None:
        with self._lock:
            self._drop_master()
            if self._dir_finalizer is not None:
                self._dir_finalizer()  # removes the dir, once
                self._dir_finalizer = self._dir = None

    def round_trip(self) -> float:
        # The mux protocol has no ping: a session running the shell builtin ``exit`` is the cheapest
        # request the far side answers (one channel open and one exec, so an upper bound on the RTT).
        self.master()
        t0 = time.perf_counter()
        res = self.run("exit 0", timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: a round trip"), transient=True)
        return time.perf_counter() - t0

    # -- sessions -----------------------------------------------------------------------

    @contextlib.contextmanager
    def channel(self, command: str, timeout: float) -> Iterator[ProcessChannel]:
        with self._channels:
            master = self.master()
            argv = [
                SSH,
                "-F", "/dev/null",  # the master holds every setting; the user's config must not add a RemoteCommand
                "-o", f"ControlPath={master.control_path}",
                "-o", "ControlMaster=no",
                # Without the master, fail instead of quietly making a connection of its own.
                "-o", "ProxyCommand=false",
                "-o", "BatchMode=yes",
                "-o", "LogLevel=ERROR",
                "-e", "none",
                "-T", "-x", "-a",
                "--", "jrc-master", command,
            ]  # fmt: skip
            try:
                proc = popen(argv, _env())
            except OSError as e:
                raise EngineError(f"{self.name}: cannot run ssh: {e}") from None
            with self._lock:
                self.channels_opened += 1
            ch = ProcessChannel(proc, master, timeout)
            try:
                yield ch
            except (OSError, EOFError) as e:
                if isinstance(e, TimeoutError) and master.is_active():
                    raise EngineError(f"{self.name}: no answer for {timeout:.0f}s", transient=True) from None
                if not master.is_active():
                    self.discard(master)
                    raise Dropped(str(e) or type(e).__name__) from None
                if isinstance(e, BrokenPipeError | EOFError):
                    raise Dropped(str(e) or type(e).__name__) from None
                raise
            finally:
                ch.close()

    # -- host keys and sign-in errors ---------------------------------------------------------

    def _probe(self) -> tuple[bytes | None, str]:
        """The target's host key, fetched by ssh through the same route without signing in.

        It is recorded only in a throw-away known_hosts file (``accept-new`` there is how ssh hands
        a key over); the user's files are not touched. Returns (key blob or None, what ssh said).
        """
        probe_dir = tempfile.mkdtemp(prefix="probe-", dir=self._private_dir())
        try:
            known = os.path.join(probe_dir, "known_hosts")
            Path(known).touch(mode=0o600)
            argv = [
                SSH,
                *self._target_args(known_hosts=known),
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=accept-new",
                "-o", "HashKnownHosts=no",
                "-o", "UpdateHostKeys=no",
                "-o", "PreferredAuthentications=none",  # never signs in
                "-o", "BatchMode=yes",
                "-o", "LogLevel=ERROR",
                "-o", "ControlPath=none",
                "-o", "RemoteCommand=none",
                "-o", "ClearAllForwardings=yes",
                "-T",
                "--", self.address, "exit 0",
            ]  # fmt: skip
            hop = self.hop()
            try:
                res = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    env=_env(),
                    start_new_session=True,
                    timeout=2 * hop.connect_timeout + 30,
                )
            except subprocess.TimeoutExpired:
                raise EngineError(
                    f"timed out fetching the host key of {hop.known_hosts_name}", transient=True
                ) from None
            said = res.stderr.decode("utf-8", "replace")
            for entry in ssh_config.read_known_hosts([known]):
                return entry.blob, said
            return None, said
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)

    def _target_key(self) -> bytes:
        blob, said = self._probe()
        if blob is None:
            raise self._sign_in_error(said, 255, probing=True)
        return blob

    def _sign_in_error(self, said: str, code: int | None, probing: bool = False) -> EngineError:
        """ssh's own words on a failed sign-in as the engine's errors (the paramiko transport's, where they match)."""
        hop = self.hop()
        text = said.strip()
        last = text.splitlines()[-1].strip() if text else f"ssh exited with code {code}"
        if "Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text:
            if not probing:
                blob, _ = self._probe()
                if blob is not None:
                    refusal = host_key_error(hop, blob, is_target=True)
                    if refusal is not None:
                        return refusal
                    # OpenSSH refused a key our reading of known_hosts accepts (its config differs): its words.
                    return HostKeyChanged(f"ssh refused the host key of {hop.known_hosts_name}: {_tail(text)}")
            # The target's key could not even be fetched: a jump host on the way is not trusted.
            return EngineError(
                f"ssh refused the host key of a jump host on the way to {hop.known_hosts_name}: {_tail(text)} "
                "Record that host's key by connecting to it once with ssh yourself.",
                details={"can_trust": False},
            )
        if "Permission denied" in text or "Too many authentication failures" in text:
            return AuthenticationFailed(self._auth_message(hop, last))
        if re.search(r"Could not resolve hostname|Name or service not known|Temporary failure in name", text):
            return EngineError(f"cannot resolve host name {hop.hostname!r} (DNS): {last}", transient=True)
        where = f"{hop.hostname}:{hop.port}"
        if "Connection refused" in text:
            return EngineError(
                f"connection refused by {where}: no SSH server listens on that port ({last})", transient=True
            )
        if re.search(r"timed out|Connection timed out|Operation timed out", text):
            return EngineError(f"timed out connecting to {where}: {last}", transient=True)
        if re.search(r"Bad configuration option|bad configuration|garbage at end|Unsupported option|line \d+:", text):
            return EngineError(f"ssh cannot use the ssh config for {self.address}: {_tail(text)}")
        if re.search(
            r"Connection closed|Connection reset|kex_exchange_identification|No route to host|Network is", text
        ):
            return EngineError(f"no SSH session with {where}: {last}", transient=True)
        return EngineError(f"ssh could not connect to {hop.label} (exit code {code}): {_tail(text) or 'no message'}")

    def _auth_message(self, hop: ssh_config.Hop, said: str) -> str:
        tried = []
        notes = []
        for path in hop.identity_files:
            if not os.path.exists(path):
                if not hop.default_identities:
                    notes.append(f"key file {path} does not exist.")
                continue
            tried.append(f"key file {path}")
            if _encrypted(path):
                notes.append(f"key file {path} is encrypted: add it to your ssh-agent (ssh-add {path}).")
        if os.environ.get("SSH_AUTH_SOCK"):
            tried.append("the keys of ssh-agent")
        else:
            notes.append("no ssh-agent (SSH_AUTH_SOCK unset), unless the ssh config names one (IdentityAgent).")
        detail = "; ".join(tried) if tried else "no key at all"
        extra = (" " + " ".join(notes)) if notes else ""
        return f"authentication failed for {hop.label}: tried publickey with {detail}.{extra} ssh said: {said}"


def _encrypted(key: str) -> bool:
    """Whether a private key file needs a passphrase (asked of ssh-keygen with an empty one, never prompting)."""
    try:
        res = subprocess.run(
            ["ssh-keygen", "-y", "-P", "", "-f", key],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=_env(),
            start_new_session=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode != 0 and b"passphrase" in res.stderr


def _tail(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[-6:] if line.strip() and "@@@" not in line)[
        -1500:
    ]


def _end_master(proc: subprocess.Popen[bytes]) -> None:
    """Close the master's session input, then make sure the process is gone."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stdout is not None:
        with contextlib.suppress(OSError):
            proc.stdout.close()


__all__ = ["OpenSSHConnection", "available"]
