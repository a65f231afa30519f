"""Teams on JupyterHub: the organization service on a real hub, with real Linux users.

The service is this package's (``jupyter-remote-compute organization``), managed by the hub
(``hub_fixture.py``); rcadmin holds the admin scope, rcalice and rcbob use through their group, rceve
neither. Each user's single-user server runs as that Linux user and reaches the service with its own
token, as the README's configuration sets it up.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import pwd
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hub_fixture
import pytest
import slurm_fixture
import sshd_fixture
from hub_fixture import (
    ADMIN,
    ADMIN_USER,
    OUTSIDER,
    REPO,
    USE,
    Hub,
    Server,
    cmdline_of,
    loopback_session,
    processes_of,
)
from procs import group_members
from slurm_fixture import SlurmBed
from sshd_fixture import TestBed, wait_for

sshd_bed = sshd_fixture.sshd_bed
slurm_bed = slurm_fixture.slurm_bed
TOKEN = "org-token-7f3a9c2e5b1d4f60"  # a machine's token as an admin types it: never in a file or an answer


@pytest.fixture(scope="module")
def org(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hub, Path]]:
    """The hub with the organization service that the group's modules share (``shared_organization``);
    at the module's end its organization is empty again (no machine, default machine, tracking server or
    quota), so nothing of this module's binds the next."""
    shared = hub_fixture.shared_organization(tmp_path_factory)
    yield shared
    emptied(shared[0])


def emptied(hub: Hub) -> None:
    """The organization's machines, default machine, tracking server and quotas removed, as its admin."""
    admin = hub.user_token(ADMIN_USER)
    for path in ("api/default-machine", "api/tracking"):
        assert _service(hub, "DELETE", path, admin).status_code == 204, path
    for quota in _service(hub, "GET", "api/quotas", admin).json()["quotas"]:
        removed = _service(hub, "DELETE", f"api/quotas/{quota['who'].replace(':', '/')}", admin)
        assert removed.status_code == 204, removed.text
    for machine in _service(hub, "GET", "api/machines", admin).json()["machines"]:
        removed = _service(hub, "DELETE", f"api/machines/{machine['name']}", admin)
        assert removed.status_code == 204, removed.text


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


