"""What every JSON route of this package's servers shares: the body it reads and the reply it writes.

A mixin for tornado handlers, used by the Jupyter server's routes (``handlers.py``) and the
organization service's (``org/service.py``), so both refuse a bad body with the same error; and one for
the routes of both that take a body too large to hold in memory (``BodyToFile``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tornado.web

from .errors import InvalidSettings


def json_object(body: bytes | None) -> dict[str, Any]:
    """A request's JSON object body (empty: ``{}``), or the error that says what is wrong with it."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise InvalidSettings("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidSettings("the request body must be a JSON object")
    return data


class JsonRoute(tornado.web.RequestHandler):
    def body(self) -> dict[str, Any]:
        return json_object(self.request.body)

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))


class BodyToFile(tornado.web.RequestHandler):
    """For a ``stream_request_body`` route: the body is written to a temporary file as it comes (``_file``,
    at ``_tmp``), which is removed however the request ends unless the route took it (set ``_tmp`` to None).
    The route's method (which tornado calls once the whole body came) starts with ``body_came()``."""

    _file: Any = None
    _tmp: Path | None = None
    _body_read = False

    def finish(self, chunk: str | bytes | dict[str, Any] | None = None) -> Any:
        if not self._body_read:
            # Answered before its body was read (refused in ``prepare``): tornado closes the connection after
            # the answer, as it cannot find the next request in it. Saying so keeps a proxy that reuses
            # connections (the hub's) from sending the next request into the closing one, which it answers 503.
            self.set_header("Connection", "close")
        return super().finish(chunk)

    def body_came(self) -> None:
        """Called first by the route's method: the whole body is in ``_file`` (open, for the route to close)."""
        self._body_read = True
        assert self._file is not None and self._tmp is not None

    def on_finish(self) -> None:
        self._discard()

    def on_connection_close(self) -> None:
        self._discard()

    def _discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
