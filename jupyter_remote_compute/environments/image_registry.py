"""Pulling a job's image: a private registry's credentials, the pull's timeout, how long pulled images stay.

The credentials come from the Secret Manager by name: the job's ``registry_secret``, else its
machine's option of that name. The value is ``user:password`` (or ``user:token``). It travels like a
job's ``secret:`` variables, on the launcher's standard input (``REGISTRY_AUTH_VAR``), and
``engines/farside/container.sh`` takes it out of its environment before anything else runs, writes it
to a 0600 auth file for the one pull (podman ``--authfile``, docker ``--config``) and removes the file
after: never in the runtime's own config, a command line, the container or its ``inspect``.

Two machine options shape the pull: ``pull_timeout`` (seconds a pull may go without progress, default
600) and ``image_max_age_days`` (an image the product pinned that no job used for that long is removed,
default 30). They reach container.sh as plain variables that the container does not get.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidSettings
from ..schema import values
from ..schema.base import checked

# The variables container.sh reads (and unsets) before the pull; never given to the container.
from ..schema.spec import IMAGE_MAX_AGE_VAR, PULL_TIMEOUT_VAR, REGISTRY_AUTH_VAR
from ..secrets import SecretStore

PULL_TIMEOUT = 600
IMAGE_MAX_AGE_DAYS = 30
#: Docker Hub's name for references without a registry host (``python:3.12``, ``library/python``).
DEFAULT_REGISTRY = "docker.io"


def registry_of(ref: str) -> str:
    """The registry host an image reference is pulled from (as podman and docker read it)."""
    first, slash, _ = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DEFAULT_REGISTRY


def check_name(value: Any, field: str = "registry_secret") -> str | None:
    """The name of a Secret Manager entry, or None when not given; errors name ``field``."""
    return checked(values.registry_secret, value, field)


def split_credentials(value: str) -> tuple[str, str] | None:
    """``(user, password)`` from ``user:password``; None for any other shape."""
    user, sep, password = value.strip("\n").partition(":")
    if not sep or not user or not password or any(ord(c) < 32 or c == "\x7f" for c in value.strip("\n")):
        return None
    return user, password


def with_machine_default(spec: Any, options: Mapping[str, Any]) -> Any:
    """``spec`` (a JobSpec) with its machine's ``registry_secret`` where it has an image and names none."""
    if spec.image is not None and spec.registry_secret is None and options.get("registry_secret"):
        return dataclasses.replace(spec, registry_secret=options["registry_secret"])
    return spec


def admit(spec: Any, secrets: SecretStore) -> None:
    """Refuse, at submit, a registry secret that is missing or not ``user:password``, naming the secret only."""
    name = spec.registry_secret
    if name is None:
        return
    if spec.image is None:
        raise InvalidSettings(
            "registry_secret: the job runs in no image, so it pulls nothing; leave it out", field="registry_secret"
        )
    value = secrets.get(name)
    if value is None:
        raise InvalidSettings(
            f"registry_secret: no secret named {name!r} in the Secret Manager; "
            f"store it with `jupyter remote-compute secrets set {name}`",
            field="registry_secret",
        )
    if split_credentials(value) is None:
        raise InvalidSettings(
            f"registry_secret: the secret {name!r} must hold user:password (or user:token) for "
            f"{registry_of(spec.image.ref)}; store it again with `jupyter remote-compute secrets set {name}`",
            field="registry_secret",
        )


def stored(secrets: SecretStore, name: str) -> str | None:
    """``user:password`` held under ``name`` (None where there is none, or it is not ``user:password``)."""
    value = secrets.get(name)
    if value is None or split_credentials(value) is None:
        return None
    return value.strip("\n")


def hidden(value: str | None) -> list[str]:
    """What to hide of credentials wherever a job's log is shown: the value and its password."""
    return [] if value is None else [value, value.split(":", 1)[1]]


def credentials(secrets: SecretStore, job: Any) -> str | None:
    """The job's registry credentials, read from the Secret Manager now (None without a registry secret)."""
    name = job.spec.registry_secret
    if name is None or job.spec.image is None:
        return None
    value = stored(secrets, name)
    if value is None:
        gone = secrets.get(name) is None
        held = "is no longer in the Secret Manager" if gone else "no longer holds user:password"
        raise InvalidSettings(f"registry_secret: the secret {name!r} {held}")
    return value


def mask_values(secrets: SecretStore, job: Any) -> list[str]:
    """What to hide of the job's registry credentials wherever its log is shown."""
    return hidden(credentials(secrets, job))


def pull_env(job: Any, options: Mapping[str, Any], secrets: SecretStore) -> tuple[dict[str, str], dict[str, str]]:
    """The plain and the secret variables container.sh reads for the pull (none for a job without an image)."""
    if job.spec.image is None:
        return {}, {}
    plain = {
        PULL_TIMEOUT_VAR: str(int(options.get("pull_timeout") or PULL_TIMEOUT)),
        IMAGE_MAX_AGE_VAR: str(int(options.get("image_max_age_days") or IMAGE_MAX_AGE_DAYS)),
    }
    value = credentials(secrets, job)
    return plain, ({REGISTRY_AUTH_VAR: value} if value is not None else {})
