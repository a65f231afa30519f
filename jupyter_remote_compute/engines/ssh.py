"""Machines reached over SSH (paramiko), needing only POSIX sh, tar and coreutils on the far side.

One authenticated connection per engine instance (through any ProxyJump hops)
carries every call as its own exec channel; at most ``MAX_CHANNELS`` run at
once. A dropped connection is re-made on the next call; calls that change
nothing on the far side are retried once on a fresh connection.

Far-side layout (``base_dir``, default ``~/.jupyter-remote-compute``)::

    <base>/cache/<sha256>          inputs by content, read-only, written by rename
    <base>/jobs/<job id>/          the job directory of ``base.py`` (work/, mlruns/, log, ...)

Inputs are hard links into the cache, so a re-sent file costs a name, not its
bytes. Every value put into a far-side command is quoted; file names travel
inside tar headers, never through a shell.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import posixpath
import queue
import re
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import paramiko

from . import ssh_config
from .base import (
    TRACKING_DIR,
    WORK_DIR,
    Engine,
    EngineContext,
    EngineError,
    FetchResult,
    InputFile,
    LaunchSpec,
    OptionField,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from .launcher import LAUNCH_SH, RUN_SH, command_script, launch_input
from .ssh_transfer import (
    BLOCK,
    CHUNK,
    END_OF_ARCHIVE,
    SafeExtractor,
    TarReader,
    UnsafeArchive,
    check_digest,
    check_relpath,
    padding,
    parse_sha256sum,
    tar_header,
)

DEFAULT_BASE_DIR = "~/.jupyter-remote-compute"
MAX_CHANNELS = 4
# paramiko's default receive window (2 MiB). Larger windows made downloads several times slower here
# (TESTBED; measured again: 32 MiB gave ~200 MB/s against ~400-700 at 2 MiB); uploads are bounded by
# the server's window, not ours.
WINDOW_SIZE = 2 << 20
MAX_PACKET = 32 << 10
# AES-GCM first: the fastest cipher both paramiko and OpenSSH offer (TESTBED: raw ssh ~495 vs 292-369 MB/s
# with chacha20); aes128-ctr next. Everything else paramiko knows stays allowed after them.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes128-ctr", "aes256-gcm@openssh.com", "aes256-ctr")
# paramiko re-keys on its own after 2^29 bytes or packets, and a re-key that lands while a channel closes
# can deadlock ("Key-exchange timed out waiting for key negotiation"; paramiko issue #822; seen twice in
# three runs in TESTBED and again here). Re-keys the server starts are handled safely, and OpenSSH always
# starts one at its own limit (RekeyLimit, 2^32 blocks = 64 GiB for AES by default), so paramiko's own
# trigger is moved out of reach and the server decides.
REKEY_NEVER = 1 << 62
READ_AHEAD = 3  # chunks read and hashed ahead of the one being sent
SMALL_FILE = 256 << 10  # inputs up to this size are read whole and batched with their neighbours
CONNECT_TIMEOUT = 15.0
CALL_TIMEOUT = 120.0  # seconds without progress on one channel
_UNSAFE_ADDRESS = re.compile(r"[\s;&|<>()$`\\\"'*?\[\]{}!#~^,]")
_ONE_LINE = re.compile(r"^[^\r\n\0]+$")


class HostKeyUnknown(EngineError):
    """The machine's host key is in no known_hosts file; ``trust_host`` records it."""

    def __init__(self, message: str, keytype: str, fingerprint: str) -> None:
        host_key = {"type": keytype, "fingerprint": fingerprint}
        super().__init__(message, details={"host_key": host_key, "can_trust": True})
        self.keytype = keytype
        self.fingerprint = fingerprint


class HostKeyChanged(EngineError):
    """The machine presents a key other than the one recorded: refused, never trusted automatically."""


class AuthenticationFailed(EngineError):
    """No key was accepted (the message lists what was tried)."""


class _Dropped(Exception):
    """The connection went away under a call; the call may be retried on a new one."""


@dataclasses.dataclass
class _Result:
    code: int
    out: bytes
    err: bytes

    def text(self) -> str:
        return self.out.decode("utf-8", "replace")

    def error(self, what: str) -> str:
        detail = (self.err or self.out).decode("utf-8", "replace").strip()
        return f"{what} failed (exit code {self.code}): {detail[-1500:] or 'no message'}"


@dataclasses.dataclass
class _Link:
    """An authenticated connection: jump transports first, the target last."""

    transports: list[paramiko.Transport]

    @property
    def target(self) -> paramiko.Transport:
        return self.transports[-1]

    def active(self) -> bool:
        return all(t.is_active() for t in self.transports)

    def close(self) -> None:
        for t in reversed(self.transports):
            with contextlib.suppress(Exception):
                t.close()


def _q(value: str) -> str:
    return shlex.quote(value)


def _script(body: str) -> str:
    """Run ``body`` under /bin/sh whatever the login shell is, so its syntax is POSIX sh's."""
    return "sh -c " + _q(body)


# Process groups with at least one member that is not a zombie, as " pg1 pg2 ... ".
# /proc where it exists (one read per process, no external command), ps otherwise. The fields after the
# command name hold no glob characters, so the unquoted split is safe.
_ALIVE_GROUPS = r"""
alive_groups() {
  if [ -r /proc/self/stat ]; then
    for f in /proc/[0-9]*/stat; do
      line=
      read -r line 2>/dev/null < "$f" || continue
      rest=${line##*")"}
      set -- $rest
      case $1 in Z|X|x) ;; *) printf ' %s' "$3" ;; esac
    done
  else
    ps -A -o pgid= -o stat= | while read -r g s; do case $s in Z*) ;; *) printf ' %s' "$g" ;; esac; done
  fi
}
group_pids() {
  if [ -r /proc/self/stat ]; then
    for f in /proc/[0-9]*/stat; do
      line=
      read -r line 2>/dev/null < "$f" || continue
      pid=${line%% *}
      rest=${line##*")"}
      set -- $rest
      case $1 in Z|X|x) ;; *) [ "$3" = "$target_pg" ] && printf ' %s' "$pid" ;; esac
    done
  else
    ps -A -o pid= -o pgid= -o stat= | while read -r p g s; do
      case $s in Z*) ;; *) [ "$g" = "$target_pg" ] && printf ' %s' "$p" ;; esac
    done
  fi
}
"""


