"""A job in a container image on the organization's ssh machine, on the real hub with real rootless podman.

rcbob's job names an image (the marked Debian image of ``test_containers.py``, in the ssh test user's
rootless store) and the organization's ``team-ssh``; his server builds the same container command as for
a machine of his own, the service starts it there with the organization's key, and the image's pin is
kept in his own folder on the machine, beside his jobs. Its output, the log line naming the image's
digest and the MLflow run's image tags land as for his own machine. The machine's own image options
(a default image, the containers' network) are his jobs' defaults there too.
"""

from __future__ import annotations

import json
import os
import pwd
import uuid
from pathlib import Path
from urllib.parse import quote

import sshd_fixture
import test_container_registry
import test_containers
import test_organization
from hub_fixture import ADMIN_USER, Hub
from sshd_fixture import TestBed
from test_container_registry import Registry, _files_holding
from test_containers import MARKER, BuiltImage
from test_organization import _as_user, _far_users, _mlflow_run, _service, run_through_server

from jupyter_remote_compute.environments import image as images

sshd_bed = sshd_fixture.sshd_bed
org = test_organization.org  # the hub the group shares (hub_fixture.shared_organization), emptied at the end
team_ssh = test_organization.team_ssh
test_image = test_containers.test_image
rootless_user = test_containers.rootless_user
registry = test_container_registry.registry


def test_a_members_job_runs_in_its_image_on_the_organizations_machine(
    org: tuple[Hub, Path], team_ssh: str, sshd_bed: TestBed, test_image: BuiltImage, rootless_user: str
) -> None:
    hub, _ = org
    server = hub.start_server("rcbob")
    home = Path(pwd.getpwnam("rcbob").pw_dir)
    out = f"marker-{uuid.uuid4().hex[:8]}.txt"
    spec = {
        "machine": team_ssh,
        "command": f"cat {MARKER} > {out}",
        "bring_back": [out],
        "environment": {"image": test_image.ref, "runtime": "podman"},
    }
    job, log = run_through_server(server, spec, timeout=240, recorded=True)
    assert job["state"] == "succeeded" and job["machine"] == f"org:{team_ssh}", (job, log)
    assert (home / out).read_text().strip() == test_image.marker
    os.unlink(home / out)
    digest = test_image.digest(user=rootless_user)
    assert f"image {test_image.ref} {digest} (podman " in log, log
    # The pin is rcbob's, in his folder on the machine beside his jobs; no container is left.
    mine = _far_users(sshd_bed) / "rcbob"
    assert (mine / "jobs" / job["id"]).is_dir()
    pins = [p for p in (mine / "images").iterdir() if p.suffix != ".used"]
    assert pins and any(p.read_text().split()[0] in (digest, digest.removeprefix("sha256:")) for p in pins)
    assert not test_containers._containers(job["id"], user=rootless_user)
    run = _mlflow_run(hub, server, job["mlflow_run_id"])
    assert run["tags"][images.TAG_IMAGE] == test_image.ref and run["tags"][images.TAG_DIGEST] == digest, run


def test_the_organization_machines_image_options_are_its_jobs_defaults(
    org: tuple[Hub, Path], team_ssh: str, test_image: BuiltImage, rootless_user: str
) -> None:
    """rcadmin gives the machine a default image and no network for its containers: rcbob's job naming no
    image runs in it, without a network, as on a machine of his own with those options."""
    hub, _ = org
    options = {"image": test_image.ref, "container_runtime": "podman", "container_network": "none"}
    admin = hub.user_token(ADMIN_USER)
    edited = _service(hub, "PATCH", f"api/machines/{team_ssh}", admin, json={"options": options})
    assert edited.status_code == 200, edited.text
    try:
        server = hub.start_server("rcbob")
        home = Path(pwd.getpwnam("rcbob").pw_dir)
        out = f"seen-{uuid.uuid4().hex[:8]}.txt"
        command = f"cat {MARKER} > {out}; ls /sys/class/net >> {out}"
        job, log = run_through_server(server, {"machine": team_ssh, "command": command, "bring_back": [out]})
        assert job["state"] == "succeeded", (job, log)
        marker, *interfaces = (home / out).read_text().split()
        os.unlink(home / out)
        assert marker == test_image.marker and interfaces == ["lo"], (marker, interfaces)
        assert f"image {test_image.ref} " in log, log
    finally:
        cleared = {k: None for k in options}
        assert _service(hub, "PATCH", f"api/machines/{team_ssh}", admin, json={"options": cleared}).status_code == 200


