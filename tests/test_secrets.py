"""The Secret Manager over real backends in this process.

conftest names keyrings.alt's file backend in PYTHON_KEYRING_BACKEND (an explicit choice, so it is
used). Backends keyring picks by itself, the Secret Service and whole jobs are in
test_secret_backends.py, in subprocesses (keyring's backend choice is global to a process).
"""

from __future__ import annotations

import os
import stat
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keyring
import keyring.backend
import keyring.errors
import pytest
from keyring.backends import chainer, fail, null

from jupyter_remote_compute.errors import InvalidSettings, NotFound, SecretStoreUnavailable
from jupyter_remote_compute.secret_sources import SAFE_BACKENDS, class_path, dir_secret, env_var_for
from jupyter_remote_compute.secrets import NAMES_ENTRY, SERVICE, SecretEntry, SecretStore, resolve_reference

VALUE = "tok-7f3a9c1e5b2d4f60a8e1c3b5d7f9a2c4"


@pytest.fixture
def store() -> SecretStore:
    """A store of its own: a fresh service name isolates each test in the shared keyring file."""
    return SecretStore(service=f"jrc-test-{uuid.uuid4().hex}")


@pytest.fixture
def use_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[keyring.backend.KeyringBackend], None]]:
    """Swap keyring's active backend for one test, named as the user's choice, then put the real one back."""
    original = keyring.get_keyring()

    def use(backend: keyring.backend.KeyringBackend) -> None:
        keyring.set_keyring(backend)
        monkeypatch.setenv("PYTHON_KEYRING_BACKEND", class_path(backend))

    yield use
    keyring.set_keyring(original)


