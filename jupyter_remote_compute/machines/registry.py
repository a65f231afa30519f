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

import datetime as dt
import hashlib
import os
import stat
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import filelock
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.reader import ReaderError

from ..errors import ConfigFileError, Conflict, InvalidSettings, NotFound
from ..fsutil import PRIVATE_FILE, SharedFileLock, atomic_write, private_dir
from ..schema.machine import Machine, MachineAccess
from ..schema.pool import Pool, PoolInput
from .options import (
    FIELDS,
    LOCAL,
    check_address,
    check_editable,
    check_enabled,
    check_entry,
    check_name,
    check_options,
    engine_of_kind,
    option_position,
)
from .pools import check_pools, pools_of, pools_with, put_pool, remove_pool
from .yaml_document import (
    YamlDocument,
    append_entry,
    delete_entry,
    keeping_tail,
    make_yaml,
    plain,
    put_following,
    same_value,
    split_document_start,
    take_following,
    yaml_problem,
)

HEADER = "# Machines this workspace may train on\n"
LOCK_TIMEOUT = 10.0
ABSENT = "absent"


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


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _access_of(written: Any) -> MachineAccess | None:
    """The entry's ``access`` (checked as the file was read); none written, or an empty one: None."""
    if not written:
        return None
    access = MachineAccess(tuple(written.get("users") or ()), tuple(written.get("groups") or ()))
    return access or None


def _access_entry(access: MachineAccess) -> CommentedMap:
    entry = CommentedMap()
    for key in ("users", "groups"):
        if getattr(access, key):
            entry[key] = list(getattr(access, key))
    return entry


def _put_access(machines: CommentedMap, name: str, entry: CommentedMap, access: MachineAccess) -> None:
    """Set (or, empty, remove) an entry's ``access``; an unchanged list keeps its lines and comments."""
    if not access:
        if "access" in entry:
            delete_entry(machines, name, entry, "access")
        return
    if _access_of(entry.get("access")) == access:
        return
    if "access" in entry and isinstance(entry["access"], CommentedMap):
        written = entry["access"]
        for key in ("users", "groups"):
            names = list(getattr(access, key))
            if not names:
                if key in written:
                    delete_entry(entry, "access", written, key)
            elif key not in written or plain(written[key]) != names:
                written[key] = names
        return
    entry.insert(option_position(entry), "access", _access_entry(access))


