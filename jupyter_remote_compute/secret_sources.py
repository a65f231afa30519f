"""Where the Secret Manager's values live: the choice of keyring, deployment secrets, a private file.

Three kinds of place, looked up in this order by ``secrets.SecretStore``:

1. **Deployment secrets** (read-only): environment variables ``REMOTE_COMPUTE_SECRET_<NAME>``
   and files in a directory the admin mounts (``JUPYTER_REMOTE_COMPUTE_SECRETS_DIR``).
2. **The user's store** (read-write), one of:
   - the system keyring, but only a backend that keeps secrets encrypted (Secret Service, macOS
     Keychain, Windows Credential Locker, KWallet) unless the user named another one explicitly;
   - a private file (opt-in, ``JUPYTER_REMOTE_COMPUTE_SECRETS_STORE=file``): one JSON file, mode
     0600, in the user's config directory.

Every setting is an environment variable, so the server, its kernels, the CLI and pipeline runners
agree; the server's traitlets set the same variables for the processes it starts. No error raised
here ever includes a secret value.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InvalidSettings, SecretStoreUnavailable
from .fsutil import atomic_write

if TYPE_CHECKING:
    import keyring.backend

# keyring is imported where it is used, not here: importing it costs more than a whole job that
# needs no secret (every command line imports this module).

if sys.platform != "darwin":
    # keyring imports every backend when it first chooses one; its macOS backend's module asks ctypes for three
    # macOS frameworks, which on Linux runs ldconfig and a compiler (~0.1 s) only to learn they are
    # absent. Off macOS that backend refuses to run anyway, so its module is not imported at all.
    sys.modules.setdefault("keyring.backends.macOS.api", None)  # type: ignore[arg-type]


#: Settings (environment variables; the server's traitlets of the same meaning set them).
STORE_ENV = "JUPYTER_REMOTE_COMPUTE_SECRETS_STORE"
FILE_ENV = "JUPYTER_REMOTE_COMPUTE_SECRETS_FILE"
DIR_ENV = "JUPYTER_REMOTE_COMPUTE_SECRETS_DIR"
BACKEND_ENV = "JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND"
#: A deployment secret in the environment: this prefix + the name mapped by ``env_var_for``.
SECRET_ENV_PREFIX = "REMOTE_COMPUTE_SECRET_"

STORE_KINDS = ("keyring", "file")

#: Backends that keep secrets encrypted by the platform. Any other backend (keyrings.alt's files,
#: keyring's fail and null stand-ins, a third-party one) is used only when the user names it.
SAFE_BACKENDS = {
    "keyring.backends.SecretService.Keyring": "Secret Service",
    "keyring.backends.libsecret.Keyring": "Secret Service (libsecret)",
    "keyring.backends.macOS.Keyring": "macOS Keychain",
    "keyring.backends.Windows.WinVaultKeyring": "Windows Credential Locker",
    "keyring.backends.kwallet.DBusKeyring": "KWallet",
    "keyring.backends.kwallet.DBusKeyringKWallet4": "KWallet 4",
}
# Modules whose backends store values without encryption (or not at all), for the message only.
_PLAINTEXT_HINTS = ("keyrings.alt", "uncrypted", "plaintext")

# A group/other permission bit on a secret file: refused, whatever the bit.
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def class_path(backend: keyring.backend.KeyringBackend) -> str:
    """``module.Class`` of a backend, as PYTHON_KEYRING_BACKEND names it."""
    return f"{type(backend).__module__}.{type(backend).__qualname__}"


def is_safe(backend: keyring.backend.KeyringBackend) -> bool:
    return class_path(backend) in SAFE_BACKENDS


def _stand_in(backend: keyring.backend.KeyringBackend) -> bool:
    """keyring's stand-ins that cannot keep a secret at all."""
    from keyring.backends import chainer, fail, null

    return isinstance(backend, (fail.Keyring, null.Keyring, chainer.ChainerBackend))


def keyring_config_path() -> Path:
    """keyring's own config file, where a user may name a backend (as keyring itself finds it)."""
    import keyring.util.platform_

    return Path(keyring.util.platform_.config_root()) / "keyringrc.cfg"


def _named_in_config() -> str | None:
    """The backend keyring's own config file (keyringrc.cfg) names, if any."""
    path = keyring_config_path()
    config = configparser.RawConfigParser()
    try:
        config.read(path, encoding="utf-8")
        return config.get("backend", "default-keyring").strip() or None
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None


@dataclasses.dataclass(frozen=True)
class KeyringChoice:
    """The keyring backend secrets go to, and why that one."""

    backend: keyring.backend.KeyringBackend
    #: None when keyring picked it by itself (then it is always a safe one).
    named_by: str | None

    @property
    def name(self) -> str:
        return class_path(self.backend)

    @property
    def label(self) -> str:
        return SAFE_BACKENDS.get(self.name, self.name)

    @property
    def safe(self) -> bool:
        return is_safe(self.backend)


