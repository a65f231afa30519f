"""A job's webhooks (``JobSpec.notify``): each change of its state POSTed as a ``StateNotice``.

The process that changed a job's state tells its webhooks: ``Notifier`` is one of the service's
listeners, so it sees every job this process changes, from whatever thread changed it, and hands a
notice to one thread of its own; nothing waits on a webhook, and a webhook that fails never fails the
job. Each POST (``requests``) has a timeout (``CONNECT_TIMEOUT``, ``TIMEOUT``) and is tried ``TRIES`` times
with a growing pause between; a notice that still fails is logged, naming the webhook's host only (a URL's
path may hold a token). A redirect is not followed: it would carry the signed body to a place the job did
not name, so it counts as the receiver's refusal.

A change is told once by the process that made it, named by ``DELIVERY_HEADER`` (the job, its attempt,
the state it left and the one it is in): a process that starts after another made the last change
and writes the job again (a lease taken, a log grown) may tell that change once more, under the same
name, for a receiver to drop.

A job's machine may name a webhook of its own (compute.yaml's ``notify``, ``notify_secret``,
``notify_events``; ``machine_webhooks``): every job on it tells that one too, of the states it lists, as the
machine was when the job was placed there (its ``machine_snapshot``). Submit refuses a machine whose
webhook names a secret the Secret Manager lacks (``admit_machine_webhook``), before anything is sent.

The body holds no secret: a URL kept in the Secret Manager (``secret:NAME``) is read when it is used,
and the signing key (``secret``) only signs: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>``.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import hmac
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Literal
from urllib.parse import urlsplit

from ..errors import InvalidSettings
from ..schema.job import State, StateNotice, WebhookDelivery
from ..schema.machine import Machine
from ..schema.notify import DELIVERY_HEADER, SIGNATURE_HEADER, Webhook, machine_webhook, shown_url
from ..schema.retry import CAUSES
from ..secrets import REFERENCE_PREFIX, SecretStore
from .job import Job, utcnow
from .store import JobStore
from .transitions import TERMINAL_STATES

log = logging.getLogger(__name__)

#: Seconds to connect, and then to wait for the answer, of one POST.
CONNECT_TIMEOUT = 5.0
TIMEOUT = 10.0
#: Tries of one POST, and the pause before the second (doubled for each after).
TRIES = 3
FIRST_PAUSE = 1.0
#: The longest a closing service waits for the notices still queued (seconds).
CLOSE_WAIT = 5.0
#: Seconds a webhook's thread waits for more before it ends.
IDLE = 30.0
#: Whose webhook it is: the job's own (``notify``), or its machine's.
Source = Literal["job", "machine"]
#: The most state changes seen that this process remembers having told (oldest forgotten first).
REMEMBERED = 10_000


def notice_of(job: Job) -> StateNotice:
    """What the webhooks of ``job`` are told of its state now."""
    ended = job.attempts[-1] if job.attempts else None
    cause = job.outcome.cause if job.outcome is not None else None
    if job.state == "queued" and job.previous_state == "collecting" and ended is not None:  # a retry
        cause = ended["end"] if ended["end"] in CAUSES else None
    # The ended attempts, and the one under way; at the end the last is among them where it was recorded.
    attempt = len(job.attempts) + (0 if job.state in TERMINAL_STATES and ended else 1)
    return StateNotice(
        event="job.state",
        job=job.id,
        name=job.name,
        machine=job.machine,
        state=job.state,
        previous_state=job.previous_state,
        attempt=max(attempt, 1),
        reason=job.reason,
        cause=cause,  # type: ignore[typeddict-item]
        at=job.updated or utcnow(),
    )


def webhooks_of(job: Job) -> dict[Webhook, Source]:
    """Who is told of ``job``'s state now, and whose webhook each is: its own, and its machine's where that
    one hears of this state."""
    hooks: dict[Webhook, Source] = dict.fromkeys(job.spec.notify, "job")
    try:
        machine = machine_webhook(job.machine_snapshot.get("options") or {})
    except InvalidSettings:  # a hand-written compute.yaml; its submit was refused, this job's was before
        machine = None
    if machine is not None and (machine[1] is None or job.state in machine[1]):
        hooks.setdefault(machine[0], "machine")
    return hooks


def admit_machine_webhook(machine: Machine, secrets: SecretStore) -> None:
    """Refuse, at submit, a machine whose webhook is not well written or names a secret that is not stored."""
    where = f"machine {machine.name}"
    try:
        found = machine_webhook(machine.options)
    except InvalidSettings as e:
        raise InvalidSettings(f"{where}: {e.message} (compute.yaml)", field="machine") from None
    for setting, name in (found[0].secret_names() if found else {}).items():
        option = "notify_secret" if setting == "secret" else "notify"
        if secrets.get(name) is None:
            raise InvalidSettings(
                f"{where}: its {option} names the secret {name!r}, which is not in the Secret Manager; store it "
                f"with `jupyter remote-compute secrets set {name}`, or change {option} in compute.yaml",
                field="machine",
            )


def signature(key: str, body: bytes) -> str:
    """The value of ``X-Hub-Signature-256`` for ``body`` signed with ``key``."""
    return "sha256=" + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


class Notifier:
    """Tells each job's webhooks of the state changes this process makes: a thread per webhook URL, in
    the order the changes were made, so a webhook that does not answer holds up no other."""

    def __init__(
        self, secrets: SecretStore, store: JobStore | None = None, emit: Callable[[Job], None] | None = None
    ) -> None:
        self.secrets = secrets
        self.store = store  # where each notice's outcome is kept on its job (Job.deliveries), and told
        self.emit = emit
        self._told: dict[str, None] = {}  # delivery names, oldest first
        self._guard = threading.Lock()
        self._lanes: dict[Webhook, _Lane] = {}
        self._closed = False
        self._registered = False

    def __call__(self, job: Job) -> None:
        """A service listener: queue a notice when ``job`` is in a state this process has not told yet."""
        if job.state == job.previous_state or not (hooks := webhooks_of(job)):
            return
        notice = notice_of(job)
        delivery = f"{job.id}.{notice['attempt']}.{job.previous_state or 'submitted'}.{job.state}"
        body = json.dumps(notice, separators=(",", ":")).encode()
        with self._guard:
            if delivery in self._told or self._closed:
                return
            self._told[delivery] = None
            if len(self._told) > REMEMBERED:
                del self._told[next(iter(self._told))]
            for hook, source in hooks.items():
                lane = self._lanes.get(hook)
                if lane is None:
                    if not self._registered:  # a face that exits without closing its service (the CLI's run)
                        atexit.register(self.close)
                        self._registered = True
                    lane = self._lanes[hook] = _Lane(self, hook)
                lane.queue.put(_Notice(job.id, source, job.state, delivery, body))

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Tell what is queued, for at most ``wait`` seconds in all (a CLI that exits when its job ended): each
        notice left is tried once more, without a pause."""
        with self._guard:
            self._closed = True
            lanes = list(self._lanes.values())
        deadline = time.monotonic() + wait
        for lane in lanes:
            lane.queue.put(None)
        for lane in lanes:
            lane.thread.join(max(0.0, deadline - time.monotonic()))

    def _idle(self, lane: _Lane) -> bool:
        """A lane whose queue stayed empty ends (under the guard, so nothing is put in it meanwhile)."""
        with self._guard:
            if not lane.queue.empty():
                return False
            if self._lanes.get(lane.hook) is lane:
                del self._lanes[lane.hook]
            return True

    def post(self, hook: Webhook, delivery: str, body: bytes) -> tuple[int | None, str | None]:
        """One notice to one webhook, tried ``TRIES`` times: the receiver's last status, and why it did not land
        (None: it did). A failure is logged, naming its host only."""
        url = hook.url
        if url.startswith(REFERENCE_PREFIX):
            url = self.secrets.get(url[len(REFERENCE_PREFIX) :]) or ""
        where = urlsplit(url).hostname or "?"
        headers = {
            "Content-Type": "application/json",
            DELIVERY_HEADER: delivery,
            "User-Agent": "jupyter-remote-compute",
        }
        if hook.secret:
            key = self.secrets.get(hook.secret)
            if key is None:
                log.warning("webhook to %s: no secret named %r in the Secret Manager; not sent", where, hook.secret)
                return None, f"not sent: no secret named {hook.secret!r} in the Secret Manager signs it"
            headers[SIGNATURE_HEADER] = signature(key, body)
        if not url:
            name = hook.url[len(REFERENCE_PREFIX) :]
            log.warning("webhook: no secret named %r holds its URL; not sent", name)
            return None, f"not sent: no secret named {name!r} in the Secret Manager holds its URL"
        pause, attempt = FIRST_PAUSE, 0
        while True:
            attempt += 1
            status, problem, final = _posted(url, body, headers)
            if problem is None:
                return status, None
            # A refusal (final) is the receiver's last word: asking again would not change its mind.
            if final or attempt >= TRIES or self._closed:  # a process ending tries each notice left once
                log.warning("webhook to %s for %s failed %d time(s): %s", where, delivery, attempt, problem)
                return status, problem
            time.sleep(pause)
            pause *= 2

    def record(self, hook: Webhook, notice: _Notice, status: int | None, problem: str | None) -> None:
        """Keep how a notice went on its job, in place of that webhook's last (``Job.deliveries``)."""
        if self.store is None:
            return
        url = shown_url(hook.url)
        outcome = WebhookDelivery(
            url=url, source=notice.source, state=notice.state, status=status, error=problem, at=utcnow()
        )
        with self.store.transaction() as jobs:
            if notice.job_id not in jobs:  # forgotten (pruned) meanwhile
                return
            job = jobs[notice.job_id]
            same = [i for i, d in enumerate(job.deliveries) if (d["url"], d["source"]) == (url, notice.source)]
            if same:  # in its place: each webhook keeps where it was first told
                job.deliveries = [*job.deliveries[: same[0]], outcome, *job.deliveries[same[0] + 1 :]]
            else:
                job.deliveries = [*job.deliveries, outcome]
            job.updated = outcome["at"]  # the record changed: a face showing the ended job reads it again
        if self.emit is not None:
            self.emit(job)


