"""GET /remote-compute/secrets on a real jupyter_server: where secrets live, as the panel shows it."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
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


# -- PUT / DELETE /remote-compute/secrets/{name}: the panel's Secrets section --------------------


async def _call(jp_fetch, *path: str, method: str = "GET", body: object = None) -> tuple[int, dict | None]:  # type: ignore[no-untyped-def,type-arg]
    kwargs: dict = {"method": method, "raise_error": False}  # type: ignore[type-arg]
    if body is not None:
        kwargs["body"] = json.dumps(body)
    response = await jp_fetch("remote-compute", *path, **kwargs)
    return response.code, (json.loads(response.body) if response.body else None)


async def test_add_replace_and_delete_a_secret_never_echoing_it(jp_fetch, server_workspace: Path):
    from jupyter_remote_compute.secrets import SecretStore

    first, second = VALUE, "tok-" + "9f8e7d6c5b4a" * 3
    code, data = await _call(jp_fetch, "secrets", "team/hf", method="PUT", body={"value": first})
    assert code == 200 and data == {"name": "team/hf", "where": SecretStore().where()}
    assert SecretStore().get("team/hf") == first  # in the real keyring backend the tests use
    code, data = await _call(jp_fetch, "secrets", "team/hf", method="PUT", body={"value": second})
    assert code == 200 and SecretStore().get("team/hf") == second  # replaced, under the same name
    code, listing = await _call(jp_fetch, "secrets")
    assert "team/hf" in [s["name"] for s in listing["secrets"]]
    assert first not in json.dumps(listing) and second not in json.dumps(listing)
    # Nothing of it in the workspace's files (compute.yaml, the state file, logs...).
    for path in (server_workspace / ".punica").rglob("*"):
        if path.is_file():
            assert second.encode() not in path.read_bytes(), path
    code, _ = await _call(jp_fetch, "secrets", "team/hf", method="DELETE")
    assert code == 204 and SecretStore().get("team/hf") is None
    code, err = await _call(jp_fetch, "secrets", "team/hf", method="DELETE")
    assert code == 404 and err["code"] == "not_found"


async def test_bad_names_and_values_are_refused_naming_the_field(jp_fetch):
    code, err = await _call(jp_fetch, "secrets", "ok-name", method="PUT", body={"value": ""})
    assert code == 400 and err["field"] == "value"
    code, err = await _call(jp_fetch, "secrets", "ok-name", method="PUT", body={})
    assert code == 400 and err["field"] == "value"
    code, err = await _call(jp_fetch, "secrets", "-starts-badly", method="PUT", body={"value": VALUE})
    assert code == 400 and err["field"] == "name" and VALUE not in json.dumps(err)


async def test_a_deployment_secret_cannot_be_replaced_or_deleted(jp_fetch, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REMOTE_COMPUTE_SECRET_SITE_TOKEN", VALUE)
    code, err = await _call(jp_fetch, "secrets", "SITE_TOKEN", method="PUT", body={"value": "other-value-123"})
    assert code == 400 and "deployment" in err["message"]
    code, err = await _call(jp_fetch, "secrets", "SITE_TOKEN", method="DELETE")
    assert code == 400 and "deployment" in err["message"]


async def test_delete_is_refused_while_a_machine_or_an_unfinished_job_uses_it(jp_fetch, server_workspace: Path):
    from jupyter_remote_compute.secrets import SecretStore

    # A machine's token: the Add a machine form stores it as compute/<machine>.
    body = {"name": "lab", "kind": "jupyter", "address": "http://127.0.0.1:9/", "token": VALUE}
    assert (await _call(jp_fetch, "machines", method="POST", body=body))[0] == 201
    code, err = await _call(jp_fetch, "secrets", "compute/lab", method="DELETE")
    assert code == 409 and err["code"] == "secret_in_use" and err["details"]["used_by"] == ["machine lab"]
    assert "machine lab" in err["message"] and VALUE not in json.dumps(err)
    assert SecretStore().get("compute/lab") == VALUE

    # A job that references it, still running (it waits on a file the test creates).
    await _call(jp_fetch, "secrets", "run/token", method="PUT", body={"value": VALUE})
    gate = server_workspace / "gate"
    spec = {"command": f"while [ ! -e {gate} ]; do sleep 0.1; done", "env": {"T": "secret:run/token"}}
    code, data = await _call(jp_fetch, "jobs", method="POST", body=spec)
    assert code == 201
    job_id = data["job"]["id"]
    code, err = await _call(jp_fetch, "secrets", "run/token", method="DELETE")
    assert code == 409 and len(err["details"]["used_by"]) == 1 and job_id in err["details"]["used_by"][0]
    gate.touch()
    deadline = time.monotonic() + 90
    while (await _call(jp_fetch, "jobs", job_id))[1]["state"] != "succeeded":  # type: ignore[index]
        assert time.monotonic() < deadline, "the job did not end"
        await asyncio.sleep(0.1)
    # Ended: nothing needs it any more.
    assert (await _call(jp_fetch, "secrets", "run/token", method="DELETE"))[0] == 204