def unavailable_message(backend: keyring.backend.KeyringBackend) -> str:
    """The one actionable message for "no keyring we may use": none at all, or only an unsafe one."""
    from keyring.backends import chainer

    kind = class_path(backend)
    members = backend.backends if isinstance(backend, chainer.ChainerBackend) else []
    if members:
        listed = ", ".join(class_path(b) for b in members)
        found = f"keyring found only {listed}, none of them a platform keyring that encrypts"
    elif _stand_in(backend):
        found = f"keyring's active backend is {kind}"
    else:
        plain = any(h in kind.lower() for h in _PLAINTEXT_HINTS)
        found = f"keyring picked {kind} by itself, which " + (
            "keeps secrets in a file without encryption" if plain else "is not a platform keyring known to encrypt"
        )
    return (
        f"No usable system keyring was found ({found}), so secrets cannot be stored or read there. "
        "Install and unlock one - e.g. gnome-keyring or another Secret Service provider on Linux, the macOS "
        "Keychain, or the Windows Credential Locker - or name a backend you trust in PYTHON_KEYRING_BACKEND "
        f"or {BACKEND_ENV}. On a server without a keyring: use secrets the deployment provides "
        f"({SECRET_ENV_PREFIX}<NAME> variables or files in {DIR_ENV}), or opt in to a private file "
        f"with {STORE_ENV}=file. Secrets are never written to a plaintext file as a silent fallback."
    )


_loaded: dict[str, keyring.backend.KeyringBackend] = {}


def choose_keyring(named: str | None = None) -> KeyringChoice:
    """The backend to use: one the user named, else the first safe one keyring found.

    ``named`` is this product's own setting (``JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND``). Naming
    fail or null does not make them usable.
    """
    import keyring.core

    if named:
        backend = _loaded.get(named)
        if backend is None:
            try:
                backend = keyring.core.load_keyring(named)
            except (ImportError, AttributeError, ValueError, RuntimeError) as e:
                raise SecretStoreUnavailable(
                    f"{BACKEND_ENV}={named!r} cannot be loaded ({type(e).__name__}: {e}); name a keyring backend "
                    "class as module.Class, e.g. keyring.backends.SecretService.Keyring"
                ) from None
            _loaded[named] = backend
        if _stand_in(backend):
            raise SecretStoreUnavailable(unavailable_message(backend))
        return KeyringChoice(backend, BACKEND_ENV)
    active = keyring.get_keyring()
    if not _stand_in(active):
        # keyring loads PYTHON_KEYRING_BACKEND, else its config file's backend: if the active one is
        # that class, the user chose it.
        if os.environ.get("PYTHON_KEYRING_BACKEND", "").strip() == class_path(active):
            return KeyringChoice(active, "PYTHON_KEYRING_BACKEND")
        config_name = _named_in_config()
        if config_name and config_name == class_path(active):
            return KeyringChoice(active, f"keyring's config file {keyring_config_path()}")
    safe = _first_safe(active)
    if safe is None:
        raise SecretStoreUnavailable(unavailable_message(active))
    return KeyringChoice(safe, None)


# keyring's active backend -> its first safe member: a chain finds its members afresh on every
# access (a few ms), and the active backend only changes when someone calls keyring.set_keyring.
_first_safe_of: tuple[keyring.backend.KeyringBackend, keyring.backend.KeyringBackend | None] | None = None


def _first_safe(active: keyring.backend.KeyringBackend) -> keyring.backend.KeyringBackend | None:
    """The backend itself if safe; from a chain, its highest-priority safe member alone.

    Alone, not the chain: a chain would also read from (and could write to) the unsafe backends behind it.
    """
    from keyring.backends import chainer

    global _first_safe_of
    if _first_safe_of is not None and _first_safe_of[0] is active:
        return _first_safe_of[1]
    candidates = active.backends if isinstance(active, chainer.ChainerBackend) else [active]
    found = next((b for b in candidates if is_safe(b)), None)  # the chain lists them by priority
    _first_safe_of = (active, found)
    return found


# -- deployment secrets ---------------------------------------------------------
def env_var_for(name: str) -> str:
    """The environment variable a deployment sets for secret ``name``.

    Upper-cased, every character other than a letter or digit becoming ``_``:
    ``compute/team-lab`` -> ``REMOTE_COMPUTE_SECRET_COMPUTE_TEAM_LAB``.
    """
    return SECRET_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.upper())


def env_secret_names() -> dict[str, str]:
    """Secret name -> variable, for every deployment variable; a variable's suffix is its name."""
    found = {}
    for var, value in os.environ.items():
        if var.startswith(SECRET_ENV_PREFIX) and value:
            suffix = var[len(SECRET_ENV_PREFIX) :]
            if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_]{0,127}", suffix):
                found[suffix] = var
    return found


