"""A small blocking client for one Jupyter Server: REST (Contents, /files, kernels); its kernels' channels
are ``jupyter_kernel.py``'s.

The jupyter engine runs in worker threads, so everything here blocks: ``http.client`` for REST
(one keep-alive connection per thread, bodies streamed in and out, never a whole file in memory).

The token travels only in the ``Authorization`` header. It is never part of a URL, and no error
raised here holds it: messages name the server's address (which cannot hold credentials, see
``JupyterEngine.validate_address``) and the secret's *name*.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import queue
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

from .base import EngineError, ProgressCallback

#: Bytes per Contents API chunk (~5.6 MB of base64 per request): measured fastest on loopback, and
#: with the prefetch below it keeps memory at a few chunks.
UPLOAD_CHUNK = 4 << 20
#: Bytes read per socket read while streaming a download to disk.
DOWNLOAD_BLOCK = 1 << 20
#: Bytes per ranged GET when a big file comes down as concurrent ranges.
RANGE_PIECE = 8 << 20
#: Statuses after which the same request may well succeed later (a proxy or hub with the server down).
TRANSIENT_STATUS = frozenset({408, 424, 429, 502, 503, 504})
_CONNECT_ERRORS = (ConnectionError, socket.timeout, TimeoutError, socket.gaierror, http.client.HTTPException)


class Unauthorized(EngineError):
    """The server refused the token (401/403)."""


class NotFoundOnServer(EngineError):
    """A 404 from the server: a missing path, a hidden path, or a kernel that is gone."""


class KernelGone(EngineError):
    """The kernel we talk to no longer exists (the server restarted, or culled it)."""


class RemoteCodeError(EngineError):
    """Our code raised in the kernel (the kernel itself is fine)."""


class Token:
    """The server token, kept out of every repr, str and traceback local that prints objects."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def header(self) -> str:
        return "token " + self._value

    def __repr__(self) -> str:
        return "Token(***)"

    __str__ = __repr__


