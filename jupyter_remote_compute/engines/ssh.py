"""Machines reached over SSH, needing only POSIX sh, tar and coreutils on the far side.

The ssh kind is the ssh transport with the default launcher (``shell.ShellEngine``): every
call is an exec channel of the engine's one connection (``ssh_connection.py``: route,
sign-in, host keys, reconnecting), the user's own OpenSSH client over a master connection this
process owns where ``ssh`` is installed (``ssh_openssh.py``), paramiko otherwise (option
``ssh_transport`` chooses). What is ssh's own is here: its options, the addresses it accepts,
which client to use and the host-key flow. The far side (prepare, the input cache, status, logs,
fetch, cleanup) is the shared one; the Slurm kind is this transport with another launcher.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import paramiko

from . import farside, ssh_config, ssh_hosts, ssh_openssh
from .base import EngineContext, EngineError, Features, OptionField
from .cache_send import input_set_digest
from .shell import ShellEngine
from .ssh_connection import AuthenticationFailed, Connection, HostKeyChanged, HostKeyUnknown, ParamikoConnection
from .transport import Transport

DEFAULT_BASE_DIR = "~/.jupyter-remote-compute"
_UNSAFE_ADDRESS = re.compile(r"[\s;&|<>()$`\\\"'*?\[\]{}!#~^,]")
_ONE_LINE = re.compile(r"^[^\r\n\0]+$")
TRANSPORTS = ("auto", "openssh", "paramiko")
# The process-wide default for machines that do not choose (tests that must not run a real ssh client set it).
TRANSPORT_ENV = "JUPYTER_REMOTE_COMPUTE_SSH_TRANSPORT"


def choose_transport(options: Mapping[str, Any]) -> str:
    """``openssh`` or ``paramiko``: the machine's ``ssh_transport``, else the environment's, else ``auto``.

    ``auto`` is OpenSSH where an ``ssh`` client is on PATH, paramiko otherwise.
    """
    wanted = options.get("ssh_transport") or os.environ.get(TRANSPORT_ENV) or "auto"
    if wanted not in TRANSPORTS:
        raise EngineError(f"ssh_transport: {wanted!r} is not one of {', '.join(TRANSPORTS)}")
    if wanted == "openssh" and not ssh_openssh.available():
        raise EngineError("ssh_transport: openssh was chosen, but no ssh client is on PATH (install openssh-client)")
    if wanted == "auto":
        return "openssh" if ssh_openssh.available() else "paramiko"
    return wanted


class SSHEngine(ShellEngine):
    """A machine reached over SSH: the user's agent and ssh config, host keys from known_hosts."""

    kind = "ssh"
    label = "SSH"
    features = Features(host_keys=True, checkpoints=True)
    options = {
        **farside.CACHE_OPTIONS,
        "user": OptionField(str, "User name on the machine (default: from ssh config, else your local name)"),
        "port": OptionField(int, "SSH port (default: from ssh config, else 22)"),
        "identity_file": OptionField(str, "Private key file to sign in with (default: ssh-agent and ssh config)"),
        "base_dir": OptionField(str, f"Directory for jobs and the input cache on the machine ({DEFAULT_BASE_DIR})"),
        "known_hosts": OptionField(str, "known_hosts file checked and written (default ~/.ssh/known_hosts)"),
        "ssh_config": OptionField(str, "ssh config file read for the address (default ~/.ssh/config)"),
        "ssh_transport": OptionField(
            str, "auto (your ssh client where installed, else built-in), openssh or paramiko (built-in)"
        ),
        ssh_hosts.HOSTS: OptionField(
            list,
            "Several ssh hosts for jobs of several nodes, the first the address and the rendezvous, "
            "e.g. [node1, node2]: each reached as this machine is",
        ),
        "rendezvous_timeout": OptionField(
            int,
            "With hosts: seconds a torchrun job's nodes have to meet at the first host before it fails (default 600)",
        ),
    }

    def __new__(cls, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> Any:
        # A machine with hosts is a host list: an engine per host inside one (ssh_hosts.py).
        if cls is SSHEngine and options.get(ssh_hosts.HOSTS):
            return ssh_hosts.HostListEngine(name, address, options, context)
        return super().__new__(cls)

    @classmethod
    def features_for(cls, options: Mapping[str, Any]) -> Features:
        return ssh_hosts.FEATURES if cls is SSHEngine and options.get(ssh_hosts.HOSTS) else cls.features

    @classmethod
    def check_settings(cls, address: str, options: Mapping[str, Any]) -> None:
        if options.get(ssh_hosts.HOSTS) is not None:
            ssh_hosts.check_hosts(address, options[ssh_hosts.HOSTS], cls.validate_address)

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        # Checked before the transport is made from them.
        super().__init__(name, self.validate_address(address), ssh_options(options), context)
        self.connection: Connection = self.transport  # type: ignore[assignment]  # what make_transport made

    def make_transport(self) -> Transport:
        transport = choose_transport(self.machine_options)
        connection = ssh_openssh.OpenSSHConnection if transport == "openssh" else ParamikoConnection
        return connection(self.name, self.address, self.machine_options)

    def default_base_dir(self) -> str:
        return self.machine_options.get("base_dir") or DEFAULT_BASE_DIR

    @classmethod
    def is_transient(cls, error: Exception) -> bool:
        # paramiko reports a connection that went away as SSHException or EOFError.
        return isinstance(error, paramiko.SSHException | EOFError) or super().is_transient(error)

    @property
    def channels_opened(self) -> int:
        """Exec channels opened so far (tests count round trips with it)."""
        return self.connection.channels_opened

    @property
    def connections_made(self) -> int:
        """Connections made so far (1 + reconnects)."""
        return self.connection.connections_made

    def hop(self) -> ssh_config.Hop:
        """The resolved route to the machine."""
        return self.connection.hop()

    def host_key(self) -> tuple[str, str]:
        """The machine's host key as (type, ``SHA256:`` fingerprint), without signing in to it."""
        return self.connection.host_key()

    def trust_host(self, expected_fingerprint: str | None = None) -> str:
        return self.connection.trust_host(expected_fingerprint)

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


def ssh_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A machine's options with the ssh transport's checked (single lines, a port number)."""
    checked = dict(options)
    for key in ("base_dir", "known_hosts", "ssh_config", "identity_file", "user", "ssh_transport"):
        value = checked.get(key)
        if value is not None and (not isinstance(value, str) or not _ONE_LINE.match(value)):
            raise EngineError(f"{key}: must be a non-empty single line")
    port = checked.get("port")
    if isinstance(port, str) and port.isdigit():
        port = checked["port"] = int(port)
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise EngineError("port: must be a number from 1 to 65535")
    return checked


__all__ = [
    "AuthenticationFailed",
    "HostKeyChanged",
    "HostKeyUnknown",
    "SSHEngine",
    "input_set_digest",
]
