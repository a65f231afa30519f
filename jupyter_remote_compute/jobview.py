"""A job as a notebook sees it: a live handle with rich reprs, and the loop that follows a job.

The magic and the handle's ``wait()`` follow a job the same way: a worker
thread drives it through the lifecycle service (``advance`` + ``read_log``)
while the kernel's main thread only prints what the worker reports. So an
interrupt (KeyboardInterrupt lands in the main thread) never cuts a step of the
lifecycle in half — a send, a start or a collection in flight finishes in the
worker, under this process's lease, and the job goes on without us.
"""

from __future__ import annotations

import codecs
import dataclasses
import html
import json
import queue
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from .jobs.job import Job, parse_time
from .jobs.logs import waiting_line
from .jobs.metrics import MetricsPage
from .jobs.service import JobService, require_trained
from .jobs.spec import format_duration
from .jobs.transitions import TERMINAL_STATES
from .people import local_person

# How long the main thread blocks between checks: short, so an interrupt is answered at once.
_TICK = 0.2

STATE_COLOURS = {
    "queued": "var(--jp-ui-font-color2)",
    "sending": "var(--jp-brand-color1)",
    "pending": "var(--jp-warn-color2)",
    "running": "var(--jp-brand-color1)",
    "collecting": "var(--jp-brand-color1)",
    "succeeded": "var(--jp-success-color1)",
    "failed": "var(--jp-error-color1)",
    "cancelled": "var(--jp-warn-color1)",
    "lost": "var(--jp-error-color1)",
}


def job_duration(job: Job) -> float | None:
    if not job.started:
        return None
    end = parse_time(job.ended) if job.ended else time.time()
    return max(0.0, end - parse_time(job.started))


def summary_line(job: Job, *, reason: bool = True) -> str:
    """One line a person reads at the end of a wait: state, duration, outputs, MLflow run.
    ``reason=False`` leaves the reason to an error raised after it (the notebook's NotTrained)."""
    parts = [f"job {job.id} on {job.machine}: {job.state}"]
    duration = job_duration(job)
    if duration is not None:
        parts[0] += f" after {format_duration(duration)}"
    if job.reason and reason:
        # The reason of a failure ends with log lines; the log itself was shown above it.
        parts.append(job.reason.splitlines()[0])
    if job.outputs:
        parts.append("outputs: " + ", ".join(sorted(job.outputs)))
    if job.mlflow_run_id:
        parts.append(f"MLflow run {job.mlflow_run_id}")
    elif job.state in TERMINAL_STATES and "not recorded in MLflow" not in (job.reason or ""):
        parts.append("MLflow run being recorded (.mlflow_run_id gives it once it is)")
    return "; ".join(parts)


def attempt_lines(job: Job) -> list[str]:
    """A job's attempts as ``jobs show`` prints them: where each ran, how long, how it ended, the work
    it lost and why (none for a job of one attempt and no retry policy)."""
    lines = []
    for number, attempt in enumerate(job.attempts, 1):
        ran = ""
        if attempt["started"]:
            ran = " after " + format_duration(parse_time(attempt["ended"]) - parse_time(attempt["started"]))
        line = f"  {number}. {attempt['machine']}: {attempt['end']}{ran}"
        if "lost_s" in attempt:
            line += f", {format_duration(attempt['lost_s'])} of work lost"
        reason = _first_line(attempt["reason"])
        if reason.startswith(attempt["end"] + ":"):  # "lost: the process vanished …" says "lost" once
            reason = reason[len(attempt["end"]) + 1 :].strip()
        lines.append(line + (f" ({reason})" if reason else ""))
    return ["attempts:", *lines] if lines else []


def delivery_lines(job: Job) -> list[str]:
    """How the last notice to each of a job's webhooks went, as ``jobs show`` prints them."""
    lines = []
    for d in job.deliveries:
        answer = f"landed (HTTP {d['status']})" if d["error"] is None else f"failed: {d['error']}"
        lines.append(f"  {d['url']} (the {d['source']}'s): told {d['state']} at {d['at']}: {answer}")
    return ["webhooks:", *lines] if lines else []


def detach_hint(job_id: str) -> str:
    return (
        f"re-attach: run the cell again (or `%remote_jobs {job_id}` then `.wait()`); "
        f"cancel: `%remote_jobs --cancel {job_id}`"
    )


# -- following a job ----------------------------------------------------------
@dataclasses.dataclass
class _Outcome:
    job: Job | None = None
    error: BaseException | None = None


