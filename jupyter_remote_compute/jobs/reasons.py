"""Why a job failed, in one line: the line of its log that says why.

A failed job's reason is ``exit code N: <line>``, where the line is picked from the end of the log: the
notebook runner's own summary, the far side's environment message, a Python traceback's final
exception, the installer's error, else the last line that is not empty. Terminal codes (colours, cursor
moves, window titles) are taken out first, and the reason is kept short without cutting a word (a path)
in two. A file the command could not find that is in the workspace but was not sent adds what to do.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from pathlib import Path

#: How much of the end of a log is read for its reason: a deep traceback fits.
TAIL_BYTES = 64 << 10
#: The longest reason made from a log, in characters.
REASON_MAX = 300
#: How many lines may follow a traceback's exception for it to still be why the command failed
#: (what an exit handler prints on the way out).
AFTER_TRACEBACK = 3

# ECMA-48: CSI (ESC [ or the 8-bit CSI, parameters, intermediates, a final byte); the strings OSC,
# DCS, SOS, PM and APC, ended by BEL or ST (or the line's end when cut short); other escapes of two.
_TERMINAL_CODES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)"
    r"|\x1b[ -/]*[0-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: The notebook runner's lines (pipelines/farside/run_notebook.py): the last says how it ended.
_RUNNER = "run-notebook: "
#: env.sh's own words, for the environment as a whole: "environment: Python 3.99 was asked for; …".
_ENVIRONMENT = "environment: "
#: env.sh's last line when a build fails; the installer's message is what the reason says.
_NOT_BUILT = re.compile(r"^(environment \w+: could not be built); the installer's message is above$")
#: container.sh's line when the runtime could not start the image; the runtime's words are above it.
_NOT_STARTED = re.compile(r"^(container: .* could not start image \S+) \(its words are above\)$")
#: The runtime's own error lines (podman's ``Error: …``, docker's ``docker: Error …``), not its warnings.
_RUNTIME_ERROR = re.compile(r"^(?:docker: )?error", re.IGNORECASE)
_TRACEBACK = re.compile(r"^\s*(?:\+ )?(?:Exception Group )?Traceback \(most recent call last\):")
#: A traceback's last line: ``ValueError: boom``, ``mod.CustomError``, ``KeyboardInterrupt``.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?: .*)?)?$")
#: The same without a ``Traceback`` line above it (cut off, or a SyntaxError): a name that says so.
_EXCEPTION_NAMED = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Interrupt|Exit|Warning)(?:: .*)?$")
# uv: "error: …" (or "\u00d7 …" on a terminal), then its causes ("cause: …", "Caused by: …", "╰─▶ …").
_UV_ERROR = re.compile(r"^\s*(?:error:|\u00d7)\s+(.*)$")
_UV_CAUSE = re.compile(r"^\s*(?:cause:|Caused by:|[├╰]─▶)\s*(.*)$")
_UV_NOTE = re.compile(r"^\s*(?:hint|help|note|warning):")
_PIP_ERROR = re.compile(r"^ERROR: (.*)$")
#: Python's words for a missing file: ``[Errno 2] No such file or directory: 'data.csv'``.
_NO_SUCH_FILE = re.compile(r"\[Errno 2\] No such file or directory: '([^']+)'")


def plain(text: str) -> str:
    """``text`` without terminal codes or other control characters (tabs kept)."""
    return _CONTROL.sub("", _TERMINAL_CODES.sub("", text))


def log_tail(log_path: Path | None) -> str | None:
    """The end of a log (``TAIL_BYTES``), decoded; None when there is no log."""
    if log_path is None or not log_path.exists():
        return None
    with open(log_path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - TAIL_BYTES))
        return f.read().decode(errors="replace")


def explaining_line(text: str) -> str | None:
    """The line of a log's tail that says why its command failed; None when every line is empty."""
    # Lines first: a carriage return redraws a line (a spinner, a progress bar), the last drawing stays.
    raw = [plain(line).rstrip() for line in text.splitlines()]
    not_built = next((m.group(1) for m in map(_NOT_BUILT.match, raw) if m), None)
    raw = [line for line in raw if not _NOT_BUILT.match(line)]
    lines = [line for line in raw if line.strip()]
    if not_built:
        # env.sh ran the installer and says its message is above: that message is why.
        found = _environment_message(lines) or _installer_error(raw) or _final_exception(lines)
        found = found or (lines[-1].strip() if lines else None)
        return f"{not_built}: {found}" if found else not_built
    if not lines:
        return None
    not_started = [i for i, line in enumerate(lines) if _NOT_STARTED.match(line)]
    if not_started:
        # The runtime's last error above container.sh's line is why (rootless podman warns on every call).
        head = _NOT_STARTED.match(lines[not_started[-1]]).group(1)  # type: ignore[union-attr]
        above = lines[: not_started[-1]]
        said = next((line.strip() for line in reversed(above) if _RUNTIME_ERROR.match(line.strip())), None)
        return f"{head}: {said}" if said else lines[not_started[-1]].strip()
    return _runner_summary(lines) or _environment_message(lines) or _final_exception(lines) or lines[-1].strip()


