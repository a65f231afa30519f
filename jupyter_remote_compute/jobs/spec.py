"""What a job is asked to do, validated once for every entry point.

A ``JobSpec`` comes from the panel, the magic, the CLI or a pipeline step.
Validation here is about shape: types, names, and that every path stays a
plain workspace-relative path. Whether the files exist (and stay inside the
workspace once symlinks are followed) is checked when they are read
(``transfer/manifest.py``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from ..engines.resources import Resources
from ..environments.environment import Environment
from ..environments.image import Image
from ..environments.image_registry import PULL_VARS
from ..environments.image_registry import check_name as check_registry_secret
from ..errors import InvalidSettings
from ..secrets import resolve_reference

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# Set by the launcher for every job; a spec may not override them.
RESERVED_ENV = frozenset({"MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "PYTHONUNBUFFERED", *PULL_VARS})


def parse_duration(value: str | float | int | None, field: str) -> float | None:
    """Seconds from ``3600``, ``"90s"``, ``"30m"``, ``"1h30m"`` or ``"2d"``; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidSettings(f"{field}: expected a duration such as 3600, '30m' or '2h'", field=field)
    if isinstance(value, (int, float)):
        seconds = float(value) if value < 1e300 else math.inf  # float() of a huge int would raise
    elif not isinstance(value, str):
        raise InvalidSettings(f"{field}: expected a duration such as 3600, '30m' or '2h'", field=field)
    else:
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or _DURATION.sub("", text).strip():
                raise InvalidSettings(
                    f"{field}: {value!r} is not a duration; write seconds or e.g. '30m', '2h', '1h30m'", field=field
                ) from None
            seconds = sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in parts)
    if seconds <= 0:
        raise InvalidSettings(f"{field}: must be longer than zero", field=field)
    if not math.isfinite(seconds):
        raise InvalidSettings(f"{field}: must be a finite duration", field=field)
    return seconds


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    out = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not out):
            n, seconds = divmod(seconds, size)
            out.append(f"{n}{unit}")
    return "".join(out)


