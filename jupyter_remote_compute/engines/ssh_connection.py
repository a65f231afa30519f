"""ssh as a transport (``transport.Transport``): two of them, one ssh-level base.

``Connection`` adds to a transport what only ssh has: the route (ssh config,
ProxyJump hops), the host-key flow (``host_key``, ``trust_host``) and a cap on
calls at once. ``ssh_openssh.OpenSSHConnection`` runs the user's own ``ssh``
over a master connection this process owns; ``ParamikoConnection`` (here)
speaks SSH itself, for machines where no ssh client is installed.

The paramiko transport: one authenticated connection (through any ProxyJump
hops) carries every call as its own exec channel; at most ``MAX_CHANNELS``
run at once. A dropped connection is re-made on the next call; calls that
change nothing on the far side are retried once on a fresh one. Host keys are
checked against known_hosts like OpenSSH does; an unknown key is only
recorded by an explicit ``trust_host``, a changed one never. Keys come from
the agent and the key files ssh would use; a password is never asked for.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import paramiko

from . import ssh_config
from .base import EngineError
from .transport import Dropped, Transport

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
CONNECT_TIMEOUT = 15.0


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


@dataclasses.dataclass
class Link:
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


def host_key_error(hop: ssh_config.Hop, blob: bytes, is_target: bool) -> EngineError | None:
    """The refusal for a host key that known_hosts does not vouch for (None: it does), with its fingerprint."""
    verdict, recorded = ssh_config.check_host_key(hop, blob)
    if verdict == "ok":
        return None
    keytype, fp = ssh_config.blob_type(blob), ssh_config.key_fingerprint(blob)
    name = hop.known_hosts_name
    if verdict == "revoked":
        return HostKeyChanged(f"the host key of {name} ({keytype} {fp}) is marked @revoked in known_hosts: refused")
    if verdict == "changed":
        old = "; ".join(f"{ssh_config.key_fingerprint(e.blob)} in {e.source}" for e in recorded)
        return HostKeyChanged(
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
    return HostKeyUnknown(
        f"the host key of {name} is not known: {keytype} {fp}. Compare this fingerprint with the machine's "
        f"own (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on it), {how}.",
        keytype,
        fp,
    )


class Connection(Transport):
    """The ssh transport to one machine: made on first use, re-made after a drop, closed by ``close``.

    What is ssh's own lives here and nowhere else: the route (``hop``: ssh config, ProxyJump), the
    host-key flow (``host_key``, ``trust_host``) and at most ``MAX_CHANNELS`` calls at once. ``channel``
    and ``run`` are a ``Transport``'s.
    """

    #: whether this transport can run a ProxyCommand from the ssh config
    runs_proxy_command: ClassVar[bool] = False

    def __init__(self, name: str, address: str, options: Mapping[str, Any]) -> None:
        super().__init__(name)
        self.address = address
        self.machine_options = options
        self._channels = threading.BoundedSemaphore(MAX_CHANNELS)
        self._hop: ssh_config.Hop | None = None

    def hop(self) -> ssh_config.Hop:
        """The resolved route to the machine (read from the ssh config once per connection)."""
        if self._hop is None:
            opts = self.machine_options
            config = ssh_config.load_config(self.config_path())
            self._hop = ssh_config.resolve(
                self.address,
                config=config,
                user=opts.get("user"),
                port=opts.get("port"),
                identity_file=opts.get("identity_file"),
                known_hosts=opts.get("known_hosts"),
                allow_proxy_command=self.runs_proxy_command,
            )
        return self._hop

    def config_path(self) -> str:
        """The user's ssh config file as this process sees it (``~`` from $HOME)."""
        return str(Path(self.machine_options.get("ssh_config") or "~/.ssh/config").expanduser())

    @abc.abstractmethod
    def _target_key(self) -> bytes:
        """The machine's host key blob, fetched without signing in and without trusting it."""

    # -- host keys ------------------------------------------------------------------

    def host_key(self) -> tuple[str, str]:
        """The machine's host key as (type, ``SHA256:`` fingerprint), without signing in to it."""
        blob = self._target_key()
        return ssh_config.blob_type(blob), ssh_config.key_fingerprint(blob)

    def trust_host(self, expected_fingerprint: str | None = None) -> str:
        """Record the machine's current host key in known_hosts (an explicit user action).

        Refuses when a different key of the same type is already recorded (a
        changed key is never trusted here), and, given ``expected_fingerprint``,
        any key whose fingerprint is not that one: the key compared and the key
        recorded are the same key. Returns the recorded fingerprint.
        """
        hop = self.hop()
        blob = self._target_key()
        fp = ssh_config.key_fingerprint(blob)
        if expected_fingerprint is not None and fp != expected_fingerprint:
            raise EngineError(
                f"not trusting {hop.known_hosts_name}: it presents {ssh_config.blob_type(blob)} {fp}, not "
                f"{expected_fingerprint}. Compare with the machine's own fingerprint (ssh-keygen -lf "
                "/etc/ssh/ssh_host_*_key.pub on it).",
                details={"host_key": {"type": ssh_config.blob_type(blob), "fingerprint": fp}, "mismatch": True},
            )
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