class EchoingKeyring(keyring.backend.KeyringBackend):
    """A backend whose errors repeat the password they were given, as a careless one might."""

    priority = 1  # type: ignore[assignment]

    def __init__(self, fail_with: str | None = None) -> None:
        super().__init__()
        self.entries: dict[tuple[str, str], str] = {}
        self.fail_with = fail_with

    def get_password(self, service: str, username: str) -> str | None:
        return self.entries.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        if username != NAMES_ENTRY:
            message = self.fail_with if self.fail_with is not None else f"cannot store {password!r} for {username}"
            raise keyring.errors.PasswordSetError(message)
        self.entries[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.entries.pop((service, username))


def full_text(error: BaseException) -> str:
    """Everything a log would show for ``error``: message, repr and traceback with its chain."""
    return "".join(traceback.format_exception(error)) + repr(error)


def test_the_tests_use_a_real_file_backend_named_explicitly(store: SecretStore) -> None:
    assert type(keyring.get_keyring()).__name__ == "PlaintextKeyring"
    status = store.status()
    assert status["usable"] and status["kind"] == "keyring"
    assert status["where"] == "the keyring backend keyrings.alt.file.PlaintextKeyring"
    # The panel and CLI say who chose it and that it is not a keyring that encrypts.
    assert "PYTHON_KEYRING_BACKEND" in status["note"] and "not one of the platform keyrings" in status["note"]


def test_set_get_delete(store: SecretStore) -> None:
    assert store.get("compute/team-lab") is None
    store.set("compute/team-lab", VALUE)
    assert store.get("compute/team-lab") == VALUE
    store.set("compute/team-lab", VALUE + "-2")  # replace
    assert store.get("compute/team-lab") == VALUE + "-2"
    assert store.names() == ["compute/team-lab"]
    store.delete("compute/team-lab")
    assert store.get("compute/team-lab") is None
    assert store.names() == []
    with pytest.raises(NotFound) as caught:
        store.delete("compute/team-lab")
    assert "compute/team-lab" in caught.value.message


def test_values_live_in_the_keyring_not_in_the_store_object(store: SecretStore) -> None:
    store.set("a", VALUE)
    again = SecretStore(store.service)
    assert again.get("a") == VALUE and again.names() == ["a"]
    assert keyring.get_password(store.service, "a") == VALUE
    assert SecretStore(f"jrc-test-{uuid.uuid4().hex}").names() == []  # services are separate


def test_names_are_sorted_and_never_hold_values(store: SecretStore) -> None:
    for name, value in (("zeta", "v-zeta-1"), ("Alpha.key", "v-alpha-2"), ("compute/b_1", VALUE)):
        store.set(name, value)
    names = store.names()
    assert names == sorted(["zeta", "Alpha.key", "compute/b_1"])
    assert not {"v-zeta-1", "v-alpha-2", VALUE} & set(names)
    index = keyring.get_password(store.service, NAMES_ENTRY)
    assert index is not None and VALUE not in index and "v-zeta-1" not in index


def test_values_returns_every_stored_value(store: SecretStore) -> None:
    store.set("a", "value-a")
    store.set("b", "value-b")
    assert sorted(store.values()) == ["value-a", "value-b"]
    store.delete("a")
    assert store.values() == ["value-b"]


def test_default_service() -> None:
    assert SecretStore().service == SERVICE == "jupyter-remote-compute"


@pytest.mark.parametrize("name", ["", "has space", "_hidden", "/abs", "-x", "a" * 129, "é", "a:b", NAMES_ENTRY, None])
def test_bad_names_are_refused(store: SecretStore, name: Any) -> None:
    for attempt in (lambda: store.set(name, VALUE), lambda: store.get(name), lambda: store.delete(name)):
        with pytest.raises(InvalidSettings) as caught:
            attempt()
        assert caught.value.field == "name"
        assert VALUE not in full_text(caught.value)
    assert store.names() == []


def test_longest_name_is_accepted(store: SecretStore) -> None:
    store.set("a" * 128, VALUE)
    assert store.names() == ["a" * 128]


@pytest.mark.parametrize("value", ["", None, 42])
def test_an_empty_or_non_text_value_is_refused(store: SecretStore, value: Any) -> None:
    with pytest.raises(InvalidSettings) as caught:
        store.set("a", value)
    assert caught.value.field == "value"
    assert store.names() == []


@pytest.mark.parametrize(
    "backend",
    [fail.Keyring(), null.Keyring()],
    ids=["fail", "null"],
)
def test_no_usable_backend_gives_an_actionable_error(
    store: SecretStore, use_backend: Callable[[Any], None], backend: keyring.backend.KeyringBackend
) -> None:
    use_backend(backend)
    for attempt in (lambda: store.get("a"), lambda: store.set("a", VALUE), lambda: store.delete("a")):
        with pytest.raises(SecretStoreUnavailable) as caught:
            attempt()
        message = caught.value.message
        assert "No usable system keyring" in message and type(backend).__module__ in message
        assert "gnome-keyring" in message and "PYTHON_KEYRING_BACKEND" in message
        assert "plaintext" in message  # says it will not fall back to one
        assert "JUPYTER_REMOTE_COMPUTE_SECRETS_STORE=file" in message  # and what to do on a server
        assert VALUE not in full_text(caught.value)
        assert caught.value.status == 503
    # Listing still works (deployment secrets need no keyring) and says why the keyring is out.
    assert store.names() == [] and store.values() == []
    status = store.status()
    assert not status["usable"] and "No usable system keyring" in status["problem"]


def test_a_chain_with_no_backends_is_unusable(
    store: SecretStore, use_backend: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyring.backend, "_limit", lambda backend: False)  # the chain finds nothing
    empty_chain = chainer.ChainerBackend()
    assert empty_chain.backends == []
    use_backend(empty_chain)
    with pytest.raises(SecretStoreUnavailable, match="No usable system keyring"):
        store.set("a", VALUE)


def test_a_value_never_appears_in_an_error(store: SecretStore, use_backend: Callable[[Any], None]) -> None:
    backend = EchoingKeyring()
    use_backend(backend)
    with pytest.raises(SecretStoreUnavailable) as caught:
        store.set("compute/team-lab", VALUE)
    assert VALUE not in full_text(caught.value)
    assert "compute/team-lab" in caught.value.message and "PasswordSetError" in caught.value.message
    # the name was not left listed for a value that was never stored
    assert store.names() == []


def test_a_backend_error_without_the_value_is_passed_on(store: SecretStore, use_backend: Callable[[Any], None]) -> None:
    use_backend(EchoingKeyring(fail_with="the collection is locked"))
    with pytest.raises(SecretStoreUnavailable) as caught:
        store.set("a", VALUE)
    assert "the collection is locked" in caught.value.message
    assert VALUE not in full_text(caught.value)


def test_a_damaged_names_entry_is_reported(store: SecretStore) -> None:
    keyring.set_password(store.service, NAMES_ENTRY, "{not json")
    with pytest.raises(SecretStoreUnavailable, match="damaged"):
        store.names()


def test_delete_repairs_a_listed_name_without_a_value(store: SecretStore) -> None:
    keyring.set_password(store.service, NAMES_ENTRY, '["ghost"]')
    with pytest.raises(NotFound):
        store.delete("ghost")
    assert store.names() == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("secret:compute/team-lab", "compute/team-lab"),
        ("secret:A1", "A1"),
        ("plain value", None),
        ("SECRET:a", None),
        ("my secret:a", None),
        ("", None),
    ],
)
def test_resolve_reference(value: str, expected: str | None) -> None:
    assert resolve_reference(value) == expected


