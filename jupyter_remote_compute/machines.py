"""The machine registry: the machines of a workspace, kept in ``.punica/compute.yaml``.

People edit that file by hand too, so every save is a ruamel.yaml round trip:
comments, blank lines, key order, quoting, indentation and keys this code does not
know survive, and only the entry being changed is rewritten. Writes are atomic,
serialised between processes by a lock file, and refused when the file changed on
disk since the caller read it (``expected_version``) or while it cannot be parsed.

The built-in machine ``local`` is always there and never written to the file.
The file never holds a secret: options that name one (``token_secret``) hold the
name of a Secret Manager entry, and keys such as ``token`` or ``password`` are refused.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import io
import os
import re
import stat
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import filelock
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark, MarkedYAMLError, YAMLError
from ruamel.yaml.reader import ReaderError
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.scalarbool import ScalarBoolean
from ruamel.yaml.scalarfloat import ScalarFloat
from ruamel.yaml.scalarint import ScalarInt
from ruamel.yaml.tokens import CommentToken

from .engines import engine_class, engine_kinds
from .engines.base import Engine, OptionField
from .errors import ConfigFileError, Conflict, InvalidSettings, NotFound
from .fsutil import SharedFileLock, atomic_write
from .secrets import NAME_RULE as SECRET_NAME_RULE
from .secrets import is_secret_name

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
NAME_RULE = "1 to 40 characters: lowercase letters, digits and '-', starting with a letter or digit"
LOCAL = "local"
HEADER = "# Machines this workspace may train on\n"
LOCK_TIMEOUT = 10.0
ABSENT = "absent"

#: Keys of an entry that are not kind-specific options.
FIELDS = ("kind", "address", "enabled", "created")
#: Options every kind takes, beside its own.
COMMON_OPTIONS: Mapping[str, OptionField] = {
    "price_per_hour": OptionField(float, "What an hour of this machine costs, for usage cost estimates"),
}
#: Option names that would put a secret in the file.
_SECRET_KEYS = frozenset({"token", "password", "passwd", "passphrase", "secret", "api_key", "apikey"})
_SECRET_SUFFIXES = ("_token", "_password", "_passphrase", "_api_key")
#: A secret *name* that looks like a pasted value: long and without the separators names use.
_LOOKS_LIKE_VALUE = re.compile(r"^(?:[0-9a-fA-F]{32,}|(?=.*[0-9])(?=.*[a-z])(?=.*[A-Z])[A-Za-z0-9+=]{24,})$")


@dataclasses.dataclass(frozen=True)
class Machine:
    """One machine as the registry sees it: the file's entry, made plain."""

    name: str
    kind: str
    address: str
    enabled: bool
    created: str | None  # UTC ISO 8601, e.g. "2026-11-29T10:02:00Z", set once at add
    options: Mapping[str, Any]
    builtin: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "address": self.address,
            "enabled": self.enabled,
            "created": self.created,
            "options": dict(self.options),
            "builtin": self.builtin,
        }


LOCAL_MACHINE = Machine(
    name=LOCAL,
    kind=LOCAL,
    address="this machine",
    enabled=True,
    created=None,
    options=types.MappingProxyType({}),
    builtin=True,
)


def _stale(path: Path) -> Conflict:
    return Conflict(f"{path} changed on disk since it was read; reload the machines and try again")


def _is_secret_key(key: str) -> bool:
    low = key.lower()
    return low in _SECRET_KEYS or low.endswith(_SECRET_SUFFIXES)


def _secret_key_message(key: str) -> str:
    return (
        f"a machine cannot hold a secret ({key!r}) in compute.yaml: store it in the Secret Manager "
        "and reference it by name with token_secret"
    )


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _digest(raw: bytes | None) -> str:
    return ABSENT if raw is None else hashlib.sha256(raw).hexdigest()


# -- YAML round trip ----------------------------------------------------------------
class _Resolver(VersionedResolver):
    """YAML 1.2 resolution minus timestamps: ``created: 2026-11-29T10:02:00Z`` loads as the
    plain string it is, and a string written back stays unquoted (ruamel would otherwise
    load a datetime, or quote a string that looks like one)."""

    def add_version_implicit_resolver(self, version: Any, tag: Any, regexp: Any, first: Any) -> None:
        if tag == "tag:yaml.org,2002:timestamp":
            return
        super().add_version_implicit_resolver(version, tag, regexp, first)


