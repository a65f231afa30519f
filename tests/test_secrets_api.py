"""GET /remote-compute/secrets on a real jupyter_server: where secrets live, as the panel shows it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

VALUE = "tok-3b9d0e7a51c24f68a0d2b4c6e8f1a3c5"


async def _secrets(jp_fetch) -> dict:  # type: ignore[no-untyped-def,type-arg]
    response = await jp_fetch("remote-compute", "secrets")
    assert response.code == 200
    return json.loads(response.body)


async def test_the_keyring_named_by_the_tests_is_shown_with_its_note(jp_fetch, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REMOTE_COMPUTE_SECRET_HF_TOKEN", VALUE)
    data = await _secrets(jp_fetch)
    assert data["store"]["where"] == "the keyring backend keyrings.alt.file.PlaintextKeyring"
    assert "named in PYTHON_KEYRING_BACKEND" in data["store"]["note"]
    assert {
        "name": "HF_TOKEN",
        "source": "deployment-env",
        "where": "environment variable REMOTE_COMPUTE_SECRET_HF_TOKEN",
        "read_only": True,
        "problem": None,
    } in data["secrets"]
    assert VALUE not in json.dumps(data)


class TestTheServerSetting:
    """c.RemoteComputeApp.secrets_store = "file" (and secrets_file), as a deployment would set it."""

    @pytest.fixture
    def secrets_home(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        # The extension exports its settings into os.environ; recording them here first undoes that afterwards.
        for variable in ("JUPYTER_REMOTE_COMPUTE_SECRETS_STORE", "JUPYTER_REMOTE_COMPUTE_SECRETS_FILE"):
            monkeypatch.setenv(variable, "")
        return tmp_path / "private"

    @pytest.fixture
    def jp_server_config(self, jp_server_config: dict, secrets_home: Path) -> dict:  # type: ignore[type-arg]
        config = json.loads(json.dumps(jp_server_config))
        config["RemoteComputeApp"].update(secrets_store="file", secrets_file=str(secrets_home / "secrets.json"))
        return config

    async def test_it_chooses_the_private_file_for_every_entry_point(self, jp_fetch, secrets_home: Path):
        data = await _secrets(jp_fetch)
        path = secrets_home / "secrets.json"
        assert data["store"]["kind"] == "file" and "private file readable by this user" in data["store"]["note"]
        # Exported, so kernels, terminals and pipeline runs the server starts use the same file.
        assert os.environ["JUPYTER_REMOTE_COMPUTE_SECRETS_STORE"] == "file"
        assert os.environ["JUPYTER_REMOTE_COMPUTE_SECRETS_FILE"] == str(path)
        # A token given with a machine goes there (the panel's Add a machine form).
        response = await jp_fetch(
            "remote-compute",
            "machines",
            method="POST",
            body=json.dumps({"name": "lab", "kind": "jupyter", "address": "http://127.0.0.1:9/", "token": VALUE}),
        )
        assert response.code == 201
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and VALUE in path.read_text()
        data = await _secrets(jp_fetch)
        assert [(s["name"], s["source"]) for s in data["secrets"]] == [("compute/lab", "file")]
