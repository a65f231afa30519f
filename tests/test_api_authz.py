"""Who may call what: authentication, the Authorizer's read/write/execute on ``remote-compute``, XSRF.

Every route and verb of the handler table is listed here with the action it needs, written out
by hand (not derived from the handlers), and the table must cover exactly what the server serves.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from jupyter_server.auth import Authorizer
from tornado.httpclient import HTTPClientError

from jupyter_remote_compute.routes import API_ROUTES

#: (path under /remote-compute/, verb) → the Authorizer action it needs.
ACTIONS: dict[tuple[str, str], str] = {
    ("machines", "GET"): "read",
    ("machines", "POST"): "write",
    ("machines/{name}", "GET"): "read",
    ("machines/{name}", "PATCH"): "write",
    ("machines/{name}", "DELETE"): "write",
    ("machines/{name}/check", "POST"): "write",
    ("machines/{name}/trust", "POST"): "write",
    ("pools", "GET"): "read",
    ("pools/{name}", "PUT"): "write",
    ("pools/{name}", "DELETE"): "write",
    ("jobs", "GET"): "read",
    ("jobs", "POST"): "execute",
    ("jobs/prune", "POST"): "write",
    ("jobs/{job_id}", "GET"): "read",
    ("jobs/{job_id}", "DELETE"): "write",
    ("jobs/{job_id}/cancel", "POST"): "execute",
    ("jobs/{job_id}/log", "GET"): "read",
    ("jobs/{job_id}/metrics", "GET"): "read",
    ("steps", "GET"): "read",
    ("schemas/{type_name}", "GET"): "read",
    ("kinds", "GET"): "read",
    ("mlflow", "GET"): "read",
    ("pipelines/runs", "GET"): "read",
    ("pipelines/runs", "POST"): "execute",
    ("pipelines/sweeps", "POST"): "execute",
    ("pipelines/runs/{run_id}", "GET"): "read",
    ("pipelines/runs/{run_id}/cancel", "POST"): "execute",
    ("pipelines/validate", "POST"): "read",
    ("usage", "GET"): "read",
    ("secrets", "GET"): "read",
    ("secrets/{secret_name}", "PUT"): "write",
    ("secrets/{secret_name}", "DELETE"): "write",
    # The organization's admin routes, passed on to its service (404 outside a hub, past the check here).
    ("organization/machines", "POST"): "write",
    ("organization/machines/{name}", "PATCH"): "write",
    ("organization/machines/{name}", "DELETE"): "write",
    ("organization/machines/{name}/check", "POST"): "write",
    ("organization/default-machine", "PUT"): "write",
    ("organization/default-machine", "DELETE"): "write",
    ("organization/tracking", "GET"): "read",
    ("organization/tracking", "PUT"): "write",
    ("organization/tracking", "DELETE"): "write",
    ("organization/secrets", "GET"): "read",
    ("organization/secrets/{secret_name}", "PUT"): "write",
    ("organization/secrets/{secret_name}", "DELETE"): "write",
    ("organization/jobs", "GET"): "read",
    ("organization/usage", "GET"): "read",
    ("organization/quotas", "GET"): "read",
    ("organization/quotas/{who}/{name}", "PUT"): "write",
    ("organization/quotas/{who}/{name}", "DELETE"): "write",
}
IDS = {
    "name": "nobox",
    "job_id": "nojob",
    "secret_name": "no/such-secret",
    "run_id": "norun",
    "who": "user",
    "type_name": "NoSuchType",
}
REFUSED: set[str] = set()  # the actions RefusingAuthorizer refuses on remote-compute, set by each test


class RefusingAuthorizer(Authorizer):
    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return not (resource == "remote-compute" and action in REFUSED)


@pytest.fixture
def jp_server_config(jp_server_config: dict) -> dict:
    return {**jp_server_config, "ServerApp": {**jp_server_config["ServerApp"], "authorizer_class": RefusingAuthorizer}}


def _url(base: str, route: str) -> str:
    return base + "remote-compute/" + route.format(**IDS)


def _body(verb: str) -> bytes | None:
    return b"{}" if verb in ("POST", "PATCH", "PUT") else None


async def _status(client: Any, url: str, verb: str, headers: dict[str, str]) -> tuple[int, dict | None]:
    try:
        response = await client.fetch(url, method=verb, body=_body(verb), headers=headers, raise_error=True)
    except HTTPClientError as e:
        response = e.response
    body = json.loads(response.body) if response.body else None
    return response.code, body


def test_the_table_covers_every_route_and_verb_served() -> None:
    served = set()
    for pattern, handler in API_ROUTES:
        route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern).removeprefix("/remote-compute/")
        served |= {(route, verb) for verb in ("GET", "POST", "PATCH", "PUT", "DELETE") if verb.lower() in vars(handler)}
    assert served == set(ACTIONS)


async def test_without_credentials_every_route_is_a_403_error(http_server_client, jp_base_url) -> None:
    for (route, verb), _ in [*ACTIONS.items(), (("no/such/route", "GET"), "read")]:
        code, body = await _status(http_server_client, _url(jp_base_url, route), verb, {})
        assert code == 403, (route, verb)
        assert body is not None and body["code"] == "forbidden" and body["message"], (route, verb, body)


@pytest.mark.parametrize("refused", ["read", "write", "execute"])
async def test_a_refused_action_is_a_403_exactly_where_it_is_needed(
    refused: str, http_server_client, jp_base_url, jp_auth_header
) -> None:
    REFUSED.clear()
    REFUSED.add(refused)
    try:
        for (route, verb), action in ACTIONS.items():
            code, body = await _status(http_server_client, _url(jp_base_url, route), verb, dict(jp_auth_header))
            if action == refused:
                assert code == 403 and body and body["code"] == "forbidden", (route, verb, code, body)
            else:
                # Allowed through: whatever the call itself answers (a 404 for the made-up ids), not a refusal.
                assert code != 403 and (body is None or body.get("code") != "forbidden"), (route, verb, code, body)
    finally:
        REFUSED.clear()


async def test_a_cookie_without_the_xsrf_token_cannot_change_anything(
    http_server_client, jp_base_url, jp_auth_header
) -> None:
    # A token-authenticated request gets the login cookie; from then on the browser's way is cookie + XSRF.
    first = await http_server_client.fetch(_url(jp_base_url, "machines"), headers=dict(jp_auth_header))
    login = "; ".join(c.split(";", 1)[0] for c in first.headers.get_list("Set-Cookie") if "_xsrf" not in c)
    assert login, "the server set no login cookie"
    code, _ = await _status(http_server_client, _url(jp_base_url, "machines"), "GET", {"Cookie": login})
    assert code == 200  # the cookie alone is enough to read
    xsrf = "2|deadbeef|0123456789abcdef0123456789abcdef|1700000000"
    for (route, verb), _ in ACTIONS.items():
        if verb == "GET":
            continue
        code, body = await _status(http_server_client, _url(jp_base_url, route), verb, {"Cookie": login})
        assert code == 403 and body and body["code"] == "forbidden", (route, verb, code, body)
        # The same request with the XSRF cookie and header passes the check (and meets the id it made up).
        with_xsrf = {"Cookie": f"{login}; _xsrf={xsrf}", "X-XSRFToken": xsrf}
        code, body = await _status(http_server_client, _url(jp_base_url, route), verb, with_xsrf)
        assert code != 403, (route, verb, code, body)