_KEY_ONLY = re.compile(r"""^(?:"[^"]*"|'[^']*'|[^\s#'"][^#]*?)\s*:\s*(?:#.*)?$""")
_DOC_START = re.compile(r"^---(?:\s.*)?$")


def _guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping, sequence, offset) as ruamel's ``YAML.indent`` wants them, read off the file,
    so a save does not re-indent what it did not change."""
    mapping: int | None = None
    sequence: int | None = None
    offset: int | None = None
    parent: int | None = None  # indent of the previous line if it was a bare "key:"
    for line in text.splitlines():
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if parent is not None and indent >= parent:
            if body.startswith("- ") or body == "-":
                if offset is None:
                    offset = indent - parent
                    after = line[indent + 1 :]
                    sequence = offset + 1 + len(after) - len(after.lstrip(" ")) if after.strip() else offset + 2
            elif mapping is None and indent > parent:
                mapping = indent - parent
        if mapping is not None and offset is not None:
            break
        parent = indent if _KEY_ONLY.match(body) else None
    mapping = mapping or 2
    if offset is None:
        offset, sequence = 0, mapping
    sequence = max(sequence or 2, offset + 2)
    return mapping, sequence, offset


def _make_yaml(text: str) -> YAML:
    y = YAML()  # round trip
    y.Resolver = _Resolver
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap a long line
    mapping, sequence, offset = _guess_indent(text)
    y.indent(mapping=mapping, sequence=sequence, offset=offset)
    return y


def _split_document_start(text: str) -> tuple[str, str]:
    """Split off everything up to an explicit ``---`` line: ruamel drops comments above it."""
    offset = 0
    for line in text.splitlines(keepends=True):
        body = line.strip()
        if _DOC_START.match(body):
            return text[: offset + len(line)], text[offset + len(line) :]
        if body and not body.startswith("#") and not body.startswith("%"):
            break
        offset += len(line)
    return "", text


# -- keeping comments where they belong -------------------------------------------------
# ruamel attaches the comment lines (and blank lines) that follow a node to the last
# scalar before them: "# about b" above entry b belongs, for ruamel, to entry a's last
# key. Adding or removing keys would then carry such lines along or drop them. These
# helpers move "what follows the last line" from one node to another around a change.
def _is_block(node: Any) -> bool:
    return isinstance(node, (CommentedMap, CommentedSeq)) and len(node) > 0 and not node.fa.flow_style()


def _tail_slot(container: Any, key: Any) -> tuple[list[Any], int]:
    """The comment slot that holds what follows the last line of ``container[key]``."""
    value = container[key]
    if _is_block(value):
        last = next(reversed(value)) if isinstance(value, CommentedMap) else len(value) - 1
        return _tail_slot(value, last)
    slot = container.ca.items.setdefault(key, [None, None, None, None])
    return slot, 2 if isinstance(container, CommentedMap) else 0


def _take_following(container: Any, key: Any) -> str:
    """Detach and return the lines after ``container[key]``'s own last line (blank lines, comments)."""
    slot, index = _tail_slot(container, key)
    token = slot[index]
    if token is None:
        return ""
    value = token.value
    cut = value.find("\n") + 1 if not value.startswith("\n") else 1
    if cut == 0:
        return ""
    # Mutate in place: a flow collection's token is shared with its parent's slot.
    token.value = value[:cut] if not value.startswith("\n") else "\n"
    return value[cut:]


def _attach(slot: list[Any], index: int, text: str) -> None:
    """Append whole lines to the comment in ``slot[index]``, creating it if there is none."""
    if not text:
        return
    token = slot[index]
    if token is None:
        # A leading newline ends the line the comment hangs on: no inline part.
        slot[index] = CommentToken("\n" + text, CommentMark(0), None)
    else:
        token.value = (token.value if token.value.endswith("\n") else token.value + "\n") + text