@pytest.mark.parametrize("value", ["secret:", "secret:has space", "secret:_x"])
def test_a_malformed_reference_is_not_taken_as_a_literal(value: str) -> None:
    with pytest.raises(InvalidSettings, match="secret:NAME"):
        resolve_reference(value)


# -- which keyring backends are used ------------------------------------------------
def test_an_unsafe_backend_keyring_picked_by_itself_is_refused(
    store: SecretStore, use_backend: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    from keyrings.alt.file import PlaintextKeyring

    use_backend(PlaintextKeyring())
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND")  # nobody named it: keyring picked it
    monkeypatch.setenv("XDG_CONFIG_HOME", str(Path(store.service)))  # no keyringrc.cfg there either
    with pytest.raises(SecretStoreUnavailable) as caught:
        store.set("a", VALUE)
    message = caught.value.message
    assert "No usable system keyring" in message and "keyrings.alt.file.PlaintextKeyring" in message
    assert "without encryption" in message
    assert keyring.get_password(store.service, "a") is None  # nothing was written to the file


def test_a_chain_of_unsafe_backends_is_refused(
    store: SecretStore, use_backend: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What keyring builds by itself when it finds several backends, here only keyrings.alt's.
    monkeypatch.setattr(keyring.backend, "_limit", lambda b: type(b).__module__.startswith("keyrings.alt.file"))
    chain = chainer.ChainerBackend()
    assert len(chain.backends) >= 1
    use_backend(chain)
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND")
    with pytest.raises(SecretStoreUnavailable) as caught:
        store.set("a", VALUE)
    assert "keyring found only keyrings.alt.file.PlaintextKeyring" in caught.value.message


def test_a_backend_named_in_keyrings_config_file_is_used(
    store: SecretStore, use_backend: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from keyrings.alt.file import PlaintextKeyring

    use_backend(PlaintextKeyring())
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    config = tmp_path / "python_keyring" / "keyringrc.cfg"
    config.parent.mkdir()
    config.write_text("[backend]\ndefault-keyring = keyrings.alt.file.PlaintextKeyring\n")
    store.set("a", VALUE)
    assert store.get("a") == VALUE
    assert str(config) in store.status()["note"]


def test_the_products_own_setting_names_a_backend(
    store: SecretStore, use_backend: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_backend(fail.Keyring())  # keyring itself has nothing
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND", "keyrings.alt.file.PlaintextKeyring")
    named = SecretStore(store.service)
    named.set("a", VALUE)
    assert named.get("a") == VALUE
    assert "JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND" in named.status()["note"]
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND", "no.such.Backend")
    with pytest.raises(SecretStoreUnavailable, match=r"JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND='no.such.Backend'"):
        SecretStore(store.service).get("a")


def test_naming_the_fail_backend_does_not_make_it_usable(store: SecretStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    with pytest.raises(SecretStoreUnavailable, match="No usable system keyring"):
        SecretStore(store.service).set("a", VALUE)


@pytest.mark.parametrize(
    ("path", "safe"),
    [
        ("keyring.backends.SecretService.Keyring", True),
        ("keyring.backends.macOS.Keyring", True),
        ("keyring.backends.Windows.WinVaultKeyring", True),
        ("keyring.backends.kwallet.DBusKeyring", True),
        ("keyrings.alt.file.PlaintextKeyring", False),
        ("keyrings.alt.file.EncryptedKeyring", False),
        ("keyrings.alt.Windows.RegistryKeyring", False),
        ("keyring.backends.fail.Keyring", False),
        ("keyring.backends.null.Keyring", False),
    ],
)
def test_backend_classification(path: str, safe: bool) -> None:
    from keyring.core import _load_keyring_class

    cls = _load_keyring_class(path)
    assert (f"{cls.__module__}.{cls.__qualname__}" in SAFE_BACKENDS) is safe


# -- deployment secrets -------------------------------------------------------------
def test_a_deployment_variable_is_read_only_and_listed(store: SecretStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOTE_COMPUTE_SECRET_COMPUTE_TEAM_LAB", VALUE)
    assert env_var_for("compute/team-lab") == "REMOTE_COMPUTE_SECRET_COMPUTE_TEAM_LAB"
    assert store.get("compute/team-lab") == VALUE
    assert store.get("COMPUTE_TEAM_LAB") == VALUE  # the name the listing shows works too
    for attempt in (lambda: store.set("compute/team-lab", "other"), lambda: store.delete("compute/team-lab")):
        with pytest.raises(InvalidSettings, match="provided by the deployment") as caught:
            attempt()
        assert "REMOTE_COMPUTE_SECRET_COMPUTE_TEAM_LAB" in caught.value.message
        assert VALUE not in full_text(caught.value)
    [entry] = store.entries()
    assert entry == SecretEntry(
        "COMPUTE_TEAM_LAB", "deployment-env", "environment variable REMOTE_COMPUTE_SECRET_COMPUTE_TEAM_LAB", True
    )
    assert store.values() == [VALUE]
    assert store.get("compute/team-lab2") is None


def test_a_deployment_variable_needs_no_keyring(
    store: SecretStore, use_backend: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_backend(fail.Keyring())
    monkeypatch.setenv("REMOTE_COMPUTE_SECRET_HF_TOKEN", VALUE)
    assert store.get("hf_token") == VALUE and store.names() == ["HF_TOKEN"]


def k8s_secret_volume(root: Path, files: dict[str, str], mode: int = 0o400) -> Path:
    """A folder laid out as Kubernetes mounts a Secret: entries are links into a hidden ..data folder."""
    data = root / "..2026_11_30_08_00_00.123"
    for rel, text in files.items():
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text(text)
        (data / rel).chmod(mode)
    (root / "..data").symlink_to(data.name)
    for top in {rel.split("/")[0] for rel in files}:
        (root / top).symlink_to(f"..data/{top}")
    return root


def test_deployment_files_are_secrets_named_by_path(
    tmp_path: Path, use_backend: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_backend(fail.Keyring())
    root = k8s_secret_volume(tmp_path / "mounted", {"hf_token": VALUE + "\n", "compute/box": "tok-box-1234"})
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_SECRETS_DIR", str(root))
    store = SecretStore(f"jrc-test-{uuid.uuid4().hex}")
    assert store.get("hf_token") == VALUE  # the newline `echo` leaves is not part of it
    assert store.get("compute/box") == "tok-box-1234"
    for escape in ("compute/..", "compute/../hf_token", "compute/./box"):  # no way up, out or around
        assert dir_secret(root, escape) is None
    entries = store.entries()
    assert [(e.name, e.source, e.read_only, e.problem) for e in entries] == [
        ("compute/box", "deployment-dir", True, None),
        ("hf_token", "deployment-dir", True, None),
    ]
    assert entries[1].where == f"file {root / 'hf_token'}"
    with pytest.raises(InvalidSettings, match="provided by the deployment"):
        store.set("hf_token", "other")
    assert sorted(store.values()) == sorted([VALUE, "tok-box-1234"])


def test_a_deployment_file_others_can_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "mounted"
    root.mkdir()
    (root / "open").write_text(VALUE)
    (root / "open").chmod(0o644)  # Kubernetes' default mode
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_SECRETS_DIR", str(root))
    store = SecretStore(f"jrc-test-{uuid.uuid4().hex}")
    with pytest.raises(SecretStoreUnavailable) as caught:
        store.get("open")
    message = caught.value.message
    assert str(root / "open") in message and "0644" in message and "chmod 600" in message
    assert VALUE not in full_text(caught.value)
    [entry] = store.entries()
    assert entry.name == "open" and entry.problem is not None and str(root / "open") in entry.problem
    assert store.names() == [] and store.values() == []


# -- the private file store ---------------------------------------------------------
@pytest.fixture
def file_store(tmp_path: Path, use_backend: Callable[[Any], None]) -> SecretStore:
    use_backend(fail.Keyring())  # a server without a keyring: the case the file is for
    return SecretStore(kind="file", path=tmp_path / "config" / "jupyter-remote-compute" / "secrets.json")


def test_the_private_file_store(file_store: SecretStore) -> None:
    path = file_store.private_file.path
    old_umask = os.umask(0)  # even with nothing masked, the file is never more open than 0600
    try:
        file_store.set("compute/box", VALUE)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert file_store.get("compute/box") == VALUE
    assert SecretStore(kind="file", path=path).names() == ["compute/box"]
    status = file_store.status()
    assert status["usable"] and "private file readable by this user" in status["note"] and str(path) in status["note"]
    [entry] = file_store.entries()
    assert (entry.source, entry.read_only) == ("file", False) and str(path) in entry.where
    file_store.delete("compute/box")
    assert file_store.get("compute/box") is None and file_store.names() == []
    with pytest.raises(NotFound):
        file_store.delete("compute/box")


def test_the_private_file_is_replaced_whole(file_store: SecretStore) -> None:
    file_store.set("a", "value-a-0")
    path = file_store.private_file.path
    # Held open, the first file's inode cannot be freed and handed to a later file (an inode number
    # compared after the writes could be that very number again, recycled).
    first = os.open(path, os.O_RDONLY)
    stop = threading.Event()
    seen: list[str] = []

    def read_all_along() -> None:
        while not stop.is_set():
            try:
                seen.append(SecretStore(kind="file", path=path).get("a") or "missing")
            except SecretStoreUnavailable as e:  # a half-written file reads as damaged
                seen.append(f"error: {e.message}")
                return

    reader = threading.Thread(target=read_all_along)
    reader.start()
    try:
        for i in range(1, 40):
            file_store.set("a", f"value-a-{i}")
    finally:
        stop.set()
        reader.join()
    # A reader only ever saw a whole file; the file was renamed into place, not rewritten.
    assert seen and all(v.startswith("value-a-") for v in seen)
    try:
        assert os.fstat(first).st_nlink == 0  # the first file is no longer in any folder: replaced by a rename
        assert os.fstat(first).st_ino != path.stat().st_ino
    finally:
        os.close(first)
    assert sorted(p.name for p in path.parent.iterdir()) == ["secrets.json"]  # no temp file left


def test_a_private_file_others_can_read_is_refused(file_store: SecretStore) -> None:
    file_store.set("a", VALUE)
    path = file_store.private_file.path
    path.chmod(0o640)
    with pytest.raises(SecretStoreUnavailable) as caught:
        file_store.get("a")
    assert str(path) in caught.value.message and "chmod 600" in caught.value.message
    assert VALUE not in full_text(caught.value)
    assert not file_store.status()["usable"]


def test_a_damaged_private_file_is_reported(file_store: SecretStore) -> None:
    path = file_store.private_file.path
    path.parent.mkdir(parents=True)
    path.write_text('{"secrets": ["' + VALUE + '"]}')
    path.chmod(0o600)
    with pytest.raises(SecretStoreUnavailable, match="damaged") as caught:
        file_store.get("a")
    assert VALUE not in full_text(caught.value)


def test_the_store_kind_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_SECRETS_STORE", "file")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    store = SecretStore()
    assert store.kind == "file"
    assert store.private_file.path == tmp_path / "jupyter-remote-compute" / "secrets.json"
    monkeypatch.setenv("JUPYTER_REMOTE_COMPUTE_SECRETS_STORE", "vault")
    with pytest.raises(InvalidSettings, match="JUPYTER_REMOTE_COMPUTE_SECRETS_STORE='vault'"):
        SecretStore()
