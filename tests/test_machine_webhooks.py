"""A machine's own webhook (compute.yaml's ``notify``, ``notify_secret``, ``notify_events``): every job on the real
ssh bed tells it, beside the job's own, of the states it lists, signed with the Secret Manager entry it names; a
machine naming a secret that is not stored is refused at submit, before anything is sent. Each job keeps how
the last notice to each webhook went (``deliveries``), shown by the REST job and ``jobs show``: real receivers
on 127.0.0.1 answer 200, 500 and a redirect."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from pathlib import Path

import pytest
import sshd_fixture
from test_api import _json
from test_cli import cli  # noqa: F401 (the CLI in a subprocess on a quickstart copy)
from test_webhooks import Receiver
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

MACHINE_KEY_NAME = "hooks/box-signing"
MACHINE_KEY = "a-machine-key-7d2e9a41c"


def test_every_job_on_a_machine_tells_its_webhook_of_the_states_it_lists(workspace: Path, make_service, ssh_agent_env):  # type: ignore[no-untyped-def]
    own, machines = Receiver(), Receiver()
    try:
        service = make_service(workspace)
        options = ssh_agent_env.options(
            notify=machines.url, notify_secret=MACHINE_KEY_NAME, notify_events=["running", "succeeded", "failed"]
        )
        service.machines.add("box", "ssh", "127.0.0.1", options)
        spec = JobSpec.from_json({"machine": "box", "command": "echo hi", "notify": [own.url]})

        # The secret the machine signs with is not stored yet: refused, nothing queued and nothing sent.
        with pytest.raises(InvalidSettings) as refused:
            service.submit(spec)
        message = str(refused.value)
        assert "machine box" in message and "notify_secret" in message and repr(MACHINE_KEY_NAME) in message
        assert f"jupyter remote-compute secrets set {MACHINE_KEY_NAME}" in message, message
        assert not service.list_jobs() and not own.posts and not machines.posts

        service.secrets.set(MACHINE_KEY_NAME, MACHINE_KEY)
        job = service.wait(service.submit(spec).job.id, timeout=120)
        assert job.state == "succeeded", job.public_json()
        wait_for(lambda: len(machines.posts) == 2, timeout=30, message="the machine's webhook told twice")
        wait_for(lambda: any(n["state"] == "succeeded" for n in own.notices()), 30, "the job's own last POST")

        # The job's own webhook hears every change; the machine's only those it lists, signed with its key.
        assert [n["state"] for n in own.notices()] == ["queued", "sending", "running", "collecting", "succeeded"]
        assert [(n["state"], n["job"], n["machine"]) for n in machines.notices()] == [
            ("running", job.id, "box"),
            ("succeeded", job.id, "box"),
        ]
        for headers, body in machines.posts:
            expected = "sha256=" + hmac.new(MACHINE_KEY.encode(), body, hashlib.sha256).hexdigest()
            assert hmac.compare_digest(headers["x-hub-signature-256"], expected)
        assert all("x-hub-signature-256" not in headers for headers, _ in own.posts)
        # The machine's record names its secret, never the value; the job's record neither.
        assert service.machines.get("box").options["notify_secret"] == MACHINE_KEY_NAME
        assert MACHINE_KEY not in service.workspace.compute_yaml.read_text()
        assert MACHINE_KEY not in str(job.public_json())
    finally:
        own.close()
        machines.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"notify": "ftp://127.0.0.1/hook"}, "options.notify"),
        ({"notify": "https://u:p@example.org/hook"}, "options.notify"),
        ({"notify": "https://example.org/hook", "notify_events": ["running", "done"]}, "options.notify_events"),
        ({"notify": "https://example.org/hook", "notify_secret": "secret:hooks/key"}, "options.notify_secret"),
    ],
)
def test_a_machine_webhook_badly_written_is_refused_naming_its_option(workspace: Path, make_service, options, field):  # type: ignore[no-untyped-def]
    service = make_service(workspace)
    with pytest.raises(InvalidSettings) as refused:
        service.machines.add("box", "ssh", "127.0.0.1", options)
    assert refused.value.field == field, refused.value
    assert str(refused.value).startswith(field), refused.value


async def test_the_rest_job_keeps_the_last_delivery_to_each_webhook(jp_fetch):  # type: ignore[no-untyped-def]
    taken, broken, elsewhere = Receiver(then=200), Receiver(then=500), Receiver()
    moved = Receiver(redirect=elsewhere.url)
    try:
        hooks = [taken.url + "?token=not-shown", broken.url, moved.url]
        _, submitted = await _json(jp_fetch, "jobs", method="POST", body={"command": "true", "notify": hooks})
        job_id = submitted["job"]["id"]
        deadline = time.monotonic() + 90
        while True:  # the 500's notices are each tried 3 times, 1 s and 2 s apart
            _, job = await _json(jp_fetch, "jobs", job_id)
            told = {d["url"]: d for d in job.get("deliveries", [])}
            if len(told) == 3 and all(d["state"] == "succeeded" for d in told.values()):
                break
            assert time.monotonic() < deadline, job.get("deliveries")
            await asyncio.sleep(0.2)
        assert job["state"] == "succeeded"
        assert set(told) == {taken.url, broken.url, moved.url}, told  # no query: it may hold a token
        assert (told[taken.url]["status"], told[taken.url]["error"]) == (200, None)
        assert (told[broken.url]["status"], told[broken.url]["error"]) == (500, "HTTP 500")
        assert told[moved.url]["status"] == 307 and "not followed" in told[moved.url]["error"]
        assert all(d["source"] == "job" and d["at"] for d in told.values())
        assert len(broken.posts) == 3 * 5 and not elsewhere.posts  # every change tried 3 times; none moved
    finally:
        for receiver in (taken, broken, moved, elsewhere):
            receiver.close()


def test_jobs_show_tells_how_each_webhook_last_went(cli):  # type: ignore[no-untyped-def]  # noqa: F811
    taken, broken = Receiver(then=200), Receiver(then=500)
    try:
        done = cli("run", "--notify", taken.url, "--notify", broken.url, "--name", "told", "--", "true")
        job_id = done.stderr.split("job ", 1)[1].split()[0].rstrip(":")
        shown = json.loads(cli("jobs", "show", job_id, "--json").stdout)
        told = {d["url"]: (d["state"], d["status"], d["error"]) for d in shown["deliveries"]}
        # The run's process told every change before it exited, the last one's outcome kept.
        assert told == {taken.url: ("succeeded", 200, None), broken.url: ("succeeded", 500, "HTTP 500")}, told
        lines = cli("jobs", "show", job_id).stdout.splitlines()
        at = lines.index("webhooks:")
        assert lines[at + 1].startswith(f"  {taken.url} (the job's): told succeeded at ")
        assert lines[at + 1].endswith(": landed (HTTP 200)")
        assert lines[at + 2].startswith(f"  {broken.url} (the job's): told succeeded at ")
        assert lines[at + 2].endswith(": failed: HTTP 500"), lines
    finally:
        taken.close()
        broken.close()
