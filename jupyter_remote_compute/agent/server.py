"""The pull agent's side of its server: one kept-alive HTTP(S) connection per thread to the
server's agent endpoints for one machine, and how long to wait after failures.

Standard library only, as the rest of the agent (see ``__init__.py``).
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import sys
import threading
import time
import urllib.parse
from typing import Any

IO_CHUNK = 1 << 20
NETWORK_ERRORS = (OSError, http.client.HTTPException)


class Refused(Exception):
    """The server answered with an error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


def log(message: str) -> None:
    sys.stderr.write(time.strftime("%Y-%m-%dT%H:%M:%S ") + message + "\n")
    sys.stderr.flush()


def backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row: doubling up to 30 s, with jitter."""
    return min(30.0, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)


class Server:
    """The server's agent endpoints for one machine; one kept-alive connection per thread."""

    def __init__(self, url: str, machine: str, token: str, cafile: str | None = None) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise SystemExit(f"--server: expected http(s)://host[:port][/base], not {url!r}")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port
        self.base = parsed.path.rstrip("/") + "/remote-compute/agent/" + urllib.parse.quote(machine)
        self.token = token
        self.tls = ssl.create_default_context(cafile=cafile) if self.scheme == "https" else None
        self._local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.tls is not None:
                conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=timeout, context=self.tls, blocksize=IO_CHUNK
                )
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout, blocksize=IO_CHUNK)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        timeout: float = 60.0,
        raw: Any = None,
        length: int | None = None,
        sink: Any = None,
    ) -> tuple[int, Any]:
        """(status, JSON answer or None); with ``sink``, a 200's body is written there instead."""
        url = self.base + "/" + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        headers = {"Authorization": "Bearer " + self.token}
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if length is not None:
            headers["Content-Length"] = str(length)
        conn = self._connection(timeout)
        try:
            conn.request(method, url, body=data, headers=headers)
            response = conn.getresponse()
            if sink is not None and response.status == 200:
                while True:
                    chunk = response.read(IO_CHUNK)
                    if not chunk:
                        break
                    sink(chunk)
                return 200, None
            payload = response.read()
        except BaseException:
            self.drop()
            raise
        if response.status >= 400:
            raise Refused(response.status, payload)
        return response.status, json.loads(payload) if payload else None
