"""An ssh host list: one machine whose ``hosts`` are several ssh hosts, for jobs of several nodes.

The first host is the machine's address and the rendezvous; each is reached as an ssh machine is.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidSettings

#: The machine option that makes an ssh machine a host list.
HOSTS = "hosts"


def check_hosts(address: str, hosts: Any, validate: Any) -> tuple[str, ...]:
    """A machine's ``hosts``: two or more ssh addresses, each once, the first the machine's address.

    ``validate`` is the ssh kind's address check (ValueError with what is wrong)."""
    where = f"options.{HOSTS}"
    if isinstance(hosts, str) or not isinstance(hosts, list | tuple) or len(hosts) < 2:
        raise InvalidSettings(
            f"{where}: expected a list of two or more ssh hosts, the first the machine's address "
            f"(e.g. [{address}, node2])",
            field=where,
        )
    out: list[str] = []
    for i, host in enumerate(hosts):
        if not isinstance(host, str):
            raise InvalidSettings(f"{where}[{i}]: expected an ssh host (text), not {type(host).__name__}", field=where)
        try:
            host = validate(host)
        except ValueError as e:
            raise InvalidSettings(f"{where}[{i}]: {str(e).removeprefix('address: ')}", field=where) from None
        if host in out:
            raise InvalidSettings(f"{where}[{i}]: {host} is listed twice; list each host once", field=where)
        out.append(host)
    if out[0] != address:
        raise InvalidSettings(
            f"{where}[0]: the first host is the rendezvous and must be the machine's address ({address}), "
            f"not {out[0]}; list {address} first",
            field=where,
        )
    return tuple(out)
