"""Teams on JupyterHub: the organization service on a real hub, with real Linux users.

The service is this package's (``jupyter-remote-compute organization``), managed by the hub
(``hub_fixture.py``); rcadmin holds the admin scope, rcalice and rcbob use through their group, rceve
neither. Each user's single-user server runs as that Linux user and reaches the service with its own
token, as the README's configuration sets it up.
"""

from __future__ import annotations

import json
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hub_fixture
import pytest
from hub_fixture import ADMIN, ADMIN_USER, OUTSIDER, USE, Hub, HubBed, Server, loopback_session

hub_bed = hub_fixture.hub_bed
TOKEN = "org-token-7f3a9c2e5b1d4f60"  # a machine's token as an admin types it: never in a file or an answer


@pytest.fixture(scope="module")
def org(hub_bed: HubBed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hub, Path]]:
    state = tmp_path_factory.mktemp("organization")
    hub = hub_bed.start(
        ["jupyter-remote-compute", "organization", "--state-dir", str(state)],
        service_environment={
            "JUPYTER_REMOTE_COMPUTE_SECRETS_STORE": "file",
            "JUPYTER_REMOTE_COMPUTE_SECRETS_FILE": str(state / "secrets.json"),
        },
    )
    yield hub, state
    hub.stop()


def _service(hub: Hub, method: str, path: str, token: str | None, **kwargs: Any) -> Any:
    headers = {"Authorization": f"token {token}"} if token else {}
    return loopback_session().request(
        method, hub.service(path), headers=headers, timeout=30, allow_redirects=False, **kwargs
    )


