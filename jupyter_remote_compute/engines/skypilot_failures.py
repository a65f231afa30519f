"""SkyPilot's failures in words that say what to do: no infra it can use, a network failure, or
SkyPilot's own message without its traceback."""

from __future__ import annotations

import json
import re
from typing import Any

#: SkyPilot's words for "no infra it can use is set up" (its NoCloudAccessError, `sky check`'s advice).
_NO_INFRA = re.compile(
    r"NoCloudAccessError|no cloud access|cloud access is not set up|no (?:enabled|available) (?:cloud|infra)"
    r"|all clouds are disabled|run:? `?sky check",
    re.IGNORECASE,
)
#: A network failure, in the words of requests/urllib3 and the resolver.
_NETWORK = re.compile(
    r"Failed to resolve|NameResolutionError|Temporary failure in name resolution|Name or service not known"
    r"|Max retries exceeded|ConnectionError|Connection (?:refused|reset)|Network is unreachable|timed out",
    re.IGNORECASE,
)
#: SkyPilot fetches its catalogues (instance types, prices) from GitHub at run time.
_CATALOG = re.compile(r"raw\.githubusercontent\.com|catalog", re.IGNORECASE)
_HOST = re.compile(r"(?:Failed to resolve|host=)\s*'([^']+)'")


def no_infra_message(tried: str, reason: str) -> str:
    """What to do when SkyPilot has no infra it can use: ``sky check``, what was tried, and why not."""
    return f"no cloud SkyPilot can use: run `sky check` (tried {tried}: {reason})"


def plain_failure(text: str, tried: str, no_infra: bool | None = None) -> str:
    """SkyPilot's failure in words that say what to do; ``no_infra`` is what `sky check` found, if asked.

    A failed catalogue download is SkyPilot's first step on a cloud it has no credentials for, so
    when `sky check` found no usable infra that is what the person is told first.
    """
    network = bool(_NETWORK.search(text))
    # The resolver's or the socket's own words, not the HTTP client's wrapping of them.
    resolve = re.search(r"Failed to resolve '[^']+'(?: \([^)]*\))?", text)
    reason = resolve.group(0) if network and resolve else _one_line(text)
    if no_infra or (no_infra is None and _NO_INFRA.search(text)):
        return no_infra_message(tried, reason)
    if network and _CATALOG.search(text):
        host = _HOST.search(text)
        where = f" from {host.group(1)}" if host else ""
        return (
            f"SkyPilot could not download its cloud catalogue{where}: a network failure ({reason}); "
            "this server needs to reach it (directly or through a proxy), or use infra that needs no "
            "catalogue (Kubernetes, Slurm); `sky check` shows what is set up"
        )
    if network:
        return f"a network failure while SkyPilot worked ({reason}); check this server's network and try again"
    return reason


def said_plainly(text: str) -> bool:
    """Whether ``plain_failure`` has words for SkyPilot's error: a network failure, no infra, or nothing said."""
    return bool(_NETWORK.search(text) or _NO_INFRA.search(text) or text == NO_REASON)


def request_failure(payload: Any, tried: str, no_infra: bool | None = None) -> str:
    """A failed request's error (``sky.api_status``'s payload) in one line: a network or infra failure
    as a sentence that says what to do (``plain_failure``), never the HTTP client's nested reprs;
    anything else in SkyPilot's own words."""
    text = error_text(payload)
    return plain_failure(text, tried, no_infra) if said_plainly(text) else error_line(payload)


NO_REASON = "no reason given"


def _one_line(text: str) -> str:
    """The last line that says something (SkyPilot's own message after its traceback), at most 300 characters."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip() and not ln.strip().startswith(("File ", "^"))]
    line = lines[-1] if lines else NO_REASON
    return " ".join(line.split())[:300]


def error_text(payload: Any) -> str:
    """A failed request's error as SkyPilot gave it (its message, when the error is JSON)."""
    text = str(payload.error or payload.status_msg or NO_REASON)
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        return text
    if data is None or data == "":  # an error serialised as JSON null: SkyPilot said nothing more
        return str(payload.status_msg or NO_REASON)
    if isinstance(data, dict):
        return str(data.get("message") or data.get("object", text))
    return text


def error_line(payload: Any) -> str:
    """A failed request's error in one line, without SkyPilot's traceback."""
    return " ".join(error_text(payload).split())[:500]
