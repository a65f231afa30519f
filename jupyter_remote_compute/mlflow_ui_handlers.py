"""The routes of MLflow's UI: where it is (``GET /remote-compute/mlflow``) and the proxy to it.

The proxy (``/remote-compute/mlflow-ui/…``) is a Jupyter handler: a request without Jupyter's
credentials is refused before anything reaches MLflow, and every request is authorized as a read
(GET, HEAD) or write (the rest) of the ``remote-compute`` resource. MLflow's own page posts its
searches without Jupyter's XSRF token, so a cookie-authenticated write is let through only when the
browser says it came from this same origin (``Origin`` equal to the host, or ``Sec-Fetch-Site:
same-origin``), which another site cannot forge. Its answers may be framed by this origin only
(``frame-ancestors 'self'``), so JupyterLab's tab shows them also where the server forbids every
frame (a JupyterHub single-user server sends ``frame-ancestors 'none'``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from tornado.httpclient import HTTPClientError, HTTPRequest

from .handlers import PREFIX, RemoteComputeHandler, api
from .mlflow_ui import MlflowUI, MlflowUIUnavailable

#: Headers that belong to one hop, never forwarded either way.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
        "Transfer-Encoding", "Upgrade", "Content-Length", "Host", "Cookie", "Authorization",
    )
)  # fmt: skip
#: Response headers Jupyter sets itself (its CSP keeps frames to this origin) or tornado computes.
_KEPT_FROM_JUPYTER = frozenset({"content-length", "transfer-encoding", "connection", "server", "date", "set-cookie"})
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_FRAME_ANCESTORS = re.compile(r"(^|;)(\s*)frame-ancestors[^;]*", re.IGNORECASE)
PROXY_TIMEOUT = 120.0


def mlflow_ui(settings: dict[str, Any]) -> MlflowUI:
    return settings["remote_compute_mlflow_ui"]


class MlflowHandler(RemoteComputeHandler):
    @api
    async def get(self) -> None:
        """Where MLflow's UI for this workspace's runs is: the tracking server's, or proxied by this server."""
        self.reply(mlflow_ui(self.settings).describe())


class MlflowUIProxyHandler(JupyterHandler):
    """Everything under ``/remote-compute/mlflow-ui/`` goes to the MLflow UI this server started."""

    auth_resource = "remote-compute"
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")  # type: ignore[assignment]

    @property
    def content_security_policy(self) -> str:
        """The server's policy with framing by this same origin: JupyterLab's tab, and nobody else."""
        policy = super().content_security_policy
        if _FRAME_ANCESTORS.search(policy):
            return _FRAME_ANCESTORS.sub(r"\1\2frame-ancestors 'self'", policy, count=1)
        return "; ".join(p for p in ("frame-ancestors 'self'", policy.strip()) if p)

    def check_xsrf_cookie(self) -> None:
        try:
            super().check_xsrf_cookie()
        except tornado.web.HTTPError:
            if self.request.method in _SAFE or not self._same_origin():
                raise

    def _same_origin(self) -> bool:
        if self.request.headers.get("Sec-Fetch-Site") == "same-origin":
            return True
        origin = self.request.headers.get("Origin")
        return bool(origin) and urlparse(origin).netloc == self.request.host

    @tornado.web.authenticated
    @authorized
    async def get(self, rest: str | None = None) -> None:
        if not rest:
            # MLflow's page loads its assets relative to the folder: it must be asked for with the slash.
            self.redirect(self.request.path + "/", permanent=False)
            return
        await self._forward()

    @tornado.web.authenticated
    @authorized
    async def head(self, rest: str | None = None) -> None:
        await self._forward()

    @tornado.web.authenticated
    @authorized
    async def post(self, rest: str | None = None) -> None:
        await self._forward()

    @tornado.web.authenticated
    @authorized
    async def put(self, rest: str | None = None) -> None:
        await self._forward()

    @tornado.web.authenticated
    @authorized
    async def patch(self, rest: str | None = None) -> None:
        await self._forward()

    @tornado.web.authenticated
    @authorized
    async def delete(self, rest: str | None = None) -> None:
        await self._forward()

    async def _forward(self) -> None:
        ui = mlflow_ui(self.settings)
        try:
            client = await ui.ensure_started()
        except MlflowUIUnavailable as e:
            self.set_status(e.status)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(e.message)
            return
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in _HOP_BY_HOP}
        if "Origin" in headers:
            # Checked above; MLflow's CORS guard sees its own origin, as for a page it served itself.
            headers["Origin"] = ui.url("")
        headers.pop("Referer", None)
        method = self.request.method or "GET"
        request = HTTPRequest(
            ui.url(self.request.uri or "/"),
            method=method,
            headers=headers,
            body=self.request.body if method in {"POST", "PUT", "PATCH"} else None,
            allow_nonstandard_methods=True,
            follow_redirects=False,
            decompress_response=False,
            request_timeout=PROXY_TIMEOUT,
        )
        try:
            response = await client.fetch(request, raise_error=False)
        except (HTTPClientError, OSError) as e:
            self.set_status(502)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"MLflow's UI did not answer: {e}")
            return
        self.set_status(response.code, response.reason)
        seen: set[str] = set()
        for name, value in response.headers.get_all():
            key = name.lower()
            if key in _HOP_BY_HOP or key in _KEPT_FROM_JUPYTER:
                continue
            (self.add_header if key in seen else self.set_header)(name, value)
            seen.add(key)
        if response.body and method != "HEAD":
            self.write(response.body)
        self.finish()


#: Part of the API (openapi.yaml); ``routes.py`` registers them.
MLFLOW_HANDLERS: list[tuple[str, type[RemoteComputeHandler]]] = [(rf"{PREFIX}/mlflow", MlflowHandler)]
#: A page and its assets, not part of the API: registered before the prefix's fallback.
MLFLOW_UI_PROXY: tuple[str, type[JupyterHandler]] = (rf"{PREFIX}/mlflow-ui(?P<rest>/.*)?", MlflowUIProxyHandler)