class ServerClient:
    """REST and kernel access to one Jupyter Server at ``base_url`` (normalised, ending in ``/``)."""

    def __init__(
        self,
        base_url: str,
        token: Callable[[], Token],
        *,
        refused: Callable[[], str],
        ca_bundle: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path if parts.path.endswith("/") else parts.path + "/"
        self.token = token
        self.refused = refused  # the message for a refused token: it names the secret, never the value
        self.timeout = timeout
        self.ssl_context: ssl.SSLContext | None = None
        if self.https:
            # Verified always; a private CA adds to what is trusted, nothing turns checking off.
            self.ssl_context = ssl.create_default_context()
            if ca_bundle:
                try:
                    self.ssl_context.load_verify_locations(cafile=ca_bundle)
                except (OSError, ssl.SSLError) as e:
                    raise EngineError(f"cannot read the CA bundle {ca_bundle}: {e}") from None
        self._local = threading.local()

    # -- plumbing ---------------------------------------------------------------------
    def url_path(self, path: str) -> str:
        """The request path for a server-relative path such as ``api/contents/a b``."""
        return self.prefix + quote(path, safe="/")

    def unreachable(self, error: BaseException) -> EngineError:
        """The error for a server that could not be reached (or whose certificate was not trusted)."""
        if isinstance(error, ssl.SSLCertVerificationError):
            return EngineError(
                f"the TLS certificate of {self.base_url} could not be verified ({error.verify_message}); "
                "if the server uses a private CA, set the machine's ca_bundle option to its certificate file"
            )
        reason = type(error).__name__ + (f": {error}" if str(error) else "")
        return EngineError(f"cannot reach the Jupyter Server at {self.base_url} ({reason})", transient=True)

    def _connection(self, timeout: float | None) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        reused = conn is not None
        if conn is None:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.ssl_context)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        conn.timeout = timeout or self.timeout
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        return conn, reused

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | Iterable[bytes] | None = None,
        length: int | None = None,
        headers: dict[str, str] | None = None,
        ok: Iterable[int] = (200,),
        timeout: float | None = None,
        query: str = "",
    ) -> http.client.HTTPResponse:
        """Send a request and return the response, its body unread. The caller reads it fully.

        ``body`` may be a sequence of byte strings sent one after another (``length`` their total),
        so a large body is never joined into one buffer.
        """
        for attempt in (1, 2):
            conn, reused = self._connection(timeout)
            try:
                target = self.url_path(path) + ("?" + query if query else "")
                conn.putrequest(method, target, skip_accept_encoding=True)
                conn.putheader("Authorization", self.token().header())
                for name, value in (headers or {}).items():
                    conn.putheader(name, value)
                if body is None:
                    if method in ("POST", "PUT", "PATCH"):
                        conn.putheader("Content-Length", "0")
                    conn.endheaders()
                elif isinstance(body, bytes):
                    conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body)
                else:
                    conn.putheader("Content-Length", str(length))
                    conn.endheaders()
                    for part in body:
                        conn.send(part)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self._drop_connection()
                # A keep-alive connection the server closed while idle: try once on a fresh one.
                if reused and attempt == 1 and (body is None or isinstance(body, bytes)):
                    continue
                raise self.unreachable(e) from None
            except (OSError, *_CONNECT_ERRORS) as e:
                self._drop_connection()
                raise self.unreachable(e) from None
            break
        if response.will_close:
            self._local.conn = None  # the response owns the socket now; closed once read
        if response.status in set(ok):
            return response
        detail = _error_detail(response)
        self._drop_connection()  # the error body was read only in part
        if response.status in (401, 403):
            raise Unauthorized(self.refused())
        if response.status == 404:
            raise NotFoundOnServer(f"{path}: not found on {self.base_url}")
        if response.status in TRANSIENT_STATUS or 300 <= response.status < 400:
            raise EngineError(f"{self.base_url} answered {response.status} {detail}".strip(), transient=True)
        raise EngineError(f"{self.base_url} answered {response.status} to {method} {path}: {detail}".strip())

    def call(self, method: str, path: str, payload: Any = None, ok: Iterable[int] = (200,), query: str = "") -> Any:
        """A JSON request; the decoded JSON answer (None for an empty body)."""
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if body is not None else None
        response = self.open(method, path, body=body, headers=headers, ok=ok, query=query)
        data = _read_all(response, self)
        return json.loads(data) if data else None

    # -- Contents API and /files --------------------------------------------------------
    def upload(
        self,
        path: str,
        source: Path,
        *,
        chunk_size: int = UPLOAD_CHUNK,
        progress: Callable[[int], None] | None = None,
    ) -> str:
        """Upload one file with JupyterLab's chunked protocol, reading ``chunk_size`` bytes at a time.

        chunk 1 creates (truncates) the file, 2..n-1 append, -1 appends the last one. A file that
        fits in one chunk is saved whole, without ``chunk``: a lone ``-1`` would append to an
        existing file instead of replacing it. Returns the sha256 of the bytes sent, hashed while
        the server is busy with the previous chunk, so the caller knows what left this side.
        """
        size = source.stat().st_size
        digest = hashlib.sha256()
        # Reading, hashing and base64 of chunk n+1 happen in a helper thread while the server
        # digests chunk n; the queue holds one chunk, so memory stays at about three chunks.
        chunks: queue.Queue[tuple[int, bytes] | BaseException | None] = queue.Queue(maxsize=1)
        stop = threading.Event()

        def produce() -> None:
            try:
                with open(source, "rb") as f:
                    sent = 0
                    while not stop.is_set():
                        data = f.read(chunk_size)
                        sent += len(data)
                        digest.update(data)
                        chunks.put((len(data), base64.b64encode(data)))
                        del data
                        if sent >= size:
                            break
                chunks.put(None)
            except BaseException as e:  # handed to the uploading thread
                chunks.put(e)

        producer = threading.Thread(target=produce, name="jrc-upload-read", daemon=True)
        producer.start()
        try:
            number = 1
            item = chunks.get()
            while item is not None:
                if isinstance(item, BaseException):
                    raise item
                n, encoded = item
                following = chunks.get()
                last = following is None
                if number == 1 and last:
                    head = b'{"type":"file","format":"base64","content":"'
                else:
                    head = b'{"type":"file","format":"base64","chunk":%d,"content":"' % (-1 if last else number)
                tail = b'"}'
                response = self.open(
                    "PUT",
                    "api/contents/" + path,
                    body=(head, encoded, tail),
                    length=len(head) + len(encoded) + len(tail),
                    headers={"Content-Type": "application/json"},
                    ok=(200, 201),
                    timeout=max(self.timeout, 120.0),
                )
                _read_all(response, self)
                del encoded
                if progress:
                    progress(n)
                number += 1
                item = following
        finally:
            stop.set()
            while producer.is_alive():  # unblock a producer waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    chunks.get_nowait()
                producer.join(0.01)
        return digest.hexdigest()

    def mkdir(self, path: str) -> None:
        self.call("PUT", "api/contents/" + path, {"type": "directory"}, ok=(200, 201))

    def exists(self, path: str) -> bool:
        try:
            self.call("GET", "api/contents/" + path, query="content=0")
        except NotFoundOnServer:
            return False
        return True

    def download(self, path: str, sink: BinaryIO, progress: Callable[[int], None] | None = None) -> int:
        """Stream ``/files/<path>`` into ``sink``; return the byte count."""
        done = 0
        for block in self.stream(path):
            sink.write(block)
            done += len(block)
            if progress:
                progress(len(block))
        return done

    def stream(self, path: str) -> Iterator[bytes]:
        """``/files/<path>`` as it arrives, one plain GET: for a reader that parses as it goes."""
        response = self.open("GET", "files/" + path, timeout=max(self.timeout, 120.0))
        whole = False
        try:
            while block := response.read(DOWNLOAD_BLOCK):
                yield block
            whole = True
        except (OSError, http.client.HTTPException) as e:
            raise self.unreachable(e) from None
        finally:
            response.close()
            if not whole:  # left with body unread (an error, or the reader stopped): not reusable
                self._drop_connection()
        if response.length not in (None, 0):
            self._drop_connection()
            raise EngineError(f"the download of {path} from {self.base_url} ended early", transient=True)

    def ranges(self, path: str, size: int, *, streams: int, piece: int = RANGE_PIECE) -> Iterator[bytes | bytearray]:
        """``/files/<path>`` (``size`` bytes), in order, from ``streams`` concurrent ranged GETs.

        Each worker thread has its own connection; at most ``streams`` pieces wait ahead of the
        reader, so memory stays at a few pieces. A server that ignores ``Range`` (200) is read whole.
        """
        first = self._piece(path, 0, piece) if size > piece and streams > 1 else None
        if first is None:
            yield from self.stream(path)
            return
        yield first
        pieces = [(start, min(start + piece, size)) for start in range(len(first), size, piece)]
        ready: dict[int, bytearray | BaseException] = {}
        cond = threading.Condition()
        handed = taken = 0
        stop = False

        def work() -> None:
            nonlocal handed
            try:
                while True:
                    with cond:
                        while not stop and handed < len(pieces) and handed >= taken + streams:
                            cond.wait()
                        if stop or handed >= len(pieces):
                            return
                        index = handed
                        handed += 1
                    data: bytearray | BaseException | None
                    try:
                        data = self._piece(path, *pieces[index])
                        if data is None:
                            data = EngineError(f"{self.base_url} stopped honouring Range for {path}", transient=True)
                    except BaseException as e:  # handed to the reading thread
                        data = e
                    with cond:
                        ready[index] = data
                        cond.notify_all()
            finally:
                self._drop_connection()  # this thread's own connection ends with it

        workers = [threading.Thread(target=work, name="jrc-range", daemon=True) for _ in range(streams)]
        for worker in workers:
            worker.start()
        try:
            for index in range(len(pieces)):
                with cond:
                    while index not in ready:
                        cond.wait()
                    data = ready.pop(index)
                    taken = index + 1
                    cond.notify_all()
                if isinstance(data, BaseException):
                    raise data
                yield data
        finally:
            with cond:
                stop = True
                cond.notify_all()
            for worker in workers:
                worker.join()

    def _piece(self, path: str, start: int, end: int) -> bytearray | None:
        """Bytes ``start .. end`` of ``/files/<path>``, exactly; None if the server sent the whole file (200)."""
        response = self.open(
            "GET", "files/" + path, headers={"Range": f"bytes={start}-{end - 1}"}, ok=(206, 200),
            timeout=max(self.timeout, 120.0),
        )  # fmt: skip
        if response.status == 200:
            response.close()
            self._drop_connection()
            return None
        buf = bytearray(end - start)
        view = memoryview(buf)
        got = 0
        try:
            while got < len(buf):
                n = response.readinto(view[got:])
                if not n:
                    break
                got += n
        except (OSError, http.client.HTTPException) as e:
            self._drop_connection()
            raise self.unreachable(e) from None
        finally:
            response.close()
        if got != len(buf):
            self._drop_connection()
            raise EngineError(f"the download of {path} from {self.base_url} ended early", transient=True)
        return buf

    def read_range(self, path: str, offset: int, limit: int) -> bytes | None:
        """Bytes ``offset .. offset+limit`` of ``/files/<path>``; None if the server ignores ``Range``."""
        end = offset + limit - 1
        try:
            response = self.open("GET", "files/" + path, headers={"Range": f"bytes={offset}-{end}"}, ok=(206, 200, 416))
        except NotFoundOnServer:
            return b""
        if response.status == 416:  # nothing at or after ``offset`` yet
            _read_all(response, self)
            return b""
        if response.status == 200:
            # The whole file is coming: don't read it, drop the connection instead.
            response.close()
            self._drop_connection()
            return None
        return _read_all(response, self)

    # -- kernels --------------------------------------------------------------------------
    def start_kernel(self, name: str) -> str:
        # path "" starts the kernel in the server's root_dir, where Contents paths are rooted.
        return self.call("POST", "api/kernels", {"name": name, "path": ""}, ok=(200, 201))["id"]

    def delete_kernel(self, kernel_id: str) -> None:
        with contextlib.suppress(NotFoundOnServer):
            self.open("DELETE", "api/kernels/" + kernel_id, ok=(204, 200)).read()


def _read_all(response: http.client.HTTPResponse, client: ServerClient) -> bytes:
    try:
        return response.read()
    except (OSError, http.client.HTTPException) as e:
        client._drop_connection()
        raise client.unreachable(e) from None


def _error_detail(response: http.client.HTTPResponse) -> str:
    """A short reason from an error response (jupyter_server sends JSON with ``message``)."""
    try:
        raw = response.read(4096)
    except (OSError, http.client.HTTPException):
        return response.reason or ""
    finally:
        response.close()
    try:
        message = json.loads(raw).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or response.reason or "")[:300]


def progress_adder(progress: ProgressCallback | None, total: int, start: int = 0) -> Callable[[int], None]:
    """A per-block counter that reports (done, total) to the lifecycle's callback."""
    done = start

    def add(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    return add