class _ProgressBar:
    """A transfer bar (tqdm.auto), made on the first report so attaching to a running job shows none."""

    def __init__(self, label: str, file: TextIO) -> None:
        self.label = label
        self.file = file
        self.bar: Any = None
        self.finished = False

    def update(self, done: int, total: int) -> None:
        if self.finished or total <= 0:
            return
        if self.bar is None:
            with warnings.catch_warnings():
                # Without ipywidgets tqdm.auto warns once and falls back to a text bar, which is fine here.
                warnings.simplefilter("ignore")
                from tqdm.auto import tqdm
            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=self.label,
                leave=True,
                file=self.file,
            )
        if self.bar.total != total:
            self.bar.total = total
        self.bar.update(max(0, done - self.bar.n))
        if done >= total:
            self.close()

    def close(self) -> None:
        self.finished = True  # one bar per wait: a late report must not start a second one
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def follow(
    service: JobService,
    job_id: str,
    timeout: float | None = None,
    *,
    write: Callable[[str], None] | None = None,
    progress_label: str = "sending",
    notes: TextIO | None = None,
) -> Job:
    """Drive the job until it ends or ``timeout`` passes, printing its log and a transfer bar.

    ``notes`` takes the bar and the waiting lines: stderr for the CLI (its stdout is the log), stdout in
    a notebook, where stderr is drawn as an error.

    Returns the job in whatever state it reached. A KeyboardInterrupt stops the
    following (the worker stops after its current step) and propagates; the job
    itself goes on.
    """
    write = write or _stdout
    events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    stop = threading.Event()
    outcome = _Outcome()

    def work() -> None:
        try:
            outcome.job = service.wait(
                job_id,
                timeout,
                on_log=lambda data: events.put(("log", data)),
                progress=lambda done, total: events.put(("progress", done, total)),
                stop=stop,
                on_wait=lambda job: events.put(("wait", waiting_line(job))),
                on_metrics=lambda page: events.put(("metrics", latest.update(page))),
            )
        except BaseException as e:  # handed to the main thread, which raises it
            outcome.error = e
        finally:
            events.put(("end",))

    worker = threading.Thread(target=work, name=f"remote-compute-follow-{job_id}", daemon=True)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    notes = notes or sys.stderr
    bar = _ProgressBar(progress_label, notes)
    latest = LatestMetrics()
    worker.start()
    try:
        while True:
            try:
                event = events.get(timeout=_TICK)
            except queue.Empty:
                continue
            if event[0] == "progress":
                bar.update(event[1], event[2])
            elif event[0] == "wait":
                bar.close()
                notes.write(event[1])
                notes.flush()
            elif event[0] == "log":
                bar.close()  # sending is over once the command writes
                write(decoder.decode(event[1]))
            elif event[0] == "metrics" and event[1]:
                # The latest values under the log so far: one line each time new points came.
                write(event[1])
            else:
                break
    except KeyboardInterrupt:
        stop.set()
        raise
    finally:
        bar.close()
    tail = decoder.decode(b"", final=True)
    if tail:
        write(tail)
    if outcome.error is not None:
        raise outcome.error
    assert outcome.job is not None
    return outcome.job


