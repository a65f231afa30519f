"""What ssh itself would do for an address: the ssh config lookup and the known_hosts check.

Kept apart from the engine so both are plain functions of files, testable
without a network. Only what the engine uses is read from the config:
HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump,
ServerAliveInterval, ConnectTimeout, UserKnownHostsFile, HashKnownHosts,
ProxyCommand (for messages: only the OpenSSH transport runs one, through ssh itself).
"""

from __future__ import annotations

import base64
import dataclasses
import getpass
import glob
import hashlib
import hmac
import io
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import paramiko

from .base import EngineError

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
MAX_JUMPS = 8


@dataclasses.dataclass(frozen=True)
class Hop:
    """One ssh server on the way, fully resolved."""

    alias: str  # what the user wrote (an alias or a host)
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    keepalive: int  # seconds, 0 = off
    connect_timeout: float
    known_hosts: tuple[str, ...]  # user files, the first one is written by trust_host
    hash_known_hosts: bool
    via: tuple[Hop, ...] = ()  # jump hosts, in connection order
    default_identities: bool = False  # no IdentityFile anywhere: ssh's default key names
    proxy_command: str | None = None  # run by the OpenSSH transport only (paramiko refuses it)

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name a known_hosts line uses: ``host`` on port 22, ``[host]:port`` otherwise."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


# -- ssh config ----------------------------------------------------------------


def _expand_includes(path: Path, base: Path, depth: int = 0) -> str:
    """The config text with ``Include`` lines replaced by the files they name (paramiko lacks Include)."""
    if depth > 16:
        raise EngineError(f"ssh config: Include nested too deeply in {path}")
    out = []
    for line in path.read_text(errors="replace").splitlines():
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].lower() == "include":
            for pattern in words[1].split():
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = str(base / pattern)
                for name in sorted(glob.glob(pattern)):
                    if os.path.isfile(name):
                        out.append(_expand_includes(Path(name), base, depth + 1))
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def load_config(user_config: str | None) -> paramiko.SSHConfig:
    """The user's ssh config followed by the system one: as in ssh, the first value found wins."""
    config = paramiko.SSHConfig()
    text = ""
    sources = []
    if user_config:
        sources.append((Path(os.path.expanduser(user_config)), Path(os.path.expanduser("~/.ssh"))))
    sources.append((Path(SYSTEM_CONFIG), Path("/etc/ssh")))
    for path, base in sources:
        if path.is_file():
            text += _expand_includes(path, base)
    try:
        config.parse(io.StringIO(text))
    except Exception as e:  # paramiko raises ConfigParseError or a bare exception for odd lines
        raise EngineError(f"ssh config: cannot read {user_config}: {e}") from None
    return config


