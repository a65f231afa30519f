"""The job's environment: a Python environment built on the machine, and the container ``Image`` the
command runs in (``environments/`` resolves, builds and runs them).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict, with_config
from pydantic_core import PydanticCustomError, core_schema

from . import values
from .base import STRICT, absent, problem, to_json, validate

_PYTHON = re.compile(r"^\d+(\.\d+){0,2}$")


@with_config(STRICT)
@dataclasses.dataclass(frozen=True)
class Image:
    """An image reference and the runtime asked to run it (``auto``: podman where installed, else docker)."""

    ref: Annotated[str, BeforeValidator(values.image_ref, json_schema_input_type=str)]
    runtime: Annotated[str, BeforeValidator(values.runtime, json_schema_input_type=str | None)] = "auto"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_before_validator_function(_image_in, handler(source))

    @classmethod
    def from_json(cls, value: Any, field: str = "image") -> Image | None:
        """``"REF"`` or ``{"ref": REF, "runtime": …}``; null is no image. Errors name the field."""
        return None if value is None else validate(cls, value, field)

    def to_json(self) -> dict[str, str]:
        return {"ref": self.ref, "runtime": self.runtime}

    def key_part(self) -> dict[str, str]:
        """What the job's key holds of the image. The digest is pinned per machine (the key holds the
        machine), so the same reference on the same machine is the same content."""
        return self.to_json()


def _image_in(value: Any) -> Any:
    if isinstance(value, str):  # "REF" alone is {"ref": REF}
        return {"ref": value}
    if not isinstance(value, (Mapping, Image)):
        raise problem("expected an image reference such as 'python:3.12-slim'")
    return value


def _packages(value: Any) -> Any:
    value = value or []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise problem("expected a list of requirements such as 'numpy>=2'")
    for i, p in enumerate(value):
        if not isinstance(p, str) or not p.strip():
            raise problem("expected a list of requirements such as 'numpy>=2'", at=i)
        if "\n" in p or p.strip().startswith("-"):
            raise problem(f"{p!r} is not one requirement", at=i)
    return tuple(p.strip() for p in value)


def _python(value: Any) -> Any:
    if not isinstance(value, str) or not _PYTHON.match(value):
        raise problem("expected a version such as '3.11'")
    return value


@with_config(STRICT)
@dataclasses.dataclass(frozen=True)
class Environment:
    """What a job asks its environment to hold: a Python environment built on the machine, and the
    container image the command (and the environment's build) runs in. On the wire the image is two
    settings, ``image`` (its reference) and ``runtime``."""

    requirements: Annotated[
        str | None,
        BeforeValidator(lambda v: values.relative_path(v) if v else None, json_schema_input_type=str | None),
        Field(
            description="a workspace file: requirements.txt, pyproject.toml (with its uv.lock), or pylock.toml",
            exclude_if=absent,
        ),
    ] = None
    packages: Annotated[
        tuple[str, ...],
        BeforeValidator(_packages, json_schema_input_type=list[str] | None),
        Field(description="requirements added on top", exclude_if=lambda v: not v),
    ] = ()
    python: Annotated[
        str | None,
        BeforeValidator(
            lambda v: _python(v) if v else None,
            json_schema_input_type=Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+){0,2}$")] | None,
        ),
        Field(description="e.g. 3.11", exclude_if=absent),
    ] = None
    same_as_here: Annotated[
        bool,
        Strict(),
        Field(description="the submitting Python's distributions, pinned", exclude_if=lambda v: not v),
    ] = False
    image: Annotated[Image | None, Field(exclude_if=absent)] = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_before_validator_function(
            _environment_in,
            handler(source),
            serialization=core_schema.wrap_serializer_function_ser_schema(_environment_out),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Any:
        """The image as it is written: its reference, and the runtime beside it."""
        ref = handler(schema)
        shown = handler.resolve_ref_schema(ref)
        shown["description"] = (
            "the Python environment the command runs in, built once per machine and content on the machine, "
            "and the container image the command (and the environment's build) runs in (null: the machine's "
            "`environment` option, else its `image` option, else the machine's own Python and shell)"
        )
        shown["properties"]["image"] = {
            "type": "string",
            "nullable": True,
            "minLength": 1,
            "description": "a container image (registry/name:tag or name@sha256:…) to run the command in; with "
            "requirements or packages the environment is built inside it, keyed by its digest",
        }
        shown["properties"]["runtime"] = {
            "type": "string",
            "enum": [*values.RUNTIMES, None],
            "nullable": True,
            "description": "the image's runtime; auto: podman, else docker",
        }
        return ref

    @property
    def builds(self) -> bool:
        """Whether a Python environment is asked for (an image alone runs the image's own Python)."""
        return bool(self.requirements or self.packages or self.python or self.same_as_here)

    @classmethod
    def from_json(cls, data: Any, field: str = "environment") -> Environment | None:
        """Check the shape of a request; None (or {}) asks for no environment."""
        if data is None:
            return None
        environment = validate(cls, data, field)
        return environment if environment != cls() else None

    def to_json(self) -> dict[str, Any]:
        return to_json(Environment, self)

    def python_part(self) -> Environment:
        """What makes the Python environment, without the image."""
        return dataclasses.replace(self, image=None)


def _environment_in(data: Any) -> Any:
    if isinstance(data, Environment):
        return data
    if not isinstance(data, Mapping):
        raise problem("expected requirements, packages, python, same_as_here or image")
    data = dict(data)
    ref, runtime = data.pop("image", None) or None, data.pop("runtime", None)
    if ref is None:
        if runtime not in (None, "", "auto"):
            raise problem("says how to run an image; name the image beside it", at="runtime")
        return data
    return {**data, "image": Image(_at("image", values.image_ref, ref), _at("runtime", values.runtime, runtime))}


def _at(name: str, check: Any, value: Any) -> Any:
    """``check(value)`` for the setting ``name`` of the environment (one the dataclass keeps elsewhere)."""
    try:
        return check(value)
    except PydanticCustomError as e:
        raise problem((e.context or {})["message"], at=name) from None


def _environment_out(environment: Environment, write: Any) -> dict[str, Any]:
    data = write(environment)
    image = data.pop("image", None)
    if image:
        data["image"] = image["ref"]
        if image["runtime"] != "auto":
            data["runtime"] = image["runtime"]
    return data
