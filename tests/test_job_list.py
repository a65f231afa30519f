"""The paged job list: a real server over a real state file, with jobs written as other processes would."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_remote_compute.jobs.job import Job
from jupyter_remote_compute.jobs.listing import JobQuery, decode_cursor, list_page
from jupyter_remote_compute.jobs.store import JobStore


def _job(i: int, *, created: str, state: str = "succeeded", machine: str = "local", name: str = "") -> Job:
    return Job(
        id=f"20250101-000000-{i:06d}",
        key=f"{i:032x}",
        machine=machine,
        kind="local",
        spec={"machine": machine, "command": f"python train.py --seed {i}", "name": name or f"run {i}"},
        state=state,
        reason=f"exit code 1\nTraceback of run {i}" if state == "failed" else None,
        created=created,
        exit_code=1 if state == "failed" else 0,
        mlflow_run_id=f"run{i}",
    )


def _seed(state_file: Path, jobs: list[Job]) -> None:
    """Write jobs through a store of its own, as the CLI or a kernel would."""
    with JobStore(state_file).transaction() as stored:
        for job in jobs:
            stored[job.id] = job


def _stamp(second: int) -> str:
    return f"2025-01-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.000Z"


async def _get(jp_fetch, headers=None, **params):
    response = await jp_fetch(
        "remote-compute", "jobs", params={k: str(v) for k, v in params.items()}, headers=headers, raise_error=False
    )
    return response.code, (json.loads(response.body) if response.body else None), response.headers


async def _error(jp_fetch, **params) -> dict:
    code, body, _ = await _get(jp_fetch, **params)
    assert code == 400, body
    return body


@pytest.fixture
def state_file(server_workspace: Path) -> Path:
    return server_workspace / ".punica" / "jobs.json"


async def test_cursors_cover_every_job_once_while_jobs_are_submitted(jp_fetch, state_file: Path):
    # Pairs share a creation time, so the order's tie-break (the id) is exercised too.
    seeded = [_job(i, created=_stamp(i // 2)) for i in range(250)]
    _seed(state_file, seeded)

    seen: list[dict] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 60} | ({"cursor": cursor} if cursor else {})
        code, page, _ = await _get(jp_fetch, **params)
        assert code == 200
        seen += page["jobs"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        # New work arrives between pages: one through this server, one from another process.
        response = await jp_fetch(
            "remote-compute", "jobs", method="POST", body=json.dumps({"command": "true", "new": True})
        )
        assert response.code == 201
        _seed(state_file, [_job(1000 + pages, created="2030-01-01T00:00:00.000Z")])

    assert pages == 5
    ids = [j["id"] for j in seen]
    assert len(ids) == len(set(ids)) == 250
    assert set(ids) == {j.id for j in seeded}
    keys = [(j["created"], j["id"]) for j in seen]
    assert keys == sorted(keys, reverse=True)

    # A fresh first page shows the eight newcomers first.
    _, first, _ = await _get(jp_fetch, limit=10)
    assert first["jobs"][0]["created"] == "2030-01-01T00:00:00.000Z"
    assert [j["id"] in set(ids) for j in first["jobs"]] == [False] * 8 + [True] * 2


async def test_items_are_summaries_and_the_whole_job_stays_at_its_url(jp_fetch, state_file: Path):
    _seed(state_file, [_job(1, created=_stamp(1), state="failed")])
    _, page, _ = await _get(jp_fetch)
    [item] = page["jobs"]
    assert item == {
        "id": "20250101-000000-000001",
        "name": "run 1",
        "machine": "local",
        "kind": "local",
        "state": "failed",
        "reason": "exit code 1",
        "created": _stamp(1),
        "updated": item["updated"],
        "started": None,
        "ended": None,
        "exit_code": 1,
        "mlflow_run_id": "run1",
    }
    assert page["next_cursor"] is None
    response = await jp_fetch("remote-compute", "jobs", item["id"])
    whole = json.loads(response.body)
    assert whole["reason"] == "exit code 1\nTraceback of run 1" and whole["spec"]["command"]


async def test_filters_by_machine_state_name_and_time(jp_fetch, state_file: Path):
    jobs = [
        _job(i, created=_stamp(i), state=("running", "failed", "succeeded")[i % 3], machine=("local", "gpu")[i % 2])
        for i in range(60)
    ]
    jobs.append(_job(100, created=_stamp(100), name="Sweep LR=0.1"))
    _seed(state_file, jobs)

    async def ids(**params) -> list[str]:
        out, cursor = [], None
        while True:
            code, page, _ = await _get(jp_fetch, limit=7, **params, **({"cursor": cursor} if cursor else {}))
            assert code == 200, page
            out += [j["id"] for j in page["jobs"]]
            if not (cursor := page["next_cursor"]):
                return out

    def expect(pred) -> list[str]:
        return [j.id for j in sorted(jobs, key=lambda j: (j.created, j.id), reverse=True) if pred(j)]

    assert await ids(state="running") == expect(lambda j: j.state == "running")
    assert await ids(state="failed,succeeded", machine="gpu") == expect(
        lambda j: j.state in ("failed", "succeeded") and j.machine == "gpu"
    )
    assert await ids(name="sweep lr") == ["20250101-000000-000100"]
    assert await ids(name="run 1") == expect(lambda j: "run 1" in j.name)
    assert await ids(since=_stamp(10), until="2025-01-01T00:00:19Z") == expect(
        lambda j: _stamp(10) <= j.created <= _stamp(19)
    )
    # A time with an offset means the same instant in UTC.
    assert await ids(since="2025-01-01T01:00:50+01:00") == expect(lambda j: j.created >= _stamp(50))
    assert await ids(machine="nowhere") == []


async def test_bad_queries_name_their_field(jp_fetch, state_file: Path):
    for value in ("0", "1001", "ten", "-5"):
        assert (await _error(jp_fetch, limit=value))["field"] == "limit"
    err = await _error(jp_fetch, state="running,finished")
    assert err["field"] == "state" and "'finished'" in err["message"] and "succeeded" in err["message"]
    assert (await _error(jp_fetch, cursor="not-a-cursor"))["field"] == "cursor"
    assert (await _error(jp_fetch, cursor="W10"))["field"] == "cursor"  # valid base64 JSON, wrong shape
    assert (await _error(jp_fetch, since="yesterday"))["field"] == "since"
    assert (await _error(jp_fetch, until="2025-13-01"))["field"] == "until"
    code, page, _ = await _get(jp_fetch, limit=1000)
    assert code == 200 and page["jobs"] == []


async def test_an_unchanged_page_costs_a_304(jp_fetch, state_file: Path):
    _seed(state_file, [_job(i, created=_stamp(i)) for i in range(5)])
    code, page, headers = await _get(jp_fetch, limit=3)
    etag = headers["ETag"]
    assert code == 200 and etag and len(page["jobs"]) == 3
    code, body, again = await _get(jp_fetch, headers={"If-None-Match": etag}, limit=3)
    assert code == 304 and body is None and again["ETag"] == etag
    # Another query is another page.
    code, _, other = await _get(jp_fetch, headers={"If-None-Match": etag}, limit=2)
    assert code == 200 and other["ETag"] != etag
    # A change to a listed job changes the page.
    store = JobStore(state_file)
    with store.transaction() as jobs:
        jobs["20250101-000000-000004"] = dataclasses.replace(jobs["20250101-000000-000004"], state="lost")
    code, changed, headers = await _get(jp_fetch, headers={"If-None-Match": etag}, limit=3)
    assert code == 200 and changed["jobs"][0]["state"] == "lost" and headers["ETag"] != etag


def test_the_index_follows_this_process_s_own_changes(workspace: Path):
    """Patched commit by commit, the index lists what a fresh read of the file lists."""
    path = workspace / ".punica" / "jobs.json"
    store = JobStore(path)
    everything = JobQuery.parse(limit=1000)
    active = JobQuery.parse(limit=3, state="queued,running")
    _seed(path, [_job(i, created=_stamp(i % 40), state=("running", "succeeded")[i % 2]) for i in range(80)])
    assert len(list_page(store, everything).jobs) == 80
    for step in range(30):
        with store.transaction() as jobs:
            if step % 3 == 0:
                jobs.pop(f"20250101-000000-{step:06d}")
            elif step % 3 == 1:
                jobs[f"20250101-000000-{step:06d}"] = dataclasses.replace(
                    jobs[f"20250101-000000-{step:06d}"], state=("lost", "running")[step % 2]
                )
            else:
                new = _job(500 + step, created=_stamp(step), state=("queued", "failed")[step % 2])
                jobs[new.id] = new
        for query in (everything, active):
            # Every page of the filtered list too, cursor after cursor.
            patched, fresh, cursor = [], [], None
            other = JobStore(path)
            while True:
                page = list_page(store, dataclasses.replace(query, cursor=cursor))
                patched += [(j.id, j.state) for j in page.jobs]
                fresh += [(j.id, j.state) for j in list_page(other, dataclasses.replace(query, cursor=cursor)).jobs]
                if page.next_cursor is None:
                    break
                cursor = decode_cursor(page.next_cursor)
            assert patched == fresh
    assert len(fresh) == len([j for j in JobStore(path).jobs().values() if j.state in ("queued", "running")])
    assert len(list_page(store, everything).jobs) == 80 - 10 + 10
    assert store.snapshot().delta is not None  # the last page came from patching, not a rebuild


def test_query_parsing_rejects_what_the_api_rejects() -> None:
    from jupyter_remote_compute.errors import InvalidSettings

    assert JobQuery.parse().limit == 100
    assert JobQuery.parse(state=["failed", "lost"]).states == {"failed", "lost"}
    with pytest.raises(InvalidSettings) as info:
        JobQuery.parse(state="done")
    assert info.value.field == "state"


async def test_listing_needs_authentication(jp_base_url, http_server_client):
    with pytest.raises(HTTPClientError) as info:
        await http_server_client.fetch(f"{jp_base_url}remote-compute/jobs?limit=5")
    assert info.value.code == 403


def _cli(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_remote_compute.cli", "jobs", "list", *args],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_shows_the_newest_50_and_json_streams_every_page(workspace: Path):
    seeded = [_job(i, created=_stamp(i), state=("failed", "succeeded")[i % 2]) for i in range(1234)]
    _seed(workspace / ".punica" / "jobs.json", seeded)
    newest_first = [j.id for j in reversed(seeded)]

    table = _cli(workspace)
    rows = table.stdout.splitlines()
    assert rows[0].split()[:3] == ["ID", "MACHINE", "STATE"]
    assert [r.split()[0] for r in rows[1:]] == newest_first[:50]
    assert "--all" in table.stderr
    # Job 1232 failed: its row shows the reason's first line only.
    assert rows[2].split()[0].endswith("001232") and rows[2].endswith("exit code 1")
    assert "Traceback" not in table.stdout

    everything = json.loads(_cli(workspace, "--json").stdout)  # more than one page of 1,000
    assert [j["id"] for j in everything] == newest_first
    assert set(everything[0]) >= {"id", "name", "state", "reason", "exit_code", "mlflow_run_id"}

    failed = json.loads(_cli(workspace, "--json", "--state", "failed", "--limit", "3").stdout)
    assert [j["id"] for j in failed] == [i for i in newest_first if int(i[-6:]) % 2 == 0][:3]
    named = _cli(workspace, "--all", "--name", "RUN 123")  # run 123, 1230-1233
    assert len(named.stdout.splitlines()) == 1 + 5 and not named.stderr


def test_remote_jobs_magic_lists_the_newest_50(workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_remote_compute.magics import load_ipython_extension

    _seed(workspace / ".punica" / "jobs.json", [_job(i, created=_stamp(i)) for i in range(70)])
    monkeypatch.chdir(workspace)
    shell = InteractiveShell.instance()
    load_ipython_extension(shell)
    table = shell.run_line_magic("remote_jobs", "")
    assert len(table) == 50 and table.jobs[0].id.endswith("000069")
    assert "--all" in capsys.readouterr().err
    assert len(shell.run_line_magic("remote_jobs", "--all")) == 70
    assert [j.id[-2:] for j in shell.run_line_magic("remote_jobs", "--until 2025-01-01T00:00:01Z")] == ["01", "00"]