def _as_user(
    server: Server, *argv: str, timeout: float = 120, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``jupyter remote-compute ARGV`` as the server's user, in their home, with their server's environment
    (its hub token among it), as a terminal of that server runs it; ``input`` on its standard input."""
    entry = pwd.getpwnam(server.user)
    return subprocess.run(
        ["jupyter-remote-compute", *argv],
        env=server.environment,
        cwd=entry.pw_dir,
        user=entry.pw_uid,
        group=entry.pw_gid,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def test_the_cli_in_a_users_server_marks_each_machines_owner(org: tuple[Hub, Path], gpu_box: Any) -> None:
    hub, _ = org
    server = hub.start_server("rcbob")
    listed = _as_user(server, "machines", "list", "--json")
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


# -- jobs on the organization's machines -------------------------------------------------------------


@pytest.fixture(scope="module")
def team_ssh(org: tuple[Hub, Path], sshd_bed: TestBed) -> str:
    """rcadmin adds the loopback sshd as the organization's ssh machine: its key and known_hosts are the
    service's (files only it reads), never a user's."""
    hub, _ = org
    options = {k: v for k, v in sshd_bed.options().items() if k in ("known_hosts", "ssh_config", "base_dir")}
    body = {"name": "team-ssh", "kind": "ssh", "address": "testbox", "options": options}
    added = _service(hub, "POST", "api/machines", hub.user_token(ADMIN_USER), json=body)
    assert added.status_code == 201, added.text
    return "team-ssh"


@pytest.fixture(scope="module")
def bobs_job(org: tuple[Hub, Path], team_ssh: str) -> dict[str, Any]:
    """rcbob runs a job on the organization's ssh machine from a terminal of his server: an input sent,
    an output brought back."""
    hub, _ = org
    server = hub.start_server("rcbob")
    bob = pwd.getpwnam("rcbob")
    home = Path(bob.pw_dir)
    # His home outlives a session: names of this session's own.
    data, model = f"data-{uuid.uuid4().hex[:8]}.csv", f"model-{uuid.uuid4().hex[:8]}.txt"
    (home / data).write_text("b,2\na,1\n")
    os.chown(home / data, bob.pw_uid, bob.pw_gid)
    command = f"sort {data} > {model}; echo trained on $(hostname)"
    ran = _as_user(
        server, "run", "--machine", team_ssh, "--send", data, "--bring-back", model, "--", "sh", "-c", command,
        timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    submitted = re.search(r"submitted job (\S+)", ran.stderr)
    assert submitted, ran.stderr
    shown = _as_user(server, "jobs", "show", submitted.group(1), "--json")
    assert shown.returncode == 0, shown.stderr
    return {"server": server, "home": home, "model": model, "run": ran, "job": json.loads(shown.stdout)}


def test_a_member_runs_a_job_on_an_organization_machine_and_gets_its_output_and_run(
    org: tuple[Hub, Path], bobs_job: dict[str, Any], sshd_bed: TestBed
) -> None:
    hub, _ = org
    job, home, model = bobs_job["job"], bobs_job["home"], bobs_job["model"]
    assert job["state"] == "succeeded" and job["machine"] == "org:team-ssh", job
    assert "trained on" in bobs_job["run"].stdout
    landed = home / model
    assert landed.read_text() == "a,1\nb,2\n" and landed.stat().st_uid == pwd.getpwnam("rcbob").pw_uid
    assert set(job["outputs"]) == {model}
    # His MLflow run, in his own store, read back with MLflow's client (the hub's environment's).
    run = _mlflow_run(hub, bobs_job["server"], job["mlflow_run_id"])
    assert run["status"] == "FINISHED" and run["tags"]["remote_compute.job_id"] == job["id"]
    assert run["tags"]["remote_compute.machine"] == "org:team-ssh"
    # Far from here his jobs are his: a folder of his own under the machine's base.
    users = _far_users(sshd_bed)
    assert (users / "rcbob" / "jobs" / job["id"]).is_dir()
    assert (users / "rcbob").stat().st_mode & 0o077 == 0
    # No key of the organization's in anything he or the hub saw.
    key = sshd_bed.user_key.read_text().strip()
    seen = json.dumps(job) + bobs_job["run"].stdout + bobs_job["run"].stderr + hub.log.read_text(errors="replace")
    assert key not in seen and str(sshd_bed.user_key) not in json.dumps(job)


def run_through_server(
    server: Server, spec: dict[str, Any], timeout: float = 300, recorded: bool = False
) -> tuple[dict[str, Any], str]:
    """``spec`` submitted to the user's own server (``POST /remote-compute/jobs``, as their panel does),
    waited for to its end (``recorded``: and its MLflow run): the job as the server shows it, and its log."""
    session = loopback_session()
    session.headers["Authorization"] = f"token {server.token}"
    submitted = session.post(f"{server.url}remote-compute/jobs", json=spec, timeout=120)
    assert submitted.status_code == 201, submitted.text
    jobs = f"{server.url}remote-compute/jobs/{submitted.json()['job']['id']}"

    def ended() -> dict[str, Any] | None:
        job = session.get(jobs, timeout=30).json()
        done = job["state"] in ("succeeded", "failed", "cancelled", "lost")
        return job if done and (job["mlflow_run_id"] or not recorded or job["state"] != "succeeded") else None

    job = wait_for(ended, timeout, f"{server.user}'s job to end")
    return job, session.get(f"{jobs}/log", timeout=30).json()["data"]


def _far_users(sshd_bed: TestBed) -> Path:
    """The folder of every hub user's jobs on the organization's ssh machine, seen from here."""
    return sshd_bed.far_path(sshd_bed.base_dir.removeprefix("~/")) / "users"


_READ_RUN = """
import json, sys
from mlflow import MlflowClient
run = MlflowClient(tracking_uri=sys.argv[1]).get_run(sys.argv[2])
print(json.dumps({"status": run.info.status, "tags": run.data.tags, "metrics": run.data.metrics}))
"""


def _mlflow_run(hub: Hub, server: Server, run_id: str) -> dict[str, Any]:
    """A run in the user's own store (their home's mlflow.db), read as that user with MLflow's client."""
    home = pwd.getpwnam(server.user).pw_dir
    read = subprocess.run(
        [str(hub.build.python), "-c", _READ_RUN, f"sqlite:///{home}/mlflow.db", run_id],
        env=server.environment, user=server.user, group=server.user, cwd=home,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    return json.loads(read.stdout)


@pytest.fixture(scope="module")
def team_slurm(org: tuple[Hub, Path], slurm_bed: SlurmBed) -> Iterator[str]:
    """rcadmin adds the Slurm bed's login node as the organization's Slurm machine: its key and
    known_hosts are the service's, as for the ssh machine."""
    yield add_slurm_machine(org[0], "team-slurm", slurm_bed)
    slurm_bed.cancel_all()


def add_slurm_machine(hub: Hub, name: str, bed: SlurmBed) -> str:
    """rcadmin adds ``bed``'s login node as the organization's Slurm machine ``name``."""
    body = {"name": name, "kind": "slurm", "address": "127.0.0.1", "options": bed.machine_options()}
    added = _service(hub, "POST", "api/machines", hub.user_token(ADMIN_USER), json=body)
    assert added.status_code == 201, added.text
    return name


# Logs a metric to MLflow on the cluster's node, then writes its output and says which Slurm job it was.
TRAIN_ON_SLURM = """\
import os, sys
import mlflow
with mlflow.start_run():
    mlflow.log_metric("loss", 0.25)
open(sys.argv[2], "w").write("".join(sorted(open(sys.argv[1]))))
print("slurm job", os.environ["SLURM_JOB_ID"])
"""


def test_a_member_runs_a_job_on_the_organizations_slurm_machine(
    org: tuple[Hub, Path], team_slurm: str, slurm_bed: SlurmBed
) -> None:
    """rcbob runs a job on the organization's Slurm cluster from a terminal of his server: sbatch'd by the
    service with the organization's key, in his own 0700 folder under the machine's base; its output and
    its MLflow run (with what it logged on the node) land in his workspace, and it is metered as his."""
    hub, _ = org
    server = hub.start_server("rcbob")
    bob = pwd.getpwnam("rcbob")
    home = Path(bob.pw_dir)
    before = _usage_row(hub, "rcbob", team_slurm)["attempts"]
    tag = uuid.uuid4().hex[:8]
    script, data, model = f"train-{tag}.py", f"data-{tag}.csv", f"model-{tag}.txt"
    for name, text in ((script, TRAIN_ON_SLURM), (data, "b,2\na,1\n")):
        (home / name).write_text(text)
        os.chown(home / name, bob.pw_uid, bob.pw_gid)
    ran = _as_user(
        server, "run", "--machine", team_slurm, "--send", script, "--send", data, "--bring-back", model,
        "--memory", "1G", "--", "python", script, data, model, timeout=300,
    )  # fmt: skip  # MLflow outgrows the bed's default 256M as it samples (test_mlflow_every_kind._sized)
    job_id = _submitted(ran)
    assert re.search(r"slurm job \d+", ran.stdout), ran.stdout + ran.stderr
    job = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
    assert job["state"] == "succeeded" and job["machine"] == f"org:{team_slurm}", job
    landed = home / model
    assert landed.read_text() == "a,1\nb,2\n" and landed.stat().st_uid == bob.pw_uid
    run = _mlflow_run(hub, server, job["mlflow_run_id"])
    assert run["status"] == "FINISHED" and run["tags"]["remote_compute.job_id"] == job_id, run
    assert run["tags"]["remote_compute.machine"] == f"org:{team_slurm}" and run["metrics"]["loss"] == 0.25, run
    users = slurm_bed.far_path(slurm_bed.base_dir) / "users"
    assert (users / "rcbob" / "jobs" / job_id).is_dir()
    assert (users / "rcbob").stat().st_mode & 0o077 == 0
    metered = _usage_row(hub, "rcbob", team_slurm)
    assert metered["attempts"] == before + 1 and metered["job_hours"] > 0, metered
    key = slurm_bed.user_key.read_text().strip()
    assert key not in json.dumps(job) + ran.stdout + ran.stderr and str(slurm_bed.user_key) not in json.dumps(job)


# -- the authorization matrix: every route of the service, each kind of user, rcbob's resources ---------

ORG_PACKAGE = REPO / "jupyter_remote_compute" / "org"
VERBS = ("get", "post", "put", "patch", "delete")


def _api_routes() -> list[tuple[str, str]]:
    """Every (pattern, verb) of ``org/service.py``'s ``API_ROUTES``, read from the package's source (its
    handlers and patterns are in modules beside it): the service imports JupyterHub, which only the hub's
    venv holds, not this test process."""
    nodes = [node for module in sorted(ORG_PACKAGE.glob("*.py")) for node in ast.parse(module.read_text()).body]
    constants: dict[str, str] = {}
    verbs: dict[str, list[str]] = {}
    table: ast.expr | None = None
    for node in nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            constants.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.ClassDef):
            methods = (ast.FunctionDef, ast.AsyncFunctionDef)
            verbs[node.name] = [f.name for f in node.body if isinstance(f, methods) and f.name in VERBS]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "API_ROUTES":
            table = node.value

    def text(node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        if isinstance(node, ast.JoinedStr):
            return "".join(text(part) for part in node.values)
        assert isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Name), ast.dump(node)
        return constants[node.value.id]

    assert isinstance(table, ast.List), "API_ROUTES is no longer a list literal: read it another way"
    routes = []
    for entry in table.elts:
        assert isinstance(entry, ast.Tuple) and isinstance(entry.elts[1], ast.Name), ast.dump(entry)
        routes += [(text(entry.elts[0]), verb) for verb in verbs[entry.elts[1].id]]
    return routes


JOB_PATTERN = r"([A-Za-z0-9][A-Za-z0-9._-]{0,127})"
MEMBER, OUTSIDER_ROLE, ADMIN_ROLE = "member", "outsider", "admin"
#: Who asks: a member of the team (use), a user outside it (no scope), the admin; rcbob's is the resource.
ASKERS = {"rcalice": MEMBER, OUTSIDER: OUTSIDER_ROLE, ADMIN_USER: ADMIN_ROLE}
BOBS_INPUT = b"b,2\na,1\n"  # what bobs_job uploaded, so rcbob's blob has its digest


@dataclasses.dataclass(frozen=True)
class Ask:
    """One request of the matrix: ``{job}``, ``{sha}`` and ``{user}`` in the path are rcbob's job id, the
    digest of his upload and his name; ``status`` is what each role gets. Only where ``sees_his`` names a
    role may its answer name rcbob (the admin's everyone's listings)."""

    method: str
    path: str
    status: dict[str, int]
    body: Any = None
    data: bytes | None = None
    sees_his: tuple[str, ...] = ()


def _by(member: int, outsider: int, admin: int) -> dict[str, int]:
    return {MEMBER: member, OUTSIDER_ROLE: outsider, ADMIN_ROLE: admin}