class LatestMetrics:
    """The last value of each live metric of a job, as one line to print under its log."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[int, float | None]] = {}

    def update(self, page: MetricsPage) -> str:
        """Take a page of new points; the line to print (empty when nothing changed)."""
        changed = False
        for name, (step, value) in page.latest().items():
            if self.values.get(name) != (step, value):
                self.values[name] = (step, value)
                changed = True
        if not changed:
            return ""
        shown = " · ".join(f"{name} {_number(value)} (step {step})" for name, (step, value) in self.values.items())
        return f"[metrics] {shown}\n"


def _number(value: float | None) -> str:
    return "nan" if value is None else f"{value:.6g}"


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# -- the handle -----------------------------------------------------------------
class RemoteTrainJob:
    """A job of the workspace, as the magic returns it; every read is fresh from the state file."""

    def __init__(self, service: JobService, job: Job | str) -> None:
        self._service = service
        self._job_id = job.id if isinstance(job, Job) else job
        self._snapshot = job if isinstance(job, Job) else service.get(job)

    # -- reading
    @property
    def job(self) -> Job:
        """The job as the state file holds it now."""
        self._snapshot = self._service.get(self._job_id)
        return self._snapshot

    @property
    def id(self) -> str:
        return self._job_id

    @property
    def state(self) -> str:
        return self.job.state

    @property
    def reason(self) -> str | None:
        return self.job.reason

    @property
    def machine(self) -> str:
        return self._snapshot.machine

    @property
    def mlflow_run_id(self) -> str | None:
        return self.job.mlflow_run_id

    @property
    def trained(self) -> bool:
        return self.job.state == "succeeded"

    @property
    def outputs(self) -> dict[str, Path]:
        """Workspace-relative path → the file in the workspace; only a trained job has outputs."""
        root = self._service.workspace.root
        return {rel: root / rel for rel in sorted(self.job.outputs)}

    @property
    def digests(self) -> dict[str, str]:
        """Workspace-relative path → sha256 of each output, as verified when it came back."""
        return {rel: info["sha256"] for rel, info in sorted(self.job.outputs.items())}

    def log(self) -> str:
        """The job's log so far (secrets masked)."""
        data = bytearray()
        offset = 0
        while True:
            chunk = self._service.read_log(self._job_id, offset)
            data += chunk.data
            offset = chunk.next_offset
            if not chunk.data or chunk.complete:
                return data.decode(errors="replace")

    # -- acting
    def wait(self, timeout: float | None = None) -> RemoteTrainJob:
        """Follow the job (its log from the start) until it ends or ``timeout`` seconds pass; returns self.

        It does not raise when the job failed: check ``trained`` or call ``require_trained()``.
        """
        try:
            # In a notebook, as the magic's: stderr is drawn as an error, and the bar is not one.
            job = follow(
                self._service, self._job_id, timeout, progress_label=f"sending to {self.machine}", notes=sys.stdout
            )
        except KeyboardInterrupt:
            print(f"\nstopped waiting; job {self._job_id} keeps running. {detach_hint(self._job_id)}", file=sys.stderr)
            raise
        self._snapshot = job
        print(summary_line(job))
        return self

    def require_trained(self) -> RemoteTrainJob:
        """Self if the job succeeded with verified outputs; else ``NotTrained`` with its reason."""
        require_trained(self.job)
        return self

    def cancel(self) -> RemoteTrainJob:
        self._snapshot = self._service.cancel(self._job_id, by=local_person())
        return self

    # -- showing
    def _fields(self) -> list[tuple[str, str]]:
        job = self._snapshot
        duration = job_duration(job)
        fields = [("state", job.state), ("machine", job.machine), ("name", job.name)]
        if duration is not None:
            fields.append(("duration", format_duration(duration)))
        if job.reason:
            fields.append(("reason", job.reason))
        fields.append(("outputs", ", ".join(sorted(job.outputs)) or "—"))
        fields.append(("MLflow run", job.mlflow_run_id or "—"))
        return fields

    def __repr__(self) -> str:
        self.job  # noqa: B018 -- refresh the snapshot
        lines = [f"<RemoteTrainJob {self._job_id}>"]
        lines += [f"  {name}: {value}" for name, value in self._fields()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        self.job  # noqa: B018 -- refresh the snapshot
        rows = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(name)}</th>"
            f"<td style='text-align:left'>{_state_html(value) if name == 'state' else _pre(value)}</td></tr>"
            for name, value in self._fields()
        )
        return f"<div><strong>Job {html.escape(self._job_id)}</strong><table>{rows}</table>{self._mlflow_link()}</div>"

    def _mlflow_link(self) -> str:
        """The "Open in MLflow" link: in JupyterLab a click runs the panel's command (its command linker reads the
        data attributes), which opens MLflow's UI at the run in a tab; elsewhere the link does nothing."""
        job = self._snapshot
        if not job.mlflow_run_id:
            return ""
        opened = {"runId": job.mlflow_run_id, "label": job.name or job.id}
        if job.tracking_uri:  # recorded on the organization's tracking server: opened there
            opened["trackingUri"] = job.tracking_uri
        args = html.escape(json.dumps(opened), quote=True)
        return (
            '<p><a href="#" data-commandlinker-command="remote-compute:open-mlflow" '
            f'data-commandlinker-args="{args}">Open in MLflow</a></p>'
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        # No application/json: JupyterLab would prefer its JSON tree to the table.
        return {"text/plain": repr(self), "text/html": self._repr_html_()}


def _first_line(text: str | None) -> str:
    return text.splitlines()[0] if text else ""


def _pre(value: str) -> str:
    text = html.escape(value)
    return f"<pre style='margin:0'>{text}</pre>" if "\n" in value else text


def _state_html(state: str) -> str:
    colour = STATE_COLOURS.get(state, "inherit")
    return f"<span style='color:{colour};font-weight:bold'>{html.escape(state)}</span>"


class JobTable:
    """The jobs of a workspace as ``%remote_jobs`` shows them."""

    COLUMNS = ("id", "machine", "state", "created", "name", "reason")

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.jobs = list(jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def _rows(self) -> list[list[str]]:
        return [[j.id, j.machine, j.state, j.created, j.name[:40], _first_line(j.reason)[:60]] for j in self.jobs]

    def __repr__(self) -> str:
        if not self.jobs:
            return "no jobs in this workspace"
        rows = [[c.upper() for c in self.COLUMNS], *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.COLUMNS))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)

    def _repr_html_(self) -> str:
        if not self.jobs:
            return "<p>No jobs in this workspace.</p>"
        head = "".join(f"<th style='text-align:left'>{c}</th>" for c in self.COLUMNS)
        body = "".join(
            "<tr>"
            + "".join(
                f"<td style='text-align:left'>{_state_html(v) if i == 2 else html.escape(v)}</td>"
                for i, v in enumerate(row)
            )
            + "</tr>"
            for row in self._rows()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