class SSHEngine(Engine):
    """A machine reached over SSH: the user's agent and ssh config, host keys from known_hosts."""

    kind = "ssh"
    label = "SSH"
    remote = True
    options = {
        "user": OptionField(str, "User name on the machine (default: from ssh config, else your local name)"),
        "port": OptionField(int, "SSH port (default: from ssh config, else 22)"),
        "identity_file": OptionField(str, "Private key file to sign in with (default: ssh-agent and ssh config)"),
        "base_dir": OptionField(str, f"Directory for jobs and the input cache on the machine ({DEFAULT_BASE_DIR})"),
        "known_hosts": OptionField(str, "known_hosts file checked and written (default ~/.ssh/known_hosts)"),
        "ssh_config": OptionField(str, "ssh config file read for the address (default ~/.ssh/config)"),
    }

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        super().__init__(name, self.validate_address(address), options, context)
        for key in ("base_dir", "known_hosts", "ssh_config", "identity_file", "user"):
            value = self.machine_options.get(key)
            if value is not None and (not isinstance(value, str) or not _ONE_LINE.match(value)):
                raise ValueError(f"{key}: must be a non-empty single line")
        port = self.machine_options.get("port")
        if isinstance(port, str) and port.isdigit():
            port = self.machine_options["port"] = int(port)
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise ValueError("port: must be a number from 1 to 65535")
        self.base_dir = self.machine_options.get("base_dir") or DEFAULT_BASE_DIR
        self._lock = threading.Lock()  # guards the connection and the counters
        self._channels = threading.BoundedSemaphore(MAX_CHANNELS)
        self._link: _Link | None = None
        self._hop: ssh_config.Hop | None = None
        #: exec channels opened so far (tests count round trips with it)
        self.channels_opened = 0
        #: connections made so far (1 + reconnects)
        self.connections_made = 0

    # -- address and options ------------------------------------------------------

    @classmethod
    def validate_address(cls, address: str) -> str:
        address = super().validate_address(address)
        if address.startswith("-") or _UNSAFE_ADDRESS.search(address):
            raise ValueError(
                "address: use a host name, an IP address or an ssh config alias, optionally user@host "
                "(no spaces, no shell characters, not starting with '-')"
            )
        return address

    def hop(self) -> ssh_config.Hop:
        """The resolved route to the machine (re-read from the ssh config once per engine)."""
        if self._hop is None:
            opts = self.machine_options
            config = ssh_config.load_config(opts.get("ssh_config") or "~/.ssh/config")
            self._hop = ssh_config.resolve(
                self.address,
                config=config,
                user=opts.get("user"),
                port=opts.get("port"),
                identity_file=opts.get("identity_file"),
                known_hosts=opts.get("known_hosts"),
            )
        return self._hop

    # -- connecting -----------------------------------------------------------------

    def _socket(self, hop: ssh_config.Hop, via: paramiko.Transport | None) -> Any:
        where = f"{hop.hostname}:{hop.port}"
        if via is not None:
            try:
                return via.open_channel(
                    "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=hop.connect_timeout
                )
            except paramiko.ChannelException as e:
                raise EngineError(
                    f"the jump host could not open a connection to {where}: {e.text}", transient=True
                ) from None
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise EngineError(f"the jump host dropped the connection to {where}: {e}", transient=True) from None
        try:
            return socket.create_connection((hop.hostname, hop.port), timeout=hop.connect_timeout)
        except socket.gaierror as e:
            raise EngineError(
                f"cannot resolve host name {hop.hostname!r} (DNS): {e.strerror}", transient=True
            ) from None
        except ConnectionRefusedError:
            raise EngineError(
                f"connection refused by {where}: no SSH server listens on that port", transient=True
            ) from None
        except TimeoutError:
            raise EngineError(
                f"timed out after {hop.connect_timeout:.0f}s connecting to {where}", transient=True
            ) from None
        except OSError as e:
            raise EngineError(f"cannot connect to {where}: {e.strerror or e}", transient=True) from None

    def _handshake(self, hop: ssh_config.Hop, sock: Any) -> paramiko.Transport:
        """Key exchange only; the host key is checked by the caller."""
        t = paramiko.Transport(sock, default_window_size=WINDOW_SIZE, default_max_packet_size=MAX_PACKET)
        t.packetizer.REKEY_BYTES = REKEY_NEVER
        t.packetizer.REKEY_PACKETS = REKEY_NEVER
        sec = t.get_security_options()
        sec.ciphers = tuple(c for c in PREFERRED_CIPHERS if c in sec.ciphers) + tuple(
            c for c in sec.ciphers if c not in PREFERRED_CIPHERS
        )
        # Ask first for a key type known_hosts already has, so a host known by its RSA key is not
        # reported as unknown just because it also has an ed25519 one (ssh does the same).
        known = []
        for k in ssh_config.known_key_types(hop):
            known.extend(["rsa-sha2-512", "rsa-sha2-256"] if k == "ssh-rsa" else [k])
        if known:
            sec.key_types = tuple(k for k in known if k in sec.key_types) + tuple(
                k for k in sec.key_types if k not in known
            )
        try:
            t.start_client(timeout=hop.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:
            t.close()
            raise EngineError(
                f"no SSH session with {hop.hostname}:{hop.port} ({e or type(e).__name__})", transient=True
            ) from None
        return t

    def _verify(self, hop: ssh_config.Hop, t: paramiko.Transport, is_target: bool) -> None:
        blob = t.get_remote_server_key().asbytes()
        verdict, recorded = ssh_config.check_host_key(hop, blob)
        if verdict == "ok":
            return
        keytype, fp = ssh_config.blob_type(blob), ssh_config.key_fingerprint(blob)
        t.close()
        name = hop.known_hosts_name
        if verdict == "revoked":
            raise HostKeyChanged(f"the host key of {name} ({keytype} {fp}) is marked @revoked in known_hosts: refused")
        if verdict == "changed":
            old = "; ".join(f"{ssh_config.key_fingerprint(e.blob)} in {e.source}" for e in recorded)
            raise HostKeyChanged(
                f"HOST KEY CHANGED for {name}: it now presents {keytype} {fp}, but the recorded key is {old}. "
                "Someone may be intercepting the connection, or the machine was reinstalled. Nothing was sent. "
                f"If you know the change is expected, remove the old entry (ssh-keygen -R '{name}' -f "
                f"{hop.known_hosts[0]}) and trust the new key."
            )
        how = (
            "then trust it (trust_host: the machine's Trust action), which records it in " + hop.known_hosts[0]
            if is_target
            else f"then record it by connecting once with ssh ({hop.user}@{hop.hostname} -p {hop.port})"
        )
        raise HostKeyUnknown(
            f"the host key of {name} is not known: {keytype} {fp}. Compare this fingerprint with the machine's "
            f"own (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on it), {how}.",
            keytype,
            fp,
        )

    def _authenticate(self, hop: ssh_config.Hop, t: paramiko.Transport) -> None:
        try:
            t.auth_none(hop.user)
            return
        except paramiko.BadAuthenticationType as e:
            allowed = list(e.allowed_types)
        except paramiko.AuthenticationException:
            allowed = ["publickey"]
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise EngineError(f"{hop.label} dropped the connection while signing in: {e}", transient=True) from None
        if "publickey" not in allowed:
            raise AuthenticationFailed(
                f"{hop.label} does not accept keys (it allows: {', '.join(allowed) or 'nothing'}); "
                "this extension signs in with ssh keys only and never asks for a password"
            )
        tried: list[str] = []
        notes: list[str] = []
        for label, key in self._candidate_keys(hop, notes):
            try:
                remaining = t.auth_publickey(hop.user, key)
            except paramiko.AuthenticationException:
                tried.append(label)
                continue
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise EngineError(f"{hop.label} dropped the connection while signing in: {e}", transient=True) from None
            if t.is_authenticated():
                return
            raise AuthenticationFailed(
                f"{hop.label} accepted {label} but asks for more ({', '.join(remaining)}); "
                "multi-step sign-in is not supported"
            )
        detail = "; ".join(tried) if tried else "no key at all"
        extra = (" " + " ".join(notes)) if notes else ""
        raise AuthenticationFailed(
            f"authentication failed for {hop.label}: tried publickey with {detail}.{extra} "
            f"The server allows: {', '.join(allowed)}."
        )

    def _candidate_keys(self, hop: ssh_config.Hop, notes: list[str]) -> Iterator[tuple[str, paramiko.PKey]]:
        """Agent keys, then key files ssh would use, in ssh's order; never asks for a passphrase."""
        agent_keys: list[paramiko.AgentKey] = []
        agent = None
        try:
            agent = paramiko.Agent()
            agent_keys = list(agent.get_keys())
        except Exception as e:  # a stale SSH_AUTH_SOCK must not stop key files from being tried
            notes.append(f"ssh-agent could not be used ({e}).")
        if agent is not None and not agent_keys:
            notes.append("ssh-agent holds no keys (SSH_AUTH_SOCK unset or empty agent).")
        file_blobs: dict[str, bytes | None] = {}
        for path in hop.identity_files:
            blob = None
            pub = Path(path + ".pub")
            with contextlib.suppress(OSError, ValueError, IndexError):
                blob = base64.b64decode(pub.read_text().split()[1])
            file_blobs[path] = blob
        wanted = {b for b in file_blobs.values() if b}
        seen: set[bytes] = set()
        try:
            # Agent keys matching an identity file first, then (unless IdentitiesOnly) the others.
            ordered = [k for k in agent_keys if k.asbytes() in wanted]
            if not hop.identities_only:
                ordered += [k for k in agent_keys if k.asbytes() not in wanted]
            for k in ordered:
                seen.add(k.asbytes())
                yield f"agent key {k.get_name()} {ssh_config.key_fingerprint(k.asbytes())}", k
            for path, blob in file_blobs.items():
                if blob is not None and blob in seen:
                    continue
                if not Path(path).exists():
                    if not hop.default_identities:
                        notes.append(f"key file {path} does not exist.")
                    continue
                try:
                    key = paramiko.PKey.from_path(path)
                except paramiko.PasswordRequiredException:
                    notes.append(f"key file {path} is encrypted: add it to your ssh-agent (ssh-add {path}).")
                    continue
                except TypeError as e:  # cryptography: "Password was not given but private key is encrypted"
                    if "password" in str(e).lower() or "encrypted" in str(e).lower():
                        notes.append(f"key file {path} is encrypted: add it to your ssh-agent (ssh-add {path}).")
                    else:
                        notes.append(f"key file {path} could not be read ({e}).")
                    continue
                except Exception as e:
                    notes.append(f"key file {path} could not be read ({e}).")
                    continue
                if key.asbytes() in seen:
                    continue
                seen.add(key.asbytes())
                yield f"key file {path} ({key.get_name()} {ssh_config.key_fingerprint(key.asbytes())})", key
        finally:
            if agent is not None:
                agent.close()

    def _connect(self, *, authenticate: bool = True) -> _Link:
        """Connect through every jump host to the target; each hop's host key is checked."""
        target = self.hop()
        transports: list[paramiko.Transport] = []
        try:
            via = None
            for hop in (*target.via, target):
                is_target = hop is target
                t = self._handshake(hop, self._socket(hop, via))
                transports.append(t)
                if is_target and not authenticate:
                    break
                self._verify(hop, t, is_target)
                self._authenticate(hop, t)
                if hop.keepalive:
                    t.set_keepalive(hop.keepalive)
                via = t
        except BaseException:
            for t in reversed(transports):
                with contextlib.suppress(Exception):
                    t.close()
            raise
        return _Link(transports)

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._link is not None and self._link.active():
                return self._link.target
            if self._link is not None:
                self._link.close()
                self._link = None
            self._link = self._connect()
            self.connections_made += 1
            return self._link.target

    def _discard(self, t: paramiko.Transport) -> None:
        with self._lock:
            if self._link is not None and self._link.target is t:
                self._link.close()
                self._link = None

    def close(self) -> None:
        with self._lock:
            if self._link is not None:
                self._link.close()
                self._link = None

    # -- host keys ------------------------------------------------------------------

    def _target_key(self) -> bytes:
        link = self._connect(authenticate=False)
        try:
            return link.target.get_remote_server_key().asbytes()
        finally:
            link.close()

    def host_key(self) -> tuple[str, str]:
        """The machine's host key as (type, ``SHA256:`` fingerprint), without signing in to it."""
        blob = self._target_key()
        return ssh_config.blob_type(blob), ssh_config.key_fingerprint(blob)

    def trust_host(self) -> str:
        """Record the machine's current host key in known_hosts (an explicit user action).

        Refuses when a different key of the same type is already recorded: a
        changed key is never trusted here. Returns the recorded fingerprint.
        """
        hop = self.hop()
        blob = self._target_key()
        fp = ssh_config.key_fingerprint(blob)
        verdict, recorded = ssh_config.check_host_key(hop, blob)
        if verdict == "ok":
            return fp
        if verdict in ("changed", "revoked"):
            old = "; ".join(f"{ssh_config.key_fingerprint(e.blob)} in {e.source}" for e in recorded) or "revoked"
            raise HostKeyChanged(
                f"not trusting {hop.known_hosts_name}: it presents {ssh_config.blob_type(blob)} {fp} but {old} "
                "is recorded. Remove the old entry yourself if the machine was really reinstalled."
            )
        ssh_config.append_known_host(hop, blob)
        return fp

    # -- running commands -------------------------------------------------------------

    @contextlib.contextmanager
    def _channel(self, command: str, timeout: float) -> Iterator[paramiko.Channel]:
        with self._channels:
            t = self._transport()
            try:
                ch = t.open_session(timeout=CONNECT_TIMEOUT)
                with self._lock:
                    self.channels_opened += 1
                ch.settimeout(timeout)
                ch.exec_command(command)
            except (paramiko.SSHException, EOFError, OSError) as e:
                self._discard(t)
                raise _Dropped(str(e) or type(e).__name__) from None
            try:
                yield ch
            except (paramiko.SSHException, EOFError, OSError) as e:
                if isinstance(e, TimeoutError | socket.timeout) and t.is_active():
                    raise EngineError(f"{self.name}: no answer for {timeout:.0f}s", transient=True) from None
                if not t.is_active():
                    self._discard(t)
                    raise _Dropped(str(e) or type(e).__name__) from None
                raise
            finally:
                ch.close()

    def _lost(self, error: object) -> EngineError:
        return EngineError(f"connection to {self.name} lost: {error}", transient=True)

    @staticmethod
    def _drain_stderr(ch: paramiko.Channel, err: bytearray) -> None:
        # stdout and stderr share the channel window: unread stderr would stall stdout.
        while ch.recv_stderr_ready():
            data = ch.recv_stderr(65536)
            if len(err) < 65536:
                err += data

    @staticmethod
    def _finish(ch: paramiko.Channel, err: bytearray, timeout: float) -> int:
        while True:
            data = ch.recv_stderr(65536)
            if not data:
                break
            if len(err) < 65536:
                err += data
        if not ch.status_event.wait(timeout):
            raise TimeoutError("no exit status")
        return ch.recv_exit_status()

    def _run(self, body: str, stdin: bytes = b"", *, timeout: float = CALL_TIMEOUT, retry: bool = True) -> _Result:
        """Run a sh script; ``retry`` once on a new connection if the old one died (read-only calls)."""
        for attempt in (0, 1):
            try:
                with self._channel(_script(body), timeout) as ch:
                    writer = None
                    if len(stdin) > WINDOW_SIZE // 2:
                        # Feed a long stdin from a thread: the far side may answer while it reads, and an
                        # unread answer would fill the window and stop it reading.
                        writer = threading.Thread(target=_feed, args=(ch, stdin), daemon=True)
                        writer.start()
                    else:
                        if stdin:
                            _send_view(ch, memoryview(stdin))
                        ch.shutdown_write()
                    out = bytearray()
                    err = bytearray()
                    while True:
                        data = ch.recv(CHUNK)
                        if not data:
                            break
                        out += data
                        self._drain_stderr(ch, err)
                    code = self._finish(ch, err, timeout)
                    if writer is not None:
                        writer.join(timeout)
                    return _Result(code, bytes(out), bytes(err))
            except _Dropped as e:
                if retry and attempt == 0:
                    continue
                raise self._lost(e) from None
        raise AssertionError("unreachable")

    # -- far-side paths ------------------------------------------------------------

    def _base_expr(self) -> str:
        """The base dir as a sh word: ``~`` becomes "$HOME", a relative path is under the home dir."""
        base = self.base_dir
        if base == "~":
            return '"$HOME"'
        if base.startswith("~/"):
            return '"$HOME"/' + _q(base[2:])
        if base.startswith("/"):
            return _q(base)
        return '"$HOME"/' + _q(base)

    @staticmethod
    def _dir(job: RemoteJob) -> str:
        d = job.handle.get("dir") if job.handle else None
        if not isinstance(d, str) or not d.startswith("/"):
            raise EngineError(f"job {job.job_id}: no job directory on the machine yet (prepare it first)")
        return d

    # -- the job's life -------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        t = self._transport()
        t0 = time.perf_counter()
        try:
            # A global request the server answers without starting a process: the network round trip.
            t.global_request("keepalive@openssh.com", wait=True)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise self._lost(e) from None
        rtt_ms = (time.perf_counter() - t0) * 1000
        body = f"""
base={self._base_expr()}
printf 'os=%s\\n' "$(uname -s)"
printf 'kernel=%s\\n' "$(uname -r)"
if [ -r /etc/os-release ]; then
  printf 'distro=%s\\n' "$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"')"
fi
printf 'python=%s\\n' "$( (python3 --version || python --version) 2>&1 | head -n 1)"
printf 'cpus=%s\\n' "$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null)"
if [ -r /proc/meminfo ]; then
  printf 'mem_kb=%s\\n' "$(sed -n 's/^MemTotal: *\\([0-9]*\\).*/\\1/p' /proc/meminfo)"
else
  printf 'mem_b=%s\\n' "$(sysctl -n hw.memsize 2>/dev/null)"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpu=/'
fi
d=$base
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
printf 'disk_kb=%s\\n' "$(df -Pk "$d" | tail -n 1 | awk '{{print $4}}')"
"""
        res = self._run(body, timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: check"))
        facts: dict[str, str] = {}
        gpus: list[dict[str, Any]] = []
        for line in res.text().splitlines():
            key, _, value = line.partition("=")
            if key == "gpu":
                name, _, mem = value.rpartition(",")
                gpus.append({"name": name.strip(), "memory_bytes": _int(mem) * (1 << 20) if _int(mem) else None})
            else:
                facts[key] = value.strip()
        memory = _int(facts.get("mem_kb")) * 1024 if facts.get("mem_kb") else _int(facts.get("mem_b"))
        python = facts.get("python", "")
        return {
            "os": facts.get("distro") or facts.get("os", ""),
            "kernel": f"{facts.get('os', '')} {facts.get('kernel', '')}".strip(),
            "python": python.removeprefix("Python ").strip() if python.startswith("Python ") else None,
            "cpus": _int(facts.get("cpus")),
            "memory_bytes": memory,
            "gpus": gpus,
            "disk_free_bytes": _int(facts.get("disk_kb")) * 1024,
            "rtt_ms": round(rtt_ms, 2),
        }

    def prepare(self, job: RemoteJob) -> RemoteJob:
        check_relpath(job.job_id, "job id")
        if "/" in job.job_id:
            raise ValueError(f"job id: {job.job_id!r} must be a single name")
        marker = json.dumps({"job_id": job.job_id, "key": job.key}, sort_keys=True) + "\n"
        body = f"""set -e
base={self._base_expr()}
(umask 077 && mkdir -p -- "$base/jobs" "$base/cache")
d="$base/jobs/"{_q(job.job_id)}
# mlruns/ is left for MLflow to create: its file store makes the Default experiment only in a
# folder that does not exist yet (an empty one fails every run logged without an experiment).
mkdir -p -- "$d/{WORK_DIR}"
cd -- "$d"
printf '%s' {_q(marker)} > job.json.tmp
if [ -f job.json ] && ! cmp -s job.json job.json.tmp; then
  rm -f job.json.tmp
  echo "job directory $d belongs to another job" >&2
  exit 3
fi
mv -f job.json.tmp job.json
printf '%s' {_q(LAUNCH_SH)} > launch.sh
printf '%s' {_q(RUN_SH)} > run.sh
pwd -P
"""
        res = self._run(body, timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: preparing job {job.job_id}"))
        path = res.text().strip().splitlines()[-1]
        if not path.startswith("/"):
            raise EngineError(f"{self.name}: unexpected job directory {path!r}")
        return dataclasses.replace(job, handle={**(job.handle or {}), "dir": path})

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        d = self._dir(job)
        stats = SendStats()
        if not files:
            return stats
        seen_paths: set[str] = set()
        for f in files:
            check_relpath(f.relpath, "input")
            check_digest(f.sha256)
            if f.relpath in seen_paths:
                raise ValueError(f"input: {f.relpath!r} is listed twice")
            seen_paths.add(f.relpath)
        base = posixpath.dirname(posixpath.dirname(d))
        job_rel = posixpath.relpath(d, base)
        digests = sorted({f.sha256 for f in files})
        incoming = f"cache/.incoming-{uuid.uuid4().hex}"
        # One channel does both steps. The far side first answers which digests its cache holds (the
        # list on stdin ends with an empty line; nothing else has been sent yet, so sed cannot read
        # past it), then unpacks the tar stream sent after that answer: objects into a private
        # incoming dir, work-tree names as hard links to them, then renames each object into the cache.
        body = f"""set -e
cd -- {_q(base)}
in={_q(incoming)}
trap 'rm -rf -- "$in"' EXIT
mkdir -p -- "$in" cache {_q(job_rel + "/" + WORK_DIR)}
# GNU tar reads a pipe in 10 KiB records by default, which made it the slowest part of a big upload;
# 128 KiB records read whole (-B) cost far fewer system calls. Other tars keep their defaults.
untar() {{ tar -xof -; }}
case $(tar --version 2>/dev/null) in *"GNU tar"*) untar() {{ tar -B -b 256 -xof -; }} ;; esac
sed -n '/^$/q;p' | (cd cache && xargs ls -lnd -- 2>/dev/null) || true
echo JRC-READY
untar
# Only a stream that reached its last entry publishes anything: a cut one may end on a clean boundary.
[ -f "$in/complete" ] || {{ echo "the input stream was cut short; nothing was kept" >&2; exit 3; }}
if [ -d "$in/objects" ]; then
  (cd -- "$in/objects" && ls | xargs sh -c 'mv -f -- "$@" ../..' sh)
fi
if [ -f "$in/post.sh" ]; then sh "$in/post.sh"; fi
"""
        try:
            with self._channel(_script(body), CALL_TIMEOUT) as ch:
                err = bytearray()
                query = ("\n".join(digests) + "\n\n").encode()
                # A long list goes from a thread: the answer may fill our window before the list is sent.
                writer = threading.Thread(target=_feed, args=(ch, query, False), daemon=True)
                writer.start()
                answer = bytearray()
                while not (answer.startswith(b"JRC-READY\n") or b"\nJRC-READY\n" in answer):
                    data = ch.recv(CHUNK)
                    if not data:
                        code = self._finish(ch, err, CALL_TIMEOUT)
                        raise EngineError(_Result(code, b"", bytes(err)).error(f"{self.name}: sending inputs"))
                    answer += data
                    self._drain_stderr(ch, err)
                writer.join(CALL_TIMEOUT)
                have: dict[str, int] = {}
                wanted = set(digests)
                for line in answer.decode("utf-8", "replace").splitlines():
                    fields = line.split()
                    if len(fields) >= 6 and fields[0].startswith("-") and fields[-1] in wanted:
                        have[fields[-1]] = _int(fields[4])
                by_digest: dict[str, InputFile] = {}
                for f in files:
                    if have.get(f.sha256) != f.size:  # absent, or not what we expect: send again
                        by_digest.setdefault(f.sha256, f)
                stats.files_sent = len(by_digest)
                stats.bytes_sent = sum(f.size for f in by_digest.values())
                stats.files_reused = len(files) - stats.files_sent
                try:
                    self._stream_inputs(ch, err, files, by_digest, incoming, job_rel, progress, stats.bytes_sent)
                    ch.shutdown_write()
                except _Changed as e:
                    # End the stream short and wait: the far side discards everything before we report.
                    ch.shutdown_write()
                    while ch.recv(CHUNK):
                        pass
                    self._finish(ch, err, CALL_TIMEOUT)
                    raise EngineError(str(e)) from None
                except OSError:
                    # The far side may have stopped reading (disk full, tar error): report its words.
                    if not (ch.exit_status_ready() or ch.closed):
                        raise
                while ch.recv(CHUNK):
                    self._drain_stderr(ch, err)
                code = self._finish(ch, err, CALL_TIMEOUT)
                if code == -1 and not ch.get_transport().is_active():
                    # paramiko's "no exit status": the connection dropped under the stream, the far side did not fail.
                    raise _Dropped("the connection closed while sending inputs")
        except _Dropped as e:
            raise self._lost(e) from None
        if code != 0:
            raise EngineError(_Result(code, b"", bytes(err)).error(f"{self.name}: sending inputs"))
        return stats

    def _stream_inputs(
        self,
        ch: paramiko.Channel,
        err: bytearray,
        files: Sequence[InputFile],
        by_digest: Mapping[str, InputFile],
        incoming: str,
        job_rel: str,
        progress: ProgressCallback | None,
        total: int,
    ) -> None:
        """The tar stream of ``send``: missing objects, then a hard link per work-tree name."""
        sink = _Sink(ch)
        done = 0
        for f in by_digest.values():
            sink.write(tar_header(f"{incoming}/objects/{f.sha256}", size=f.size, mode=0o444, mtime=_mtime(f.source)))
            h = hashlib.sha256()
            left = f.size
            with open(f.source, "rb", buffering=0) as src:
                if f.size <= SMALL_FILE:
                    # Small files ride along in the shared buffer: fewer, fuller packets.
                    data = src.read(f.size + 1)
                    h.update(data)
                    if len(data) == f.size:
                        sink.write(data)
                        left = 0
                        done += f.size
                else:
                    sink.flush()
                    # Reading and hashing run in a thread (both release the GIL) while this one
                    # encrypts and sends: the digest checked below is of exactly the bytes sent.
                    with _ReadAhead(src, f.size, h) as chunks:
                        for view in chunks:
                            _send_view(ch, view)
                            left -= len(view)
                            done += len(view)
                            self._drain_stderr(ch, err)
                            if progress:
                                progress(done, total)
                        if chunks.grew:
                            left = -1
            if left or h.hexdigest() != f.sha256:
                # Never let a file that changed under us land in the cache under the old digest:
                # closing without the end of the archive makes the far-side tar fail and discard it.
                raise _Changed(f"input {f.relpath!r} changed while it was being sent; send again")
            sink.write(padding(f.size))
            if progress and f.size <= SMALL_FILE:
                progress(done, total)
        post = []
        for f in files:
            dst = f"{job_rel}/{WORK_DIR}/{f.relpath}"
            if f.mode & 0o111:
                # Executable inputs get their own copy: the cache object is shared and read-only.
                post.append(
                    f"mkdir -p -- {_q(posixpath.dirname(dst))} && rm -f -- {_q(dst)} && "
                    f"cp -- cache/{f.sha256} {_q(dst)} && chmod {f.mode & 0o7777:o} -- {_q(dst)}"
                )
                continue
            target = f"{incoming}/objects/{f.sha256}" if f.sha256 in by_digest else f"cache/{f.sha256}"
            sink.write(tar_header(dst, linkname=target))
        if post:
            script = ("set -e\n" + "\n".join(post) + "\n").encode()
            sink.write(tar_header(f"{incoming}/post.sh", size=len(script), mode=0o600))
            sink.write(script + padding(len(script)))
        sink.write(tar_header(f"{incoming}/complete", size=0, mode=0o600))
        sink.write(END_OF_ARCHIVE)
        sink.flush()

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        d = self._dir(job)
        payload = launch_input(launch.env, launch.secret_env)  # secrets: stdin only
        script = command_script(launch.command)
        if len(script) > 64 << 10:
            # Too long for one command line: write it first, in its own call.
            res = self._run(f"cat > {_q(d + '/command.sh')}", script.encode(), retry=False)
            if res.code != 0:
                raise EngineError(res.error(f"{self.name}: writing the command of {job.job_id}"))
            write = ":"
        else:
            write = f"printf '%s' {_q(script)} > command.sh"
        body = f"""cd -- {_q(d)} || exit 97
if [ -f pid ]; then read -r p < pid; echo "already $p"; exit 0; fi
{write}
exec sh launch.sh {_q(d)}
"""
        res = self._run(body, payload, timeout=60, retry=False)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: starting job {job.job_id}"))
        words = res.text().split()
        if not words or not words[-1].isdigit():
            raise EngineError(f"{self.name}: the launcher did not report a process id ({res.text()[-200:]!r})")
        return dataclasses.replace(job, handle={**job.handle, "pid": int(words[-1])})

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        if not jobs:
            return {}
        lines = []
        for i, job in enumerate(jobs):
            lines.append(f"j {i} {_q(self._dir(job))}")
        body = (
            _ALIVE_GROUPS
            + r"""
live=
scanned=
j() {
  d=$2
  if [ ! -d "$d" ]; then echo "$1 gone - -"; return; fi
  size=-
  if [ -f "$d/log" ]; then size=$(wc -c < "$d/log" | tr -d ' '); fi
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--} $size"; return; fi
  if [ ! -f "$d/pid" ]; then echo "$1 notstarted - $size"; return; fi
  read -r pg < "$d/pid"
  if [ -z "$scanned" ]; then live=" $(alive_groups) "; scanned=1; fi
  case "$live" in *" $pg "*) echo "$1 running - $size"; return ;; esac
  # the group is gone; it writes exit_code before it ends, so look again
  if [ -f "$d/exit_code" ]; then read -r c < "$d/exit_code"; echo "$1 exited ${c:--} $size"
  elif [ -f "$d/cancelled" ]; then echo "$1 cancelled - $size"
  else echo "$1 gone - $size"; fi
}
"""
            + "\n".join(lines)
            + "\n"
        )
        res = self._run(body, timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: poll"))
        result: dict[str, RemoteStatus] = {}
        for line in res.text().splitlines():
            parts = line.split()
            if len(parts) != 4 or not parts[0].isdigit():
                continue
            job = jobs[int(parts[0])]
            state, code, size = parts[1], parts[2], parts[3]
            log_size = int(size) if size.isdigit() else None
            if state == "exited":
                exit_code = int(code) if code.lstrip("-").isdigit() else None
                result[job.job_id] = RemoteStatus("exited", exit_code=exit_code, log_size=log_size)
            elif state == "running":
                result[job.job_id] = RemoteStatus("running", log_size=log_size)
            elif state == "cancelled":
                result[job.job_id] = RemoteStatus("gone", log_size=log_size, detail="cancelled")
            elif state == "notstarted":
                result[job.job_id] = RemoteStatus("gone", log_size=log_size, detail="never started")
            else:
                detail = "job directory is missing" if size == "-" and code == "-" else "process vanished"
                result[job.job_id] = RemoteStatus("gone", log_size=log_size, detail=f"{detail} on {self.name}")
        missing = [j.job_id for j in jobs if j.job_id not in result]
        if missing:
            raise EngineError(f"{self.name}: poll gave no answer for {', '.join(missing)}", transient=True)
        return result

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        if limit == 0:
            return b""
        d = self._dir(job)
        body = f"""[ -d {_q(d)} ] || {{ echo "job directory is missing" >&2; exit 3; }}
[ -f {_q(d + "/log")} ] || exit 0
tail -c +{offset + 1} -- {_q(d + "/log")} | head -c {limit}
"""
        res = self._run(body, timeout=120)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: reading the log of {job.job_id}"))
        return res.out

    def cancel(self, job: RemoteJob, grace: float) -> None:
        d = self._dir(job)
        ticks = max(0, int(grace * 10))
        body = (
            _ALIVE_GROUPS
            + f"""
d={_q(d)}
[ -f "$d/pid" ] || {{ echo notstarted; exit 0; }}
read -r target_pg < "$d/pid"
case $target_pg in ''|*[!0-9]*) echo "bad pid file" >&2; exit 3 ;; esac
nap() {{ sleep 0.1 2>/dev/null || sleep 1; }}
: > "$d/cancelled"
kill -s TERM -- "-$target_pg" 2>/dev/null
i=0
while [ -n "$(group_pids)" ] && [ $i -lt {ticks} ]; do nap; i=$((i+1)); done
if [ -n "$(group_pids)" ]; then kill -s KILL -- "-$target_pg" 2>/dev/null; fi
i=0
while [ -n "$(group_pids)" ] && [ $i -lt 50 ]; do nap; i=$((i+1)); done
left=$(group_pids)
if [ -n "$left" ]; then echo "still running:$left" >&2; exit 4; fi
echo done
"""
        )
        res = self._run(body, timeout=grace + 30, retry=True)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: cancelling job {job.job_id}"))

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        d = self._dir(job)
        for out in outputs:
            check_relpath(out, "output")
        manifest = f".fetch-{uuid.uuid4().hex}"
        lines = []
        for i, out in enumerate(outputs):
            p = _q(f"{WORK_DIR}/{out}")
            lines.append(f'if [ -e {p} ] || [ -h {p} ]; then set -- "$@" {p}; else echo \'M {i}\' >> "$m"; fi')
        body = f"""cd -- {_q(d)} || exit 3
m={_q(manifest)}
trap 'rm -f -- "$m"' EXIT
: > "$m"
set --
{chr(10).join(lines)}
if [ -d {TRACKING_DIR} ]; then set -- "$@" {TRACKING_DIR}; fi
if [ $# -gt 0 ]; then
  find "$@" -type f -exec sha256sum -- {{}} + >> "$m"
  du -sk -- "$@" | {{ t=0; while read -r k _; do case $k in ''|*[!0-9]*) ;; *) t=$((t+k)) ;; esac; done; \
echo "T $t" >> "$m"; }}
fi
tar -cf - "$m" "$@"
"""
        wanted = [f"{WORK_DIR}/{o}" for o in outputs]

        def allowed(name: str) -> bool:
            if name == TRACKING_DIR or name.startswith(TRACKING_DIR + "/"):
                return True
            return any(name == w or name.startswith(w + "/") for w in wanted)

        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        result = FetchResult()
        extractor = SafeExtractor(dest, allowed, self.name)
        try:
            with self._channel(_script(body), CALL_TIMEOUT) as ch:
                ch.shutdown_write()
                err = bytearray()

                def read(n: int) -> bytes:
                    data = ch.recv(n)
                    self._drain_stderr(ch, err)
                    return data

                reader = TarReader(read)
                members = reader.members()
                first = next(members, None)
                if first is None or first.name.removeprefix("./") != manifest:
                    code = self._finish(ch, err, CALL_TIMEOUT)
                    raise EngineError(_Result(code, b"", bytes(err)).error(f"{self.name}: fetching outputs"))
                if first.size > 256 << 20:
                    raise UnsafeArchive(f"{self.name}: the output list is implausibly large")
                text = reader.read_exact(first.size + len(padding(first.size)))[: first.size]
                total = 0
                sums = bytearray()
                for line in text.split(b"\n"):
                    if line.startswith(b"M "):
                        result.missing.append(outputs[int(line[2:])])
                    elif line.startswith(b"T "):
                        total = int(line[2:]) * 1024
                    elif line:
                        sums += line + b"\n"
                for name, digest in parse_sha256sum(bytes(sums)).items():
                    key = name.removeprefix(WORK_DIR + "/") if name.startswith(WORK_DIR + "/") else name
                    result.digests[key] = digest
                done = 0

                def tick(n: int) -> None:
                    nonlocal done
                    done += n
                    if progress:
                        progress(done, max(total, done))

                try:
                    for info in members:
                        extractor.extract(reader, info, tick)
                except UnsafeArchive:
                    if not ch.get_transport().is_active():
                        # Cut short by a dropped connection, not a bad archive: fetch again.
                        raise _Dropped("the connection closed while fetching outputs") from None
                    raise
                code = self._finish(ch, err, CALL_TIMEOUT)
        except _Dropped as e:
            raise self._lost(e) from None
        if code != 0:
            raise EngineError(_Result(code, b"", bytes(err)).error(f"{self.name}: fetching outputs"))
        return result

    def _extract_command(self, command: str, dest: Path, allowed: Callable[[str], bool]) -> list[str]:
        """Extract the tar stream a far-side command prints, with the same checks as ``fetch`` (for tests)."""
        extractor = SafeExtractor(Path(dest), allowed, self.name)
        try:
            with self._channel(_script(command), CALL_TIMEOUT) as ch:
                ch.shutdown_write()
                reader = TarReader(ch.recv)
                for info in reader.members():
                    extractor.extract(reader, info)
                self._finish(ch, bytearray(), CALL_TIMEOUT)
        except _Dropped as e:
            raise self._lost(e) from None
        return sorted(extractor.files)

    def cleanup(self, job: RemoteJob) -> None:
        d = self._dir(job)
        # Only a directory this engine made (it holds job.json) is removed.
        body = f"""d={_q(d)}
[ -e "$d" ] || exit 0
[ -f "$d/job.json" ] || {{ echo "$d is not a job directory" >&2; exit 3; }}
# directories only: a file may be a hard link to a read-only cache object, whose mode must stay
find "$d" -type d ! -perm -u+w -exec chmod u+w {{}} + 2>/dev/null
rm -rf -- "$d"
"""
        res = self._run(body, timeout=300)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: removing job {job.job_id}"))


class _Changed(Exception):
    pass


class _ReadAhead:
    """Read a file in ``CHUNK`` pieces from a thread, hashing each piece before handing it over.

    Iterating yields memoryviews of a few reused buffers; each is valid until the next one is taken,
    so at most ``READ_AHEAD + 1`` chunks are in memory. ``grew`` says the file was longer than ``size``.
    """

    def __init__(self, src: Any, size: int, h: Any) -> None:
        self._src = src
        self._size = size
        self._h = h
        self._free: queue.Queue[bytearray] = queue.Queue()
        self._full: queue.Queue[memoryview | BaseException | None] = queue.Queue()
        for _ in range(READ_AHEAD + 1):
            self._free.put(bytearray(CHUNK))
        self._stop = False
        self.grew = False
        self._thread = threading.Thread(target=self._run, name="jrc-ssh-read", daemon=True)

    def _run(self) -> None:
        try:
            left = self._size
            while left > 0:
                buf = self._free.get()
                if self._stop:
                    return
                n = self._src.readinto(memoryview(buf)[: min(CHUNK, left)])
                if not n:
                    break
                view = memoryview(buf)[:n]
                self._h.update(view)
                self._full.put(view)
                left -= n
            self.grew = left == 0 and bool(self._src.read(1))
            self._full.put(None)
        except BaseException as e:  # handed to the sending thread
            self._full.put(e)

    def __enter__(self) -> _ReadAhead:
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[memoryview]:
        while True:
            item = self._full.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            self._free.put(item.obj)  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._free.put(bytearray(0))  # wakes the reader if it waits for a buffer
        self._thread.join()


class _Sink:
    """Gather small writes (headers, small files) into big channel sends."""

    def __init__(self, ch: paramiko.Channel) -> None:
        self.ch = ch
        self.buf = bytearray()

    def write(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            buf, self.buf = self.buf, bytearray()
            _send_view(self.ch, memoryview(buf))


def _feed(ch: paramiko.Channel, data: bytes, close: bool = True) -> None:
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        _send_view(ch, memoryview(data))
        if close:
            ch.shutdown_write()


def _send_view(ch: paramiko.Channel, view: memoryview) -> None:
    # Channel.sendall re-slices a bytes object after every packet (a copy each time); a memoryview does not.
    while view:
        n = ch.send(view)
        if n <= 0:
            raise OSError("channel closed while sending")
        view = view[n:]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _int(value: str | None) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return 0


__all__ = [
    "BLOCK",
    "AuthenticationFailed",
    "HostKeyChanged",
    "HostKeyUnknown",
    "SSHEngine",
]
