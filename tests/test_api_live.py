"""Live metrics and the long-polled log through the REST API of a real jupyter_server.

The job logs to MLflow on its machine and then waits on a file this test creates, so what the API
answers before that file exists was read while the job ran.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import yaml
from test_api import _json, _wait_job
from test_live_metrics import TRAIN
from tornado.httpclient import HTTPClientError

import jupyter_remote_compute

SPEC = yaml.safe_load((Path(jupyter_remote_compute.__file__).parent / "openapi.yaml").read_text())


def _loss(page: dict) -> list[tuple[int, float]]:
    return [(p["step"], p["value"]) for m in page["metrics"] if m["key"] == "loss" for p in m["points"]]


def _check_shape(page: dict) -> None:
    schema = SPEC["paths"]["/remote-compute/jobs/{job_id}/metrics"]["get"]["responses"]["200"]
    properties = schema["content"]["application/json"]["schema"]["properties"]
    assert set(page) == set(properties)
    for series in page["metrics"]:
        assert set(series) == {"run", "key", "points"}
        assert all(set(p) == {"step", "value", "timestamp"} for p in series["points"])


async def test_metrics_and_log_reach_the_api_while_the_job_runs(jp_fetch, server_workspace, scratch_dir):
    (server_workspace / "train.py").write_text(TRAIN)
    _, data = await _json(jp_fetch, "jobs", method="POST", body={"command": "python train.py", "send": ["train.py"]})
    job_id = data["job"]["id"]

    # Long-polled: each answer comes when new points exist (or after wait), never on a timer of ours.
    points: list[tuple[int, float]] = []
    cursor = ""
    deadline = time.monotonic() + 180
    while len(points) < 3:
        assert time.monotonic() < deadline, f"no metrics yet: {points}"
        _, page = await _json(jp_fetch, "jobs", job_id, "metrics", wait="25", **({"since": cursor} if cursor else {}))
        _check_shape(page)
        points += _loss(page)
        cursor = page["cursor"]
    _, job = await _json(jp_fetch, "jobs", job_id)
    assert job["state"] == "running" and page["watching"] and not page["complete"]
    assert points == [(0, 1.0), (1, 0.5), (2, 1 / 3)]

    # The log so far, then a long-polled read past its end, held until the job writes more.
    text, offset = "", 0
    while "logged" not in text:
        _, log = await _json(jp_fetch, "jobs", job_id, "log", offset=str(offset), wait="25")
        text, offset = text + log["data"], log["next_offset"]
    asked = time.monotonic()
    held = asyncio.ensure_future(_json(jp_fetch, "jobs", job_id, "log", offset=str(offset), wait="30"))
    # The IOLoop stays free while the read is held: another request is answered meanwhile.
    code, _ = await _json(jp_fetch, "machines")
    assert code == 200 and not held.done()
    (scratch_dir / job_id / "work" / "go").write_text("")
    _, more = await held
    assert "trained" in more["data"] or more["complete"]
    # Answered because the log grew, not because its 30 s hold ran out (the most a read may be held).
    assert time.monotonic() - asked < 29, "the held read did not answer when the log grew"

    # The point logged last comes after the cursor, and only it.
    _, last = await _json(jp_fetch, "jobs", job_id, "metrics", since=cursor, wait="25")
    assert _loss(last) == [(3, 0.125)]
    await _wait_job(jp_fetch, job_id, {"succeeded"})
    _, ended = await _json(jp_fetch, "jobs", job_id, "metrics", since=last["cursor"], wait="25")
    assert ended["complete"] and not ended["watching"] and ended["metrics"] == []


async def test_metrics_refuse_a_bad_cursor_and_an_unknown_job(jp_fetch):
    _, data = await _json(jp_fetch, "jobs", method="POST", body={"command": "true"})
    job_id = data["job"]["id"]
    for path, params, status, field in (
        (("jobs", job_id, "metrics"), {"since": "nonsense"}, 400, "since"),
        (("jobs", job_id, "metrics"), {"wait": "31"}, 400, "wait"),
        (("jobs", job_id, "log"), {"wait": "-1"}, 400, "wait"),
        (("jobs", "nosuchjob", "metrics"), {}, 404, None),
    ):
        with pytest.raises(HTTPClientError) as info:
            await _json(jp_fetch, *path, **params)
        err = json.loads(info.value.response.body)
        assert info.value.code == status and err.get("field") == field, (path, params, err)
