"""What a machine entry of compute.yaml may hold: names, kinds, addresses and each kind's options.

Every entry is checked when the file is read and when a face saves one, with errors that name the
line and the field; keys that would put a secret in the file are refused.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarbool import ScalarBoolean

from ..engines import ROUTED_KINDS, engine_class, engine_kinds
from ..engines.base import Engine, OptionField
from ..errors import Conflict, InvalidSettings
from ..schema.notify import machine_webhook
from ..secrets import NAME_RULE as SECRET_NAME_RULE
from ..secrets import URL_CREDENTIALS, is_secret_name
from .yaml_document import YamlDocument

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
NAME_RULE = "1 to 40 characters: lowercase letters, digits and '-', starting with a letter or digit"
LOCAL = "local"
FIELDS = ("kind", "address", "enabled", "created", "access")
#: What an ``access`` entry holds (an organization's machine: who may use it, ``schema.machine.MachineAccess``).
ACCESS_KEYS = ("users", "groups")
#: Options every kind takes, beside its own.
COMMON_OPTIONS: Mapping[str, OptionField] = {
    "price_per_hour": OptionField(float, "What an hour of this machine costs, for usage cost estimates"),
    # The Python environment of jobs (environments/environment.py): a default, where packages come from, eviction.
    "environment": OptionField(dict, "The Python environment jobs run in unless they ask for their own"),
    "index_url": OptionField(str, "The package index environments are installed from (default: the installer's)"),
    "index_ca_bundle": OptionField(
        str,
        "Path on the machine to the CA bundle the index's certificate is checked with (default: the machine's "
        "SSL_CERT_FILE, pip's cert, its system store)",
    ),
    "find_links": OptionField(str, "A folder or page of wheels environments may be installed from, beside the index"),
    "wheels": OptionField(
        str, "'from_here': this side resolves and sends the wheels, the machine installs offline (no index there)"
    ),
    "wheels_platform": OptionField(
        str, "The machine's platform for wheels: from_here (default: this side's arch on manylinux_2_28)"
    ),
    "env_max_age_days": OptionField(int, "Days an unused Python environment stays on the machine (default 30)"),
    "env_max_bytes": OptionField(int, "Most bytes the machine's Python environments take together (default 20 GiB)"),
    # Container images (environments/image.py): run on local and ssh machines, refused at submit elsewhere.
    "image": OptionField(str, "The container image jobs run in unless they, or the environment option, name one"),
    "container_runtime": OptionField(str, "auto (podman, else docker), podman or docker"),
    "container_network": OptionField(str, "host (default) or none: the containers' network"),
    "container_gpus": OptionField(str, "none (default) or all: whether jobs' containers get all the machine's GPUs"),
    # Pulling images (environments/image_registry.py): a private registry's credentials, the stall limit, eviction.
    "registry_secret": OptionField(
        str,
        "Name of the Secret Manager entry (user:password) for the private registry images are pulled from",
        secret_name=True,
    ),
    "pull_timeout": OptionField(
        int, "Seconds an image pull may go without progress before the job fails (default 600)"
    ),
    "image_max_age_days": OptionField(int, "Days an image no job used stays on the machine (default 30)"),
    # How many jobs of a pool's (or any) placement the machine takes at once (jobs/placement.py).
    "max_jobs": OptionField(
        int, "The most jobs that run on the machine at once when a pool places jobs (default: no limit)"
    ),
    # Its own webhook, told of its jobs' state changes beside each job's own (jobs/notify.py).
    "notify": OptionField(
        str, "A URL every job on this machine POSTs its state changes to (secret:NAME: the URL kept as a secret)"
    ),
    "notify_secret": OptionField(
        str, "Name of the Secret Manager entry whose value signs the notify webhook's body", secret_name=True
    ),
    "notify_events": OptionField(list, "The job states the notify webhook is told of (default: every change)"),
    # A running job's machine that does not answer (jobs/retries.py).
    "unreachable_after": OptionField(
        int,
        "Seconds the machine may not answer before a running job's attempt ends machine_unreachable (default: "
        "waited for; 600 for a job whose retry names machine_unreachable)",
    ),
}
#: Option names that would put a secret in the file.
_SECRET_KEYS = frozenset({"token", "password", "passwd", "passphrase", "secret", "api_key", "apikey"})
_SECRET_SUFFIXES = ("_token", "_password", "_passphrase", "_api_key")
#: A secret *name* that looks like a pasted value: long and without the separators names use.
_LOOKS_LIKE_VALUE = re.compile(r"^(?:[0-9a-fA-F]{32,}|(?=.*[0-9])(?=.*[a-z])(?=.*[A-Z])[A-Za-z0-9+=]{24,})$")


def _is_secret_key(key: str) -> bool:
    low = key.lower()
    return low in _SECRET_KEYS or low.endswith(_SECRET_SUFFIXES)


def _secret_key_message(key: str) -> str:
    return (
        f"a machine cannot hold a secret ({key!r}) in compute.yaml: store it in the Secret Manager "
        "and reference it by name with token_secret"
    )


# -- validation -------------------------------------------------------------------------
def check_name(name: object) -> None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidSettings(f"a machine name must be {NAME_RULE}", field="name")
    if name == LOCAL:
        raise InvalidSettings("'local' is the built-in machine (this computer); choose another name", field="name")


def check_editable(name: str) -> None:
    if name == LOCAL:
        raise Conflict("'local' is the built-in machine: it cannot be changed, disabled or removed")


def check_enabled(enabled: object) -> None:
    if not isinstance(enabled, bool):
        raise InvalidSettings("enabled must be true or false", field="enabled")


def engine_of_kind(kind: object) -> type[Engine]:
    known = ", ".join(k for k in engine_kinds() if k != LOCAL) or "none installed"
    if kind == LOCAL:
        raise InvalidSettings(
            f"kind 'local' is the built-in machine and cannot be added (kinds: {known})", field="kind"
        )
    if not isinstance(kind, str) or kind in ROUTED_KINDS:
        raise InvalidSettings(f"kind must be one of: {known}", field="kind")
    try:
        return engine_class(kind)
    except ValueError:
        raise InvalidSettings(f"unknown kind {kind!r}; known kinds: {known}", field="kind") from None


_UNPRINTABLE = "must not hold control characters or lone surrogates (it holds {})"


def unprintable(text: str) -> str | None:
    """The first control character or lone surrogate in ``text``, written as Python escapes it; else None.

    Neither belongs in an address: a terminal would act on one where it is shown, and the other is no
    character at all (compute.yaml could not be written as UTF-8).
    """
    for c in text:
        if unicodedata.category(c) in ("Cc", "Cs"):
            return ascii(c)
    return None


def check_address(cls: type[Engine], address: object) -> str:
    if not isinstance(address, str):
        raise InvalidSettings("address must be text (a host name or a URL)", field="address")
    if (found := unprintable(address)) is not None:
        raise InvalidSettings("address " + _UNPRINTABLE.format(found), field="address")
    try:
        return cls.validate_address(address)
    except ValueError as e:
        raise InvalidSettings(str(e), field="address") from None


_TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _coerce(key: str, field: OptionField, value: Any) -> Any:
    """Check one option's value against its declared type; the message never repeats the value."""
    where = f"options.{key}"
    expected = field.type
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(expected, type) and issubclass(expected, os.PathLike) and isinstance(value, str):
        ok = True
    else:
        ok = isinstance(value, expected)
    if not ok:
        word = _TYPE_WORDS.get(expected, getattr(expected, "__name__", str(expected)))
        raise InvalidSettings(f"{where} must be {word}, not {type(value).__name__}", field=where)
    if field.secret_name:
        if value.startswith("secret:"):
            raise InvalidSettings(f"{where} takes the plain name of a secret, without 'secret:'", field=where)
        if not is_secret_name(value):
            raise InvalidSettings(f"{where} must name a Secret Manager entry: {SECRET_NAME_RULE}", field=where)
        if _LOOKS_LIKE_VALUE.match(value):
            raise InvalidSettings(
                f"{where} looks like a secret itself, not the name of one: store the secret in the Secret "
                "Manager (e.g. as compute/<machine>) and put that name here",
                field=where,
            )
    return value


