"""Who may use each of the organization's machines: an access list of hub users and groups, on a real hub.

rcadmin sets the lists (the service's API and the CLI in his server); rcalice and rcbob are in the hub
group ``rcteam`` with the use scope, rceve in no group and without it (``hub_fixture.py``). A machine
limited to ``rcteam`` is rcalice's to see and run on; one limited to rcalice is not rcbob's, though he
holds the use scope: not listed, not his default, and refused by name.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import hub_fixture
import pytest
import sshd_fixture
import test_organization
from hub_fixture import ADMIN_USER, GROUP, OUTSIDER, Hub, loopback_session
from sshd_fixture import TestBed
from test_organization import _as_user, _machines_of, _service, _submitted

sshd_bed = sshd_fixture.sshd_bed
org = test_organization.org  # the hub the group shares (hub_fixture.shared_organization), emptied at the end
REFUSAL = "may not use the organization's machine {!r}: only the users and groups on its access list may; "
GRANTS = "an admin of the organization grants access"


@pytest.fixture(scope="module")
def limited(org: tuple[Hub, Path], sshd_bed: TestBed) -> dict[str, dict[str, Any]]:
    """rcadmin adds the loopback sshd twice: for the group rcteam, and for rcalice alone."""
    hub, _ = org
    options = {k: v for k, v in sshd_bed.options().items() if k in ("known_hosts", "ssh_config", "base_dir")}
    token = hub.user_token(ADMIN_USER)
    added = {}
    for name, access in (("team-only", {"groups": [GROUP]}), ("alice-only", {"users": ["rcalice"]})):
        body = {"name": name, "kind": "ssh", "address": "testbox", "options": options, "access": access}
        answer = _service(hub, "POST", "api/machines", token, json=body)
        assert answer.status_code == 201, answer.text
        added[name] = answer.json()
    return added


def _listed(hub: Hub, token: str) -> list[str]:
    answer = _service(hub, "GET", "api/machines", token)
    assert answer.status_code == 200, answer.text
    return [m["name"] for m in answer.json()["machines"]]


def _prepare(hub: Hub, token: str, machine: str) -> Any:
    return _service(hub, "PUT", f"api/jobs/acl-{uuid.uuid4().hex[:8]}", token, json={"machine": machine, "key": "k"})


def test_a_machine_limited_to_a_group_is_its_members_to_see_and_run_on(
    org: tuple[Hub, Path], limited: dict[str, dict[str, Any]]
) -> None:
    hub, state = org
    assert limited["team-only"]["access"] == {"users": [], "groups": [GROUP]}
    assert "access:\n      groups:\n      - rcteam" in (state / ".punica" / "compute.yaml").read_text()
    server = hub.start_server("rcalice")
    panel = {m["name"]: m for m in _machines_of(server)["machines"]}
    assert panel["team-only"]["owner"] == "organization" and panel["alice-only"]["owner"] == "organization"
    assert "access" not in panel["team-only"]  # the lists name other members: an admin's to read
    ran = _as_user(server, "run", "--machine", "team-only", "--", "sh", "-c", "echo ran for the team", timeout=300)
    assert ran.returncode == 0 and "ran for the team" in ran.stdout, ran.stdout + ran.stderr
    # rceve, in no group (and without the use scope), sees neither and is refused a job on it.
    eve = hub.start_server(OUTSIDER)
    assert [m["name"] for m in _machines_of(eve)["machines"]] == ["local"]
    assert _prepare(hub, eve.token, "team-only").status_code == 403


def test_a_member_off_a_machines_list_neither_sees_it_nor_submits_to_it(
    org: tuple[Hub, Path], limited: dict[str, dict[str, Any]]
) -> None:
    hub, _ = org
    bob = hub.start_server("rcbob")
    assert "alice-only" not in [m["name"] for m in _machines_of(bob)["machines"]]
    assert _listed(hub, bob.token) == ["team-only"]
    expected = "rcbob " + REFUSAL.format("alice-only") + GRANTS
    for method, path, body in (
        ("PUT", f"api/jobs/acl-{uuid.uuid4().hex[:8]}", {"machine": "alice-only", "key": "k"}),
        ("GET", "api/machines/alice-only", None),
        ("POST", "api/machines/alice-only/check", None),
        ("POST", "api/machines/alice-only/admit", {}),
    ):
        refused = _service(hub, method, path, bob.token, json=body)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json() == {"code": "forbidden", "message": expected}, refused.text
    # From a terminal of his server, by its name or as org:NAME: the same refusal, before anything is sent.
    for name in ("alice-only", "org:alice-only"):
        ran = _as_user(bob, "run", "--machine", name, "--", "true")
        assert ran.returncode != 0 and expected in ran.stderr, ran.stderr
    # The admin sees every machine, whoever it is for.
    assert _listed(hub, hub.user_token(ADMIN_USER)) == ["team-only", "alice-only"]


def test_a_restricted_default_machine_is_no_default_for_those_off_its_list(
    org: tuple[Hub, Path], limited: dict[str, dict[str, Any]]
) -> None:
    hub, _ = org
    admin = hub.user_token(ADMIN_USER)
    named = _service(hub, "PUT", "api/default-machine", admin, json={"machine": "alice-only"})
    assert named.status_code == 200, named.text
    try:
        alice, bob = hub.user_token("rcalice"), hub.user_token("rcbob")
        assert _service(hub, "GET", "api/default-machine", alice).json()["machine"]["name"] == "alice-only"
        assert _service(hub, "GET", "api/default-machine", bob).json() == {"machine": None, "set_by": None}
        assert _service(hub, "GET", "api/machines", bob).json()["default"] is None
        # His job that names no machine runs where it would without a default: his own server.
        server = hub.start_server("rcbob")
        ran = _as_user(server, "run", "--", "sh", "-c", "echo ran here")
        assert "ran here" in ran.stdout, ran.stderr
        shown = _as_user(server, "jobs", "show", _submitted(ran), "--json")
        assert json.loads(shown.stdout)["machine"] == "local", shown.stdout
    finally:
        assert _service(hub, "DELETE", "api/default-machine", admin).status_code == 204


def test_the_admin_sets_the_list_from_the_cli_and_the_files_comments_stay(
    org: tuple[Hub, Path], limited: dict[str, dict[str, Any]]
) -> None:
    hub, state = org
    compute_yaml = state / ".punica" / "compute.yaml"
    marked = compute_yaml.read_text().replace("  alice-only:", "  # rcalice's thesis runs\n  alice-only:", 1)
    compute_yaml.write_text(marked.replace("      - rcalice", "      - rcalice  # until March", 1))
    admin = hub.start_server(ADMIN_USER)
    edited = _as_user(admin, "machines", "edit", "alice-only", "--org", "--allow-user", "rcalice",
                      "--allow-group", GROUP, "--json")  # fmt: skip
    assert edited.returncode == 0, edited.stderr
    assert json.loads(edited.stdout)["access"] == {"users": ["rcalice"], "groups": [GROUP]}
    text = compute_yaml.read_text()
    assert "# rcalice's thesis runs" in text and "- rcalice  # until March" in text and f"- {GROUP}" in text
    assert "alice-only" in _listed(hub, hub.user_token("rcbob"))  # rcbob is in the group now
    # A member may not change it; nor is a list said of one's own machine.
    bob = hub.start_server("rcbob")
    refused = _as_user(bob, "machines", "edit", "alice-only", "--org", "--allow-user", "rcbob")
    assert refused.returncode != 0 and hub_fixture.ADMIN in refused.stderr, refused.stderr
    own = _as_user(bob, "machines", "edit", "local", "--allow-user", "rcbob")
    assert own.returncode != 0 and "add --org" in own.stderr, own.stderr
    mine = loopback_session().post(
        f"{bob.url}remote-compute/machines", headers={"Authorization": f"token {bob.token}"}, timeout=60,
        json={"name": "his-box", "kind": "ssh", "address": "h.lab", "access": {"users": ["rcbob"]}},
    )  # fmt: skip
    assert mine.status_code == 400 and mine.json()["field"] == "access", mine.text
    cleared = _as_user(admin, "machines", "edit", "alice-only", "--org", "--allow-everyone")
    assert cleared.returncode == 0 and "for every member" in cleared.stdout, cleared.stderr
    assert "# rcalice's thesis runs" in compute_yaml.read_text()
    assert "access" not in json.dumps(_service(hub, "GET", "api/machines/alice-only", hub.user_token("rcbob")).json())
