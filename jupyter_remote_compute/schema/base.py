"""How a boundary type is read: pydantic validates it, and its first error becomes an ``InvalidSettings``.

A validator raises ``problem(...)``, which says what is wrong and what to do without naming the
setting; ``validate`` names it from where pydantic found it (``send[0]``, ``env.TOKEN``,
``resources.memory``), behind an optional prefix (``options.environment``), so one check serves
every place a value is read from.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from ..errors import InvalidSettings

T = TypeVar("T")

#: Read: no setting the type does not know. Written (and so described): every field but those left out when empty.
STRICT = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


def unless_none(check: Any) -> Any:
    """A check of an optional value: null (or "") is not given."""

    def read(value: Any) -> Any:
        return None if value is None or value == "" else check(value)

    return read


def absent(value: Any) -> bool:
    """``exclude_if`` of a field left out of what is written while it is not set."""
    return value is None


#: What a person reads for pydantic's own errors (a value of the wrong type, a setting too many).
_MESSAGES = {
    "missing": "is required",
    "missing_argument": "is required",
    "extra_forbidden": "unknown setting",
    "unexpected_keyword_argument": "unknown setting",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "dict_type": "expected an object",
    "dataclass_type": "expected an object",
    "dataclass_args_type": "expected an object",
    "model_type": "expected an object",
}


def problem(message: str, at: str | int | None = None) -> PydanticCustomError:
    """What a validator raises: ``message`` without the setting's name (``validate`` adds it);
    ``at``: the setting below the one validated that is at fault (a key of a mapping)."""
    return PydanticCustomError("invalid", "{message}", {"message": message, "at": at})


def field_name(loc: tuple[str | int, ...], prefix: str = "") -> str:
    """``("send", 0)`` → ``send[0]``, ``("env", "TOKEN")`` → ``env.TOKEN``, behind ``prefix``."""
    name = prefix
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part != "[key]":
            name += f".{part}" if name else str(part)
    return name


def invalid(error: ValidationError, prefix: str = "", type_: Any = None) -> InvalidSettings:
    """The first of pydantic's errors as the error users see: the setting named, then what is wrong
    (for a setting the type does not know, the ones it does, when ``type_`` is given)."""
    first = error.errors(include_url=False)[0]
    context = first.get("ctx") or {}
    at = context.get("at")
    field = field_name((*first["loc"], *(() if at is None else (at,))), prefix)
    message = context["message"] if first["type"] == "invalid" else _MESSAGES.get(first["type"], first["msg"])
    if first["type"] in ("extra_forbidden", "unexpected_keyword_argument") and type_ is not None:
        known = known_settings(type_, tuple(first["loc"][:-1]))
        if known:
            message += f"; use {', '.join(known[:-1])} or {known[-1]}" if len(known) > 1 else f"; use {known[0]}"
    return InvalidSettings(f"{field}: {message}" if field else message, field=field or None)


def known_settings(type_: Any, path: tuple[str | int, ...]) -> list[str]:
    """The settings the object at ``path`` inside ``type_`` takes, as they are written; [] if unknown."""
    schema = _input_schema(type_)
    definitions = schema.get("$defs", {})

    def resolved(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = definitions.get(node["$ref"].rsplit("/", 1)[-1], {})
        for choice in node.get("anyOf", ()):  # an optional object: the alternative that has settings
            choice = resolved(choice)
            if "properties" in choice or "items" in choice:
                return choice
        return node

    node = resolved(schema)
    for part in path:
        node = resolved(node.get("items", {}) if isinstance(part, int) else node.get("properties", {}).get(part, {}))
    return list(node.get("properties", {}))


@functools.cache
def _input_schema(type_: Any) -> dict[str, Any]:
    try:
        return adapter(type_).json_schema(mode="validation")
    except Exception:  # a type pydantic cannot describe: its refusals just say "unknown setting"
        return {}


@functools.cache
def adapter(type_: Any) -> TypeAdapter[Any]:
    """One adapter per type: building one compiles its validator and serializer."""
    return TypeAdapter(type_)


def validate(type_: type[T], data: Any, prefix: str = "") -> T:
    """``data`` read as ``type_``; a refusal names the setting (``prefix`` in front, e.g. ``options.``)."""
    try:
        return adapter(type_).validate_python(data)
    except ValidationError as e:
        raise invalid(e, prefix, type_) from None


def to_json(type_: Any, value: Any, exclude: Any = None) -> Any:
    """``value`` as JSON data, in the shape its type writes (the state file's and the API's); ``exclude``:
    fields left out, as pydantic's ``exclude`` names them (``{"run": {"driver"}}``)."""
    # The serializer itself: TypeAdapter.dump_python's own checks cost as much again (Job.to_json, per job).
    return adapter(type_).serializer.to_python(value, mode="json", by_alias=True, exclude=exclude)


def checked(check: Callable[[Any], T], value: Any, field: str) -> T:
    """A validator's check run outside a model: a problem becomes an ``InvalidSettings`` naming ``field``."""
    try:
        return check(value)
    except PydanticCustomError as e:
        context = e.context or {}
        at = context.get("at")
        name = field_name(() if at is None else (at,), field)
        raise InvalidSettings(f"{name}: {context.get('message', e.message())}", field=name) from None
