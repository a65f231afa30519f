"""The usage record: every attempt metered once, summed right, readable as JSON and CSV, kept across restarts."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from server_process import Server
from waiting import wait_for

from jupyter_remote_compute.cli import main as run_cli
from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.job import Job, parse_time
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.machines.facts import remember_facts
from jupyter_remote_compute.usage.ledger import (
    ORG_GROUP_KEYS,
    Attempt,
    UsageRecord,
    job_metrics,
    parse_group_by,
    summarize,
)

GATE = "while [ ! -f go ]; do sleep 0.05; done"


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def _attempt(job: str, machine: str, queued: str, started: str | None, ended: str, state: str, **kw) -> Attempt:
    return Attempt(
        job=job,
        attempt=kw.pop("attempt", 1),
        name=job,
        machine=machine,
        kind="ssh",
        user=kw.pop("user", "ada"),
        queued=_epoch(queued),
        started=_epoch(started) if started else None,
        ended=_epoch(ended),
        state=state,
        gpus=kw.pop("gpus", 0),
        source=kw.pop("source", "engine"),
        **kw,
    )


KNOWN = [
    # gpu-box, October: 2 h on 4 GPUs after 30 min queued (priced), a cancelled hour on 4 GPUs of 2 nodes.
    _attempt("a", "gpu-box", "2026-10-01T09:30", "2026-10-01T10:00", "2026-10-01T12:00", "succeeded", gpus=4,
             price_per_hour=3.0, bytes_sent=1000, bytes_fetched=50),
    _attempt("b", "gpu-box", "2026-10-02T10:00", "2026-10-02T10:00", "2026-10-02T11:00", "cancelled", gpus=4,
             price_per_hour=3.0, nodes=2),
    # gpu-box, November: a lost attempt (its end estimated) of 90 min, then a failed one of 15 min.
    _attempt("c", "gpu-box", "2026-11-03T08:00", "2026-11-03T08:00", "2026-11-03T09:30", "lost", gpus=4,
             price_per_hour=3.0, source="estimated"),
    _attempt("d", "gpu-box", "2026-11-04T08:00", "2026-11-04T08:10", "2026-11-04T08:25", "failed", gpus=4,
             price_per_hour=3.0, user="bo"),
    # A machine without a price: no cost, a requeued attempt then its second attempt.
    _attempt("e", "cpu-box", "2026-11-05T00:00", "2026-11-05T01:00", "2026-11-05T03:00", "requeued"),
    _attempt("e", "cpu-box", "2026-11-05T03:00", "2026-11-05T04:00", "2026-11-05T05:00", "succeeded", attempt=2),
    # Never started: queued for 20 min, then cancelled.
    _attempt("f", "cpu-box", "2026-11-06T00:00", None, "2026-11-06T00:20", "cancelled"),
]  # fmt: skip


def _rows(summary: dict) -> dict[tuple, dict]:
    return {tuple(r[k] for k in summary["group_by"]): r for r in summary["rows"]}


def test_sums_per_machine_and_month_match_the_known_times() -> None:
    summary = summarize(KNOWN, ["machine", "month"])
    rows = _rows(summary)
    assert set(rows) == {("gpu-box", "2026-10"), ("gpu-box", "2026-11"), ("cpu-box", "2026-11")}

    october = rows["gpu-box", "2026-10"]
    assert october["job_hours"] == pytest.approx(3.0)
    assert october["node_hours"] == pytest.approx(4.0)  # 2 h on one node, 1 h on two
    assert october["gpu_hours"] == pytest.approx(12.0)
    assert october["queue_hours"] == pytest.approx(0.5)
    assert october["cost_estimate"] == pytest.approx(9.0)
    assert (october["bytes_sent"], october["bytes_fetched"]) == (1000, 50)

    november = rows["gpu-box", "2026-11"]
    assert november["job_hours"] == pytest.approx(1.75)
    assert november["gpu_hours"] == pytest.approx(7.0)
    assert november["queue_hours"] == pytest.approx(10 / 60, abs=1e-5)
    assert november["estimated_attempts"] == 1
    assert november["cost_estimate"] == pytest.approx(5.25)

    cpu = rows["cpu-box", "2026-11"]
    assert (cpu["attempts"], cpu["jobs"]) == (3, 2)
    assert cpu["job_hours"] == cpu["node_hours"] == pytest.approx(3.0)
    assert cpu["gpu_hours"] == 0
    assert cpu["queue_hours"] == pytest.approx(1 + 1 + 1 / 3, abs=1e-5)
    assert cpu["cost_estimate"] is None


def test_a_requeued_jobs_run_carries_both_attempts() -> None:
    metrics = job_metrics([a for a in KNOWN if a.job == "e"], now=0)
    assert metrics["remote_compute.wall_s"] == 3 * 3600  # 2 h before the requeue, 1 h after
    assert metrics["remote_compute.queue_s"] == 2 * 3600
    assert metrics["remote_compute.gpu_s"] == 0


def test_since_until_and_user_grouping() -> None:
    summary = summarize(KNOWN, ["user"], since=_epoch("2026-11-01T00:00"), until=_epoch("2026-11-04T23:00"))
    rows = _rows(summary)
    assert rows["ada",]["job_hours"] == pytest.approx(1.5)
    assert rows["bo",]["job_hours"] == pytest.approx(0.25)


def test_a_torn_last_line_is_ignored_and_a_repeated_attempt_counts_once(tmp_path: Path) -> None:
    record = UsageRecord(tmp_path / "usage.jsonl")
    record.append(KNOWN[0])
    record.append(KNOWN[0])  # collection ran again after a crash: the first line stays the one
    with open(record.path, "ab") as f:
        f.write(json.dumps(KNOWN[1].to_json()).encode()[:40])  # a writer died mid-line
    assert record.attempts() == [KNOWN[0]]
    record.append(KNOWN[2])  # the next writer ends the fragment first, so its own line stays whole
    again = UsageRecord(record.path)  # another process, reading from the start
    assert again.attempts() == [KNOWN[0], KNOWN[2]]
    assert record.attempts() == [KNOWN[0], KNOWN[2]]  # this one read on from where it stopped


def test_bad_grouping_and_times_name_the_field(workspace: Path, make_service) -> None:
    service = make_service(workspace)
    with pytest.raises(InvalidSettings) as e:
        service.usage("machine,colour")
    assert e.value.field == "group_by" and "colour" in e.value.message
    with pytest.raises(InvalidSettings) as e:
        service.usage(since="last tuesday")
    assert e.value.field == "since"
    with pytest.raises(InvalidSettings) as e:
        service.usage(until="")  # given but empty is not "no bound"
    assert e.value.field == "until"
    with pytest.raises(InvalidSettings) as e:
        service.usage(since="2026-02-01", until="2026-01-01")
    assert e.value.field == "until"


def _expected_hours(job: Job) -> float:
    """What the job's own record says it ran: from its start to when it stopped on the machine."""
    if job.started is None:
        return 0.0
    return (job.outcome.at - parse_time(job.started)) / 3600


