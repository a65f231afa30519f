"""SkyPilot's cluster record read: the cluster's state, how its head node is reached, its price, and
what a job's end means when its cluster went away."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import EngineError


def cluster_state(record: Any | None) -> str:
    if record is None:
        return "absent"
    status = record["status"]
    return str(getattr(status, "value", status))


def on_spot(record: Any | None, use_spot: bool) -> bool:
    """Whether the cluster runs on spot capacity: SkyPilot's record of what it launched (the handle's
    ``launched_resources.use_spot``), else the machine's ``use_spot`` option (no record: torn down)."""
    handle = record.get("handle") if record is not None else None
    spot = getattr(getattr(handle, "launched_resources", None), "use_spot", None)
    return bool(use_spot) if spot is None else bool(spot)


def cluster_gone(cluster: str, record: Any | None, spot: bool) -> tuple[str, str] | None:
    """(cause, words) for a job on a cluster SkyPilot, asked afresh, says is not UP; None while it is UP.

    Asked only after the head's answer was bad (the job's process vanished, the head did not answer).
    A spot cluster that went away is taken to have been reclaimed by its cloud (``preempted``): SkyPilot's
    record does not tell a reclaim from a ``sky stop`` or ``sky down`` made by hand. Any other went away
    (stopped, torn down, its Slurm allocation ended, unhealthy): ``lost``.
    """
    state = cluster_state(record)
    if state == "UP":
        return None
    said = "absent (`sky status` no longer lists it)" if state == "absent" else state
    # INIT is SkyPilot's word for a cluster launching or unhealthy; its own reason says which.
    why = ""
    if state == "INIT" and record is not None:
        why = " ".join(str(record.get("init_status_reason") or "").split())[:200]
    if why:
        said = f"{said}: {why}"
    if spot:
        return ("preempted", f"the spot cluster {cluster} was reclaimed (SkyPilot says it is {said})")
    return ("lost", f"SkyPilot cluster {cluster} is {said} (it went away while the job ran)")


def head_route(record: Any) -> tuple[str, int, str, str | None]:
    """(host, port, user, key file) of a cluster's head node, as SkyPilot's record says.

    A Slurm cluster is reached through its login node (the one ``~/.slurm/config`` names), whose
    home the allocation shares; a cloud VM at its head address with the key SkyPilot made.
    """
    handle = record["handle"]
    info = getattr(handle, "cached_cluster_info", None)
    provider = getattr(info, "provider_config", None) or {}
    login = provider.get("ssh") if isinstance(provider, Mapping) else None
    if isinstance(login, Mapping) and login.get("hostname"):
        return (str(login["hostname"]), int(login.get("port") or 22), str(login["user"]), login.get("private_key"))
    credentials = record.get("credentials") or {}
    host = getattr(handle, "head_ip", None)
    if not host:
        raise EngineError(
            f"SkyPilot reports no address for the head of cluster {record['name']}; try again", transient=True
        )
    port = getattr(handle, "head_ssh_port", None) or 22
    user = credentials.get("ssh_user") or getattr(handle, "ssh_user", None)
    if not user:
        raise EngineError(f"SkyPilot reports no ssh user for cluster {record['name']}")
    return (str(host), int(port), str(user), credentials.get("ssh_private_key"))


def hourly_price(record: Any) -> float | None:
    """The cluster's price per hour in US dollars when SkyPilot knows it (clouds; not Slurm or Kubernetes)."""
    handle = record.get("handle")
    launched = getattr(handle, "launched_resources", None)
    nodes = getattr(handle, "launched_nodes", 1) or 1
    try:
        price = launched.get_cost(3600) * nodes if launched is not None else None
    except Exception:
        return None
    return round(float(price), 4) if price else None


def default_known_hosts(cluster: str) -> Path:
    """Where a cluster's head node key is kept unless the machine names a known_hosts file."""
    return Path.home() / ".config" / "jupyter-remote-compute" / "skypilot" / f"{cluster}.known_hosts"
