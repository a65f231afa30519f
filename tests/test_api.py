"""The REST API against a real jupyter_server running the extension."""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from tornado.httpclient import HTTPClientError

import jupyter_remote_compute
from jupyter_remote_compute import engines
from jupyter_remote_compute.engines.local import LocalEngine


async def _json(jp_fetch, *path, method="GET", body=None, **params):
    kwargs = {"method": method, "params": params}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    response = await jp_fetch("remote-compute", *path, **kwargs)
    return response.code, (json.loads(response.body) if response.body else None)


async def _error(jp_fetch, *path, method="GET", body=None):
    with pytest.raises(HTTPClientError) as info:
        await _json(jp_fetch, *path, method=method, body=body)
    return info.value.code, json.loads(info.value.response.body)


async def _wait_job(jp_fetch, job_id, states, timeout=90.0):
    deadline = time.monotonic() + timeout
    while True:
        _, job = await _json(jp_fetch, "jobs", job_id)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job stuck in {job['state']}"
        await asyncio.sleep(0.1)


async def test_machines_list_has_the_builtin_machine(jp_fetch):
    code, data = await _json(jp_fetch, "machines")
    assert code == 200
    local = data["machines"][0]
    assert local["name"] == "local" and local["builtin"] is True
    assert "version" in data
    assert "local" in {k["kind"] for k in data["kinds"]}


async def test_quickstart_through_the_api(jp_fetch, server_workspace: Path):
    spec = {
        "machine": "local",
        "command": "python train.py",
        "send": ["train.py", "data/points.csv"],
        "bring_back": ["model.pkl", "metrics.json"],
    }
    code, data = await _json(jp_fetch, "jobs", method="POST", body=spec)
    assert code == 201 and data["attached"] is False
    job_id = data["job"]["id"]
    code, again = await _json(jp_fetch, "jobs", method="POST", body=spec)
    if again["job"]["state"] not in ("succeeded", "failed"):
        assert code == 200 and again["attached"] is True and again["job"]["id"] == job_id

    job = await _wait_job(jp_fetch, job_id, {"succeeded", "failed", "lost", "cancelled"})
    assert job["state"] == "succeeded", job["reason"]
    assert (server_workspace / "model.pkl").is_file()
    assert job["mlflow_run_id"]
    _, log = await _json(jp_fetch, "jobs", job_id, "log")
    assert "trained on 40 rows" in log["data"] and log["complete"] is True
    _, listed = await _json(jp_fetch, "jobs", state="succeeded")
    assert [j["id"] for j in listed["jobs"]] == [job_id]
    assert "lease" not in listed["jobs"][0]

    code, _ = await _json(jp_fetch, "jobs", job_id, method="DELETE")
    assert code == 204
    code, err = await _error(jp_fetch, "jobs", job_id)
    assert code == 404 and err["code"] == "not_found"


@pytest.fixture
def detectors_not_loaded() -> None:
    """The secret detectors as a fresh process has them: not loaded (asked for before the server)."""
    from jupyter_remote_compute.guards import screening

    screening._detectors.cache_clear()


async def test_the_server_loads_the_secret_detectors_at_start_not_on_the_first_submit(detectors_not_loaded, jp_fetch):
    from jupyter_remote_compute.guards import screening

    code, _ = await _json(jp_fetch, "machines")  # a request that screens nothing
    assert code == 200
    deadline = time.monotonic() + 60
    while screening._detectors.cache_info().currsize == 0:
        assert time.monotonic() < deadline, "the server did not load the detectors after it started"
        await asyncio.sleep(0.05)


async def test_cancel_through_the_api(jp_fetch):
    _, data = await _json(jp_fetch, "jobs", method="POST", body={"command": "echo go; sleep 120"})
    job_id = data["job"]["id"]
    assert data["job"]["user"] == getpass.getuser()  # who submitted: mlflow.user on its run
    await _wait_job(jp_fetch, job_id, {"running"})
    code, job = await _json(jp_fetch, "jobs", job_id, "cancel", method="POST", body={})
    assert code == 200
    job = await _wait_job(jp_fetch, job_id, {"cancelled"})
    # The person, not jupyter_server's random id for a visitor it cannot name: who runs this server.
    assert job["reason"] == f"cancelled by {getpass.getuser()}"
    code, err = await _error(jp_fetch, "jobs", job_id, "cancel", method="POST", body={})
    assert code == 409 and err["code"] == "conflict"