def _digest(raw: bytes | None) -> str:
    return ABSENT if raw is None else hashlib.sha256(raw).hexdigest()


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

    def pools(self) -> list[Pool]:
        """The file's pools, in file order (machines/pools.py)."""
        return pools_of(self._parse(self._read()))

    def machines_and_pools(self) -> tuple[list[Machine], list[Pool]]:
        """Both from one read, so a placement sees the pools and the machines they name as one file."""
        doc = self._parse(self._read())
        return [LOCAL_MACHINE, *self._machines(doc)], pools_of(doc)

    # -- writing ---------------------------------------------------------------------
    def put_pool(self, name: str, given: PoolInput, *, expected_version: str | None = None) -> Pool:
        """Make or replace a pool (its machines and rule); the rest of the file stays as it was."""

        def change(doc: YamlDocument) -> Pool:
            self._machines_for_write(doc)  # a file with no machines yet gets its mapping (local may be pooled)
            return put_pool(doc, name, given)

        return self._mutate(expected_version, change)

    def remove_pool(self, name: str, *, expected_version: str | None = None) -> None:
        self._mutate(expected_version, lambda doc: remove_pool(doc, name))

    def add(
        self,
        name: str,
        kind: str,
        address: str,
        options: Mapping[str, Any] | None = None,
        *,
        enabled: bool = True,
        access: MachineAccess | None = None,
        expected_version: str | None = None,
    ) -> Machine:
        """Add a machine at the end of the file (created on first add); ``access`` only where it lists someone."""
        check_name(name)
        cls = engine_of_kind(kind)
        address = check_address(cls, address)
        clean = check_options(cls, options or {}, changing=None)
        cls.check_settings(address, clean)
        check_enabled(enabled)

        def change(doc: YamlDocument) -> Machine:
            machines, carried = self._machines_for_write(doc)
            if name in machines:
                raise Conflict(f"a machine named {name!r} already exists in {self.path}", field="name")
            if doc.pools is not None and name in doc.pools:
                raise Conflict(f"a pool is named {name!r}: a machine cannot have a pool's name", field="name")
            entry = CommentedMap()
            entry["kind"] = kind
            entry["address"] = address
            for key, value in clean.items():
                entry[key] = value
            if access:
                entry["access"] = _access_entry(access)
            entry["enabled"] = enabled
            entry["created"] = _now()
            append_entry(machines, name, entry)
            put_following(machines, name, carried)
            return self._machine(doc, name)

        return self._mutate(expected_version, change)

    def update(
        self,
        name: str,
        *,
        address: str | None = None,
        options: Mapping[str, Any] | None = None,
        enabled: bool | None = None,
        access: MachineAccess | None = None,
        expected_version: str | None = None,
    ) -> Machine:
        """Change a machine's address, options (merged; a key mapped to None is removed), enabled or
        access list (an empty one removes it)."""
        check_editable(name)
        if enabled is not None:
            check_enabled(enabled)
        if options is not None and not isinstance(options, Mapping):
            raise InvalidSettings("options must be a mapping of option names to values", field="options")

        def change(doc: YamlDocument) -> Machine:
            machines, entry = self._entry_for_write(doc, name)
            new_address = entry["address"]
            new_options = None
            if address is not None or options:
                cls = engine_of_kind(entry["kind"])
                if address is not None:
                    new_address = check_address(cls, address)
                current = {k: v for k, v in entry.items() if k not in FIELDS}
                new_options = check_options(cls, current, changing=options or {})
                cls.check_settings(new_address, new_options)
            with keeping_tail(machines, name):
                if new_address != entry["address"]:
                    entry["address"] = new_address
                if new_options is not None:
                    for key in [k for k in entry if k not in FIELDS and k not in new_options]:
                        delete_entry(machines, name, entry, key)
                    for key, value in new_options.items():
                        if key not in entry:
                            entry.insert(option_position(entry), key, value)
                        elif not same_value(entry[key], value):
                            entry[key] = value  # only a changed value loses its original spelling
                if access is not None:
                    _put_access(machines, name, entry, access)
                if enabled is not None and bool(entry.get("enabled", True)) != enabled:
                    if "enabled" in entry:
                        entry["enabled"] = enabled
                    else:
                        entry.insert(option_position(entry), "enabled", enabled)
            return self._machine(doc, name)

        return self._mutate(expected_version, change)

    def set_enabled(self, name: str, enabled: bool, *, expected_version: str | None = None) -> Machine:
        """Enable or disable a machine (disabling works even if its kind is not installed)."""
        return self.update(name, enabled=enabled, expected_version=expected_version)

    def remove(self, name: str, *, expected_version: str | None = None) -> None:
        """Remove a machine's entry; the lines around it stay as they were."""
        check_editable(name)

        def change(doc: YamlDocument) -> None:
            machines, _ = self._entry_for_write(doc, name)
            pools = pools_with(doc, name)
            if pools:
                raise Conflict(
                    f"machine {name!r} is in pool {pools[0]!r}: take it out of the pool (or remove the pool) first"
                )
            delete_entry(doc.root, "machines", machines, name)
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

    def _parse(self, raw: bytes | None) -> YamlDocument:
        """Parse and check the whole file; ConfigFileError naming file, line and problem."""
        try:
            text = (raw or b"").decode("utf-8")
        except UnicodeDecodeError as e:
            line = (raw or b"")[: e.start].count(b"\n") + 1
            raise ConfigFileError(f"{self.path}, line {line}: not UTF-8 text") from None
        crlf = "\r\n" in text
        prefix, body = split_document_start(text.replace("\r\n", "\n") if crlf else text)
        doc = YamlDocument(self.path, make_yaml(body), prefix, body, prefix.count("\n"), crlf, None, None)
        try:
            root = doc.yaml.load(body)
        except MarkedYAMLError as e:
            raise doc.error(*yaml_problem(e, doc.line_offset)) from None
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
            check_pools(doc)  # a pool of the built-in machine alone needs no machines
            return doc
        machines = root["machines"]
        if not isinstance(machines, CommentedMap):
            raise doc.error(doc.line(root, "machines", value=True), "'machines' must map machine names to settings")
        doc.machines = machines
        for name, entry in machines.items():
            check_entry(doc, name, entry)
        check_pools(doc)
        return doc

    def _machines(self, doc: YamlDocument) -> list[Machine]:
        return [self._machine(doc, name) for name in (doc.machines or {})]

    def _machine(self, doc: YamlDocument, name: str) -> Machine:
        entry = doc.machines[name]  # type: ignore[index]
        created = entry.get("created")
        return Machine(
            name=name,
            kind=str(entry["kind"]),
            address=str(entry["address"]),
            enabled=bool(entry.get("enabled", True)),
            created=None if created is None else str(created),
            options=types.MappingProxyType({str(k): plain(v) for k, v in entry.items() if k not in FIELDS}),
            access=_access_of(entry.get("access")),
        )

    def _machines_for_write(self, doc: YamlDocument) -> tuple[CommentedMap, str]:
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
                carried = take_following(doc.root, "machines")
            elif len(doc.root):
                carried = take_following(doc.root, next(reversed(doc.root)))
            doc.root["machines"] = CommentedMap()
            doc.machines = doc.root["machines"]
        return doc.machines, carried

    def _entry_for_write(self, doc: YamlDocument, name: str) -> tuple[CommentedMap, CommentedMap]:
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
        private_dir(self.path.parent)
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

    def _mutate(self, expected_version: str | None, change: Callable[[YamlDocument], Any]) -> Any:
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
                mode = stat.S_IMODE(os.stat(target).st_mode) if raw is not None else PRIVATE_FILE
                atomic_write(target, data, mode=mode)
            return result