#: Every route and verb of the service, with what each asker gets against rcbob's resource. A route added
#: to API_ROUTES fails test_the_matrix_names_every_route_of_the_service until it is here.
MATRIX: dict[tuple[str, str], list[Ask]] = {
    ("api/me", "get"): [Ask("GET", "api/me", _by(200, 200, 200))],
    # The organization's machines and default machine are the organization's, no user's: the scopes decide.
    ("api/machines", "get"): [Ask("GET", "api/machines", _by(200, 403, 200), sees_his=(ADMIN_ROLE,))],
    ("api/machines", "post"): [Ask("POST", "api/machines", _by(403, 403, 400), body={})],
    ("api/default-machine", "get"): [Ask("GET", "api/default-machine", _by(200, 403, 200))],
    ("api/default-machine", "put"): [
        Ask("PUT", "api/default-machine", _by(403, 403, 404), body={"machine": "no-such-machine"})
    ],
    ("api/default-machine", "delete"): [Ask("DELETE", "api/default-machine", _by(403, 403, 204))],
    ("api/tracking", "get"): [Ask("GET", "api/tracking", _by(200, 403, 200))],
    ("api/tracking", "put"): [Ask("PUT", "api/tracking", _by(403, 403, 400), body={"uri": "file:///srv/mlruns"})],
    ("api/tracking", "delete"): [Ask("DELETE", "api/tracking", _by(403, 403, 204))],
    # The service's own secrets (a machine's registry_secret): the admins' to set, nobody's to read back.
    ("api/secrets", "get"): [Ask("GET", "api/secrets", _by(403, 403, 200))],
    (r"api/secrets/([^/]+)", "put"): [
        Ask("PUT", "api/secrets/matrix", _by(403, 403, 200), body={"value": "u:p"}),
        Ask("DELETE", "api/secrets/matrix", _by(403, 403, 204)),
    ],
    (r"api/secrets/([^/]+)", "delete"): [Ask("DELETE", "api/secrets/no-such-secret", _by(403, 403, 404))],
    # A machine whose access list names rcbob alone (test_org_access.py has the rest): the admin's to read.
    (r"api/machines/([^/]+)", "get"): [
        Ask("GET", "api/machines/team-ssh", _by(200, 403, 200)),
        Ask("GET", "api/machines/bobs-box", _by(403, 403, 200), sees_his=(ADMIN_ROLE,)),
    ],
    (r"api/machines/([^/]+)", "patch"): [Ask("PATCH", "api/machines/no-such-machine", _by(403, 403, 404), body={})],
    (r"api/machines/([^/]+)", "delete"): [Ask("DELETE", "api/machines/no-such-machine", _by(403, 403, 404))],
    (r"api/machines/([^/]+)/check", "post"): [Ask("POST", "api/machines/no-such-machine/check", _by(404, 403, 404))],
    (r"api/machines/([^/]+)/admit", "post"): [
        Ask("POST", "api/machines/no-such-machine/admit", _by(404, 403, 404), body={})
    ],
    # His jobs: found in the caller's own folder only, so not found for anyone else, the admin included.
    ("api/jobs", "get"): [
        Ask("GET", "api/jobs", _by(200, 403, 200)),
        Ask("GET", "api/jobs?all_users=1", _by(403, 403, 200), sees_his=(ADMIN_ROLE,)),
    ],
    # The same id PUT by another is a job of the caller's own (prepared, then removed here), never his.
    (f"api/jobs/{JOB_PATTERN}", "put"): [
        Ask("PUT", "api/jobs/{job}", _by(200, 403, 200), body={"machine": "team-ssh", "key": "matrix"}),
        Ask("DELETE", "api/jobs/{job}", _by(204, 403, 204)),
    ],
    (f"api/jobs/{JOB_PATTERN}", "get"): [Ask("GET", "api/jobs/{job}", _by(404, 403, 404))],
    (f"api/jobs/{JOB_PATTERN}", "delete"): [Ask("DELETE", "api/jobs/{job}", _by(404, 403, 404))],
    (f"api/jobs/{JOB_PATTERN}/(send|start|cancel|fetch)", "post"): [
        Ask("POST", "api/jobs/{job}/send", _by(404, 403, 404), body={"files": []}),
        Ask("POST", "api/jobs/{job}/start", _by(404, 403, 404), body={"command": "true"}),
        Ask("POST", "api/jobs/{job}/cancel", _by(404, 403, 404), body={"grace": 1}),
        Ask("POST", "api/jobs/{job}/fetch", _by(404, 403, 404), body={"outputs": []}),
    ],
    (f"api/jobs/{JOB_PATTERN}/log", "get"): [Ask("GET", "api/jobs/{job}/log", _by(404, 403, 404))],
    (f"api/jobs/{JOB_PATTERN}/outputs", "get"): [
        Ask("GET", "api/jobs/{job}/outputs?manifest=.fetch-x", _by(404, 403, 404))
    ],
    ("api/poll", "post"): [Ask("POST", "api/poll", _by(200, 403, 200), body={"jobs": ["{job}"]})],
    # His usage and quotas: his own to a member; everyone's only to the admin.
    ("api/usage", "get"): [
        Ask("GET", "api/usage?group_by=user,machine", _by(200, 403, 200)),
        Ask("GET", "api/usage?group_by=user&all_users=1", _by(403, 403, 200), sees_his=(ADMIN_ROLE,)),
    ],
    ("api/quotas", "get"): [Ask("GET", "api/quotas", _by(200, 403, 200), sees_his=(ADMIN_ROLE,))],
    (r"api/quotas/([^/]+)/([^/]+)", "put"): [
        Ask("PUT", "api/quotas/user/{user}", _by(403, 403, 200), body={"jobs": 98}, sees_his=(ADMIN_ROLE,))
    ],
    (r"api/quotas/([^/]+)/([^/]+)", "delete"): [Ask("DELETE", "api/quotas/user/{user}", _by(403, 403, 204))],
    # His uploads are his: his digest is missing for anyone else, and another's upload never becomes his.
    ("api/inputs/missing", "post"): [
        Ask("POST", "api/inputs/missing", _by(200, 403, 200), body={"digests": ["{sha}"]})
    ],
    (r"api/inputs/([^/]+)", "put"): [Ask("PUT", "api/inputs/{sha}", _by(400, 403, 400), data=b"not his")],
}
ROUTES = _api_routes()


def test_the_matrix_names_every_route_of_the_service() -> None:
    assert set(MATRIX) == set(ROUTES), "a route of API_ROUTES without its row in MATRIX, or a row of none"
    for (pattern, _), asks in MATRIX.items():
        actions = re.search(r"/\(([a-z|]+)\)$", pattern)
        if actions:  # one route, several actions: each is asked
            assert {a.path.rsplit("/", 1)[1] for a in asks} == set(actions.group(1).split("|")), pattern


@pytest.fixture(scope="module")
def askers(org: tuple[Hub, Path]) -> dict[str, str]:
    hub, _ = org
    tokens = {user: hub.user_token(user) for user in (*ASKERS, "rcbob")}
    bobs_box = {"name": "bobs-box", "kind": "ssh", "address": "bobs-box.lab", "access": {"users": ["rcbob"]}}
    added = _service(hub, "POST", "api/machines", tokens[ADMIN_USER], json=bobs_box)
    assert added.status_code == 201, added.text
    return tokens