def _split_user_host_port(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` (as ProxyJump writes hops)."""
    spec = spec.removeprefix("ssh://")
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", spec)
    if m:
        host, port_s = m.group(1), m.group(2)
    elif spec.count(":") == 1:
        host, port_s = spec.split(":")
    else:
        host, port_s = spec, None
    if port_s:
        port = int(port_s)
    return user or None, host, port


def _yes(value: Any) -> bool:
    return str(value).lower() in ("yes", "true", "1")


def resolve(
    address: str,
    *,
    config: paramiko.SSHConfig,
    user: str | None = None,
    port: int | None = None,
    identity_file: str | None = None,
    known_hosts: str | None = None,
    allow_proxy_command: bool = False,
    _depth: int = 0,
) -> Hop:
    """Resolve ``address`` (an alias or host, optionally ``user@``) to a Hop with its jump hosts.

    Explicit arguments override the config, as ``ssh -l/-p/-i`` do; user, port
    and key apply to the target only, ``known_hosts`` to every hop. A
    ProxyCommand is refused unless ``allow_proxy_command`` (the OpenSSH
    transport, where ssh itself runs it).
    """
    if _depth > MAX_JUMPS:
        raise EngineError(f"ProxyJump: more than {MAX_JUMPS} nested jump hosts (a loop in the ssh config?)")
    spec_user, alias, spec_port = _split_user_host_port(address)
    found = config.lookup(alias)
    hostname = found.get("hostname", alias)
    the_user = user or spec_user or found.get("user") or getpass.getuser()
    try:
        the_port = int(port or spec_port or found.get("port", 22))
    except ValueError:
        raise EngineError(f"ssh config: Port for {alias!r} is not a number") from None
    if identity_file:
        identities: tuple[str, ...] = (identity_file,)
        defaults = False
        only = True  # an explicitly chosen key is the one to use, like ssh -i with IdentitiesOnly
    else:
        configured = found.get("identityfile") or []
        identities = tuple(configured) or DEFAULT_IDENTITIES
        defaults = not configured
        only = _yes(found.get("identitiesonly", "no"))
    identities = tuple(os.path.expanduser(p) for p in identities if p.lower() != "none")
    keepalive = int(found.get("serveraliveinterval", 30) or 0)
    timeout = float(found.get("connecttimeout", 15) or 15)
    if known_hosts:
        files: tuple[str, ...] = (known_hosts,)
    else:
        files = tuple(found.get("userknownhostsfile", "~/.ssh/known_hosts").split())
    files = tuple(os.path.expanduser(f) for f in files)
    hash_hosts = _yes(found.get("hashknownhosts", "no"))

    via: tuple[Hop, ...] = ()
    jump = found.get("proxyjump")
    if jump and jump.lower() != "none":
        hops = [h.strip() for h in jump.split(",") if h.strip()]
        chain: list[Hop] = []
        for i, hop_spec in enumerate(hops):
            # A chosen known_hosts file is the machine's trust store: it covers the whole route.
            hop = resolve(
                hop_spec,
                config=config,
                known_hosts=known_hosts,
                allow_proxy_command=allow_proxy_command,
                _depth=_depth + 1,
            )
            if i > 0:
                # Later hops go through the earlier ones, not through their own ProxyJump (as ssh -J does).
                hop = dataclasses.replace(hop, via=())
            chain.extend(hop.via)
            chain.append(dataclasses.replace(hop, via=()))
        via = tuple(chain)
    proxy_command = found.get("proxycommand")
    if proxy_command and proxy_command.lower() == "none":
        proxy_command = None
    if proxy_command and not via and not allow_proxy_command:
        raise EngineError(
            f"ssh config: {alias!r} uses ProxyCommand, which only the OpenSSH transport runs (no ssh client "
            "here, or ssh_transport: paramiko); use ProxyJump instead, or install OpenSSH's client"
        )
    return Hop(
        alias,
        hostname,
        the_port,
        the_user,
        identities,
        only,
        keepalive,
        timeout,
        files,
        hash_hosts,
        via,
        defaults,
        None if via else proxy_command,
    )


# -- known_hosts ---------------------------------------------------------------

Verdict = Literal["ok", "unknown", "changed", "revoked"]


def key_fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def blob_type(blob: bytes) -> str:
    """The key type named inside an ssh public key blob (``ssh-ed25519``, ``ssh-rsa`` …)."""
    n = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + n].decode("ascii", "replace")


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # ssh patterns know only * and ?; brackets in "[host]:port" are literal.
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class KnownHost:
    marker: str  # "", "@revoked" or "@cert-authority"
    patterns: tuple[str, ...]
    keytype: str
    blob: bytes
    source: str  # file:line, for messages

    def matches(self, name: str) -> bool:
        hit = False
        for pattern in self.patterns:
            if pattern.startswith("|1|"):
                try:
                    _, _, salt_b64, digest_b64 = pattern.split("|", 3)
                    salt = base64.b64decode(salt_b64)
                    want = base64.b64decode(digest_b64)
                except (ValueError, TypeError):
                    continue
                if hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want):
                    hit = True
                continue
            negate = pattern.startswith("!")
            if _pattern_regex(pattern.lstrip("!")).fullmatch(name):
                if negate:
                    return False
                hit = True
        return hit


def read_known_hosts(files: Iterable[str]) -> list[KnownHost]:
    entries = []
    for file in files:
        try:
            lines = Path(file).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for lineno, line in enumerate(lines, 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            marker = ""
            if fields[0].startswith("@"):
                marker, fields = fields[0], fields[1:]
            if len(fields) < 3:
                continue
            try:
                blob = base64.b64decode(fields[2], validate=True)
            except ValueError:
                continue
            entries.append(KnownHost(marker, tuple(fields[0].split(",")), fields[1], blob, f"{file}:{lineno}"))
    return entries


def check_host_key(hop: Hop, blob: bytes) -> tuple[Verdict, list[KnownHost]]:
    """Compare the server's key with every known_hosts file ssh would read for this hop.

    Returns the verdict and the entries recorded for the host with the same key
    type (for "changed": the keys that were expected).
    """
    name = hop.known_hosts_name
    keytype = blob_type(blob)
    recorded = [e for e in read_known_hosts([*hop.known_hosts, *GLOBAL_KNOWN_HOSTS]) if e.matches(name)]
    if any(e.marker == "@revoked" and e.blob == blob for e in recorded):
        return "revoked", []
    plain = [e for e in recorded if not e.marker]
    if any(e.blob == blob for e in plain):
        return "ok", []
    same_type = [e for e in plain if blob_type(e.blob) == keytype]
    if same_type:
        return "changed", same_type
    return "unknown", []


def known_key_types(hop: Hop) -> list[str]:
    """Key types already recorded for the host, so the server is asked for one of those first (as ssh does)."""
    name = hop.known_hosts_name
    types = []
    for e in read_known_hosts([*hop.known_hosts, *GLOBAL_KNOWN_HOSTS]):
        if not e.marker and e.matches(name):
            t = blob_type(e.blob)
            if t not in types:
                types.append(t)
    return types


def append_known_host(hop: Hop, blob: bytes) -> Path:
    """Record the key for the hop in its first user known_hosts file (hashed if HashKnownHosts says so)."""
    path = Path(hop.known_hosts[0])
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = hop.known_hosts_name
    if hop.hash_known_hosts:
        salt = os.urandom(20)
        digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
        name = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    line = f"{name} {blob_type(blob)} {base64.b64encode(blob).decode()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
        # One write with O_APPEND: a concurrent ssh appending too cannot interleave inside the line.
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return path