async def test_bad_settings_name_the_field(jp_fetch):
    code, err = await _error(jp_fetch, "jobs", method="POST", body={"command": "true", "send": ["../x"]})
    assert code == 400 and err["field"] == "send[0]"
    code, err = await _error(jp_fetch, "jobs", method="POST", body={"command": "true", "timeout": "soon"})
    assert code == 400 and err["field"] == "timeout"
    code, err = await _error(jp_fetch, "jobs", method="POST", body={"command": "true", "colour": "red"})
    assert code == 400 and err["field"] == "colour"
    code, err = await _error(jp_fetch, "machines", method="POST", body={"name": "x", "kind": "nope", "address": "h"})
    assert code == 400 and err["field"] == "kind"


class BoxEngine(LocalEngine):
    """A second kind for the test server: behaves like the built-in machine, but may be added to compute.yaml."""

    kind = "testbox"
    label = "Test box"


@pytest.fixture
def testbox_kind(monkeypatch):
    monkeypatch.setitem(engines._registry(), "testbox", BoxEngine)


async def test_machines_are_added_checked_and_removed(jp_fetch, server_workspace: Path, testbox_kind):
    _, data = await _json(jp_fetch, "machines")
    code, machine = await _json(
        jp_fetch,
        "machines",
        method="POST",
        body={"name": "box", "kind": "testbox", "address": "here", "version": data["version"]},
    )
    assert code == 201 and machine["created"].endswith("Z")
    text = (server_workspace / ".punica/compute.yaml").read_text()
    assert text.startswith("# Machines this workspace may train on.") and "box:" in text
    code, checked = await _json(jp_fetch, "machines", "box", "check", method="POST", body={})
    assert code == 200 and checked["facts"]["cpus"] >= 1
    code, machine = await _json(jp_fetch, "machines", "box", method="PATCH", body={"enabled": False})
    assert machine["enabled"] is False
    code, err = await _error(jp_fetch, "jobs", method="POST", body={"machine": "box", "command": "true"})
    assert code == 400 and err["field"] == "machine" and "disabled" in err["message"]
    code, _ = await _json(jp_fetch, "machines", "box", method="DELETE")
    assert code == 204
    code, err = await _error(jp_fetch, "machines", "box")
    assert code == 404