def test_real_jobs_are_metered_once_each_whatever_their_end(workspace: Path, make_service, scratch_dir: Path) -> None:
    service = make_service(workspace)
    remember_facts(workspace / ".punica", "local", {"gpus": [{"name": "A", "memory_bytes": 1}] * 2})
    (workspace / "data.bin").write_bytes(b"x" * 5000)

    def submit(command: str, **settings) -> str:
        return service.submit(JobSpec.from_json({"command": command, **settings}), new=True).job.id

    ok = submit("head -c 3000 data.bin > out.bin", send=["data.bin"], bring_back=["out.bin"])
    failed = submit("exit 3")
    cancelled = submit(GATE)
    lost = submit(GATE)
    for job_id in (ok, failed):
        assert service.wait(job_id, timeout=60).state in ("succeeded", "failed")
    for job_id in (cancelled, lost):
        wait_for(lambda j=job_id: service.advance(j).state == "running", message="the gated jobs to run")

    # Under way: counted up to now and said so.
    live = service.usage("state")
    assert _rows(live)["running",]["running"] == 2
    assert _rows(live)["running",]["job_hours"] > 0

    service.cancel(cancelled)
    os.killpg(service.get(lost).handle["pid"], signal.SIGKILL)  # the whole group: no exit code is written
    for job_id in (cancelled, lost):
        wait_for(lambda j=job_id: not service.advance(j).active, timeout=60, message="the jobs to end")

    jobs = {job_id: service.get(job_id) for job_id in (ok, failed, cancelled, lost)}
    assert [jobs[j].state for j in (ok, failed, cancelled, lost)] == ["succeeded", "failed", "cancelled", "lost"]
    attempts = {a.job: a for a in service.usage_record.attempts()}
    assert set(attempts) == set(jobs)
    for job_id, job in jobs.items():
        attempt = attempts[job_id]
        assert (attempt.attempt, attempt.state, attempt.machine, attempt.gpus) == (1, job.state, "local", 2)
        assert attempt.wall_s(0) / 3600 == pytest.approx(_expected_hours(job), abs=1e-6)
        assert attempt.queued == parse_time(job.created)
        assert attempt.user
    assert attempts[lost].source == "estimated" and attempts[ok].source == "engine"
    assert attempts[ok].bytes_sent == 5000 and attempts[ok].bytes_fetched >= 3000

    summary = service.usage("machine")
    (row,) = summary["rows"]
    total = sum(_expected_hours(j) for j in jobs.values())
    assert row["running"] == 0 and row["attempts"] == 4
    assert row["job_hours"] == pytest.approx(total, abs=1e-5)
    assert row["gpu_hours"] == pytest.approx(2 * total, abs=1e-5)
    assert row["estimated_attempts"] == 1

    # The usage record is not the state file: forgetting the jobs keeps what they used.
    service.prune(older_than=None, states=None, keep_newest=0)
    assert service.store.jobs() == {}
    assert _rows(service.usage("machine"))["local",]["attempts"] == 4


