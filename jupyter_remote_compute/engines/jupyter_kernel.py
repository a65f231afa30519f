"""A Jupyter kernel as the jupyter engine talks to it: one websocket (``websocket-client``, a
jupyter_server dependency) that evaluates an expression quietly, and the expressions that run an
operation of the far side's program (``farside/kernel.py``) there.

The kernel's answers never echo a secret: start's expression holds the job's secret environment,
so errors are scrubbed of it and carry only the exception's name and message.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import datetime as dt
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import websocket

from . import farside
from .base import EngineError
from .jupyter_contents import TRANSIENT_STATUS, KernelGone, RemoteCodeError, ServerClient, Unauthorized

_FAR_B64 = base64.b64encode(farside.kernel_program().encode()).decode()


def far_expression(op: str, args: Sequence[Any], blob: bytes | None = None) -> str:
    """One Python expression that runs ``op(*args[, blob])`` of ``farside/kernel.py`` in a namespace of its own.

    It travels as a user expression of an otherwise empty execute request: the kernel ``eval``s
    it directly, skipping IPython's cell machinery (input transformers, which crawl over
    megabytes of base64, and the linecache copy of every cell, which would keep start's secrets).
    ``blob`` (bulk data) rides as its own base64 literal rather than inside the JSON arguments.
    """
    payload = base64.b64encode(json.dumps([op, list(args)]).encode()).decode()
    extra = "" if blob is None else ", '" + base64.b64encode(blob).decode("ascii") + "'"
    return (
        "(lambda b, j, ns: (exec(compile(b.b64decode('" + _FAR_B64 + "'), '<jupyter-remote-compute>', 'exec'), ns),"
        " ns['call'](*j.loads(b.b64decode('" + payload + "'))" + extra + "))[1])"
        "(__import__('base64'), __import__('json'), {'__name__': '__jrc_far__'})"
    )


def decode_answer(value: str) -> Any:
    """A far-side operation's answer: ``B`` and base64 bytes, or ``J`` and base64 JSON."""
    kind, body = value[:1], value[1:]
    data = base64.b64decode(body)
    return data if kind == "B" else json.loads(data)


class KernelChannel:
    """One websocket to one kernel; runs code quietly and returns a value from it."""

    def __init__(self, client: ServerClient, kernel_id: str, timeout: float = 30.0) -> None:
        self.client = client
        self.kernel_id = kernel_id
        self.session = uuid.uuid4().hex
        scheme = "wss" if client.https else "ws"
        url = (
            f"{scheme}://{client.host}:{client.port}{client.url_path('api/kernels/' + kernel_id + '/channels')}"
            f"?session_id={self.session}"
        )
        sslopt = {"context": client.ssl_context} if client.ssl_context else None
        try:
            self.ws = websocket.create_connection(
                url,
                header=["Authorization: " + client.token().header()],
                sslopt=sslopt,
                timeout=timeout,
                suppress_origin=True,  # a non-browser client; an Origin would have to match the server's host
                enable_multithread=True,
                skip_utf8_validation=True,  # pure-Python validation of megabyte frames; json.loads checks anyway
            )
        except websocket.WebSocketBadStatusException as e:
            if e.status_code in (401, 403):
                raise Unauthorized(client.refused()) from None
            if e.status_code == 404:
                raise KernelGone(f"kernel {kernel_id} is gone from {client.base_url}") from None
            transient = e.status_code in TRANSIENT_STATUS or 300 <= e.status_code < 400
            raise EngineError(
                f"{client.base_url} refused the kernel connection ({e.status_code})", transient=transient
            ) from None
        except (OSError, websocket.WebSocketException) as e:
            raise client.unreachable(e) from None

    def execute(self, expression: str, timeout: float, *, scrub: Iterable[str] = ()) -> str:
        """Evaluate ``expression`` (which must yield a str) in the kernel and return its value.

        It is sent as a user expression of an empty, ``silent``, ``store_history=False`` execute
        request: IPython neither numbers it, broadcasts it on iopub, caches it as a cell nor
        writes it to its history database, which matters because start's expression carries the
        job's secret environment. The value comes back in the reply (on this connection only),
        not as printed output.
        """
        msg_id = uuid.uuid4().hex
        message = {
            "header": {
                "msg_id": msg_id,
                "username": "jupyter-remote-compute",
                "session": self.session,
                "date": dt.datetime.now(dt.timezone.utc).isoformat(),
                "msg_type": "execute_request",
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": {},
            "content": {
                "code": "",
                "silent": True,
                "store_history": False,
                "user_expressions": {"value": expression},
                "allow_stdin": False,
                "stop_on_error": False,
            },
            "channel": "shell",
            "buffers": [],
        }
        deadline = time.monotonic() + timeout
        try:
            self.ws.send(json.dumps(message))
            del message
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:  # as the socket's own timeout below: a busy kernel may answer later
                    raise EngineError(
                        f"the kernel on {self.client.base_url} did not answer within {timeout:.0f}s", transient=True
                    )
                self.ws.settimeout(remaining)
                frame = self.ws.recv()
                if isinstance(frame, bytes):
                    continue  # binary frames carry buffers; ours never do
                reply = json.loads(frame)
                if reply.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if reply.get("msg_type") == "status" and reply["content"].get("execution_state") == "dead":
                    raise KernelGone(f"the kernel on {self.client.base_url} died")
                if reply.get("channel") == "shell" and reply.get("msg_type") == "execute_reply":
                    return _expression_value(reply["content"], self.client.base_url, scrub)
        except websocket.WebSocketTimeoutException:
            raise EngineError(
                f"the kernel on {self.client.base_url} did not answer within {timeout:.0f}s", transient=True
            ) from None
        except (OSError, websocket.WebSocketException) as e:
            raise self.client.unreachable(e) from None

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a socket that is already broken
            self.ws.close(timeout=1)


def _expression_value(content: dict[str, Any], where: str, scrub: Iterable[str]) -> str:
    def clean(text: str) -> str:
        for value in scrub:
            if value:
                text = text.replace(value, "***")
        return text

    if content.get("status") != "ok":
        # ename and evalue only: a traceback can quote the code, and start's code holds secrets.
        raise RemoteCodeError(
            clean(f"code failed in the kernel on {where}: {content.get('ename')}: {content.get('evalue')}")
        )
    result = content.get("user_expressions", {}).get("value", {})
    if result.get("status") != "ok":
        raise RemoteCodeError(
            clean(f"code failed in the kernel on {where}: {result.get('ename')}: {result.get('evalue')}")
        )
    text = result.get("data", {}).get("text/plain", "")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise EngineError(f"the kernel on {where} answered something unexpected") from None
    if not isinstance(value, str):
        raise EngineError(f"the kernel on {where} answered something unexpected")
    return value
