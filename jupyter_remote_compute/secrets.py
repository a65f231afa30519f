"""The Secret Manager: named secrets, never in a file of ours unless the user opts in.

A Jupyter token, a cloud key or any value a job's env references (``secret:NAME``)
lives here under a short name; compute.yaml and job settings hold only the name.

A name is looked up in the deployment's read-only secrets first (environment variables,
a mounted directory), then in the user's store: the system keyring (a backend that
encrypts, unless the user named another) or, opted into, a private file. Where each
one lives is decided in ``secret_sources``. keyring cannot enumerate entries, so the
names (never the values) are kept in one extra entry of the same service, updated on
every set and delete.

No usable store gets a clear, actionable error instead of a silent plaintext fallback.
No error raised here ever includes a secret value.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock

from . import secret_sources as sources
from .errors import InvalidSettings, NotFound, SecretStoreUnavailable
from .fsutil import SharedFileLock

if TYPE_CHECKING:
    import keyring.backend

SERVICE = "jupyter-remote-compute"
#: The keyring username holding the JSON list of names; the name pattern cannot produce it.
NAMES_ENTRY = "__names__"
#: Prefix of a job setting that references a secret instead of holding a value.
REFERENCE_PREFIX = "secret:"

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")
NAME_RULE = "1 to 128 characters: letters, digits and _ . / -, starting with a letter or digit (e.g. compute/team-lab)"

#: Where a secret lives (``SecretEntry.source``).
SOURCE_ENV = "deployment-env"
SOURCE_DIR = "deployment-dir"
SOURCE_KEYRING = "keyring"
SOURCE_FILE = "file"

_LOCK_TIMEOUT = 10.0

#: Credentials written into a URL: ``https://token@host``, ``scheme://user:password@host`` (an ssh URL's
#: bare ``git@`` names a user, not a secret). Refused in a machine's index URLs and a job's requirements.
URL_CREDENTIALS = re.compile(r"(?:\bhttps?://[^/@\s]+@|://[^/@\s:]+:[^/@\s]+@)")


def is_secret_name(value: object) -> bool:
    """True if ``value`` is a well-formed secret name (not whether such a secret exists)."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def resolve_reference(value: str) -> str | None:
    """``"secret:NAME"`` -> ``"NAME"``; any other value -> None (it is a literal).

    A value with the prefix but a malformed name raises InvalidSettings (field None:
    the caller knows which setting it was) rather than silently passing as a literal.
    """
    if not isinstance(value, str) or not value.startswith(REFERENCE_PREFIX):
        return None
    name = value[len(REFERENCE_PREFIX) :]
    if not is_secret_name(name):
        raise InvalidSettings(f"a secret reference must be 'secret:NAME' where NAME is {NAME_RULE}")
    return name


def _check_name(name: object) -> str:
    # The name is not echoed: a mistyped call may have put a value where the name goes.
    if not is_secret_name(name):
        raise InvalidSettings(f"a secret name must be {NAME_RULE}", field="name")
    return name  # type: ignore[return-value]


def _scrubbed(error: BaseException, value: str | None) -> str:
    """A backend's error text, dropped entirely if it contains the value (some echo what they got)."""
    text = str(error)
    if value and value in text:
        return f"{type(error).__name__} (details withheld: they contained the secret value)"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclasses.dataclass(frozen=True)
