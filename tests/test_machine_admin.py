"""Adding, editing and trusting machines through the service every face uses (real keyring, real sshd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sshd_fixture

from jupyter_remote_compute.errors import Conflict, InvalidSettings, MachineError
from jupyter_remote_compute.secrets import SecretStore

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

ADDRESS = "http://127.0.0.1:9"  # a jupyter machine is never reached by these tests


def _name() -> str:
    # The test keyring lives for the whole session: each test uses names of its own.
    return "m-" + uuid.uuid4().hex[:10]


# -- a refused add or edit leaves the Secret Manager alone --------------------------------------------------
def test_a_refused_duplicate_add_keeps_the_existing_machines_token(workspace: Path, make_service) -> None:
    service = make_service(workspace)
    name = _name()
    service.admin.add(name, "jupyter", ADDRESS, token="first-token-value")
    with pytest.raises(Conflict):
        service.admin.add(name, "jupyter", ADDRESS, token="second-token-value")
    assert SecretStore().get(f"compute/{name}") == "first-token-value"


def test_a_refused_stale_add_leaves_no_orphan_secret(workspace: Path, make_service) -> None:
    service = make_service(workspace)
    name = _name()
    with pytest.raises(Conflict):
        service.admin.add(name, "jupyter", ADDRESS, token="stale-token-value", expected_version="0" * 64)
    assert SecretStore().get(f"compute/{name}") is None
    assert f"compute/{name}" not in SecretStore().names()


def test_an_add_with_invalid_options_stores_no_token(workspace: Path, make_service) -> None:
    service = make_service(workspace)
    name = _name()
    with pytest.raises(InvalidSettings) as info:
        service.admin.add(name, "jupyter", ADDRESS, {"no_such_option": 1}, token="never-stored-value")
    assert info.value.field == "options.no_such_option"
    assert SecretStore().get(f"compute/{name}") is None


def test_a_refused_stale_edit_keeps_the_old_token(workspace: Path, make_service) -> None:
    service = make_service(workspace)
    name = _name()
    service.admin.add(name, "jupyter", ADDRESS, token="old-token-value")
    with pytest.raises(Conflict):
        service.admin.update(name, token="new-token-value", expected_version="0" * 64)
    assert SecretStore().get(f"compute/{name}") == "old-token-value"
    service.admin.update(name, token="new-token-value", expected_version=service.machines.version())
    assert SecretStore().get(f"compute/{name}") == "new-token-value"


def test_an_accepted_add_stores_the_token_under_the_name_the_file_keeps(workspace: Path, make_service) -> None:
    service = make_service(workspace)
    name = _name()
    machine = service.admin.add(name, "jupyter", ADDRESS, token="kept-token-value")
    assert machine.options["token_secret"] == f"compute/{name}"
    assert SecretStore().get(f"compute/{name}") == "kept-token-value"
    assert "kept-token-value" not in service.workspace.compute_yaml.read_text()


# -- trusting an SSH host key from the command line ----------------------------------------------------------
def _cli(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_remote_compute.cli", "--workspace", str(workspace), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )


def _system_ssh_accepts(bed: sshd_fixture.TestBed, known_hosts: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
         "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "-i", str(bed.user_key), "-p", str(bed.sshd.port), f"{bed.user}@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture
def untrusted(workspace: Path, make_service, ssh_agent_env):  # type: ignore[no-untyped-def]
    known_hosts = workspace / "known_hosts"
    known_hosts.write_text("")
    service = make_service(workspace)
    service.machines.add("fresh", "ssh", "127.0.0.1", ssh_agent_env.options(known_hosts=str(known_hosts)))
    with pytest.raises(MachineError) as info:
        service.admin.check("fresh")
    return known_hosts, info.value.details["host_key"]


def test_trust_without_a_fingerprint_shows_the_key_and_trusts_nothing(workspace: Path, untrusted) -> None:
    known_hosts, host_key = untrusted
    proc = _cli(workspace, "machines", "trust", "fresh")
    assert proc.returncode != 0
    assert host_key["type"] in proc.stdout + proc.stderr and host_key["fingerprint"] in proc.stdout + proc.stderr
    assert known_hosts.read_text() == ""


def test_trust_refuses_a_fingerprint_the_machine_does_not_present(workspace: Path, untrusted) -> None:
    known_hosts, host_key = untrusted
    wrong = "SHA256:" + "A" * 43
    proc = _cli(workspace, "machines", "trust", "fresh", "--fingerprint", wrong)
    assert proc.returncode != 0
    assert host_key["fingerprint"] in proc.stderr and "Traceback" not in proc.stderr
    assert known_hosts.read_text() == ""


def test_trust_with_the_presented_fingerprint_satisfies_the_system_ssh(
    workspace: Path, untrusted, ssh_agent_env
) -> None:
    known_hosts, host_key = untrusted
    assert _system_ssh_accepts(ssh_agent_env, known_hosts).returncode != 0  # nothing known yet
    proc = _cli(workspace, "machines", "trust", "fresh", "--fingerprint", host_key["fingerprint"], "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"name": "fresh", "fingerprint": host_key["fingerprint"], "trusted": True}
    accepted = _system_ssh_accepts(ssh_agent_env, known_hosts)
    assert accepted.returncode == 0, accepted.stderr


# -- who may use an organization's machine (its access list, org/organization.py) ---------------------------
def test_an_access_list_is_kept_in_compute_yaml_with_its_comments_and_checked(workspace: Path, make_service) -> None:
    admin = make_service(workspace).admin
    name = _name()
    access = {"users": ["ana", "ana"], "groups": []}
    body = {"name": name, "kind": "jupyter", "address": ADDRESS, "token": "a-token-value", "access": access}
    with pytest.raises(InvalidSettings) as own:
        admin.add_from(body)  # a user's own machine is theirs alone
    assert own.value.field == "access"
    machine = admin.add_from(body, shared=True)
    assert machine.to_json()["access"] == {"users": ["ana"], "groups": []}
    compute_yaml = workspace / ".punica" / "compute.yaml"
    compute_yaml.write_text(compute_yaml.read_text().replace("      - ana", "      - ana  # the lab's PI", 1))
    edited = admin.update_from(name, {"access": {"users": ["ana"], "groups": ["lab"]}}, shared=True)
    assert edited.access is not None and edited.access.admits("bo", ["lab"]) and not edited.access.admits("bo", [])
    assert "- ana  # the lab's PI" in compute_yaml.read_text()
    for bad, field in (({"users": [" ana"]}, "access.users[0]"), ({"people": []}, "access.people")):
        with pytest.raises(InvalidSettings) as refused:
            admin.update_from(name, {"access": bad}, shared=True)
        assert refused.value.field == field
    assert admin.update_from(name, {"access": {}}, shared=True).access is None  # empty: every member
    assert "access" not in compute_yaml.read_text()
    # Written by hand, a list is checked as the file is read, naming its line.
    compute_yaml.write_text(compute_yaml.read_text() + "    access: {users: ana}\n")
    with pytest.raises(Exception, match=r"line \d+: machine '.*': access.users must be a list of JupyterHub names"):
        admin.get(name)
