"""A job's webhooks (``notify``): a real HTTP server on 127.0.0.1 receives the POST of each change of a real
job's state, signed with a Secret Manager entry; a webhook that fails never fails the job."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_cli import cli  # noqa: F401 (the CLI in a subprocess on a quickstart copy)
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings, SecretInSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.workspace import Workspace

KEY_NAME = "hooks/signing"
KEY = "a-signing-key-4f1c9e2b7d"


class Receiver:
    """An HTTP server that keeps every POST; it answers each with the next of ``answers`` (then ``then``),
    after ``delay`` seconds. A ``redirect`` answers each with a 307 to that URL."""

    def __init__(
        self, answers: list[int] | None = None, delay: float = 0.0, then: int = 204, redirect: str | None = None
    ) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.answers = list(answers or [])
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay)  # a receiver slow to answer, as one far away is
                received.posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(received.answers.pop(0) if received.answers else 307 if redirect else then)
                if redirect:
                    self.send_header("Location", redirect)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def notices(self) -> list[dict[str, object]]:
        return [json.loads(body) for _, body in self.posts]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    own = Receiver()
    yield own
    own.close()


def test_each_state_change_of_a_retried_job_is_posted_signed(workspace: Path, make_service, receiver, tmp_path):  # type: ignore[no-untyped-def]
    service = make_service(workspace)
    service.secrets.set(KEY_NAME, KEY)
    tried = tmp_path / "tried"  # the first attempt fails with 3, the second succeeds
    spec = JobSpec.from_json(
        {
            "command": f"if [ -f {tried} ]; then echo done; else touch {tried}; exit 3; fi",
            "name": "hooked",
            "retry": {"max": 1, "exit_codes": [3]},
            "notify": [{"url": receiver.url, "secret": KEY_NAME}],
        }
    )
    job = service.wait(service.submit(spec).job.id, timeout=120)
    assert job.state == "succeeded", job.public_json()
    wait_for(lambda: any(n["state"] == "succeeded" for n in receiver.notices()), timeout=30, message="the last POST")

    notices = receiver.notices()
    assert [(n["previous_state"], n["state"], n["attempt"]) for n in notices] == [
        (None, "queued", 1),
        ("queued", "sending", 1),
        ("sending", "running", 1),
        ("running", "collecting", 1),
        ("collecting", "queued", 2),
        ("queued", "sending", 2),
        ("sending", "running", 2),
        ("running", "collecting", 2),
        ("collecting", "succeeded", 2),
    ], notices
    assert all(n["job"] == job.id and n["name"] == "hooked" and n["machine"] == "local" for n in notices)
    assert all(n["event"] == "job.state" and n["at"] for n in notices)
    retried = notices[4]
    assert retried["cause"] == "failed" and "attempt 1 failed" in str(retried["reason"]), retried
    assert notices[-1]["cause"] is None and notices[-1]["reason"] is None
    # Each is signed with the Secret Manager's key, as GitHub signs its own, and named once.
    for headers, body in receiver.posts:
        expected = "sha256=" + hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-hub-signature-256"], expected)
        assert headers["content-type"] == "application/json"
        assert KEY not in body.decode() and KEY not in json.dumps(headers)
    deliveries = [headers["x-remote-compute-delivery"] for headers, _ in receiver.posts]
    assert len(set(deliveries)) == len(deliveries), deliveries
    # The job's record names the secret, never its value.
    state = Workspace(workspace).state_file
    assert all(KEY not in p.read_text() for p in state.parent.glob(state.name + "*")), "the key in the state file"
    assert job.public_json()["spec"]["notify"] == [{"url": receiver.url, "secret": KEY_NAME}]


def test_a_failing_webhook_is_tried_again_and_never_fails_the_job(workspace: Path, make_service, caplog):  # type: ignore[no-untyped-def]
    flaky = Receiver(answers=[503])  # its first POST is refused for now: the second try lands
    down = Receiver()
    down.close()  # nothing listens at its address any more
    try:
        service = make_service(workspace)
        spec = JobSpec.from_json({"command": "true", "notify": [down.url, flaky.url]})
        job = service.wait(service.submit(spec).job.id, timeout=60)
        assert job.state == "succeeded", job.public_json()
        wait_for(lambda: any(n["state"] == "succeeded" for n in flaky.notices()), timeout=60, message="the last POST")
        states = [n["state"] for n in flaky.notices()]
        assert states[:2] == ["queued", "queued"], states  # refused once, then taken
        assert states[-1] == "succeeded" and "x-hub-signature-256" not in flaky.posts[0][0]

        def warned() -> list[str]:
            return [r.getMessage() for r in caplog.records if "webhook to 127.0.0.1" in r.getMessage()]

        warnings = wait_for(warned, timeout=30, message="the webhook that is down to be given up, logged")
        assert all("/hook" not in w and "failed 3 time(s)" in w for w in warnings), warnings  # its host, not path
    finally:
        flaky.close()


def test_a_redirect_is_not_followed_so_the_signed_body_goes_nowhere_else(workspace: Path, make_service, caplog):  # type: ignore[no-untyped-def]
    elsewhere = Receiver()
    moved = Receiver(redirect=elsewhere.url + "?stolen=1")
    try:
        service = make_service(workspace)
        service.secrets.set(KEY_NAME, KEY)
        spec = JobSpec.from_json({"command": "true", "notify": [{"url": moved.url, "secret": KEY_NAME}]})
        job = service.wait(service.submit(spec).job.id, timeout=60)
        assert job.state == "succeeded", job.public_json()

        def given_up() -> list[str]:
            return [r.getMessage() for r in caplog.records if "not followed" in r.getMessage()]

        warnings = wait_for(given_up, timeout=30, message="the redirected notices to be given up, logged")
        # Each notice was POSTed once (a redirect is the receiver's last word), and none reached elsewhere.
        wait_for(lambda: len(moved.posts) >= 5, timeout=30, message="every state change POSTed")
        assert len(moved.posts) == len(set(h["x-remote-compute-delivery"] for h, _ in moved.posts))
        assert elsewhere.posts == [], elsewhere.posts
        assert "failed 1 time(s): HTTP 307: a redirect (to 127.0.0.1), not followed" in warnings[0], warnings
        assert all("stolen" not in w and "/hook" not in w for w in warnings), warnings
    finally:
        moved.close()
        elsewhere.close()


def test_a_url_holding_a_token_is_kept_in_the_secret_manager_and_named(workspace: Path, make_service, receiver):  # type: ignore[no-untyped-def]
    service = make_service(workspace)
    pasted = "https://hooks.slack.com/services/T0ABCDEFG/B0ABCDEFG/q8vN3kR7xY2mP5tW9zL4cJ6h"
    with pytest.raises(SecretInSettings) as refused:
        service.submit(JobSpec.from_json({"command": "true", "notify": [pasted]}))
    assert str(refused.value).startswith("notify[0].url: ") and "secret:NAME" in str(refused.value)

    service.secrets.set("hooks/url", receiver.url)  # the receiver's URL stands for one holding a token
    job = service.wait(
        service.submit(JobSpec.from_json({"command": "true", "notify": ["secret:hooks/url"]})).job.id, 60
    )
    assert job.state == "succeeded", job.public_json()
    wait_for(lambda: any(n["state"] == "succeeded" for n in receiver.notices()), timeout=30, message="the last POST")
    assert job.public_json()["spec"]["notify"] == [{"url": "secret:hooks/url"}]
    state = Workspace(workspace).state_file
    assert all(receiver.url not in p.read_text() for p in state.parent.glob(state.name + "*"))


@pytest.mark.parametrize(
    ("notify", "field"),
    [
        ([{"url": "http://127.0.0.1:9/hook", "secret": "no/such-key"}], "notify[0].secret"),
        (["http://127.0.0.1:9/hook", "secret:no/such-url"], "notify[1].url"),
        (["ftp://127.0.0.1/hook"], "notify[0].url"),
    ],
)
def test_a_webhook_naming_a_missing_secret_or_a_bad_url_is_refused_at_submit(workspace, make_service, notify, field):  # type: ignore[no-untyped-def]
    service = make_service(workspace)
    with pytest.raises(InvalidSettings) as refused:
        service.submit(JobSpec.from_json({"command": "true", "notify": notify}))
    assert refused.value.field == field or str(refused.value).startswith(f"{field}:"), refused.value
    assert not service.list_jobs()


def test_the_cli_and_the_magic_take_webhooks_and_their_signing_secret():
    from jupyter_remote_compute.cli import build_parser
    from jupyter_remote_compute.magics import build_train_parser
    from jupyter_remote_compute.run_options import command_of, spec_settings

    words = ["--notify", "https://example.org/a", "--notify", "secret:hooks/url", "--notify-secret", KEY_NAME]
    for args in (
        build_parser(plugins=False).parse_args(["run", *words, "--", "train"]),
        build_train_parser().parse_args([*words, "--", "train"]),
    ):
        spec = JobSpec.from_json(spec_settings(args, command_of(args)))
        assert [(w.url, w.secret) for w in spec.notify] == [
            ("https://example.org/a", KEY_NAME),
            ("secret:hooks/url", KEY_NAME),
        ]
    alone = build_parser(plugins=False).parse_args(["run", "--notify-secret", KEY_NAME, "--", "train"])
    with pytest.raises(InvalidSettings) as info:
        JobSpec.from_json(spec_settings(alone, command_of(alone)))
    assert info.value.field == "notify[0].url"


def test_the_cli_tells_every_change_it_made_before_it_exits(cli):  # type: ignore[no-untyped-def]  # noqa: F811
    # run --detach starts the job and returns; every change it made is told by then, though the webhook
    # takes a while to answer each.
    slow = Receiver(delay=0.5)
    try:
        done = cli("run", "--detach", "--notify", slow.url, "--name", "told", "--", "true")
        job_id = done.stderr.split("submitted job ", 1)[1].split()[0]
        told = [(n["previous_state"], n["state"]) for n in slow.notices()]
    finally:
        slow.close()
    state = json.loads(cli("jobs", "show", job_id, "--json").stdout)["state"]
    assert told[:3] == [(None, "queued"), ("queued", "sending"), ("sending", "running")], told
    assert told[-1][1] == state, (told, state)