@pytest.mark.parametrize("asker", list(ASKERS))
@pytest.mark.parametrize(("pattern", "verb"), ROUTES, ids=[f"{v} {p.replace(JOB_PATTERN, '<job>')}" for p, v in ROUTES])
def test_no_route_gives_one_user_anothers_job_log_outputs_usage_or_quota(
    org: tuple[Hub, Path], bobs_job: dict[str, Any], team_ssh: str, askers: dict[str, str],
    pattern: str, verb: str, asker: str,
) -> None:  # fmt: skip
    """Each route of the service (``API_ROUTES``) asked by a member, an outsider and the admin about
    rcbob's job, upload, usage and quota: refused for the scope, not found for his job, or answered with
    the asker's own; nothing of his in the answer (but the admin's listings of everyone's), and nothing
    of his changed."""
    hub, _ = org
    bob, job_id = askers["rcbob"], bobs_job["job"]["id"]
    sha = hashlib.sha256(BOBS_INPUT).hexdigest()
    his = _service(hub, "GET", f"api/jobs/{job_id}", bob)
    assert his.status_code == 200, his.text
    admin = askers[ADMIN_USER]
    assert _service(hub, "PUT", "api/quotas/user/rcbob", admin, json={"jobs": 99}).status_code == 200
    role = ASKERS[asker]
    try:
        for ask in MATRIX[(pattern, verb)]:
            path = ask.path.format(job=job_id, sha=sha, user="rcbob")
            body = json.loads(json.dumps(ask.body).replace("{job}", job_id).replace("{sha}", sha))
            sent = {"json": body} if ask.body is not None else {"data": ask.data} if ask.data is not None else {}
            answer = _service(hub, ask.method, path, askers[asker], **sent)
            said = f"{ask.method} {path} as {asker}: {answer.status_code} {answer.text[:300]}"
            assert answer.status_code == ask.status[role], said
            if role not in ask.sees_his:
                assert "rcbob" not in answer.text, said
            if answer.status_code == 403:
                assert answer.json()["code"] == "forbidden", said
            elif answer.status_code == 404:
                assert answer.json()["code"] != "forbidden", said
            if (ask.method, pattern) == ("PUT", f"api/jobs/{JOB_PATTERN}") and answer.status_code == 200:
                assert answer.json()["user"] == asker, said  # the same id, the asker's own job
            if ask.path == "api/poll" and answer.status_code == 200:
                assert answer.json()["statuses"][job_id]["state"] == "gone", said
            if ask.path == "api/inputs/missing" and answer.status_code == 200:
                assert answer.json()["missing"] == [sha], said
        # Nothing of his changed: his job as it was, his upload still his.
        assert _service(hub, "GET", f"api/jobs/{job_id}", bob).json() == his.json()
        assert _service(hub, "POST", "api/inputs/missing", bob, json={"digests": [sha]}).json() == {"missing": []}
    finally:
        _service(hub, "DELETE", "api/quotas/user/rcbob", admin)


def test_the_admin_lists_every_users_jobs_with_their_user(org: tuple[Hub, Path], bobs_job: dict[str, Any]) -> None:
    hub, _ = org
    listed = _service(hub, "GET", "api/jobs?all_users=1", hub.user_token(ADMIN_USER))
    assert listed.status_code == 200, listed.text
    (found,) = [j for j in listed.json()["jobs"] if j["id"] == bobs_job["job"]["id"]]
    assert found["user"] == "rcbob" and found["machine"] == "team-ssh"
    # The same from rcadmin's terminal, and a member refused it naming the admin scope.
    terminal = hub.start_server(ADMIN_USER)
    as_json = _as_user(terminal, "jobs", "list", "--all-users", "--machine", "org:team-ssh", "--json")
    assert as_json.returncode == 0, as_json.stderr
    (again,) = [j for j in json.loads(as_json.stdout) if j["id"] == bobs_job["job"]["id"]]
    assert (again["user"], again["machine"], again["running"]) == ("rcbob", "team-ssh", False), again
    as_table = _as_user(terminal, "jobs", "list", "--all-users", "--all")
    assert as_table.returncode == 0 and as_table.stdout.split()[:3] == ["USER", "ID", "MACHINE"], as_table
    row = next(line.split() for line in as_table.stdout.splitlines() if bobs_job["job"]["id"] in line)
    assert row[:3] == ["rcbob", bobs_job["job"]["id"], "org:team-ssh"], as_table.stdout
    refused = _as_user(bobs_job["server"], "jobs", "list", "--all-users")
    assert refused.returncode != 0 and ADMIN in refused.stderr, refused.stderr
    mixed = _as_user(terminal, "jobs", "list", "--all-users", "--state", "failed")
    assert mixed.returncode != 0 and "--state: not with --all-users" in mixed.stderr, mixed.stderr


# Logs three points, waits until the test says go, then writes its output.
TRAIN = """\
import os, sys, time
import mlflow
with mlflow.start_run():
    for step in range(3):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    while not os.path.exists("go"):
        time.sleep(0.05)
open(sys.argv[1], "w").write("hers\\n")
"""


def test_a_job_submitted_to_a_users_server_runs_on_the_organizations_machine(
    org: tuple[Hub, Path], team_ssh: str, sshd_bed: TestBed
) -> None:
    """POST /remote-compute/jobs of rcalice's server, with the organization's machine by its plain name:
    her server drives it through the service, in a folder of hers on the machine, and her panel reads
    what it logs to MLflow there while it runs."""
    hub, _ = org
    server = hub.start_server("rcalice")
    alice = pwd.getpwnam("rcalice")
    home = Path(alice.pw_dir)
    script, output = f"train-{uuid.uuid4().hex[:8]}.py", f"out-{uuid.uuid4().hex[:8]}.txt"
    (home / script).write_text(TRAIN)
    os.chown(home / script, alice.pw_uid, alice.pw_gid)
    session = loopback_session()
    session.headers["Authorization"] = f"token {server.token}"
    spec = {"machine": team_ssh, "command": f"python {script} {output}", "send": [script], "bring_back": [output]}
    submitted = session.post(f"{server.url}remote-compute/jobs", json=spec, timeout=60)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["job"]["id"]
    jobs = f"{server.url}remote-compute/jobs/{job_id}"

    def logged() -> list[Any] | None:
        page = session.get(f"{jobs}/metrics", params={"wait": 5}, timeout=60).json()
        points = [p["value"] for m in page["metrics"] if m["key"] == "loss" for p in m["points"]]
        return points if len(points) == 3 else None

    assert wait_for(logged, 120, "her job's live metrics") == [1.0, 0.5, pytest.approx(1 / 3)]
    job_dir = _far_users(sshd_bed) / "rcalice" / "jobs" / job_id
    assert session.get(jobs, timeout=30).json()["state"] == "running"  # seen while it waits for go
    (job_dir / "work" / "go").touch()

    def ended() -> dict[str, Any] | None:
        job = session.get(jobs, timeout=30).json()
        return job if job["state"] in ("succeeded", "failed", "cancelled", "lost") and job["mlflow_run_id"] else None

    job = wait_for(ended, 120, "rcalice's job to end and be recorded")
    assert job["state"] == "succeeded" and job["machine"] == "org:team-ssh", job
    assert (home / output).read_text() == "hers\n"


# %remote_train in an IPython shell of the user's, as a notebook of their server runs it.
_MAGIC = """
import sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_remote_compute")
job = shell.run_line_magic("remote_train", sys.argv[1])
print("job", job.job.id if hasattr(job, "job") else job)
"""


