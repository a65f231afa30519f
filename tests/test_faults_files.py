"""A truncated or garbage state file, compute.yaml or policy.yaml: the REST API (which the panel
shows) and the CLI both name the file and the line; the file is moved aside (state) or left as it
was (compute.yaml, policy.yaml), and is never overwritten.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

TRUNCATED_STATE = b'{"schema": 1,\n "jobs": {\n  "20261130-000000-abcdef": {"id": "20261130-000000-ab'
GARBAGE_STATE = b"<<<<<<< HEAD\nnot json at all\n"
BROKEN_COMPUTE = b"machines:\n  box:\n    kind: ssh\n    address: [127.0.0.1\n    user: me\n"
GOOD_COMPUTE = b"machines:\n  box:\n    kind: ssh\n    address: 127.0.0.1\n    user: nobody\n"
BROKEN_POLICY = b"rules:\n  - deny egress: remote\n  - allow egress: [oops\n"


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(root.parent / "scratch")}
    return subprocess.run(
        [sys.executable, "-m", "jupyter_remote_compute.cli", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


async def _error(jp_fetch, *path: str, **kw) -> dict:  # type: ignore[no-untyped-def]
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(*path, **kw)
    return {"status": info.value.code, **json.loads(info.value.response.body)}


def _aside(root: Path) -> list[Path]:
    return sorted((root / ".punica").glob("jobs.json.unreadable-*"))


async def test_a_broken_state_file_is_moved_aside_whole_and_reported_with_its_line(jp_fetch, server_workspace: Path):
    root = server_workspace
    state = root / ".punica/jobs.json"
    state.write_bytes(TRUNCATED_STATE)
    # The server's poller or this request finds it broken: either way it is moved aside, not rewritten.
    answer = json.loads((await jp_fetch("remote-compute", "jobs")).body)
    assert answer["jobs"] == []
    (reported,) = answer["set_aside"]
    assert reported["path"] == str(_aside(root)[0]) and reported["problem"].startswith("line 3, column ")
    assert "jobs.json" in reported["message"] and "line 3" in reported["message"]
    assert _aside(root)[0].read_bytes() == TRUNCATED_STATE  # kept, byte for byte

    # The CLI says the same, and a second broken file within the same second is kept too, not written over.
    state.write_bytes(GARBAGE_STATE)
    listed = _cli(root, "jobs", "list")
    assert listed.returncode == 0, listed.stderr
    assert len(_aside(root)) == 2, _aside(root)
    assert sorted(p.read_bytes() for p in _aside(root)) == sorted([TRUNCATED_STATE, GARBAGE_STATE])
    warnings = [line for line in listed.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and all(".punica/jobs.json" in w for w in warnings), listed.stderr
    assert any("line 3, column" in w for w in warnings) and any("line 1, column 1" in w for w in warnings)

    # Work goes on with a fresh state file.
    submitted = _cli(root, "run", "--detach", "--", "true")
    assert submitted.returncode == 0, submitted.stderr
    assert len(json.loads(state.read_bytes())["jobs"]) == 1


async def test_a_broken_compute_yaml_is_reported_with_its_line_and_left_as_it_was(jp_fetch, server_workspace: Path):
    compute = server_workspace / ".punica/compute.yaml"
    compute.write_bytes(BROKEN_COMPUTE)
    listed = await _error(jp_fetch, "remote-compute", "machines")
    assert listed["status"] == 422 and listed["code"] == "config_file"
    assert "compute.yaml, line 5" in listed["message"], listed["message"]
    body = json.dumps({"name": "other", "kind": "ssh", "address": "10.0.0.1"})
    added = await _error(jp_fetch, "remote-compute", "machines", method="POST", body=body)
    assert added["status"] == 422 and "compute.yaml, line 5" in added["message"]
    spec = json.dumps({"machine": "box", "command": "true"})
    submitted = await _error(jp_fetch, "remote-compute", "jobs", method="POST", body=spec)
    assert submitted["status"] == 422 and "compute.yaml, line 5" in submitted["message"]

    for args in (("machines", "list"), ("machines", "add", "x", "--kind", "ssh", "--address", "10.0.0.2")):
        done = _cli(server_workspace, *args)
        assert done.returncode == 1 and "compute.yaml, line 5" in done.stderr, done.stderr
    assert compute.read_bytes() == BROKEN_COMPUTE  # never rewritten, not even "fixed"
    assert not list(compute.parent.glob("compute.yaml.*[!k]"))  # no stray copies (the lock file aside)


async def test_a_broken_policy_stops_remote_jobs_naming_its_line_and_is_left_as_it_was(
    jp_fetch, server_workspace: Path
):
    punica = server_workspace / ".punica"
    (punica / "compute.yaml").write_bytes(GOOD_COMPUTE)
    policy = punica / "policy.yaml"
    policy.write_bytes(BROKEN_POLICY)
    spec = json.dumps({"machine": "box", "command": "true"})
    refused = await _error(jp_fetch, "remote-compute", "jobs", method="POST", body=spec)
    assert refused["status"] == 422 and refused["code"] == "config_file"
    assert ".punica/policy.yaml:3" in refused["message"] or ".punica/policy.yaml:4" in refused["message"], refused
    done = _cli(server_workspace, "run", "--machine", "box", "--detach", "--", "true")
    assert done.returncode == 1 and ".punica/policy.yaml:" in done.stderr, done.stderr
    assert policy.read_bytes() == BROKEN_POLICY
    assert not (punica / "jobs.json").exists() or json.loads((punica / "jobs.json").read_bytes())["jobs"] == {}
