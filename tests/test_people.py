"""People are named as a person reads them on every face, never by jupyter_server's random hex id for a
visitor it cannot name: the REST API by Jupyter's identity of the visitor, the CLI by the hub's user name
or the OS user."""

from __future__ import annotations

import asyncio
import getpass
import json
import time
from pathlib import Path

import pytest
from conftest import job_runs
from jupyter_server.auth import IdentityProvider, User
from waiting import wait_for


async def _json(jp_fetch, *path, method="GET", body=None):
    kwargs = {"method": method}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    response = await jp_fetch("remote-compute", *path, **kwargs)
    return json.loads(response.body) if response.body else None


async def _until(fetch, done, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value}"
        await asyncio.sleep(0.1)


def _one_step(folder: Path, step: str, command: str) -> None:
    """``<step>.rcpipeline``: one node, ``step``, whose job runs ``command``."""
    node = {
        "id": step,
        "step": "train-on-remote-machine",
        "position": {"x": 0, "y": 0},
        "settings": {"command": command},
    }
    (folder / f"{step}.rcpipeline").write_text(json.dumps({"version": 1, "nodes": [node], "edges": []}))


class NamedIdentity(IdentityProvider):
    """An identity provider that knows who the visitor is, as a hub's or an OAuth login's does: a
    username, and the display name its profile gives."""

    def get_user(self, handler):  # type: ignore[no-untyped-def]
        user = super().get_user(handler)
        if asyncio.iscoroutine(user):
            return self._named(user)
        return None if user is None else User("ada", name="Ada", display_name="Ada Lovelace")

    async def _named(self, user):  # type: ignore[no-untyped-def]
        return None if await user is None else User("ada", name="Ada", display_name="Ada Lovelace")


async def test_an_anonymous_visitor_cancelling_a_pipeline_run_is_whoever_runs_the_server(
    jp_fetch, server_workspace: Path
):
    """JupyterLab alone (a token): jupyter_server names each browser with a uuid4's hex; the run, its
    step's job and the panel's detail say the person instead."""
    _one_step(server_workspace, "wait", "echo up; sleep 120")
    run = (await _json(jp_fetch, "pipelines", "runs", method="POST", body={"file": "wait.rcpipeline"}))["run"]
    assert run["user"] == getpass.getuser()

    async def step_job():
        job_id = (await _json(jp_fetch, "pipelines", "runs", run["id"]))["nodes"]["wait"]["job_id"]
        return await _json(jp_fetch, "jobs", job_id) if job_id else None

    await _until(step_job, lambda job: job is not None and job["state"] == "running", "the step's job to run")
    await _json(jp_fetch, "pipelines", "runs", run["id"], "cancel", method="POST", body={})
    ended = await _until(
        lambda: _json(jp_fetch, "pipelines", "runs", run["id"]), lambda r: r["state"] != "running", "the run to end"
    )
    job = await _until(step_job, lambda j: j["state"] == "cancelled", "the step's job to end")
    me = getpass.getuser()
    assert ended["state"] == "cancelled" and ended["reason"] == f"cancelled by {me}", ended
    assert job["reason"] == f"cancelled by {me}", job["reason"]
    assert job["user"] == me


class TestAVisitorJupyterNames:
    """A server whose identity provider names its visitors, as a hub's or an OAuth login's does."""

    @pytest.fixture
    def jp_server_config(self, jp_server_config: dict) -> dict:
        app = {**jp_server_config["ServerApp"], "identity_provider_class": NamedIdentity}
        return {**jp_server_config, "ServerApp": app}

    async def test_submits_as_their_login_and_cancels_by_their_display_name(self, jp_fetch, tracking_uri: str):
        submitted = (await _json(jp_fetch, "jobs", method="POST", body={"command": "echo up; sleep 120"}))["job"]
        assert submitted["user"] == "ada"  # the login: usage per user and MLflow's Created by
        await _until(
            lambda: _json(jp_fetch, "jobs", submitted["id"]), lambda j: j["state"] == "running", "the job to run"
        )
        await _json(jp_fetch, "jobs", submitted["id"], "cancel", method="POST", body={})
        job = await _until(
            lambda: _json(jp_fetch, "jobs", submitted["id"]), lambda j: j["state"] == "cancelled", "the job to end"
        )
        assert job["reason"] == "cancelled by Ada Lovelace"
        [run] = wait_for(lambda: job_runs(tracking_uri, job["id"]) or None, timeout=120, message="the job's MLflow run")
        assert run.data.tags["mlflow.user"] == "ada"

    async def test_a_pipeline_run_they_start_is_theirs_its_jobs_and_its_mlflow_parent_run_too(
        self, jp_fetch, server_workspace: Path, tracking_uri: str
    ):
        """The panel and the canvas start a run through the REST API: the run, its step's job and MLflow's
        Created by of its parent run name the visitor's login, not whoever runs the server."""
        _one_step(server_workspace, "hello", "echo hello")
        run = (await _json(jp_fetch, "pipelines", "runs", method="POST", body={"file": "hello.rcpipeline"}))["run"]
        assert run["user"] == "ada"
        ended = await _until(
            lambda: _json(jp_fetch, "pipelines", "runs", run["id"]), lambda r: r["state"] != "running", "the run to end"
        )
        assert ended["state"] == "succeeded" and ended["user"] == "ada", ended
        job = await _json(jp_fetch, "jobs", ended["nodes"]["hello"]["job_id"])
        assert job["user"] == "ada"
        listed = (await _json(jp_fetch, "pipelines", "runs"))["runs"]
        assert [r["user"] for r in listed if r["id"] == run["id"]] == ["ada"]
        parent = wait_for(
            lambda: _parent_run(tracking_uri, run["id"]),
            timeout=120,
            message="the pipeline's MLflow parent run",
        )
        assert parent.data.tags["mlflow.user"] == "ada" and parent.info.user_id == "ada"


def _parent_run(tracking_uri: str, pipeline_run_id: str):  # type: ignore[no-untyped-def]
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    found = client.search_runs(
        experiments, filter_string=f"tags.`remote_compute.pipeline_run_id` = '{pipeline_run_id}'"
    )
    return found[0] if found else None