def test_remote_train_in_a_users_shell_runs_on_the_organizations_machine(
    org: tuple[Hub, Path], team_ssh: str, bobs_job: dict[str, Any]
) -> None:
    hub, _ = org
    server, home = bobs_job["server"], bobs_job["home"]
    word = uuid.uuid4().hex[:8]
    ran = subprocess.run(
        [str(hub.build.python), "-c", _MAGIC, f"--machine {team_ssh} -- echo magic-{word}"],
        env=server.environment, user=server.user, group=server.user, cwd=home,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0 and f"magic-{word}" in ran.stdout, ran.stdout + ran.stderr
    listed = json.loads(_as_user(server, "jobs", "list", "--machine", f"org:{team_ssh}", "--json").stdout)
    logged = [j for j in listed if f"magic-{word}" in json.dumps(j)]
    assert [(j["machine"], j["state"]) for j in logged] == [(f"org:{team_ssh}", "succeeded")], listed


def test_a_users_own_machine_wins_over_the_organizations_of_its_name(team_ssh: str, bobs_job: dict[str, Any]) -> None:
    server = bobs_job["server"]
    added = _as_user(server, "machines", "add", team_ssh, "--kind", "ssh", "--address", "own.lab")
    assert added.returncode == 0, added.stderr
    try:
        assert _as_user(server, "machines", "disable", team_ssh).returncode == 0
        refused = _as_user(server, "run", "--machine", team_ssh, "--detach", "--", "true")
        assert refused.returncode != 0 and "disabled" in refused.stderr, refused.stderr
        # org:NAME still names the organization's, here checked through the service.
        checked = _as_user(server, "machines", "check", f"org:{team_ssh}", "--json", timeout=120)
        assert checked.returncode == 0, checked.stderr
        assert json.loads(checked.stdout)["cpus"] >= 1
    finally:
        assert _as_user(server, "machines", "remove", team_ssh).returncode == 0


def test_a_job_on_an_organization_machine_of_a_kind_not_served_yet_fails_saying_so(
    gpu_box: Any, bobs_job: dict[str, Any]
) -> None:
    unknown = _as_user(bobs_job["server"], "run", "--machine", "nowhere", "--", "true")
    assert unknown.returncode != 0 and "no machine named 'nowhere'" in unknown.stderr
    assert "nor among the organization's" in unknown.stderr
    ran = _as_user(bobs_job["server"], "run", "--machine", "lab-jupyter", "--", "true")
    assert ran.returncode != 0
    assert "lab-jupyter is a jupyter machine; jobs through the organization run on its ssh and slurm" in ran.stderr


def test_a_member_cancels_his_job_and_its_process_on_the_machine_ends(
    bobs_job: dict[str, Any], team_ssh: str, sshd_bed: TestBed
) -> None:
    server = bobs_job["server"]
    ran = _as_user(server, "run", "--detach", "--new", "--machine", team_ssh, "--", "sleep", "600")
    submitted = re.search(r"submitted job (\S+)", ran.stderr)
    assert ran.returncode == 0 and submitted, ran.stderr
    job_id = submitted.group(1)
    pid_file = _far_users(sshd_bed) / "rcbob" / "jobs" / job_id / "pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the job to start on the machine")
    group = int(pid_file.read_text())
    cancelled = _as_user(server, "jobs", "cancel", job_id, "--json", timeout=120)
    assert cancelled.returncode == 0, cancelled.stderr

    def ended() -> dict[str, Any] | None:
        job = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
        return job if job["state"] not in ("queued", "sending", "running", "pending", "collecting") else None

    job = wait_for(ended, 60, "the cancelled job to end")
    assert job["state"] == "cancelled" and "cancelled by rcbob" in job["reason"], job
    assert group_members(group) == []  # the machine is this one: its process table says the sleep ended


def _service_pid(hub: Hub) -> int | None:
    """The organization service's process, as the hub started it (its command names its state folder)."""
    found = [pid for pid in processes_of(hub.hub_url) if "organization --state-dir" in cmdline_of(pid)]
    return found[0] if len(found) == 1 else None


def _gated_job(server: Server, machine: str, sshd_bed: TestBed, word: str) -> tuple[str, Path, str]:
    """rcbob's job on the organization's ssh machine, started and waiting for a file ``gate`` in its work
    folder; then it writes ``word`` to the output it names. Its id, far folder and output."""
    model = f"{word}-{uuid.uuid4().hex[:8]}.txt"
    command = f"while [ ! -f gate ]; do sleep 0.1; done; echo {word} > {model}"
    ran = _as_user(server, "run", "--detach", "--machine", machine, "--bring-back", model, "--", "sh", "-c", command)
    submitted = re.search(r"submitted job (\S+)", ran.stderr)
    assert ran.returncode == 0 and submitted, ran.stderr
    job_id = submitted.group(1)
    job_dir = _far_users(sshd_bed) / server.user / "jobs" / job_id
    wait_for(lambda: (job_dir / "pid").exists(), 60, "the job to start on the machine")
    return job_id, job_dir, model


def test_a_service_killed_mid_job_loses_nothing(
    org: tuple[Hub, Path], bobs_job: dict[str, Any], team_ssh: str, sshd_bed: TestBed
) -> None:
    """The service keeps its jobs in files: killed while rcbob's job runs and started again by the hub,
    it follows the job to its end, and his output lands."""
    hub, _ = org
    server, home = bobs_job["server"], bobs_job["home"]
    job_id, job_dir, model = _gated_job(server, team_ssh, sshd_bed, "late")
    killed = _service_pid(hub)
    assert killed is not None
    os.kill(killed, signal.SIGKILL)

    def serving_again() -> bool:
        pid = _service_pid(hub)
        me = _service(hub, "GET", "api/me", server.token) if pid not in (None, killed) else None
        return me is not None and me.status_code == 200

    # JupyterHub looks at its managed services every 30 s and starts one that exited.
    wait_for(serving_again, 90, "the hub to start the service again")
    (job_dir / "work" / "gate").touch()
    followed = _as_user(server, "jobs", "log", "-f", job_id, timeout=180)
    assert followed.returncode == 0, followed.stderr
    shown = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
    assert shown["state"] == "succeeded" and shown["mlflow_run_id"], shown
    assert (home / model).read_text() == "late\n"


def test_a_service_stopped_while_its_job_ends_follows_it_once_started_again(
    org: tuple[Hub, Path], bobs_job: dict[str, Any], team_ssh: str, sshd_bed: TestBed
) -> None:
    """Stopped as the hub stops it (SIGTERM) while rcbob's job runs, the service is down when the job
    ends; the hub starts it again, and then his server follows the job to its end: the output and the
    MLflow run land in his workspace, and the organization's ledger meters the job once."""
    hub, state = org
    server, home = bobs_job["server"], bobs_job["home"]
    job_id, job_dir, model = _gated_job(server, team_ssh, sshd_bed, "after")
    stopped = _service_pid(hub)
    assert stopped is not None
    os.kill(stopped, signal.SIGTERM)
    wait_for(lambda: _service_pid(hub) != stopped, 30, "the service to stop")
    (job_dir / "work" / "gate").touch()  # it ends while the service is down
    wait_for(lambda: (job_dir / "exit_code").exists(), 30, "the job to end on the machine")

    def serving_again() -> bool:
        pid = _service_pid(hub)
        return pid not in (None, stopped) and _service(hub, "GET", "api/me", server.token).status_code == 200

    wait_for(serving_again, 90, "the hub to start the service again")
    followed = _as_user(server, "jobs", "log", "-f", job_id, timeout=180)
    assert followed.returncode == 0, followed.stderr

    def recorded() -> dict[str, Any] | None:
        job = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
        return job if job["mlflow_run_id"] else None

    shown = wait_for(recorded, 120, "his job's MLflow run to be recorded")
    assert shown["state"] == "succeeded", shown
    assert (home / model).read_text() == "after\n"
    run = _mlflow_run(hub, server, shown["mlflow_run_id"])
    assert run["status"] == "FINISHED" and run["tags"]["remote_compute.job_id"] == job_id, run
    ledger = (state / ".punica" / "usage.jsonl").read_text().splitlines()
    assert len([line for line in ledger if json.loads(line).get("job") == f"rcbob/{job_id}"]) == 1, ledger
    (listed,) = [j for j in _service(hub, "GET", "api/jobs", server.token).json()["jobs"] if j["id"] == job_id]
    assert listed["running"] is False, listed


# -- usage and quotas --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alices_job(org: tuple[Hub, Path], team_ssh: str) -> str:
    """rcalice runs a short job on the organization's machine from a terminal of her server."""
    hub, _ = org
    ran = _as_user(hub.start_server("rcalice"), "run", "--new", "--machine", team_ssh, "--", "sleep", "1")
    submitted = re.search(r"submitted job (\S+)", ran.stderr)
    assert ran.returncode == 0 and submitted, ran.stderr
    return submitted.group(1)