def check_relative_path(path: str, field: str) -> str:
    """A workspace-relative POSIX path: no absolute path, no ``..``, no control characters."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidSettings(f"{field}: expected a workspace-relative path", field=field)
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        raise InvalidSettings(f"{field}: {path!r} contains a control character (newline, tab, …)", field=field)
    if path.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", path) or "\\" in path:
        raise InvalidSettings(f"{field}: {path!r} must be relative to the workspace, not absolute", field=field)
    parts = PurePosixPath(path).parts
    if ".." in parts:
        raise InvalidSettings(f"{field}: {path!r} leads out of the workspace ('..' is not allowed)", field=field)
    normalised = str(PurePosixPath(*[p for p in parts if p != "."])) if parts else "."
    if normalised in (".", "") or normalised.startswith(".punica"):
        raise InvalidSettings(f"{field}: {path!r} names the workspace itself or its .punica folder", field=field)
    return normalised


def _str_list(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InvalidSettings(f"{field}: expected a list of paths", field=field)
    return list(value)


def _given_or(value: Any, default: Any) -> Any:
    return default if value is None or value == "" else value


NO_RESOURCES = Resources()


@dataclasses.dataclass(frozen=True)
class JobSpec:
    machine: str
    command: str | tuple[str, ...]
    send: tuple[str, ...] = ()
    bring_back: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    timeout: float | None = None  # the longest the job may run on the far side
    name: str = ""
    key: str | None = None  # an explicit idempotency key; otherwise derived from the content
    # What the job asks its machine for (gpus, cpus, memory, nodes, partition); empty: the machine's defaults.
    resources: Resources = dataclasses.field(default_factory=Resources)
    # The Python environment the command runs in, and the container image it runs in
    # (environments/environment.py, environments/image.py); None: the machine's own Python and shell.
    environment: Environment | None = None
    # The Secret Manager entry (user:password) for pulling the image from a private registry
    # (environments/image_registry.py).
    registry_secret: str | None = None

    @property
    def image(self) -> Image | None:
        """The container image the command runs in (``environment.image``); None: the machine's own shell."""
        return self.environment.image if self.environment else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """Build and validate a spec from user input; errors name the setting."""
        if not isinstance(data, Mapping):
            raise InvalidSettings("a job needs an object of settings")
        if "image" in data:
            raise InvalidSettings(
                "image: an image is part of the environment now: write environment.image (and environment.runtime)",
                field="image",
            )
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            name = sorted(unknown)[0]
            raise InvalidSettings(f"{name}: unknown setting", field=name)

        # null (or "") means "not given"; any other falsy value ({}, 0, false) is a wrong type, not a default.
        machine = _given_or(data.get("machine"), "local")
        if not isinstance(machine, str):
            raise InvalidSettings("machine: expected a machine name", field="machine")

        command = data.get("command")
        if isinstance(command, str):
            if not command.strip():
                raise InvalidSettings("command: cannot be empty", field="command")
        elif isinstance(command, (list, tuple)) and command and all(isinstance(a, str) for a in command):
            command = tuple(command)
        else:
            raise InvalidSettings("command: expected a shell command or a list of arguments", field="command")
        if "\0" in (command if isinstance(command, str) else "".join(command)):
            raise InvalidSettings("command: contains a NUL character", field="command")

        # Globs are checked like paths: their fixed parts may not climb out either.
        send = tuple(check_relative_path(p, f"send[{i}]") for i, p in enumerate(_str_list(data.get("send"), "send")))
        bring_back = tuple(
            check_relative_path(p, f"bring_back[{i}]")
            for i, p in enumerate(_str_list(data.get("bring_back"), "bring_back"))
        )

        env_in = _given_or(data.get("env"), {})
        if not isinstance(env_in, Mapping):
            raise InvalidSettings("env: expected NAME → value pairs", field="env")
        env: dict[str, str] = {}
        for name, value in env_in.items():
            field = f"env.{name}"
            if not isinstance(name, str) or not ENV_NAME.match(name):
                raise InvalidSettings(f"{field}: not a valid environment variable name", field=field)
            if name in RESERVED_ENV:
                raise InvalidSettings(f"{field}: is set by jupyter-remote-compute for every job", field=field)
            if not isinstance(value, str):
                raise InvalidSettings(f"{field}: expected a string value", field=field)
            if "\0" in value:
                raise InvalidSettings(f"{field}: contains a NUL character", field=field)
            env[name] = value

        name = _given_or(data.get("name"), "")
        if not isinstance(name, str) or len(name) > 200 or any(ord(c) < 32 for c in name):
            raise InvalidSettings("name: expected one line of at most 200 characters", field="name")
        key = data.get("key")
        if key is not None and (not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", key)):
            raise InvalidSettings("key: letters, digits and _ . : - only, at most 128", field="key")

        return cls(
            machine=machine,
            command=command,
            send=send,
            bring_back=bring_back,
            env=env,
            timeout=parse_duration(data.get("timeout"), "timeout"),
            name=name,
            key=key,
            resources=Resources.from_json(data.get("resources"), "resources."),
            environment=Environment.from_json(data.get("environment")),
            registry_secret=check_registry_secret(data.get("registry_secret")),
        )

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec as the job state file keeps it: checked when it was submitted, only rebuilt here."""
        command = data["command"]
        return cls(
            machine=data.get("machine") or "local",
            command=command if isinstance(command, str) else tuple(command),
            send=tuple(data.get("send") or ()),
            bring_back=tuple(data.get("bring_back") or ()),
            env=dict(data.get("env") or {}),
            timeout=data.get("timeout"),
            name=data.get("name") or "",
            key=data.get("key"),
            # Most jobs ask for nothing: one shared (frozen) value, not a validation per job read.
            resources=Resources.from_json(resources) if (resources := data.get("resources")) else NO_RESOURCES,
            environment=_stored_environment(data),
            registry_secret=data.get("registry_secret"),
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "machine": self.machine,
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "send": list(self.send),
            "bring_back": list(self.bring_back),
            "env": dict(self.env),
            "timeout": self.timeout,
            "name": self.name,
            "key": self.key,
        }
        resources = self.resources.to_json()
        if resources:  # absent when nothing is asked: a job stored before resources existed reads back the same
            data["resources"] = resources
        if self.environment:  # likewise absent when none is asked for
            data["environment"] = self.environment.to_json()
        if self.registry_secret:  # likewise absent without one
            data["registry_secret"] = self.registry_secret
        return data

    @property
    def command_line(self) -> str:
        """The command as the machine's shell runs it, for people and records: words given apart are quoted."""
        return self.command if isinstance(self.command, str) else shlex.join(self.command)

    @property
    def display_name(self) -> str:
        return self.name or self.command_line

    def secret_refs(self) -> dict[str, str]:
        """Env variable → Secret Manager name, for values written ``secret:NAME``."""
        return {k: ref for k, v in self.env.items() if (ref := resolve_reference(v))}

    def plain_env(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if not resolve_reference(v)}

    def screened_settings(self) -> dict[str, Any]:
        """Every user-written value, by the name the user knows it under, for secret screening."""
        settings: dict[str, Any] = {"name": self.name}
        if isinstance(self.command, str):
            settings["command"] = self.command
        else:
            settings.update({f"command[{i}]": arg for i, arg in enumerate(self.command)})
        settings.update({f"env.{k}": v for k, v in self.env.items()})
        settings.update({f"send[{i}]": p for i, p in enumerate(self.send)})
        settings.update({f"bring_back[{i}]": p for i, p in enumerate(self.bring_back)})
        if self.resources.partition:
            settings["resources.partition"] = self.resources.partition
        if self.environment:
            settings.update({f"environment.packages[{i}]": p for i, p in enumerate(self.environment.packages)})
        if self.image:
            settings["environment.image"] = self.image.ref
        if self.registry_secret:  # a pasted password instead of a name is caught here
            settings["registry_secret"] = self.registry_secret
        return settings


def _stored_environment(data: Mapping[str, Any]) -> Environment | None:
    """The stored environment; a job stored when the image was a spec field of its own has it moved in."""
    environment = Environment.from_json(data.get("environment"))
    image = Image.from_json(data.get("image"))
    if image is None or (environment and environment.image):
        return environment
    return dataclasses.replace(environment or Environment(), image=image)