def _put_following(container: Any, key: Any, text: str) -> None:
    """Attach ``text`` (whole lines) after ``container[key]``'s last line."""
    if text:
        _attach(*_tail_slot(container, key), text)


def _put_after_header(owner: CommentedMap, key: Any, text: str) -> None:
    """Attach ``text`` right after the ``key:`` line of ``owner`` (before its first child)."""
    if text:
        _attach(owner.ca.items.setdefault(key, [None, None, None, None]), 2, text)


@contextmanager
def _keeping_tail(container: Any, key: Any) -> Iterator[None]:
    """Keep the lines that follow ``container[key]`` after it while its content changes."""
    following = _take_following(container, key)
    yield
    _put_following(container, key, following)


def _append(mapping: CommentedMap, key: str, value: Any) -> None:
    """Add ``key`` at the end of ``mapping``, before the lines that followed its old last item."""
    if len(mapping):
        last = next(reversed(mapping))
        following = _take_following(mapping, last)
        mapping[key] = value
        _put_following(mapping, key, following)
    else:
        if mapping.fa.flow_style():
            mapping.fa.set_block_style()
        mapping[key] = value


def _delete(owner: CommentedMap, owner_key: Any, mapping: CommentedMap, key: str) -> None:
    """Remove ``key`` from ``mapping`` (``owner[owner_key]``), keeping the lines that followed it."""
    keys = list(mapping)
    position = keys.index(key)
    following = _take_following(mapping, key)
    del mapping[key]
    mapping.ca.items.pop(key, None)  # ruamel leaves it behind; a re-added key would inherit it
    if position > 0:
        _put_following(mapping, keys[position - 1], following)
    elif len(mapping) and not mapping.fa.flow_style():
        _put_after_header(owner, owner_key, following)
    else:
        _put_following(owner, owner_key, following)


def _same(old: Any, new: Any) -> bool:
    plain = _plain(old)
    return type(plain) is type(new) and plain == new


def _plain(value: Any) -> Any:
    """ruamel's round-trip scalars and collections as plain Python values."""
    if isinstance(value, ScalarBoolean):
        return bool(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, ScalarInt):
        return int(value)
    if isinstance(value, ScalarFloat):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _yaml_problem(error: MarkedYAMLError, line_offset: int) -> tuple[int, str]:
    """(1-based line, problem) of a YAML syntax error, in words a person can act on."""
    mark = error.problem_mark or error.context_mark
    line = (mark.line if mark else 0) + 1 + line_offset
    problem = (error.problem or "not valid YAML").strip()
    # A duplicate key's message repeats both values; the key is enough to find it.
    problem = re.sub(r' with value ".*', "", problem, flags=re.DOTALL)
    if error.context:
        context = error.context.strip()
        if error.context_mark and error.problem_mark and error.context_mark.line != error.problem_mark.line:
            context += f" (from line {error.context_mark.line + 1 + line_offset})"
        problem = f"{problem}, {context}"
    return line, problem


# -- the parsed file --------------------------------------------------------------------
@dataclasses.dataclass
class _Document:
    path: Path
    yaml: YAML
    prefix: str  # text up to an explicit "---", written back verbatim
    body: str
    line_offset: int
    crlf: bool  # ruamel mangles CR LF in comments: edit with LF, write back with CR LF
    root: CommentedMap | None
    machines: CommentedMap | None

    def line(self, container: Any, key: Any, *, value: bool = False) -> int:
        try:
            row = container.lc.value(key)[0] if value else container.lc.key(key)[0]
        except (AttributeError, KeyError, TypeError):
            row = getattr(getattr(container, "lc", None), "line", 0) or 0
        return row + 1 + self.line_offset

    def error(self, line: int, problem: str) -> ConfigFileError:
        return ConfigFileError(f"{self.path}, line {line}: {problem}")

    def dump(self) -> bytes:
        out = io.StringIO()
        self.yaml.dump(self.root, out)
        text = self.prefix + out.getvalue()
        return (text.replace("\n", "\r\n") if self.crlf else text).encode("utf-8")