def test_the_admin_sees_every_users_usage_and_a_member_only_his_own(
    org: tuple[Hub, Path], bobs_job: dict[str, Any], alices_job: str
) -> None:
    hub, _ = org
    admin = hub.user_token(ADMIN_USER)
    by_user = _service(hub, "GET", "api/usage?all_users=1&group_by=user,machine", admin)
    assert by_user.status_code == 200, by_user.text
    rows = {(r["user"], r["machine"]): r for r in by_user.json()["rows"]}
    for user in ("rcalice", "rcbob"):
        assert rows[(user, "team-ssh")]["attempts"] >= 1 and rows[(user, "team-ssh")]["job_hours"] > 0, rows
    by_group = _service(hub, "GET", "api/usage?all_users=1&group_by=group,month&format=csv", admin)
    assert by_group.status_code == 200 and by_group.text.startswith("group,month,attempts,"), by_group.text
    assert "\nrcteam," in by_group.text
    # A member's own usage is his alone; everyone's needs the admin scope.
    bob = bobs_job["server"].token
    own = _service(hub, "GET", "api/usage?group_by=user", bob).json()["rows"]
    assert [r["user"] for r in own] == ["rcbob"]
    refused = _as_user(bobs_job["server"], "usage", "--all-users")
    assert refused.returncode != 0 and ADMIN in refused.stderr, refused.stderr


def _through(server: Server, method: str, path: str, **kwargs: Any) -> Any:
    """A route of the user's own server, as their Compute panel calls it."""
    return loopback_session().request(
        method, f"{server.url}remote-compute/{path}", headers={"Authorization": f"token {server.token}"},
        timeout=120, **kwargs,
    )  # fmt: skip


def test_an_admins_panel_is_told_so_and_reaches_the_organizations_admin_routes(
    org: tuple[Hub, Path], bobs_job: dict[str, Any], sshd_bed: TestBed
) -> None:
    """The Organization section: shown for the admin only (``organization.admin``), and what it does goes
    through the user's own server to the service with the server's hub token."""
    hub, _ = org
    admin = hub.start_server(ADMIN_USER)
    assert _machines_of(admin)["organization"]["admin"] is True
    # Quotas: set, listed with what is used and left, removed. A group nobody is in binds no other test.
    body = {"gpu_hours": 5, "jobs": 2, "soft": True}
    quota = _through(admin, "PUT", "organization/quotas/group/rcpanel", json=body)
    assert quota.status_code == 200, quota.text
    assert quota.json()["who"] == "group:rcpanel" and quota.json()["gpu_hours"] == 5
    listed = _through(admin, "GET", "organization/quotas").json()["quotas"]
    (standing,) = [q for q in listed if q["who"] == "group:rcpanel"]
    assert standing["used"] == {"gpu_hours": 0, "job_hours": 0, "jobs": 0} and standing["left"]["jobs"] == 2
    assert _through(admin, "DELETE", "organization/quotas/group/rcpanel").status_code == 204
    assert "group:rcpanel" not in {q["who"] for q in _through(admin, "GET", "organization/quotas").json()["quotas"]}
    # Every user's usage per month, and every job with its user.
    usage = _through(admin, "GET", "organization/usage?group_by=user,month")
    assert usage.status_code == 200, usage.text
    assert "rcbob" in {r["user"] for r in usage.json()["rows"]}
    jobs = _through(admin, "GET", "organization/jobs").json()["jobs"]
    (found,) = [j for j in jobs if j["id"] == bobs_job["job"]["id"]]
    assert found["user"] == "rcbob" and found["machine"] == "team-ssh"
    # The service's own secrets (what a machine's registry_secret names): stored, listed by name, removed.
    stored = _through(admin, "PUT", "organization/secrets/team%2Fpanel", json={"value": "rc:p4nel-only"})
    assert stored.status_code == 200 and stored.json()["name"] == "team/panel", stored.text
    names = _through(admin, "GET", "organization/secrets")
    assert "team/panel" in {s["name"] for s in names.json()["secrets"]} and "p4nel-only" not in names.text
    assert _through(admin, "DELETE", "organization/secrets/team%2Fpanel").status_code == 204
    # The machine form's Save and check, for one of the organization's machines: a port nobody listens on.
    machine = {"name": "panel-box", "kind": "ssh", "address": "testbox", "options": {"port": 1}}
    added = _through(admin, "POST", "organization/machines", json=machine)
    assert added.status_code == 201, added.text
    assert added.json()["owner"] == "organization" and added.json()["admin"] == ADMIN_USER
    checked = _through(admin, "POST", "organization/machines/panel-box/check")
    assert checked.status_code in (200, 502) and checked.json().get("ok") is not True, checked.text
    # The default machine: named, as every member's machine list then says, and cleared.
    named = _through(admin, "PUT", "organization/default-machine", json={"machine": "panel-box"})
    assert named.status_code == 200, named.text
    assert named.json()["machine"]["name"] == "panel-box" and named.json()["set_by"] == ADMIN_USER
    assert _machines_of(bobs_job["server"])["organization"]["default"] == "org:panel-box"
    unnamed = _through(admin, "PUT", "organization/default-machine", json={})
    assert unnamed.status_code == 400 and unnamed.json()["field"] == "machine", unnamed.text
    assert _through(admin, "DELETE", "organization/default-machine").status_code == 204
    assert _machines_of(admin)["organization"]["default"] is None
    assert _through(admin, "DELETE", "organization/machines/panel-box").status_code == 204
    # A member's server passes the same requests on; the service refuses them, naming the admin scope.
    bob = bobs_job["server"]
    assert _machines_of(bob)["organization"]["admin"] is False
    for method, path, json_body in (
        ("PUT", "organization/quotas/user/rcbob", {"jobs": 9}),
        ("GET", "organization/usage", None),
        ("GET", "organization/jobs", None),
        ("POST", "organization/machines", machine),
        ("PUT", "organization/default-machine", {"machine": "team-ssh"}),
        ("DELETE", "organization/default-machine", None),
        ("GET", "organization/secrets", None),
        ("PUT", "organization/secrets/team%2Fpanel", {"value": "rc:p4nel-only"}),
    ):
        refused = _through(bob, method, path, json=json_body)
        assert refused.status_code == 403 and ADMIN in refused.json()["message"], (path, refused.text)


def _ledger(state: Path, user: str, job_id: str) -> list[dict[str, Any]]:
    """The organization's ledger lines of one user's job."""
    lines = [json.loads(line) for line in (state / ".punica" / "usage.jsonl").read_text().splitlines() if line]
    return [line for line in lines if line["job"] == f"{user}/{job_id}"]


def test_every_attempt_of_a_retried_job_is_metered_and_one_users_id_is_not_anothers_job(
    org: tuple[Hub, Path], team_ssh: str, bobs_job: dict[str, Any]
) -> None:
    """A retry prepares the same job id on the service again: each attempt is a line of the ledger. And a
    job id is the user's own: rcalice's job under rcbob's id is metered as hers, beside his."""
    hub, state = org
    flag = f"/tmp/jrc-retried-{uuid.uuid4().hex[:8]}"  # outlives the first attempt's folder, removed for the retry
    spec = {
        "machine": team_ssh,
        "command": f"if [ -e {flag} ]; then rm {flag}; echo second; else touch {flag}; exit 3; fi",
        "retry": {"max": 1, "on": ["failed"]},
    }
    job, log = run_through_server(bobs_job["server"], spec)
    assert job["state"] == "succeeded" and "second" in log, (job, log)
    lines = sorted(_ledger(state, "rcbob", job["id"]), key=lambda line: line["attempt"])
    assert [(line["attempt"], line["state"]) for line in lines] == [(1, "failed"), (2, "succeeded")], lines

    # rcalice prepares and runs a job of hers under the id of rcbob's first job, through the service.
    alice, theirs = hub.user_token("rcalice"), bobs_job["job"]["id"]
    before = _usage_row(hub, "rcalice", team_ssh)["attempts"]
    assert _service(hub, "PUT", f"api/jobs/{theirs}", alice, json={"machine": team_ssh, "key": "hers"}).ok
    started = _service(hub, "POST", f"api/jobs/{theirs}/start", alice, json={"command": "true"})
    assert started.status_code == 204, started.text

    def ended() -> bool:
        polled = _service(hub, "POST", "api/poll", alice, json={"jobs": [theirs]}).json()
        return polled["statuses"][theirs]["state"] == "exited"

    wait_for(ended, 60, "rcalice's job under rcbob's id to end")
    assert [line["user"] for line in _ledger(state, "rcalice", theirs)] == ["rcalice"]
    assert len(_ledger(state, "rcbob", theirs)) == 1
    assert _usage_row(hub, "rcalice", team_ssh)["attempts"] == before + 1
    assert _service(hub, "DELETE", f"api/jobs/{theirs}", alice).ok


