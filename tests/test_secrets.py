"""The Secret Manager over a real keyring backend (keyrings.alt's file backend, set up by conftest)."""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import keyring
import keyring.backend
import keyring.errors
import pytest
from keyring.backends import chainer, fail, null

from jupyter_remote_compute.errors import InvalidSettings, NotFound, SecretStoreUnavailable
from jupyter_remote_compute.secrets import NAMES_ENTRY, SERVICE, SecretStore, resolve_reference

VALUE = "tok-7f3a9c1e5b2d4f60a8e1c3b5d7f9a2c4"


@pytest.fixture
def store() -> SecretStore:
    """A store of its own: a fresh service name isolates each test in the shared keyring file."""
    return SecretStore(service=f"jrc-test-{uuid.uuid4().hex}")


@pytest.fixture
def use_backend() -> Iterator[Callable[[keyring.backend.KeyringBackend], None]]:
    """Swap keyring's active backend for one test, then put the real one back."""
    original = keyring.get_keyring()
    yield keyring.set_keyring
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


def test_the_tests_use_a_real_file_backend() -> None:
    assert type(keyring.get_keyring()).__name__ == "PlaintextKeyring"


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
    for attempt in (
        lambda: store.get("a"),
        lambda: store.set("a", VALUE),
        lambda: store.delete("a"),
        store.names,
        store.values,
    ):
        with pytest.raises(SecretStoreUnavailable) as caught:
            attempt()
        message = caught.value.message
        assert "No usable system keyring" in message and type(backend).__module__ in message
        assert "gnome-keyring" in message and "PYTHON_KEYRING_BACKEND" in message
        assert "plaintext" in message  # says it will not fall back to one
        assert VALUE not in full_text(caught.value)
        assert caught.value.status == 503


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