def _closed_port() -> int:
    """A loopback port the OS gave and nothing listens on now: a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _schema(name: str) -> dict:
    return yaml.safe_load((Path(jupyter_remote_compute.__file__).parent / "openapi.yaml").read_text())["components"][
        "schemas"
    ][name]


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
async def test_a_machine_that_cannot_be_reached_is_the_check_s_answer_not_an_error(jp_fetch, transport):
    port = _closed_port()
    _, data = await _json(jp_fetch, "machines")
    options = {"port": port, "user": "nobody", "ssh_transport": transport}
    body = {"name": "gone", "kind": "ssh", "address": "127.0.0.1", "options": options, "version": data["version"]}
    await _json(jp_fetch, "machines", method="POST", body=body)
    why = f"connection refused by 127.0.0.1:{port}: no SSH server listens on that port"
    if transport == "openssh":
        why += f" (ssh: connect to host 127.0.0.1 port {port}: Connection refused)"
    code, checked = await _json(jp_fetch, "machines", "gone", "check", method="POST", body={})
    assert code == 200 and checked == {"name": "gone", "ok": False, "reachable": False, "reason": why}
    jsonschema.validate(checked, _schema("CheckResult"))
    code, trusted = await _json(jp_fetch, "machines", "gone", "trust", method="POST", body={})
    assert code == 200 and trusted == {"name": "gone", "trusted": False, "reachable": False, "reason": why}
    jsonschema.validate(trusted, _schema("TrustResult"))


async def test_a_machine_that_answers_is_checked_reachable(jp_fetch, testbox_kind):
    _, data = await _json(jp_fetch, "machines")
    body = {"name": "box", "kind": "testbox", "address": "here", "version": data["version"]}
    await _json(jp_fetch, "machines", method="POST", body=body)
    code, checked = await _json(jp_fetch, "machines", "box", "check", method="POST", body={})
    assert code == 200 and checked["ok"] is True and checked["reachable"] is True and "reason" not in checked
    jsonschema.validate(checked, _schema("CheckResult"))


@pytest.mark.parametrize(
    ("kind", "address"),
    [
        ("ssh", "h\ud800st"),  # a lone surrogate (JSON may carry one: "\\ud800")
        ("ssh", "\udfffhost"),
        ("ssh", "lab\x01box"),
        ("ssh", "box\x7f"),
        ("agent", "lab-gpu-1\x1b[31m"),  # a terminal's colour code
        ("agent", "lab\x85gpu"),  # C1 control: a line break to some
        ("agent", "h\ud800st"),
    ],
)
async def test_an_address_with_control_characters_or_lone_surrogates_is_refused(
    jp_fetch, server_workspace: Path, address, kind
):
    _, data = await _json(jp_fetch, "machines")
    before = (server_workspace / ".punica/compute.yaml").read_bytes()
    body = {"name": "odd", "kind": kind, "address": address, "options": {}, "version": data["version"]}
    code, err = await _error(jp_fetch, "machines", method="POST", body=body)
    assert code == 400 and err["field"] == "address" and "control characters or lone surrogates" in err["message"]
    assert (server_workspace / ".punica/compute.yaml").read_bytes() == before


async def test_a_stale_machine_write_is_refused(jp_fetch, server_workspace: Path, testbox_kind):
    _, data = await _json(jp_fetch, "machines")
    compute = server_workspace / ".punica/compute.yaml"
    compute.write_text(compute.read_text() + "# a hand edit made meanwhile\n")
    body = {"name": "box", "kind": "testbox", "address": "here", "version": data["version"]}
    code, err = await _error(jp_fetch, "machines", method="POST", body=body)
    assert code == 409 and err["code"] == "conflict" and "changed on disk" in err["message"]
    assert compute.read_text().endswith("# a hand edit made meanwhile\n") and "box:" not in compute.read_text()


async def test_every_verb_needs_authentication(jp_fetch, jp_serverapp, jp_base_url, http_server_client):
    for path, method in [("machines", "GET"), ("jobs", "GET"), ("jobs", "POST")]:
        with pytest.raises(HTTPClientError) as info:
            await http_server_client.fetch(
                f"{jp_base_url}remote-compute/{path}", method=method, body=b"{}" if method == "POST" else None
            )
        assert info.value.code == 403
        error = json.loads(info.value.response.body)
        assert error["code"] == "forbidden" and isinstance(error["message"], str)


async def test_state_changes_are_emitted_as_events(jp_fetch, jp_serverapp):
    seen: list[dict] = []

    async def listener(logger, schema_id, data):
        seen.append(data)

    schema_id = "https://events.jupyter.org/jupyter_remote_compute/job"
    jp_serverapp.event_logger.add_listener(schema_id=schema_id, listener=listener)
    _, data = await _json(jp_fetch, "jobs", method="POST", body={"command": "echo hello"})
    job_id = data["job"]["id"]
    await _wait_job(jp_fetch, job_id, {"succeeded"})
    deadline = time.monotonic() + 10
    while not any(e["id"] == job_id and e["state"] == "succeeded" for e in seen):
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.05)
    states = [e["state"] for e in seen if e["id"] == job_id]
    assert states[0] == "queued" and "running" in states


async def test_steps_lists_the_training_step_with_enabled_machines(jp_fetch, testbox_kind):
    await _json(jp_fetch, "machines", method="POST", body={"name": "on", "kind": "testbox", "address": "a"})
    await _json(
        jp_fetch, "machines", method="POST", body={"name": "off", "kind": "testbox", "address": "b", "enabled": False}
    )
    _, data = await _json(jp_fetch, "steps")
    step = next(s for s in data["steps"] if s["id"] == "train-on-remote-machine")
    assert step["label"] == "Train on a Remote Machine"
    assert step["settings"]["properties"]["machine"]["enum"] == ["local", "on"]


async def test_errors_outside_the_domain_are_the_documented_error_json(jp_fetch):
    # An unknown route under the prefix, a verb a route does not serve, and a log offset past any file.
    code, err = await _error(jp_fetch, "no-such-route")
    assert (code, err["code"]) == (404, "not_found") and set(err) == {"code", "message"}
    code, err = await _error(jp_fetch, "jobs", "x", "log", method="POST", body={})
    assert (code, err["code"]) == (405, "method_not_allowed") and set(err) == {"code", "message"}
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("remote-compute", "machines", "box", method="PUT", body="{}")
    assert info.value.code == 405 and info.value.response.headers["Allow"] == "GET, DELETE, PATCH"
    assert json.loads(info.value.response.body)["code"] == "method_not_allowed"


async def test_a_log_offset_or_limit_out_of_range_names_the_field(jp_fetch):
    _, data = await _json(jp_fetch, "jobs", method="POST", body={"command": "echo hi"})
    job_id = data["job"]["id"]
    for params, field in [
        ({"offset": "1859993907911488"}, "offset"),
        ({"offset": "-1"}, "offset"),
        ({"offset": "1e3"}, "offset"),
        ({"limit": "0"}, "limit"),
        ({"limit": str(5 << 20)}, "limit"),
    ]:
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("remote-compute", "jobs", job_id, "log", params=params)
        err = json.loads(info.value.response.body)
        assert (info.value.code, err["code"], err["field"]) == (400, "invalid", field), params
    code, chunk = await _json(jp_fetch, "jobs", job_id, "log", offset="0", limit="10")
    assert code == 200 and chunk["offset"] == 0


def test_the_job_event_schema_admits_every_lifecycle_state() -> None:
    # A state the schema lacks makes jupyter_events refuse the event, and the server's poller fail.
    from importlib.resources import files

    import yaml

    from jupyter_remote_compute.jobs.transitions import ACTIVE_STATES, TERMINAL_STATES

    schema = yaml.safe_load(files("jupyter_remote_compute").joinpath("events/job.yaml").read_text())
    assert set(schema["properties"]["state"]["enum"]) == ACTIVE_STATES | TERMINAL_STATES


async def test_a_pool_is_made_listed_named_by_a_job_and_removed(jp_fetch):
    code, pool = await _json(jp_fetch, "pools", "here", method="PUT", body={"machines": ["local"]})
    assert code == 200 and pool == {"name": "here", "machines": ["local"], "placement": "first"}
    _, listed = await _json(jp_fetch, "pools")
    assert listed["pools"] == [pool] and listed["version"]
    for name, body, status, field in (
        ("bad", {"machines": ["local", "nowhere"]}, 400, "machines[1]"),
        ("bad", {"machines": []}, 400, "machines"),
        ("bad", {"machines": ["local"], "placement": "random"}, 400, "placement"),
        ("local", {"machines": ["local"]}, 409, "name"),
    ):
        code, err = await _error(jp_fetch, "pools", name, method="PUT", body=body)
        assert (code, err["field"]) == (status, field), err
        assert err["message"].startswith(field + ":") or status == 409, err

    _, submitted = await _json(jp_fetch, "jobs", method="POST", body={"machine": "here", "command": "echo pooled"})
    job = submitted["job"]
    assert (job["pool"], job["machine"], job["placement"]) == ("here", "local", "placed on local: first with room")
    done = await _wait_job(jp_fetch, job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done["reason"]
    code, _ = await _json(jp_fetch, "pools", "here", method="DELETE")
    assert code == 204
    code, err = await _error(jp_fetch, "pools", "here", method="DELETE")
    assert code == 404 and err["code"] == "not_found"