class SecretEntry:
    """One secret as a listing shows it: its name and where it lives, never its value."""

    name: str
    source: str  # one of the SOURCE_* values
    where: str  # for people: "environment variable X", "file /path", "the system keyring (Secret Service)"
    read_only: bool  # provided by the deployment: not changeable here
    problem: str | None = None  # why it cannot be used as it stands (a file others can read, shadowed)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class SecretStore:
    """Named secrets: the deployment's (read-only), then the user's store. Every call asks the store afresh.

    Settings default to the environment (see ``secret_sources``), so every entry point agrees:
    ``kind`` "keyring" or "file", ``path`` of the private file, ``secrets_dir`` of the deployment's
    files, ``keyring_backend`` a backend the user names.
    """

    def __init__(
        self,
        service: str = SERVICE,
        *,
        kind: str | None = None,
        path: Path | None = None,
        secrets_dir: Path | None = None,
        keyring_backend: str | None = None,
    ) -> None:
        if not service:
            raise ValueError("service must be a non-empty name")
        self.service = service
        self.kind = kind or sources.store_kind()
        if self.kind not in sources.STORE_KINDS:
            raise InvalidSettings(f"secret store kind {self.kind!r}: expected one of {', '.join(sources.STORE_KINDS)}")
        self.private_file = sources.PrivateFile(path or sources.default_secrets_file())
        self.secrets_dir = secrets_dir or sources.default_secrets_dir()
        self.keyring_backend = keyring_backend or os.environ.get(sources.BACKEND_ENV, "").strip() or None

    # -- the public operations ------------------------------------------------
    def get(self, name: str) -> str | None:
        """The value of ``name`` (the deployment's first), or None if there is none."""
        name = _check_name(name)
        value = sources.env_secret(name) or sources.dir_secret(self.secrets_dir, name)
        if value is not None:
            return value
        if self.kind == "file":
            return self.private_file.read().get(name)
        backend = self._backend()
        with self._guard(f"read secret {name!r}"):
            return backend.get_password(self.service, name)

    def set(self, name: str, value: str) -> None:
        """Store ``value`` under ``name`` in the user's store, replacing any previous value."""
        name = _check_name(name)
        if not isinstance(value, str) or not value:
            raise InvalidSettings("a secret value must be non-empty text", field="value")
        self._refuse_deployment_name(name, "changed")
        if self.kind == "file":
            with self._names_lock():
                self.private_file.write({**self.private_file.read(), name: value})
            return
        backend = self._backend()
        with self._names_lock():
            names = self._read_names(backend)
            # List the name first: a value stored but unlisted would escape values(), which
            # job settings use to refuse pasted secrets. A listed name without a value is harmless.
            if name not in names:
                self._write_names(backend, [*names, name])
            try:
                with self._guard(f"store secret {name!r}", value):
                    backend.set_password(self.service, name, value)
            except SecretStoreUnavailable:
                if name not in names:
                    self._try_write_names(backend, names)
                raise

    def delete(self, name: str) -> None:
        """Remove ``name`` from the user's store; NotFound if it holds no such secret."""
        name = _check_name(name)
        self._refuse_deployment_name(name, "deleted")
        if self.kind == "file":
            with self._names_lock():
                stored = self.private_file.read()
                present = stored.pop(name, None) is not None
                if present:
                    self.private_file.write(stored)
        else:
            present = self._delete_from_keyring(name)
        if not present:
            raise NotFound(f"no secret named {name!r} in the Secret Manager ({self.where()})")

    def names(self) -> list[str]:
        """Sorted names of every secret that can be used (deployment's and the user's); never values."""
        return sorted({e.name for e in self.entries() if e.problem is None})

    def entries(self) -> list[SecretEntry]:
        """Every secret and where it lives, the deployment's first; the user's store only if usable."""
        found = [
            SecretEntry(name, SOURCE_ENV, f"environment variable {var}", True)
            for name, var in sorted(sources.env_secret_names().items())
        ]
        for name, file in sorted(sources.dir_secret_names(self.secrets_dir).items()):
            found.append(SecretEntry(name, SOURCE_DIR, f"file {file}", True, sources.file_access_problem(file)))
        if self.status()["usable"]:
            source = SOURCE_FILE if self.kind == "file" else SOURCE_KEYRING
            where = self.where()
            for name in self._user_names():
                provider = self._deployment_provider(name)
                problem = f"not used: the deployment provides this name ({provider})" if provider else None
                found.append(SecretEntry(name, source, where, False, problem))
        return found

    def values(self) -> list[str]:
        """Every value this store can give, to refuse them when pasted into job settings. Never log the result.

        A user's store that cannot be used holds nothing to refuse, so it adds nothing here.
        """
        found = [v for v in (os.environ.get(var) for var in sources.env_secret_names().values()) if v]
        for name in sources.dir_secret_names(self.secrets_dir):
            with suppress(SecretStoreUnavailable):  # a refused file is reported where it is used
                value = sources.dir_secret(self.secrets_dir, name)
                if value:
                    found.append(value)
        if self.kind == "file":
            with suppress(SecretStoreUnavailable):
                found.extend(v for v in self.private_file.read().values() if v)
            return found
        try:
            backend = self._backend()
            names = self._read_names(backend)
        except SecretStoreUnavailable:
            return found
        for name in names:
            with self._guard(f"read secret {name!r}"):
                value = backend.get_password(self.service, name)
            if value:
                found.append(value)
        return found

    def where(self) -> str:
        """Where a secret set here goes, for people: the keyring backend or the private file."""
        if self.kind == "file":
            return f"a private file ({self.private_file.path})"
        try:
            choice = sources.choose_keyring(self.keyring_backend)
        except SecretStoreUnavailable:
            return "the system keyring (none usable)"
        return f"the system keyring ({choice.label})" if choice.safe else f"the keyring backend {choice.name}"

    def status(self) -> dict[str, Any]:
        """The user's store as the panel and CLI describe it: kind, where, a note to show, usable or why not."""
        where = self.where()
        if self.kind == "file":
            note = (
                f"Secrets are stored in a private file readable by this user: {self.private_file.path} "
                "(no keyring is used)."
            )
            try:
                self.private_file.read()
            except SecretStoreUnavailable as e:
                return {"kind": "file", "where": where, "note": note, "usable": False, "problem": e.message}
            return {"kind": "file", "where": where, "note": note, "usable": True, "problem": None}
        try:
            choice = sources.choose_keyring(self.keyring_backend)
        except SecretStoreUnavailable as e:
            return {"kind": "keyring", "where": where, "note": None, "usable": False, "problem": e.message}
        note = None
        if not choice.safe:
            note = (
                f"Secrets are kept by the keyring backend {choice.name}, named in {choice.named_by}; "
                "it is not one of the platform keyrings known to encrypt them."
            )
        return {"kind": "keyring", "where": where, "note": note, "usable": True, "problem": None}

    # -- helpers --------------------------------------------------------------
    def _deployment_provider(self, name: str) -> str | None:
        """Which deployment source provides ``name`` (for people), or None."""
        var = sources.env_var_for(name)
        if os.environ.get(var):
            return f"environment variable {var}"
        path = sources.dir_secret_path(self.secrets_dir, name)
        if path is not None and path.is_file():
            return f"file {path}"
        return None

    def _refuse_deployment_name(self, name: str, verb: str) -> None:
        provider = self._deployment_provider(name)
        if provider:
            # Not a Conflict (409): nothing here is stale, and trying again cannot help.
            raise InvalidSettings(
                f"the secret {name!r} is provided by the deployment ({provider}) and cannot be {verb} here",
                field="name",
            )

    def _user_names(self) -> list[str]:
        if self.kind == "file":
            return sorted(self.private_file.read())
        return sorted(self._read_names(self._backend()))

    def _delete_from_keyring(self, name: str) -> bool:
        backend = self._backend()
        with self._names_lock():
            names = self._read_names(backend)
            with self._guard(f"read secret {name!r}"):
                present = backend.get_password(self.service, name) is not None
            if present:
                with self._guard(f"delete secret {name!r}"):
                    try:
                        backend.delete_password(self.service, name)
                    except _keyring_errors().PasswordDeleteError:
                        present = False  # vanished between the two calls
            if name in names:
                self._write_names(backend, [n for n in names if n != name])
        return present

    def _backend(self) -> keyring.backend.KeyringBackend:
        return sources.choose_keyring(self.keyring_backend).backend

    @contextmanager
    def _guard(self, action: str, value: str | None = None) -> Iterator[None]:
        """Turn any backend failure into SecretStoreUnavailable whose text cannot hold ``value``."""
        import keyring.errors  # loaded on first use (see secret_sources), always before a backend call

        try:
            yield
        except keyring.errors.NoKeyringError:
            raise SecretStoreUnavailable(sources.unavailable_message(keyring.get_keyring())) from None
        except (keyring.errors.KeyringError, OSError, RuntimeError, ValueError) as e:
            # ``from None``: a chained original could print the value in a traceback.
            raise SecretStoreUnavailable(
                f"the system keyring could not {action} (service {self.service!r}): {_scrubbed(e, value)}"
            ) from None

    @contextmanager
    def _names_lock(self) -> Iterator[None]:
        from jupyter_core.paths import jupyter_runtime_dir

        lock_dir = Path(jupyter_runtime_dir())
        lock_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.service)
        lock = SharedFileLock(lock_dir / f"{safe}.secrets.lock", timeout=_LOCK_TIMEOUT)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise SecretStoreUnavailable(
                f"another process is changing the Secret Manager (lock {lock.lock_file}); try again"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def _read_names(self, backend: keyring.backend.KeyringBackend) -> list[str]:
        with self._guard("read the list of secret names"):
            raw = backend.get_password(self.service, NAMES_ENTRY)
        if raw is None:
            return []
        try:
            names = json.loads(raw)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(is_secret_name(n) for n in names):
            raise SecretStoreUnavailable(
                f"the list of secret names in the keyring (service {self.service!r}, entry {NAMES_ENTRY!r}) "
                "is damaged; delete that entry and store the secrets again"
            )
        return list(dict.fromkeys(names))

    def _write_names(self, backend: keyring.backend.KeyringBackend, names: list[str]) -> None:
        with self._guard("update the list of secret names"):
            backend.set_password(self.service, NAMES_ENTRY, json.dumps(sorted(names)))

    def _try_write_names(self, backend: keyring.backend.KeyringBackend, names: list[str]) -> None:
        with suppress(SecretStoreUnavailable):  # best effort: the original failure is the one to report
            self._write_names(backend, names)


def _keyring_errors() -> Any:
    import keyring.errors

    return keyring.errors


def mask(data: bytes, secrets: Iterable[str]) -> bytes:
    """Hide secret values in ``data``, keeping its length so byte offsets into a log stay valid."""
    for value in secrets:
        raw = value.encode()
        if len(raw) >= 4:
            data = data.replace(raw, b"*" * len(raw))
    return data