def env_secret(name: str) -> str | None:
    return os.environ.get(env_var_for(name)) or None


def default_secrets_dir() -> Path | None:
    raw = os.environ.get(DIR_ENV, "").strip()
    return Path(raw).expanduser() if raw else None


def _check_private(path: Path, what: str) -> os.stat_result:
    """A secret file readable or writable by anyone but its owner is refused, naming the file."""
    st = path.stat()
    if st.st_mode & _OTHERS:
        raise SecretStoreUnavailable(
            f"{what} {path} is accessible to other users (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"refusing to use it. Make it readable by its owner only: chmod 600 {path}"
            + (" (in Kubernetes, defaultMode: 0400 on the Secret volume)" if what == "deployment secret file" else "")
        )
    return st


def dir_secret_path(root: Path | None, name: str) -> Path | None:
    """The file of the deployment directory ``root`` that holds ``name`` (it may be absent), or None."""
    parts = name.split("/")
    # Names with '/' map to subfolders (a Kubernetes Secret volume's items may have such paths);
    # a dot-led part would be a hidden file or a way out.
    if root is None or any(not p or p.startswith(".") for p in parts):
        return None
    return root.joinpath(*parts)


def dir_secret(root: Path | None, name: str) -> str | None:
    path = dir_secret_path(root, name)
    if root is None or path is None or not path.is_file():
        return None
    if not path.resolve().is_relative_to(root.resolve()):
        raise SecretStoreUnavailable(f"deployment secret file {path} leads outside {root}; refusing to read it")
    _check_private(path, "deployment secret file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise SecretStoreUnavailable(f"deployment secret file {path} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise SecretStoreUnavailable(f"deployment secret file {path} is not UTF-8 text") from None
    # `echo TOKEN > file` leaves a newline that is no part of the secret.
    return text.rstrip("\r\n") or None


def dir_secret_names(root: Path | None) -> dict[str, Path]:
    """Secret name -> file for every file under the deployment directory ``root`` (hidden entries skipped)."""
    if root is None or not root.is_dir():
        return {}
    found = {}
    # followlinks: a Kubernetes Secret volume's entries are links into its hidden ..data folder.
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for file in sorted(files):
            if file.startswith("."):
                continue
            path = Path(folder, file)
            name = path.relative_to(root).as_posix()
            if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,127}", name):
                found[name] = path
    return found


def file_access_problem(path: Path) -> str | None:
    """Why a deployment file cannot be used (mode, unreadable), without reading the secret."""
    try:
        _check_private(path, "deployment secret file")
    except SecretStoreUnavailable as e:
        return e.message
    except OSError as e:
        return f"deployment secret file {path} cannot be read: {e.strerror}"
    if not os.access(path, os.R_OK):
        return f"deployment secret file {path} cannot be read by this user"
    return None


# -- the private file store -----------------------------------------------------
def store_kind() -> str:
    kind = os.environ.get(STORE_ENV, "").strip().lower() or "keyring"
    if kind not in STORE_KINDS:
        raise InvalidSettings(f"{STORE_ENV}={kind!r}: expected one of {', '.join(STORE_KINDS)}", field=STORE_ENV)
    return kind


def default_secrets_file() -> Path:
    raw = os.environ.get(FILE_ENV, "").strip()
    if raw:
        return Path(raw).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(config_home) / "jupyter-remote-compute" / "secrets.json"


class PrivateFile:
    """Secrets in one JSON file readable by this user only (the opt-in store for servers with no keyring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, str]:
        try:
            st = _check_private(self.path, "secrets file")
        except FileNotFoundError:
            return {}
        if st.st_uid != os.geteuid():
            raise SecretStoreUnavailable(f"secrets file {self.path} belongs to another user; refusing to use it")
        try:
            data = json.loads(self.path.read_bytes())
        except OSError as e:
            raise SecretStoreUnavailable(f"secrets file {self.path} cannot be read: {e.strerror}") from None
        except ValueError:
            data = None
        secrets = data.get("secrets") if isinstance(data, dict) else None
        if not isinstance(secrets, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()
        ):
            raise SecretStoreUnavailable(
                f"secrets file {self.path} is damaged (expected {{'secrets': {{NAME: VALUE}}}}); "
                "move it aside and store the secrets again"
            )
        return secrets

    def write(self, secrets: dict[str, str]) -> None:
        """Replace the file whole: a temp file created 0600, fsync, rename (readers see old or new)."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            data = json.dumps({"version": 1, "secrets": dict(sorted(secrets.items()))}, indent=1).encode()
            atomic_write(self.path, data, mode=0o600)
        except OSError as e:
            raise SecretStoreUnavailable(f"secrets file {self.path} cannot be written: {e.strerror}") from None