def _machines_of(server: Server) -> dict[str, Any]:
    """What the user's Compute panel reads: GET /remote-compute/machines of their own server."""
    answer = loopback_session().get(
        f"{server.url}remote-compute/machines", headers={"Authorization": f"token {server.token}"}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture(scope="module")
def gpu_box(org: tuple[Hub, Path]) -> dict[str, Any]:
    """rcadmin adds an ssh machine and a Jupyter machine whose token the service keeps."""
    hub, _ = org
    token = hub.user_token(ADMIN_USER)
    ssh = {"name": "gpu-box", "kind": "ssh", "address": "gpu-box.lab", "options": {"user": "train"}}
    added = _service(hub, "POST", "api/machines", token, json=ssh)
    assert added.status_code == 201, added.text
    jupyter = {"name": "lab-jupyter", "kind": "jupyter", "address": "https://jupyter.lab:8888", "token": TOKEN}
    notebook = _service(hub, "POST", "api/machines", token, json=jupyter)
    assert notebook.status_code == 201, notebook.text
    return added.json()


def test_an_admins_machine_is_the_organizations_with_the_admins_name(gpu_box: dict[str, Any]) -> None:
    assert gpu_box["name"] == "gpu-box" and gpu_box["owner"] == "organization" and gpu_box["admin"] == ADMIN_USER


def test_every_member_sees_the_organizations_machines_after_their_own(org: tuple[Hub, Path], gpu_box: Any) -> None:
    hub, _ = org
    server = hub.start_server("rcalice")
    listed = _machines_of(server)
    by_name = {m["name"]: m for m in listed["machines"]}
    assert by_name["local"]["owner"] == "rcalice"
    assert by_name["gpu-box"]["owner"] == "organization" and by_name["gpu-box"]["admin"] == ADMIN_USER
    assert [m["owner"] for m in listed["machines"]].index("organization") > 0  # the user's own come first
    assert listed["organization"]["use"] is True and listed["organization"]["admin"] is False
    assert TOKEN not in json.dumps(listed)


def test_a_user_without_the_use_scope_sees_only_their_own(org: tuple[Hub, Path], gpu_box: Any) -> None:
    hub, _ = org
    server = hub.start_server(OUTSIDER)
    listed = _machines_of(server)
    assert [m["name"] for m in listed["machines"]] == ["local"]
    assert listed["organization"]["use"] is False
    refused = _service(hub, "GET", "api/machines", server.token)
    assert refused.status_code == 403 and USE in refused.json()["message"], refused.text


def test_only_an_admin_changes_the_organizations_machines(org: tuple[Hub, Path], gpu_box: Any) -> None:
    hub, state = org
    member = hub.user_token("rcbob")
    before = (state / ".punica" / "compute.yaml").read_text()
    for method, path, body in (
        ("POST", "api/machines", {"name": "mine", "kind": "ssh", "address": "h.lab"}),
        ("PATCH", "api/machines/gpu-box", {"address": "elsewhere.lab"}),
        ("DELETE", "api/machines/gpu-box", None),
    ):
        refused = _service(hub, method, path, member, json=body)
        assert refused.status_code == 403 and ADMIN in refused.json()["message"], (method, refused.text)
    assert (state / ".punica" / "compute.yaml").read_text() == before
    # No token at all: a browser is sent to the hub's login; an API call is refused.
    assert _service(hub, "GET", "api/machines", None).status_code == 302
    assert _service(hub, "POST", "api/machines", None, json={}).status_code == 403


def test_an_admins_edit_keeps_the_files_comments_and_no_token_is_in_a_file(org: tuple[Hub, Path], gpu_box: Any) -> None:
    hub, state = org
    compute_yaml = state / ".punica" / "compute.yaml"
    compute_yaml.write_text(compute_yaml.read_text().replace("gpu-box:", "# the team's A100 box\n  gpu-box:", 1))
    edited = _service(hub, "PATCH", "api/machines/gpu-box", hub.user_token(ADMIN_USER), json={"address": "gpu2.lab"})
    assert edited.status_code == 200, edited.text
    assert edited.json()["address"] == "gpu2.lab" and edited.json()["admin"] == ADMIN_USER
    text = compute_yaml.read_text()
    assert "# the team's A100 box" in text and "gpu2.lab" in text
    assert TOKEN not in text and TOKEN in (state / "secrets.json").read_text()
    assert TOKEN not in hub.log.read_text(errors="replace")  # the hub's log holds the service's
    assert (state / "secrets.json").stat().st_mode & 0o077 == 0


def test_a_browser_reaches_the_service_through_the_hubs_login(org: tuple[Hub, Path]) -> None:
    hub, _ = org
    session = hub.login(ADMIN_USER)
    me = session.get(hub.service("api/me"), timeout=30)
    assert me.status_code == 200, me.text
    assert me.json() == {"name": ADMIN_USER, "groups": [], "use": True, "admin": True}


def test_the_cli_in_a_users_server_marks_each_machines_owner(org: tuple[Hub, Path], gpu_box: Any) -> None:
    hub, _ = org
    server = hub.start_server("rcbob")
    bob = pwd.getpwnam("rcbob")
    listed = subprocess.run(
        ["jupyter-remote-compute", "machines", "list", "--json"],
        env=server.environment,
        cwd=bob.pw_dir,
        user=bob.pw_uid,
        group=bob.pw_gid,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    owners = {m["name"]: m["owner"] for m in json.loads(listed.stdout)}
    assert owners["local"] == "rcbob" and owners["gpu-box"] == "organization"


def test_the_readmes_hub_configuration_grants_what_the_bed_runs_with() -> None:
    """The README's jupyterhub_config.py, run as JupyterHub runs it: the same service command, scopes,
    roles and server token scopes as the hub these tests start (hub_fixture.py)."""
    from traitlets.config import Config

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("## Teams on JupyterHub") :]
    block = section[
        section.index("```python\n") + len("```python\n") : section.index("\n```", section.index("```python"))
    ]
    config = Config()
    exec(compile(block, "README.md", "exec"), {"get_config": lambda: config})  # as JupyterHub's loader does
    hub = config.JupyterHub
    (service,) = hub.services
    assert service["name"] == hub_fixture.SERVICE and service["command"][1:3] == ["organization", "--state-dir"]
    assert set(service["oauth_client_allowed_scopes"]) == {USE, ADMIN}
    subscopes = {name: scope.get("subscopes") for name, scope in hub.custom_scopes.items()}
    assert subscopes == {name: scope.get("subscopes") for name, scope in hub_fixture.CUSTOM_SCOPES.items()}
    roles = {role["name"]: role for role in hub.load_roles}
    assert f"access:services!service={hub_fixture.SERVICE}" in roles["user"]["scopes"]
    assert roles["remote-compute-users"]["scopes"] == [USE] and roles["remote-compute-admins"]["scopes"] == [ADMIN]
    assert sorted(config.Spawner.server_token_scopes) == sorted(hub_fixture.SERVER_TOKEN_SCOPES)
    assert config.Spawner.environment["REMOTE_COMPUTE_ORG_URL"].endswith(f"/services/{hub_fixture.SERVICE}/")