def test_a_member_may_not_set_a_quota(org: tuple[Hub, Path], bobs_job: dict[str, Any]) -> None:
    _, state = org
    refused = _as_user(bobs_job["server"], "quota", "set", "--user", "rcbob", "--jobs", "9")
    assert refused.returncode != 0 and ADMIN in refused.stderr and "quotas" in refused.stderr, refused.stderr
    assert (
        not (state / ".punica" / "quotas.json").exists()
        or "rcbob" not in (state / ".punica" / "quotas.json").read_text()
    )
    listed = _as_user(bobs_job["server"], "quota", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr


def _set_quota(hub: Hub, who: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = _service(hub, "PUT", f"api/quotas/{who}", hub.user_token(ADMIN_USER), json=body)
    assert answer.status_code == 200, answer.text
    (standing,) = [
        q
        for q in _service(hub, "GET", "api/quotas", hub.user_token(ADMIN_USER)).json()["quotas"]
        if q["who"] == who.replace("/", ":")
    ]
    return standing


def test_a_jobs_quota_refuses_a_second_running_job_before_anything_is_sent(
    org: tuple[Hub, Path], bobs_job: dict[str, Any], team_ssh: str, sshd_bed: TestBed
) -> None:
    hub, _ = org
    server = bobs_job["server"]
    _set_quota(hub, "user/rcbob", {"jobs": 1})
    try:
        first = _as_user(server, "run", "--detach", "--new", "--machine", team_ssh, "--", "sh", "-c",
                         "while [ ! -f gate ]; do sleep 0.1; done")  # fmt: skip
        submitted = re.search(r"submitted job (\S+)", first.stderr)
        assert first.returncode == 0 and submitted, first.stderr
        jobs = _far_users(sshd_bed) / "rcbob" / "jobs"
        wait_for(lambda: (jobs / submitted.group(1) / "pid").exists(), 60, "his first job to start")
        second = _as_user(server, "run", "--new", "--machine", team_ssh, "--", "true")
        assert second.returncode != 0, second.stdout + second.stderr
        assert "user rcbob's jobs quota allows 1 running at once; 1 running, 0 left" in second.stderr, second.stderr
        refused = re.search(r"submitted job (\S+)", second.stderr)
        assert refused and not (jobs / refused.group(1)).exists()  # nothing reached the machine
        (jobs / submitted.group(1) / "work" / "gate").touch()
    finally:
        assert _service(hub, "DELETE", "api/quotas/user/rcbob", hub.user_token(ADMIN_USER)).status_code == 204


def test_a_used_up_job_hours_quota_stops_a_running_job_and_says_why(
    org: tuple[Hub, Path], alices_job: str, team_ssh: str
) -> None:
    hub, _ = org
    server = hub.start_server("rcalice")
    used = _set_quota(hub, "user/rcalice", {"job_hours": 1000})["used"]["job_hours"]
    _set_quota(hub, "user/rcalice", {"job_hours": used + 3 / 3600, "grace_seconds": 1})
    try:
        ran = _as_user(server, "run", "--detach", "--new", "--machine", team_ssh, "--", "sleep", "600")
        submitted = re.search(r"submitted job (\S+)", ran.stderr)
        assert ran.returncode == 0 and submitted, ran.stderr
        job_id = submitted.group(1)

        def ended() -> dict[str, Any] | None:
            job = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
            return job if job["state"] in ("succeeded", "failed", "cancelled", "lost") else None

        job = wait_for(ended, 90, "the job over her quota to be stopped")
        assert job["state"] == "failed", job
        assert "stopped by the organization: user rcalice's job_hours quota" in job["reason"], job
        record = _service(hub, "GET", f"api/jobs/{job_id}", server.token).json()
        assert record["notices"] and "job_hours hard quota" in record["notices"][0], record
    finally:
        assert _service(hub, "DELETE", "api/quotas/user/rcalice", hub.user_token(ADMIN_USER)).status_code == 204


# -- the organization's default machine ------------------------------------------------------------


def _usage_row(hub: Hub, user: str, machine: str) -> dict[str, Any]:
    rows = _service(hub, "GET", "api/usage?all_users=1&group_by=user,machine", hub.user_token(ADMIN_USER)).json()
    found = [r for r in rows["rows"] if (r["user"], r["machine"]) == (user, machine)]
    return found[0] if found else {"attempts": 0, "job_hours": 0.0}


def test_only_an_admin_names_the_default_machine(org: tuple[Hub, Path], team_ssh: str, bobs_job: Any) -> None:
    hub, state = org
    refused = _as_user(bobs_job["server"], "machines", "default", team_ssh, "--org")
    assert refused.returncode != 0, refused.stdout
    assert f"rcbob may not set the organization's default machine: ask a hub admin for the {ADMIN}" in refused.stderr
    answer = _service(hub, "PUT", "api/default-machine", bobs_job["server"].token, json={"machine": team_ssh})
    assert answer.status_code == 403 and ADMIN in answer.json()["message"], answer.text
    assert _service(hub, "DELETE", "api/default-machine", bobs_job["server"].token).status_code == 403
    assert not (state / ".punica" / "default.json").exists()
    # Without --org there is no default to set: a single user's is local.
    alone = _as_user(bobs_job["server"], "machines", "default", team_ssh)
    assert alone.returncode != 0 and "add --org" in alone.stderr, alone.stderr


def test_the_default_machine_is_preselected_unlisted_and_metered(
    org: tuple[Hub, Path], team_ssh: str, sshd_bed: TestBed
) -> None:
    """rcadmin names team-ssh the default: rcalice's server lists it apart, as the default; a job she
    submits naming no machine (the CLI's run, the REST API the New Job form calls, a pipeline's step) runs
    there through the service and is metered as hers on it. Cleared, a job naming none runs on local again."""
    hub, _ = org
    admin = hub.start_server(ADMIN_USER)
    alice = hub.start_server("rcalice")
    before = _usage_row(hub, "rcalice", team_ssh)["attempts"]
    named = _as_user(admin, "machines", "default", team_ssh, "--org")
    assert named.returncode == 0, named.stderr
    assert f"org:{team_ssh} is now the organization's default machine (set by {ADMIN_USER})" in named.stdout
    try:
        listed = _machines_of(alice)
        assert listed["organization"]["default"] == f"org:{team_ssh}"
        assert team_ssh not in [m["name"] for m in listed["machines"]], listed["machines"]
        table = _as_user(alice, "machines", "list")
        assert table.returncode == 0 and f"the organization's default, org:{team_ssh}" in table.stdout, table.stdout
        shown = _as_user(alice, "machines", "default", "--org", "--json")
        assert json.loads(shown.stdout)["machine"]["name"] == team_ssh, shown.stdout + shown.stderr

        ran = _as_user(alice, "run", "--new", "--", "sh", "-c", "echo on the default", timeout=300)
        assert ran.returncode == 0 and "on the default" in ran.stdout, ran.stdout + ran.stderr
        cli_job = re.search(r"submitted job (\S+)", ran.stderr)
        assert cli_job, ran.stderr
        job = json.loads(_as_user(alice, "jobs", "show", cli_job.group(1), "--json").stdout)
        assert job["machine"] == f"org:{team_ssh}" and job["state"] == "succeeded", job
        assert (_far_users(sshd_bed) / "rcalice" / "jobs" / job["id"]).is_dir()

        session = loopback_session()
        session.headers["Authorization"] = f"token {alice.token}"
        posted = session.post(f"{alice.url}remote-compute/jobs", json={"command": "true", "new": True}, timeout=60)
        assert posted.status_code == 201 and posted.json()["job"]["machine"] == f"org:{team_ssh}", posted.text
        rest_job = f"{alice.url}remote-compute/jobs/{posted.json()['job']['id']}"
        wait_for(lambda: session.get(rest_job, timeout=30).json()["state"] == "succeeded", 120, "the REST job to end")

        # A pipeline's step that names no machine runs there too (a word of this session's: no earlier
        # run's job to reuse).
        word = uuid.uuid4().hex[:8]
        document = {"version": 1, "edges": [], "nodes": [{"id": "plain", "step": "train-on-remote-machine",
                    "settings": {"command": f"echo step {word}"}, "position": {"x": 0, "y": 0}}]}  # fmt: skip
        entry = pwd.getpwnam("rcalice")
        pipeline = Path(entry.pw_dir) / f"default-{word}.rcpipeline"
        pipeline.write_text(json.dumps(document))
        os.chown(pipeline, entry.pw_uid, entry.pw_gid)
        piped = _as_user(alice, "pipeline", "run", pipeline.name, "--json", timeout=300)
        assert piped.returncode == 0, piped.stdout + piped.stderr
        node = json.loads(piped.stdout)["nodes"]["plain"]
        assert node["state"] == "succeeded", node
        step_job = json.loads(_as_user(alice, "jobs", "show", node["job_id"], "--json").stdout)
        assert step_job["machine"] == f"org:{team_ssh}", step_job

        metered = _usage_row(hub, "rcalice", team_ssh)
        assert metered["attempts"] == before + 3 and metered["job_hours"] > 0, metered
    finally:
        cleared = _as_user(admin, "machines", "default", "--org", "--clear")
        assert cleared.returncode == 0, cleared.stderr
    listed = _machines_of(alice)
    assert listed["organization"]["default"] is None and team_ssh in [m["name"] for m in listed["machines"]]
    session = loopback_session()
    session.headers["Authorization"] = f"token {alice.token}"
    local = session.post(f"{alice.url}remote-compute/jobs", json={"command": "true", "new": True}, timeout=60)
    assert local.status_code == 201 and local.json()["job"]["machine"] == "local", local.text


# -- quota notices the user sees ---------------------------------------------------------------------


def _ended(server: Server, job_id: str) -> dict[str, Any] | None:
    job = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
    return job if job["state"] in ("succeeded", "failed", "cancelled", "lost") else None


def _submitted(ran: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"submitted job (\S+)", ran.stderr)
    assert ran.returncode == 0 and found, ran.stdout + ran.stderr
    return found.group(1)


def test_a_hard_quota_notices_in_the_jobs_log_then_stops_it_naming_quota_used_and_limit(
    org: tuple[Hub, Path], team_ssh: str
) -> None:
    """rcadmin's job-hours quota of 0.0003 h (about a second), grace 0: his running job's own log gets the
    organization's notice and then why it was stopped, and the job fails with that reason."""
    hub, _ = org
    server = hub.start_server(ADMIN_USER)
    _set_quota(hub, f"user/{ADMIN_USER}", {"job_hours": 0.0003, "grace_seconds": 0})
    try:
        job_id = _submitted(_as_user(server, "run", "--detach", "--new", "--machine", team_ssh, "--", "sleep", "600"))
        job = wait_for(lambda: _ended(server, job_id), 90, "the job over his quota to be stopped")
        assert job["state"] == "failed", job
        reason = job["reason"]
        assert f"stopped by the organization: user {ADMIN_USER}'s job_hours quota of 0.0003 h per month" in reason
        used = re.search(r"is used up: (\d+\.\d{4}) h used", reason)
        assert used and float(used.group(1)) >= 0.0003, reason
        logged = _as_user(server, "jobs", "log", job_id)
        assert logged.returncode == 0, logged.stderr
        lines = [line for line in logged.stdout.splitlines() if line.startswith("[organization] ")]
        assert len(lines) == 2, logged.stdout
        assert lines[0].startswith(f"[organization] notice: user {ADMIN_USER}'s job_hours hard quota: ")
        assert "of 0.0003 h per month used" in lines[0] and "stopped at 100 % after a grace of 0 s" in lines[0]
        assert lines[1] == f"[organization] {reason}"
        record = _service(hub, "GET", f"api/jobs/{job_id}", server.token).json()
        assert record["notices"] == [lines[0].removeprefix("[organization] notice: ")], record
        assert record["stopped"] == reason
        assert job["notices"] == record["notices"], job  # his own job's JSON (jobs show --json) carries it
    finally:
        assert _service(hub, "DELETE", f"api/quotas/user/{ADMIN_USER}", hub.user_token(ADMIN_USER)).status_code == 204


def test_a_soft_gpu_hours_quota_counts_a_running_jobs_gpus_and_only_notices(
    org: tuple[Hub, Path], team_ssh: str, sshd_bed: TestBed
) -> None:
    """The machine's last check found two GPUs, so a job there that asked for none holds both: its
    GPU-hours count while it runs, a soft quota of 0.0003 GPU-hours notices it in its log before it ends,
    and it runs to its end."""
    hub, state = org
    server = hub.start_server(ADMIN_USER)
    facts_file = state / ".punica" / "machine-facts.json"
    kept = facts_file.read_text() if facts_file.exists() else None
    facts = json.loads(kept) if kept else {}
    facts[team_ssh] = {**facts.get(team_ssh, {}), "gpus": 2, "gpu_names": ["A100", "A100"], "checked": 0}
    facts_file.write_text(json.dumps(facts))
    facts_file.chmod(0o600)
    before = _set_quota(hub, f"user/{ADMIN_USER}", {"gpu_hours": 1000, "soft": True})["used"]["gpu_hours"]
    _set_quota(hub, f"user/{ADMIN_USER}", {"gpu_hours": before + 0.0003, "soft": True, "grace_seconds": 0})
    try:
        command = "while [ ! -f gate ]; do sleep 0.1; done; echo done"
        ran = _as_user(server, "run", "--detach", "--new", "--machine", team_ssh, "--", "sh", "-c", command)
        job_id = _submitted(ran)

        def noticed() -> str | None:
            record = _service(hub, "GET", f"api/jobs/{job_id}", server.token).json()
            return record["notices"][0] if record["notices"] else None

        notice = wait_for(noticed, 60, "the soft GPU-hours quota's notice")
        assert notice.startswith(f"user {ADMIN_USER}'s gpu_hours soft quota: "), notice
        quotas = _service(hub, "GET", "api/quotas", server.token).json()["quotas"]
        (mine,) = [q for q in quotas if q["who"] == f"user:{ADMIN_USER}"]
        assert mine["used"]["gpu_hours"] >= before + 0.0003 * 0.9, mine  # counted while it runs
        # His own server's job carries it once a poll brought it: its REST API, and the CLI's JSON.
        session = loopback_session()
        session.headers["Authorization"] = f"token {server.token}"
        detail = f"{server.url}remote-compute/jobs/{job_id}"
        rest = wait_for(lambda: session.get(detail, timeout=30).json().get("notices"), 60, "the notice on his job")
        assert rest == [notice], rest
        shown = json.loads(_as_user(server, "jobs", "show", job_id, "--json").stdout)
        assert shown["state"] == "running" and shown["notices"] == [notice], shown  # soft: noticed, not stopped
        logged = _as_user(server, "jobs", "log", job_id).stdout
        assert f"[organization] notice: {notice}\n" in logged, logged
        (_far_users(sshd_bed) / ADMIN_USER / "jobs" / job_id / "work" / "gate").touch()
        job = wait_for(lambda: _ended(server, job_id), 90, "the noticed job to end")
        assert job["state"] == "succeeded" and "stopped" not in (job["reason"] or ""), job
    finally:
        if kept is None:
            facts_file.unlink()
        else:
            facts_file.write_text(kept)
        assert _service(hub, "DELETE", f"api/quotas/user/{ADMIN_USER}", hub.user_token(ADMIN_USER)).status_code == 204
