"""The Secret Manager: named secrets in the system keyring, never in a file of ours.

A Jupyter token, a cloud key or any value a job's env references (``secret:NAME``)
lives here under a short name; compute.yaml and job settings hold only the name.
keyring cannot enumerate entries, so the names (never the values) are kept in one
extra entry of the same service, updated on every set and delete.

A keyring with no usable backend (headless Linux without a Secret Service) gets a
clear, actionable error instead of a silent plaintext fallback. No error raised
here ever includes a secret value.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import filelock
import keyring
import keyring.backend
import keyring.errors
from keyring.backends import chainer, fail, null

from .errors import InvalidSettings, NotFound, SecretStoreUnavailable

SERVICE = "jupyter-remote-compute"
#: The keyring username holding the JSON list of names; the name pattern cannot produce it.
NAMES_ENTRY = "__names__"
#: Prefix of a job setting that references a secret instead of holding a value.
REFERENCE_PREFIX = "secret:"

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")
NAME_RULE = "1 to 128 characters: letters, digits and _ . / -, starting with a letter or digit (e.g. compute/team-lab)"

_LOCK_TIMEOUT = 10.0
# Serialises the read-modify-write of the names entry between threads of this process;
# the file lock below does the same between processes.
_thread_lock = threading.Lock()


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


def _unusable(backend: keyring.backend.KeyringBackend) -> bool:
    """True for keyring's stand-ins that cannot keep a secret (fail, null, an empty chain)."""
    if isinstance(backend, (fail.Keyring, null.Keyring)):
        return True
    if isinstance(backend, chainer.ChainerBackend):
        return not any(not _unusable(b) for b in backend.backends)
    return False


def _unavailable_message(backend: keyring.backend.KeyringBackend) -> str:
    kind = f"{type(backend).__module__}.{type(backend).__qualname__}"
    return (
        f"No usable system keyring was found (keyring's active backend is {kind}), so secrets cannot be "
        "stored or read. Install and unlock one - e.g. gnome-keyring or another Secret Service provider "
        "on Linux, the macOS Keychain, or the Windows Credential Locker - or set PYTHON_KEYRING_BACKEND "
        "to a backend you trust. Secrets are never written to a plaintext file as a fallback."
    )


def _scrubbed(error: BaseException, value: str | None) -> str:
    """A backend's error text, dropped entirely if it contains the value (some echo what they got)."""
    text = str(error)
    if value and value in text:
        return f"{type(error).__name__} (details withheld: they contained the secret value)"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class SecretStore:
    """Named secrets of one keyring service. Stateless: every call asks the keyring."""

    def __init__(self, service: str = SERVICE) -> None:
        if not service:
            raise ValueError("service must be a non-empty name")
        self.service = service

    # -- the public operations ------------------------------------------------
    def get(self, name: str) -> str | None:
        """The value stored under ``name``, or None if there is none."""
        name = _check_name(name)
        backend = self._backend()
        with self._guard(f"read secret {name!r}"):
            return backend.get_password(self.service, name)

    def set(self, name: str, value: str) -> None:
        """Store ``value`` under ``name``, replacing any previous value."""
        name = _check_name(name)
        if not isinstance(value, str) or not value:
            raise InvalidSettings("a secret value must be non-empty text", field="value")
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
        """Remove ``name``; NotFound if there is no such secret."""
        name = _check_name(name)
        backend = self._backend()
        with self._names_lock():
            names = self._read_names(backend)
            with self._guard(f"read secret {name!r}"):
                present = backend.get_password(self.service, name) is not None
            if present:
                with self._guard(f"delete secret {name!r}"):
                    try:
                        backend.delete_password(self.service, name)
                    except keyring.errors.PasswordDeleteError:
                        present = False  # vanished between the two calls
            if name in names:
                self._write_names(backend, [n for n in names if n != name])
        if not present:
            raise NotFound(f"no secret named {name!r} in the Secret Manager ({self.service})")

    def names(self) -> list[str]:
        """Sorted names of the stored secrets; never their values."""
        return sorted(self._read_names(self._backend()))

    def values(self) -> list[str]:
        """Every stored value, to refuse them when pasted into job settings. Never log the result."""
        backend = self._backend()
        found = []
        for name in self._read_names(backend):
            with self._guard(f"read secret {name!r}"):
                value = backend.get_password(self.service, name)
            if value:
                found.append(value)
        return found

    # -- helpers --------------------------------------------------------------
    def _backend(self) -> keyring.backend.KeyringBackend:
        backend = keyring.get_keyring()
        if _unusable(backend):
            raise SecretStoreUnavailable(_unavailable_message(backend))
        return backend

    @contextmanager
    def _guard(self, action: str, value: str | None = None) -> Iterator[None]:
        """Turn any backend failure into SecretStoreUnavailable whose text cannot hold ``value``."""
        try:
            yield
        except keyring.errors.NoKeyringError:
            raise SecretStoreUnavailable(_unavailable_message(keyring.get_keyring())) from None
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
        lock = filelock.FileLock(str(lock_dir / f"{safe}.secrets.lock"), timeout=_LOCK_TIMEOUT)
        with _thread_lock:
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


def mask(data: bytes, secrets: Iterable[str]) -> bytes:
    """Hide secret values in ``data``, keeping its length so byte offsets into a log stay valid."""
    for value in secrets:
        raw = value.encode()
        if len(raw) >= 4:
            data = data.replace(raw, b"*" * len(raw))
    return data
