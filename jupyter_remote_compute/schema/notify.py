"""Who a job tells of its state changes (``Webhook``; what it tells them is ``job.StateNotice``).

A job may name webhooks (``notify``): on each change of its state the process that changed it POSTs a
``StateNotice`` as JSON to each (jobs/notify.py). A URL that itself holds a token (a chat's incoming
webhook) is written ``secret:NAME`` and kept in the Secret Manager; ``secret`` names the Secret Manager
entry whose value signs the body (HMAC-SHA256, in ``X-Hub-Signature-256`` as GitHub signs its own).
Neither value is ever in the job's record, its notices or the logs: only their names.

A machine may name a webhook of its own in compute.yaml (``machine_webhook``: ``notify``, ``notify_secret``,
``notify_events``): every job on it tells that one too, of the states it lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BeforeValidator, Field, with_config
from pydantic_core import core_schema

from ..errors import InvalidSettings
from ..secrets import REFERENCE_PREFIX, is_secret_name
from .base import STRICT, absent, problem, to_json

#: The most webhooks one job may name.
MAX_WEBHOOKS = 8
#: The header that carries the body's signature: ``sha256=`` and its hex HMAC-SHA256.
SIGNATURE_HEADER = "X-Hub-Signature-256"
#: The header that names one state change: the same change told twice carries the same value.
DELIVERY_HEADER = "X-Remote-Compute-Delivery"


def url_problem(value: Any) -> str | None:
    """What is wrong with a webhook's URL, or None."""
    if not isinstance(value, str):
        return "expected an http(s) URL, or secret:NAME for one kept in the Secret Manager"
    if value.startswith(REFERENCE_PREFIX):
        if not is_secret_name(value[len(REFERENCE_PREFIX) :]):
            return "secret:NAME needs the name of a Secret Manager entry that holds the URL"
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected an http(s) URL, got {value!r}"
    if parts.username or parts.password:
        return "a URL with a user or password in it: keep the URL in the Secret Manager and write secret:NAME"
    return None


def shown_url(url: str) -> str:
    """A webhook's URL as a job's record and its faces show it: no query, fragment or credentials (which
    may hold a token); ``secret:NAME`` as written."""
    if url.startswith(REFERENCE_PREFIX):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme, host + (f":{parts.port}" if parts.port else ""), parts.path, "", ""))


def _url(value: Any) -> str:
    if (wrong := url_problem(value)) is not None:
        raise problem(wrong)
    return value


def _is_key_name(value: Any) -> bool:
    return isinstance(value, str) and not value.startswith(REFERENCE_PREFIX) and is_secret_name(value)


def _secret(value: Any) -> str | None:
    if value is None:
        return None
    if not _is_key_name(value):
        raise problem("expected the plain name of a Secret Manager entry (the signing key)")
    return value


@with_config(STRICT)
@dataclasses.dataclass(frozen=True, kw_only=True)
class Webhook:
    """A URL a job's state changes are POSTed to, and the secret that signs them."""

    url: Annotated[
        str,
        BeforeValidator(_url, json_schema_input_type=str),
        Field(description="where each state change is POSTed (JSON); secret:NAME: the URL kept in the Secret Manager"),
    ]
    secret: Annotated[
        str | None,
        BeforeValidator(_secret, json_schema_input_type=str | None),
        Field(
            description=f"the Secret Manager entry whose value signs the body (HMAC-SHA256 in {SIGNATURE_HEADER}); "
            "null: unsigned",
            exclude_if=absent,
        ),
    ] = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_before_validator_function(_webhook_in, handler(source))

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> Webhook:
        return cls(url=data["url"], secret=data.get("secret"))

    def to_json(self) -> dict[str, Any]:
        return to_json(Webhook, self)

    def secret_names(self) -> dict[str, str]:
        """The Secret Manager entries this webhook needs, by the setting that names them."""
        names = {"secret": self.secret} if self.secret else {}
        if self.url.startswith(REFERENCE_PREFIX):
            names["url"] = self.url[len(REFERENCE_PREFIX) :]
        return names


def _webhook_in(data: Any) -> Any:
    if isinstance(data, Webhook):
        return data
    if isinstance(data, str):
        return {"url": data}  # a URL alone is an unsigned webhook
    if not isinstance(data, Mapping):
        raise problem("expected a URL or {url: ..., secret: NAME}")
    return data


def webhooks(value: Any) -> Any:
    """``notify``: a URL, or a list of URLs and {url, secret}."""
    if value is None:
        return ()
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise problem("expected a list of webhooks: URLs or {url: ..., secret: NAME}")
    if len(value) > MAX_WEBHOOKS:
        raise problem(f"at most {MAX_WEBHOOKS} webhooks, got {len(value)}")
    return tuple(value)


def machine_webhook(options: Mapping[str, Any]) -> tuple[Webhook, frozenset[str] | None] | None:
    """The webhook a machine's options name, and the job states it is told of (None: every change); None
    when ``notify`` is not set. ``InvalidSettings`` names the option at fault (``options.notify_events``)."""
    from .job import STATES  # job.py reads this module through spec.py

    url = options.get("notify")
    if url in (None, ""):
        return None
    if (wrong := url_problem(url)) is not None:
        raise InvalidSettings(f"options.notify: {wrong}", field="options.notify")
    secret = options.get("notify_secret") or None
    if secret is not None and not _is_key_name(secret):
        raise InvalidSettings(
            "options.notify_secret: expected the plain name of a Secret Manager entry (the signing key)",
            field="options.notify_secret",
        )
    events = options.get("notify_events")
    if events is None:
        return Webhook(url=url, secret=secret), None
    if isinstance(events, str) or not isinstance(events, (list, tuple)) or any(e not in STATES for e in events):
        raise InvalidSettings(
            f"options.notify_events: expected a list of job states ({', '.join(STATES)}), e.g. [failed, lost]",
            field="options.notify_events",
        )
    return Webhook(url=url, secret=secret), frozenset(events)