class MachineRegistry:
    """The machines of one workspace's compute.yaml, plus the built-in ``local``."""

    def __init__(self, path: Path, *, lock_timeout: float = LOCK_TIMEOUT) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.lock_timeout = lock_timeout

    # -- reading ---------------------------------------------------------------------
    def version(self) -> str:
        """An etag of the file as it is on disk now: its sha256, or ``"absent"``."""
        return _digest(self._read())

    def snapshot(self) -> tuple[str, list[Machine]]:
        """The version and the machines from one read, so an etag matches what was listed."""
        raw = self._read()
        return _digest(raw), [LOCAL_MACHINE, *self._machines(self._parse(raw))]

    def list(self) -> list[Machine]:
        """``local`` first, then the file's machines in file order."""
        return self.snapshot()[1]

    def get(self, name: str) -> Machine:
        """One machine by name. ``local`` is answered without reading the file."""
        if name == LOCAL:
            return LOCAL_MACHINE
        doc = self._parse(self._read())
        if doc.machines is None or name not in doc.machines:
            raise NotFound(f"no machine named {name!r} in {self.path}")
        return self._machine(doc, name)

    # -- writing ---------------------------------------------------------------------
    def add(
        self,
        name: str,
        kind: str,
        address: str,
        options: Mapping[str, Any] | None = None,
        *,
        enabled: bool = True,
        expected_version: str | None = None,
    ) -> Machine:
        """Add a machine at the end of the file (created on first add)."""
        _check_name(name)
        cls = _engine(kind)
        address = _check_address(cls, address)
        clean = _check_options(cls, options or {}, changing=None)
        _check_enabled(enabled)

        def change(doc: _Document) -> Machine:
            machines, carried = self._machines_for_write(doc)
            if name in machines:
                raise Conflict(f"a machine named {name!r} already exists in {self.path}", field="name")
            entry = CommentedMap()
            entry["kind"] = kind
            entry["address"] = address
            for key, value in clean.items():
                entry[key] = value
            entry["enabled"] = enabled
            entry["created"] = _now()
            _append(machines, name, entry)
            _put_following(machines, name, carried)
            return self._machine(doc, name)

        return self._mutate(expected_version, change)

    def update(
        self,
        name: str,
        *,
        address: str | None = None,
        options: Mapping[str, Any] | None = None,
        enabled: bool | None = None,
        expected_version: str | None = None,
    ) -> Machine:
        """Change a machine's address, options (merged; a key mapped to None is removed) or enabled."""
        _check_editable(name)
        if enabled is not None:
            _check_enabled(enabled)
        if options is not None and not isinstance(options, Mapping):
            raise InvalidSettings("options must be a mapping of option names to values", field="options")

        def change(doc: _Document) -> Machine:
            machines, entry = self._entry_for_write(doc, name)
            new_address = entry["address"]
            new_options = None
            if address is not None or options:
                cls = _engine(entry["kind"])
                if address is not None:
                    new_address = _check_address(cls, address)
                current = {k: v for k, v in entry.items() if k not in FIELDS}
                new_options = _check_options(cls, current, changing=options or {})
            with _keeping_tail(machines, name):
                if new_address != entry["address"]:
                    entry["address"] = new_address
                if new_options is not None:
                    for key in [k for k in entry if k not in FIELDS and k not in new_options]:
                        _delete(machines, name, entry, key)
                    for key, value in new_options.items():
                        if key not in entry:
                            entry.insert(_option_position(entry), key, value)
                        elif not _same(entry[key], value):
                            entry[key] = value  # only a changed value loses its original spelling
                if enabled is not None and bool(entry.get("enabled", True)) != enabled:
                    if "enabled" in entry:
                        entry["enabled"] = enabled
                    else:
                        entry.insert(_option_position(entry), "enabled", enabled)
            return self._machine(doc, name)

        return self._mutate(expected_version, change)

    def set_enabled(self, name: str, enabled: bool, *, expected_version: str | None = None) -> Machine:
        """Enable or disable a machine (disabling works even if its kind is not installed)."""
        return self.update(name, enabled=enabled, expected_version=expected_version)

    def remove(self, name: str, *, expected_version: str | None = None) -> None:
        """Remove a machine's entry; the lines around it stay as they were."""
        _check_editable(name)

        def change(doc: _Document) -> None:
            machines, _ = self._entry_for_write(doc, name)
            _delete(doc.root, "machines", machines, name)
            if not machines:
                # "machines: {}" cannot carry the comments that follow the key line; a null can.
                doc.root["machines"] = None

        self._mutate(expected_version, change)

    # -- internals -------------------------------------------------------------------
    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ConfigFileError(f"{self.path}: cannot be read: {e.strerror}") from None

    def _parse(self, raw: bytes | None) -> _Document:
        """Parse and check the whole file; ConfigFileError naming file, line and problem."""
        try:
            text = (raw or b"").decode("utf-8")
        except UnicodeDecodeError as e:
            line = (raw or b"")[: e.start].count(b"\n") + 1
            raise ConfigFileError(f"{self.path}, line {line}: not UTF-8 text") from None
        crlf = "\r\n" in text
        prefix, body = _split_document_start(text.replace("\r\n", "\n") if crlf else text)
        doc = _Document(self.path, _make_yaml(body), prefix, body, prefix.count("\n"), crlf, None, None)
        try:
            root = doc.yaml.load(body)
        except MarkedYAMLError as e:
            raise doc.error(*_yaml_problem(e, doc.line_offset)) from None
        except ReaderError as e:
            line = doc.body[: e.position].count("\n") + 1 + doc.line_offset
            code = e.character if isinstance(e.character, int) else ord(e.character)
            raise doc.error(line, f"character U+{code:04X} is not allowed in YAML") from None
        except YAMLError as e:
            raise doc.error(1 + doc.line_offset, f"not valid YAML ({e})") from None
        if root is None:
            return doc
        if not isinstance(root, CommentedMap):
            line = getattr(getattr(root, "lc", None), "line", 0) + 1 + doc.line_offset
            raise doc.error(line, "expected a mapping with 'machines:' at the top level")
        doc.root = root
        if "machines" not in root or root["machines"] is None:
            return doc
        machines = root["machines"]
        if not isinstance(machines, CommentedMap):
            raise doc.error(doc.line(root, "machines", value=True), "'machines' must map machine names to settings")
        doc.machines = machines
        for name, entry in machines.items():
            _check_entry(doc, name, entry)
        return doc

    def _machines(self, doc: _Document) -> list[Machine]:
        return [self._machine(doc, name) for name in (doc.machines or {})]

    def _machine(self, doc: _Document, name: str) -> Machine:
        entry = doc.machines[name]  # type: ignore[index]
        created = entry.get("created")
        return Machine(
            name=name,
            kind=str(entry["kind"]),
            address=str(entry["address"]),
            enabled=bool(entry.get("enabled", True)),
            created=None if created is None else str(created),
            options=types.MappingProxyType({str(k): _plain(v) for k, v in entry.items() if k not in FIELDS}),
        )

    def _machines_for_write(self, doc: _Document) -> tuple[CommentedMap, str]:
        """The ``machines`` mapping, created (with the file's header) if the file has none, and
        the comment lines that followed where it now starts: they go after the first new entry."""
        if doc.root is None:
            # Missing, empty or comments only: keep what text there is, then start the mapping.
            text = doc.body if doc.body.strip() else HEADER
            if not text.endswith("\n"):
                text += "\n"
            doc.root = doc.yaml.load(text + "machines: {}\n")
        carried = ""
        if doc.machines is None:
            if "machines" in doc.root:  # "machines:" with no value
                carried = _take_following(doc.root, "machines")
            elif len(doc.root):
                carried = _take_following(doc.root, next(reversed(doc.root)))
            doc.root["machines"] = CommentedMap()
            doc.machines = doc.root["machines"]
        return doc.machines, carried

    def _entry_for_write(self, doc: _Document, name: str) -> tuple[CommentedMap, CommentedMap]:
        if doc.machines is None or name not in doc.machines:
            raise NotFound(f"no machine named {name!r} in {self.path}")
        entry = doc.machines[name]
        if any(other is entry for key, other in doc.machines.items() if key != name):
            raise Conflict(
                f"machine {name!r} shares its settings with another entry through a YAML anchor in {self.path}; "
                "edit the file by hand"
            )
        return doc.machines, entry

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = SharedFileLock(self.lock_path, timeout=self.lock_timeout)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise Conflict(
                f"{self.path} is being changed by another process (lock {self.lock_path} held for more than "
                f"{self.lock_timeout:g} s); try again, or delete the lock file if no other process is running"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def _mutate(self, expected_version: str | None, change: Callable[[_Document], Any]) -> Any:
        with self._locked():
            raw = self._read()
            current = _digest(raw)
            if expected_version is not None and expected_version != current:
                raise _stale(self.path)
            doc = self._parse(raw)  # refuses an invalid file before anything is written
            result = change(doc)
            data = doc.dump()
            try:
                self._parse(data)
            except ConfigFileError as e:  # a bug here, not the user's: never write a broken file
                raise ConfigFileError(
                    f"refusing to save {self.path}: the result would not load ({e.message})"
                ) from None
            target = self.path.resolve() if self.path.is_symlink() else self.path
            # Hand edits do not take the lock: re-check just before replacing the file.
            if _digest(self._read()) != current:
                raise _stale(self.path)
            if data != raw:  # an edit that changes nothing leaves the file (and its mtime) alone
                mode = stat.S_IMODE(os.stat(target).st_mode) if raw is not None else 0o644
                atomic_write(target, data, mode=mode)
            return result


# -- validation -------------------------------------------------------------------------
def _check_name(name: object) -> None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidSettings(f"a machine name must be {NAME_RULE}", field="name")
    if name == LOCAL:
        raise InvalidSettings("'local' is the built-in machine (this computer); choose another name", field="name")


def _check_editable(name: str) -> None:
    if name == LOCAL:
        raise Conflict("'local' is the built-in machine: it cannot be changed, disabled or removed")


def _check_enabled(enabled: object) -> None:
    if not isinstance(enabled, bool):
        raise InvalidSettings("enabled must be true or false", field="enabled")


def _engine(kind: object) -> type[Engine]:
    known = ", ".join(k for k in engine_kinds() if k != LOCAL) or "none installed"
    if kind == LOCAL:
        raise InvalidSettings(
            f"kind 'local' is the built-in machine and cannot be added (kinds: {known})", field="kind"
        )
    if not isinstance(kind, str):
        raise InvalidSettings(f"kind must be one of: {known}", field="kind")
    try:
        return engine_class(kind)
    except ValueError:
        raise InvalidSettings(f"unknown kind {kind!r}; known kinds: {known}", field="kind") from None


def _check_address(cls: type[Engine], address: object) -> str:
    if not isinstance(address, str):
        raise InvalidSettings("address must be text (a host name or a URL)", field="address")
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


def _check_options(
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
    for key, field in declared.items():
        if field.required and key not in merged:
            raise InvalidSettings(f"options.{key} is required for {cls.kind} machines", field=f"options.{key}")
    return merged


def _option_position(entry: CommentedMap) -> int:
    """Where a new option goes: before ``enabled``/``created`` (as a new entry is laid out)."""
    keys = list(entry)
    for field in ("enabled", "created"):
        if field in keys:
            return keys.index(field)
    return len(keys)


def _check_entry(doc: _Document, name: Any, entry: Any) -> None:
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
    if entry["kind"] == LOCAL:
        raise doc.error(doc.line(entry, "kind", value=True), f"machine {name!r}: kind 'local' is built in")
    if "enabled" in entry and not isinstance(entry["enabled"], (bool, ScalarBoolean)):
        raise doc.error(doc.line(entry, "enabled", value=True), f"machine {name!r}: enabled must be true or false")
    if entry.get("created") is not None and not isinstance(entry["created"], str):
        raise doc.error(doc.line(entry, "created", value=True), f"machine {name!r}: created must be a timestamp")
    for key in entry:
        if not isinstance(key, str):
            raise doc.error(doc.line(entry, key), f"machine {name!r}: setting names must be text")
        if _is_secret_key(key):
            raise doc.error(doc.line(entry, key), f"machine {name!r}: " + _secret_key_message(key))
