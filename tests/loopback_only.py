"""Run a Python module with every network connection limited to loopback: ``python loopback_only.py -m MOD ...``.

The API fuzzer adds machines at whatever address it makes up and then checks them; this keeps
those checks (paramiko, HTTP clients: all through ``socket``) from resolving or reaching any host
but this one. A refused connection is an ``OSError``, which the engines report as a machine error.
"""

from __future__ import annotations

import ipaddress
import runpy
import socket
import sys
from typing import Any

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _is_loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _refuse(host: object) -> OSError:
    return ConnectionRefusedError(f"loopback_only: {host!r} is not a loopback address (tests never leave this host)")


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if host is not None and not _is_loopback(host):
        raise socket.gaierror(socket.EAI_NONAME, f"loopback_only: {host!r} is not resolved in tests")
    return _real_getaddrinfo(host, *args, **kwargs)


def _connect(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
        raise _refuse(address[0])
    return _real_connect(self, address)


def _connect_ex(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
        raise _refuse(address[0])
    return _real_connect_ex(self, address)


def install() -> None:
    socket.getaddrinfo = _getaddrinfo
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit("usage: loopback_only.py -m MODULE [ARG ...]")
    install()
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