class ParamikoConnection(Connection):
    """The authenticated paramiko connection to one machine, made on first use and re-made after a drop."""

    transport_name = "paramiko"

    def __init__(self, name: str, address: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, address, options)
        self.link: Link | None = None

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
        refusal = host_key_error(hop, t.get_remote_server_key().asbytes(), is_target)
        if refusal is not None:
            t.close()
            raise refusal

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

    def _connect(self, *, authenticate: bool = True) -> Link:
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
        return Link(transports)

    def transport(self) -> paramiko.Transport:
        with self._lock:
            if self.link is not None and self.link.active():
                return self.link.target
            if self.link is not None:
                self.link.close()
                self.link = None
            self.link = self._connect()
            self.connections_made += 1
            return self.link.target

    def discard(self, t: paramiko.Transport) -> None:
        with self._lock:
            if self.link is not None and self.link.target is t:
                self.link.close()
                self.link = None

    def close(self) -> None:
        with self._lock:
            if self.link is not None:
                self.link.close()
                self.link = None

    def _target_key(self) -> bytes:
        link = self._connect(authenticate=False)
        try:
            return link.target.get_remote_server_key().asbytes()
        finally:
            link.close()

    def active(self) -> bool:
        return self.link is not None and self.link.active()

    def round_trip(self) -> float:
        t = self.transport()
        t0 = time.perf_counter()
        try:
            # A global request the server answers without starting a process: the network round trip.
            t.global_request("keepalive@openssh.com", wait=True)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise self.lost(e) from None
        return time.perf_counter() - t0

    # -- running commands -------------------------------------------------------------

    @contextlib.contextmanager
    def channel(self, command: str, timeout: float) -> Iterator[paramiko.Channel]:  # type: ignore[override]
        with self._channels:
            t = self.transport()
            try:
                ch = t.open_session(timeout=CONNECT_TIMEOUT)
                with self._lock:
                    self.channels_opened += 1
                ch.settimeout(timeout)
                ch.exec_command(command)
            except (paramiko.SSHException, EOFError, OSError) as e:
                self.discard(t)
                raise Dropped(str(e) or type(e).__name__) from None
            try:
                yield ch
            except (paramiko.SSHException, EOFError, OSError) as e:
                if isinstance(e, TimeoutError | socket.timeout) and t.is_active():
                    raise EngineError(f"{self.name}: no answer for {timeout:.0f}s", transient=True) from None
                if not t.is_active() or isinstance(e, EOFError):  # EOF: the far end went away
                    self.discard(t)
                    raise Dropped(str(e) or type(e).__name__) from None
                raise
            finally:
                ch.close()


SSHConnection = ParamikoConnection  # the name it had before the OpenSSH transport