def check_options(
    cls: type[Engine], options: Mapping[str, Any], *, changing: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The options to save. ``changing`` is None for a new machine (``options`` is all there is),
    else the changes to merge into ``options`` (the entry's current options: keys this code
    does not know are kept, only the changed keys are checked)."""
    if not isinstance(options, Mapping) or (changing is not None and not isinstance(changing, Mapping)):
        raise InvalidSettings("options must be a mapping of option names to values", field="options")
    declared: Mapping[str, OptionField] = {**COMMON_OPTIONS, **cls.options}
    incoming = options if changing is None else changing
    merged = {} if changing is None else dict(options)
    for key, value in incoming.items():
        if not isinstance(key, str) or not key:
            raise InvalidSettings("option names must be non-empty text", field="options")
        where = f"options.{key}"
        if _is_secret_key(key):
            raise InvalidSettings(_secret_key_message(key), field=where)
        if key in FIELDS:
            raise InvalidSettings(f"{key} is a machine field, not an option: set it on its own", field=where)
        if value is None and changing is not None:
            if key in declared and declared[key].required:
                raise InvalidSettings(f"{where} is required for {cls.kind} machines", field=where)
            merged.pop(key, None)
            continue
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise InvalidSettings(f"unknown option {key!r} for {cls.kind} machines (options: {known})", field=where)
        merged[key] = _coerce(key, declared[key], value)
        if key == "price_per_hour" and merged[key] < 0:
            raise InvalidSettings(f"{where} must not be negative", field=where)
        if key in ("pull_timeout", "image_max_age_days", "max_jobs") and merged[key] <= 0:
            raise InvalidSettings(f"{where} must be a whole number above zero", field=where)
        if key == "wheels" and merged[key] != "from_here":
            raise InvalidSettings(f"{where}: the only value is 'from_here' (leave it out for the index)", field=where)
        if key in ("index_url", "find_links") and URL_CREDENTIALS.search(merged[key]):
            raise InvalidSettings(
                f"{where} holds a user name or password: give the index's credentials to the job as secrets "
                "(env UV_INDEX_<NAME>_PASSWORD=secret:NAME, or PIP_INDEX_URL=secret:NAME), not in compute.yaml",
                field=where,
            )
    if any(key.startswith("notify") for key in incoming):
        machine_webhook(merged)  # a URL, a secret's name, job states
    for key, field in declared.items():
        if field.required and key not in merged:
            raise InvalidSettings(f"options.{key} is required for {cls.kind} machines", field=f"options.{key}")
    return merged


def option_position(entry: CommentedMap) -> int:
    """Where a new option goes: before ``enabled``/``created`` (as a new entry is laid out)."""
    keys = list(entry)
    for field in ("enabled", "created"):
        if field in keys:
            return keys.index(field)
    return len(keys)


def check_entry(doc: YamlDocument, name: Any, entry: Any) -> None:
    """One entry of ``machines`` as a person may have written it."""
    machines = doc.machines
    at = doc.line(machines, name)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise doc.error(at, f"machine name {str(name)!r} is not valid: a name must be {NAME_RULE}")
    if name == LOCAL:
        raise doc.error(at, "'local' is the built-in machine and cannot be listed; rename this entry")
    if not isinstance(entry, CommentedMap):
        raise doc.error(doc.line(machines, name, value=True), f"machine {name!r} must be a mapping of settings")
    for key in ("kind", "address"):
        if key not in entry:
            raise doc.error(at, f"machine {name!r} has no {key}")
        if not isinstance(entry[key], str) or not entry[key]:
            raise doc.error(doc.line(entry, key, value=True), f"machine {name!r}: {key} must be non-empty text")
        if (found := unprintable(entry[key])) is not None:
            raise doc.error(doc.line(entry, key, value=True), f"machine {name!r}: {key} {_UNPRINTABLE.format(found)}")
    if entry["kind"] == LOCAL:
        raise doc.error(doc.line(entry, "kind", value=True), f"machine {name!r}: kind 'local' is built in")
    if "enabled" in entry and not isinstance(entry["enabled"], (bool, ScalarBoolean)):
        raise doc.error(doc.line(entry, "enabled", value=True), f"machine {name!r}: enabled must be true or false")
    if entry.get("created") is not None and not isinstance(entry["created"], str):
        raise doc.error(doc.line(entry, "created", value=True), f"machine {name!r}: created must be a timestamp")
    if entry.get("access") is not None:
        check_access_entry(doc, name, entry["access"], doc.line(entry, "access", value=True))
    for key in entry:
        if not isinstance(key, str):
            raise doc.error(doc.line(entry, key), f"machine {name!r}: setting names must be text")
        if _is_secret_key(key):
            raise doc.error(doc.line(entry, key), f"machine {name!r}: " + _secret_key_message(key))


def check_access_entry(doc: YamlDocument, name: str, access: Any, at: int) -> None:
    """An entry's ``access`` as a person may have written it: ``users`` and ``groups``, lists of hub names."""
    if not isinstance(access, CommentedMap) or any(key not in ACCESS_KEYS for key in access):
        raise doc.error(at, f"machine {name!r}: access must map users and groups to lists of JupyterHub names")
    for key in ACCESS_KEYS:
        names = access.get(key)
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) and n for n in names)):
            where = doc.line(access, key, value=True)
            raise doc.error(where, f"machine {name!r}: access.{key} must be a list of JupyterHub names")
