"""What a SkyPilot launch asks for: the machine's settings, checked when it is saved, and the
``sky.Resources`` and ``sky.Task`` a launch provisions with.

The SDK is imported only when a machine of this kind is used (``load_sdk``), so the kind is listed
(and says what to install) where SkyPilot is not.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ..errors import InvalidSettings
from .base import EngineError
from .resources import Resources

INSTALL_HINT = 'install jupyter-remote-compute[skypilot] (pip install "jupyter-remote-compute[skypilot]")'
DEFAULT_AUTOSTOP = 30
#: SkyPilot cluster names: a letter, then letters, digits, '-', '_' or '.', ending in a letter or digit.
_CLUSTER_NAME = re.compile(r"^[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$")


def sky_installed() -> bool:
    """Whether SkyPilot (the ``skypilot`` distribution, not the unrelated ``sky``) can be imported."""
    try:
        importlib.metadata.distribution("skypilot")
        return importlib.util.find_spec("sky") is not None
    except (ImportError, ValueError):  # PackageNotFoundError is an ImportError
        return False


def load_sdk() -> ModuleType:
    """SkyPilot's client SDK, imported on first use; a clear error naming the extra when it is missing."""
    try:
        from sky.client import sdk
    except ImportError:
        raise EngineError(f"SkyPilot is not installed: {INSTALL_HINT}") from None
    return sdk


def sky_module() -> ModuleType:
    load_sdk()
    import sky

    return sky


def default_cluster(machine: str) -> str:
    """The SkyPilot cluster a machine uses unless it names one: ``jrc-<machine name>``, made valid."""
    slug = re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")[:40] or "machine"
    return f"jrc-{slug}"


@dataclasses.dataclass(frozen=True)
class SkyPilotSettings:
    """A machine's SkyPilot settings, checked when the machine is saved."""

    infra: str | None
    accelerator: str | None
    use_spot: bool
    cluster: str
    autostop: int
    down: bool
    defaults: Resources

    @property
    def cloud(self) -> str | None:
        """The infra's cloud in SkyPilot's lower-case spelling (``k8s`` is ``kubernetes``)."""
        return cloud_key(self.infra.split("/")[0]) if self.infra else None

    @classmethod
    def from_options(cls, machine: str, address: str, options: Mapping[str, Any]) -> SkyPilotSettings:
        infra = options.get("infra") or (address if address not in ("", "-", "skypilot") else None)
        if infra is not None and (not isinstance(infra, str) or not re.match(r"^[a-zA-Z0-9][-_./a-zA-Z0-9*]*$", infra)):
            raise InvalidSettings(
                "infra: use SkyPilot's infra string, such as aws, gcp/us-central1, k8s or slurm/mycluster",
                field="infra",
            )
        accelerator = options.get("accelerator") or None
        if accelerator is not None and (
            not isinstance(accelerator, str) or not re.match(r"^[A-Za-z0-9][-_.A-Za-z0-9]*(:\d+)?$", accelerator)
        ):
            raise InvalidSettings(
                "accelerator: a SkyPilot accelerator name such as A100, H100 or L4", field="accelerator"
            )
        cluster = options.get("cluster") or default_cluster(machine)
        if not isinstance(cluster, str) or not _CLUSTER_NAME.match(cluster) or len(cluster) > 63:
            raise InvalidSettings(
                "cluster: a SkyPilot cluster name: a letter, then letters, digits, '-', '_' or '.'", field="cluster"
            )
        autostop = options.get("autostop", DEFAULT_AUTOSTOP)
        if isinstance(autostop, str) and autostop.strip().lstrip("-").isdigit():
            autostop = int(autostop)
        if isinstance(autostop, bool) or not isinstance(autostop, int) or autostop < -1:
            raise InvalidSettings(
                "autostop: idle minutes before the cluster stops itself (0 or more; -1 never)", field="autostop"
            )
        flags = {}
        for name in ("use_spot", "down"):
            value = options.get(name, False)
            if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
                value = value.lower() in ("true", "yes", "1")
            if not isinstance(value, bool):
                raise InvalidSettings(f"{name}: true or false", field=name)
            flags[name] = value
        defaults = Resources.from_json(options.get("resources"), "resources.")
        return cls(infra, accelerator, flags["use_spot"], cluster, autostop, flags["down"], defaults)


def sky_resources(settings: SkyPilotSettings, asked: Resources | None) -> Any:
    """The ``sky.Resources`` a job's resources ask for on this machine (the machine's defaults under them)."""
    sky = sky_module()
    res = (asked or Resources()).over(settings.defaults)
    if res.nodes is not None and res.nodes > 1:
        raise InvalidSettings(
            "resources.nodes: a SkyPilot machine runs each job on its head node", field="resources.nodes"
        )
    if res.partition:
        raise InvalidSettings(
            "resources.partition: choose the Slurm partition in the machine's infra (slurm/<cluster>/<partition>)",
            field="resources.partition",
        )
    kwargs: dict[str, Any] = {"use_spot": settings.use_spot}
    if settings.infra:
        kwargs["infra"] = settings.infra
    if res.gpus:
        if not settings.accelerator:
            raise InvalidSettings(
                f"resources.gpus: {res.gpus} GPUs asked, but the machine names no accelerator (e.g. A100)",
                field="resources.gpus",
            )
        kwargs["accelerators"] = f"{settings.accelerator.split(':')[0]}:{res.gpus}"
    elif settings.accelerator:
        kwargs["accelerators"] = settings.accelerator
    if res.cpus is not None:
        kwargs["cpus"] = str(res.cpus)
    if res.memory_mb is not None:
        kwargs["memory"] = f"{max(1, math.ceil(res.memory_mb / 1024))}"
    try:
        return sky.Resources(**kwargs)
    except (ValueError, TypeError) as e:
        # SkyPilot's own words (an unknown infra, a bad accelerator) name what is wrong.
        raise InvalidSettings(f"SkyPilot refused the resources: {e}", field="resources") from None


def launch_task(settings: SkyPilotSettings, asked: Resources | None) -> Any:
    """The task a launch provisions with: resources only, no command (jobs come later, one ``exec`` each)."""
    sky = sky_module()
    task = sky.Task(name=settings.cluster)
    task.set_resources(sky_resources(settings, asked))
    return task


def cloud_key(cloud: str) -> str:
    """A cloud in SkyPilot's lower-case spelling (``k8s`` is ``kubernetes``)."""
    return {"k8s": "kubernetes"}.get(cloud.lower(), cloud.lower())