def test_the_organizations_registry_secret_pulls_a_members_image_and_no_member_holds_it(
    org: tuple[Hub, Path], team_ssh: str, sshd_bed: TestBed, registry: Registry, rootless_user: str
) -> None:
    """rcadmin names a secret of the service's own as team-ssh's ``registry_secret`` and stores the private
    registry's user:password there from his terminal (``secrets set --org``): rcbob's job in an image of
    that registry pulls with it, and the value reaches neither his server, his job's record and log, nor
    any answer of the service. Until it is stored, his job fails saying which secret an admin must store;
    while the machine names it, it cannot be removed; a member may not list, set or remove it."""
    hub, _ = org
    admin = hub.user_token(ADMIN_USER)
    name = f"registry/org-{uuid.uuid4().hex[:6]}"
    named = {"options": {"registry_secret": name, "container_runtime": "podman"}}
    assert _service(hub, "PATCH", f"api/machines/{team_ssh}", admin, json=named).status_code == 200
    server = hub.start_server("rcbob")
    home = Path(pwd.getpwnam("rcbob").pw_dir)
    spec = {"machine": team_ssh, "command": f"cat {MARKER}", "environment": {"image": registry.ref}}
    try:
        with registry.known_to(rootless_user):
            job, _ = run_through_server(server, spec, timeout=240)
            assert job["state"] == "failed", job
            assert f"the secret {name!r}" in job["reason"] and "ask an admin to store it" in job["reason"], job

            refused = _as_user(server, "secrets", "set", name, "--org", input=registry.credentials)
            assert refused.returncode != 0 and "custom:remote-compute:admin" in refused.stderr, refused
            terminal = hub.start_server(ADMIN_USER)
            stored = _as_user(terminal, "secrets", "set", name, "--org", input=registry.credentials)
            assert stored.returncode == 0, stored.stderr
            listed = _as_user(terminal, "secrets", "list", "--org", "--json")
            assert listed.returncode == 0 and name in [e["name"] for e in json.loads(listed.stdout)["secrets"]]

            job, log = run_through_server(server, spec, timeout=300)
            assert job["state"] == "succeeded", (job, log)
            assert f"container: pulling {registry.ref} from {registry.host}" in log, log
        secret = registry.password.encode()
        far = _far_users(sshd_bed) / "rcbob" / "jobs" / job["id"]
        assert secret not in (far / "log").read_bytes(), "not even the far side's raw log"
        assert _files_holding(secret, home / ".punica") == [], "nothing of rcbob's holds it"
        assert name not in json.dumps(job), job
        for token in (hub.user_token("rcbob"), admin):
            for path in ("api/secrets", f"api/machines/{team_ssh}", f"api/jobs/{job['id']}"):
                assert registry.password not in _service(hub, "GET", path, token).text, path
        assert _service(hub, "GET", "api/secrets", hub.user_token("rcbob")).status_code == 403
        in_use = _service(hub, "DELETE", f"api/secrets/{quote(name, safe='')}", admin)
        assert in_use.status_code == 409 and in_use.json()["code"] == "secret_in_use", in_use.text
    finally:
        cleared = {"options": {"registry_secret": None, "container_runtime": None}}
        assert _service(hub, "PATCH", f"api/machines/{team_ssh}", admin, json=cleared).status_code == 200
        _service(hub, "DELETE", f"api/secrets/{quote(name, safe='')}", admin)