def failure_reason(exit_code: int | None, log_path: Path | None, inputs: Sequence[str], workspace: Path) -> str:
    """``exit code N: <the explaining line>``, with what to send when the command missed a workspace file."""
    tail = log_tail(log_path)
    line = "(no log)" if tail is None else (explaining_line(tail) or "(empty log)")
    reason = f"exit code {exit_code}: {line}"
    hint = _unsent_file_hint(line, inputs, workspace)
    return shorten(reason, REASON_MAX - len(hint)) + hint


def shorten(text: str, limit: int = REASON_MAX) -> str:
    """``text`` at most ``limit`` characters, cut at a space (never inside a word or path) and marked."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "…"


def _runner_summary(lines: list[str]) -> str | None:
    return next((line for line in reversed(lines) if line.startswith(_RUNNER)), None)


def _environment_message(lines: list[str]) -> str | None:
    return next((line for line in reversed(lines) if line.startswith(_ENVIRONMENT)), None)


def _final_exception(lines: list[str]) -> str | None:
    """The exception a Python traceback ends with (of a chain, the last raised), when the traceback is
    how the log ends: one the command printed and went on from is not why it failed."""
    at = _exception_at(lines)
    return lines[at].strip() if at is not None and len(lines) - 1 - at <= AFTER_TRACEBACK else None


def _exception_at(lines: list[str]) -> int | None:
    """Where the last traceback's exception is: the first line after its ``Traceback`` line, at that
    line's indentation, that reads as one (the frames are deeper; a traceback another program quotes
    is indented)."""
    headers = [i for i, line in enumerate(lines) if _TRACEBACK.match(line)]
    if headers:
        indent = _indent(lines[headers[-1]])
        for i in range(headers[-1] + 1, len(lines)):
            if _indent(lines[i]) < indent:
                return None
            if _indent(lines[i]) == indent and _EXCEPTION.match(lines[i].strip()):
                return i  # (a frame wrapped to a terminal's width is at that indentation too)
        return None
    for i in range(len(lines) - 1, 0, -1):
        if _EXCEPTION_NAMED.match(lines[i]) and lines[i - 1][:1].isspace():
            return i
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _installer_error(raw: list[str]) -> str | None:
    """uv's last error with its deepest cause (the build's own exception, when uv quotes one), or pip's
    first ``ERROR:`` line. ``raw`` keeps the empty lines: a cause wrapped over lines ends at one."""
    heads = [i for i, line in enumerate(raw) if _UV_ERROR.match(line)]
    if heads:
        head = _UV_ERROR.match(raw[heads[-1]]).group(1)  # type: ignore[union-attr]
        block = []  # the error's indented lines: its causes, then what uv quotes ("[stderr]")
        for line in raw[heads[-1] + 1 :]:
            if line.strip() and (not line[:1].isspace() or _UV_NOTE.match(line)):
                break
            block.append(line)
        causes: list[str] = []
        for line in block:
            if not line.strip():
                break
            if cause := _UV_CAUSE.match(line):
                causes.append(cause.group(1))
            elif causes:  # the error or a cause wrapped to the terminal's width (COLUMNS)
                causes[-1] += " " + line.strip()
            else:
                head += " " + line.strip()
        quoted = [line for line in block if line.strip()]
        at = _exception_at(quoted)
        deepest = quoted[at].strip() if at is not None else (causes[-1] if causes else None)
        head = head.rstrip(":")
        return f"{head}: {deepest}" if deepest else head
    return next((m.group(1) for m in map(_PIP_ERROR.match, raw) if m), None)


def _unsent_file_hint(line: str, inputs: Sequence[str], workspace: Path) -> str:
    """For a missing file the workspace has and the job did not send: how to send it."""
    found = _NO_SUCH_FILE.search(line)
    if not found:
        return ""
    rel = found.group(1).removeprefix("./")
    if rel.startswith("/") or ".." in rel.split("/") or not (workspace / rel).is_file() or _sent(rel, inputs):
        return ""
    return f"; {rel} is in the workspace but was not sent: send it with the job (--send {rel})"


def _sent(rel: str, inputs: Sequence[str]) -> bool:
    for pattern in inputs:
        pattern = pattern.removeprefix("./").rstrip("/")
        if rel == pattern or rel.startswith(pattern + "/") or fnmatch.fnmatchcase(rel, pattern):
            return True
    return False