def _posted(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str | None, bool]:
    """POST ``body`` once: the receiver's status (None: no answer); None when it took it, else why not
    (naming no URL, whose path or query may hold a token); and whether that is its final word (a 4xx but
    408 and 429, a redirect)."""
    import requests  # here: every face imports this module, and most of their jobs name no webhook

    try:
        with requests.post(
            url, data=body, headers=headers, timeout=(CONNECT_TIMEOUT, TIMEOUT), allow_redirects=False, stream=True
        ) as answer:
            code = answer.status_code
            location = answer.headers.get("Location", "")
    except requests.Timeout as e:
        phase = "connect" if isinstance(e, requests.ConnectTimeout) else "answer"
        return None, f"no {phase} within {CONNECT_TIMEOUT if phase == 'connect' else TIMEOUT:g} s", False
    except (requests.RequestException, OSError, ValueError) as e:
        return None, _cause(e), False
    if 200 <= code < 300:
        return code, None, False
    if 300 <= code < 400:
        elsewhere = urlsplit(location).hostname or "the same host"
        return code, f"HTTP {code}: a redirect (to {elsewhere}), not followed", True
    return code, f"HTTP {code}", 400 <= code < 500 and code not in (408, 429)


def _cause(error: BaseException) -> str:
    """The innermost reason of a failed request, as a few words (requests' own text repeats the URL)."""
    import requests

    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.strerror and not isinstance(error, requests.RequestException):
            return error.strerror.lower()
        inner = getattr(error, "reason", None) or error.__cause__ or error.__context__
        if not isinstance(inner, BaseException):
            break
        error = inner
    return type(error).__name__


@dataclasses.dataclass(frozen=True)
class _Notice:
    """One state change queued for one webhook."""

    job_id: str
    source: Source
    state: State
    delivery: str  # its name (DELIVERY_HEADER)
    body: bytes


class _Lane:
    """One webhook's notices, POSTed in order by a thread of its own that ends once idle a while."""

    def __init__(self, notifier: Notifier, hook: Webhook) -> None:
        self.notifier = notifier
        self.hook = hook
        self.queue: queue.Queue[_Notice | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="webhook", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=IDLE)
            except queue.Empty:
                if self.notifier._idle(self):
                    return
                continue
            if item is None:
                return
            try:
                status, problem = self.notifier.post(self.hook, item.delivery, item.body)
                self.notifier.record(self.hook, item, status, problem)
            except Exception:  # a webhook's fault is never the job's
                log.exception("webhook failed")