def test_the_cli_prints_json_and_csv(workspace: Path, make_service, capsys) -> None:
    record = UsageRecord(workspace / ".punica" / "usage.jsonl")
    for attempt in KNOWN:
        record.append(attempt)
    assert run_cli(["--workspace", str(workspace), "usage", "--by", "machine,month", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert _rows(data)["gpu-box", "2026-10"]["gpu_hours"] == pytest.approx(12.0)
    assert run_cli(["--workspace", str(workspace), "usage", "--by", "machine", "--csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["machine"], float(r["job_hours"])) for r in table] == [("cpu-box", 3.0), ("gpu-box", 4.75)]
    assert run_cli(["--workspace", str(workspace), "usage"]) == 0
    assert "~14.25" in capsys.readouterr().out  # the cost, shown as an estimate


@pytest.fixture
def server(quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(quickstart, scratch_dir, tracking_uri, tmp_path / "server.log")
    yield srv
    srv.stop()


def _get(server: Server, query: str) -> tuple[str, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/remote-compute/usage?{query}",
        headers={"Authorization": f"token {server.token}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.headers["Content-Type"], response.read()


def test_the_record_survives_a_server_restart_and_reads_as_csv(server: Server) -> None:
    server.start()
    job = server.request("POST", "jobs", {"command": "echo hello", "name": "metered"})["job"]
    wait_for(lambda: server.request("GET", f"jobs/{job['id']}")["state"] == "succeeded", timeout=90, message="the job")
    before = server.request("GET", "usage?group_by=machine,user")
    server.kill()
    server.start()
    after = server.request("GET", "usage?group_by=machine,user")
    assert after["rows"] == before["rows"]
    (row,) = after["rows"]
    assert (row["machine"], row["attempts"], row["running"]) == ("local", 1, 0)
    assert row["user"]  # who submitted it

    kind, body = _get(server, "group_by=machine,month&format=csv")
    assert kind.startswith("text/csv")
    (line,) = list(csv.DictReader(io.StringIO(body.decode())))
    assert line["machine"] == "local" and float(line["job_hours"]) == pytest.approx(row["job_hours"])
    assert line["month"] == datetime.now(timezone.utc).strftime("%Y-%m")


def test_the_organizations_sums_count_an_attempt_in_each_of_its_users_groups() -> None:
    both = _attempt("a", "gpu", "2026-03-01T10:00", "2026-03-01T10:00", "2026-03-01T12:00", "succeeded",
                    gpus=2, groups=("nlp", "vision"))  # fmt: skip
    alone = _attempt("b", "gpu", "2026-03-01T10:00", "2026-03-01T10:00", "2026-03-01T11:00", "failed", user="bo")
    rows = summarize([both, alone], ("group",), now=_epoch("2026-04-01T00:00"))["rows"]
    assert [(r["group"], r["job_hours"], r["gpu_hours"]) for r in rows] == [
        ("", 1.0, 0.0),
        ("nlp", 2.0, 4.0),
        ("vision", 2.0, 4.0),
    ]
    with pytest.raises(InvalidSettings, match="group_by: 'group' is not a grouping"):
        parse_group_by("group")  # a workspace's own usage has no hub groups
    assert parse_group_by("user,group", ORG_GROUP_KEYS) == ("user", "group")
