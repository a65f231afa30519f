"""The JupyterHub test bed itself (hub_fixture.py): logins, scopes, spawns as Linux users, closed homes.

What the organization service's tests will stand on, proved with a probe service in its place
(tests/data/hub_probe_service.py).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import hub_fixture
import pytest
from hub_fixture import ADMIN, GROUP, USE, Hub, HubBed, HubExited, Server, cmdline_of, loopback_session
from procs import proc_stats
from waiting import wait_for

hub_bed = hub_fixture.hub_bed
PROBE = Path(__file__).parent / "data" / "hub_probe_service.py"


@pytest.fixture(scope="module")
def hub(hub_bed: HubBed) -> Iterator[Hub]:
    hub = hub_bed.start([str(hub_bed.build.python), str(PROBE)])
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def alice_server(hub: Hub) -> Server:
    return hub.start_server("rcalice")


def test_a_member_logs_in_through_the_hub_and_reaches_the_service_with_use_and_not_admin(hub: Hub) -> None:
    session = hub.login("rcalice")
    answer = session.get(hub.service("whoami"), timeout=30)
    assert answer.status_code == 200, answer.text
    # The cookie alone did not open it: the hub's OAuth ran (authorize, then the service's callback).
    hops = [r.url for r in answer.history]
    assert any("/hub/api/oauth2/authorize" in u for u in hops) and any("/oauth_callback" in u for u in hops), hops
    assert answer.url == hub.service("whoami")
    who = answer.json()
    assert who["name"] == "rcalice" and GROUP in who["groups"]
    assert USE in who["scopes"] and ADMIN not in who["scopes"]
    assert session.get(hub.service("use"), timeout=30).status_code == 200


def test_a_user_outside_the_group_is_refused_the_use_route(hub: Hub) -> None:
    session = hub.login("rceve")
    who = session.get(hub.service("whoami"), timeout=30).json()
    assert who["name"] == "rceve" and who["groups"] == [] and USE not in who["scopes"]
    assert session.get(hub.service("use"), timeout=30).status_code == 403
    assert hub.api("GET", "users/rceve").json()["servers"] == {}  # reaching the service spawned nothing


def test_the_admin_holds_admin_and_with_it_use(hub: Hub) -> None:
    session = hub.login("rcadmin")
    who = session.get(hub.service("whoami"), timeout=30).json()
    assert who["name"] == "rcadmin" and GROUP not in who["groups"]
    assert {USE, ADMIN} <= set(who["scopes"])
    assert session.get(hub.service("use"), timeout=30).status_code == 200


def test_a_wrong_password_does_not_log_in(hub: Hub) -> None:
    with pytest.raises(PermissionError):
        hub.login("rcalice", password="not-the-password")


def test_a_server_runs_as_its_user_on_loopback(alice_server: Server) -> None:
    alice = pwd.getpwnam("rcalice")
    status = Path(f"/proc/{alice_server.pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uids == [str(alice.pw_uid)] * 4  # real, effective, saved, filesystem
    assert alice_server.environment["HOME"] == alice.pw_dir
    listening = _listening_addresses(alice_server.pid)
    assert listening and all(address == "127.0.0.1" for address in listening), listening


def test_a_servers_own_token_reaches_the_service_with_its_users_scopes(hub: Hub, alice_server: Server) -> None:
    headers = {"Authorization": f"token {alice_server.token}"}
    session = loopback_session()
    who = session.get(hub.service("whoami"), headers=headers, timeout=30, allow_redirects=False)
    assert who.status_code == 200, who.text
    assert who.json()["name"] == "rcalice" and USE in who.json()["scopes"]
    assert session.get(hub.service("use"), headers=headers, timeout=30).status_code == 200
    # A token without the custom scope is answered 403 there: the server's token is what carries it.
    bare = hub.user_token("rcalice", scopes=["access:services!service=remote-compute"])
    assert session.get(hub.service("use"), headers={"Authorization": f"token {bare}"}, timeout=30).status_code == 403


def test_a_server_loads_this_clones_extension_and_its_user_has_its_command(alice_server: Server) -> None:
    headers = {"Authorization": f"token {alice_server.token}"}
    answer = loopback_session().get(f"{alice_server.url}remote-compute/kinds", headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    # What the organization service's command will be: `jupyter remote-compute …`, from this clone.
    environment = {name: alice_server.environment[name] for name in ("PATH", "PYTHONPATH", "HOME")}
    done = _as_user("rcalice", "jupyter", "remote-compute", "--help", env=environment)
    assert done.returncode == 0 and "usage: jupyter remote-compute" in done.stdout, done.stderr
    package = Path(environment["PYTHONPATH"]) / "jupyter_remote_compute" / "__init__.py"
    assert package.read_text() == (hub_fixture.REPO / "jupyter_remote_compute" / "__init__.py").read_text()
    # Its JupyterLab loads the clone's front end (the Compute panel): the page's config lists it.
    page = loopback_session().get(f"{alice_server.url}lab", headers=headers, timeout=60)
    assert page.status_code == 200, page.text[:500]
    config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>\s*(\{.*?\})\s*</script>', page.text, re.S).group(1))
    assert "jupyter-remote-compute" in [e["name"] for e in config["federated_extensions"]], config


def test_alices_home_and_her_servers_files_are_closed_to_bob(hub: Hub, alice_server: Server) -> None:
    home = Path(pwd.getpwnam("rcalice").pw_dir)
    runtime = sorted((home / ".local" / "share" / "jupyter" / "runtime").glob("jpserver-*.json"))
    assert runtime, "the server wrote no runtime file"
    # Each readable by its owner, none by bob: the server's connection file and environment (its token),
    # and the hub's config (the users' password and the bed's admin token).
    owned = {
        runtime[0]: "rcalice",
        Path(f"/proc/{alice_server.pid}/environ"): "rcalice",
        hub.workdir / "hub" / "jupyterhub_config.py": "root",
    }
    for path, owner in owned.items():
        assert _as_user(owner, "cat", str(path)).returncode == 0, path
        refused = _as_user("rcbob", "cat", str(path))
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, (path, refused)
    assert _as_user("rcbob", "ls", str(home)).returncode != 0
    assert _as_user("rcbob", "ls", pwd.getpwnam("rcbob").pw_dir).returncode == 0  # his own he reads


#: Connects to the Unix socket named by its argument: exit 0 when it could, 1 and why when not.
CONNECT = (
    "import socket, sys\n"
    "try:\n    socket.socket(socket.AF_UNIX).connect(sys.argv[1])\n"
    "except OSError as e:\n    sys.exit(f'{type(e).__name__}: {e}')"
)


def _listens(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return False
    return True


def test_in_a_0755_home_bob_reads_none_of_alices_jobs_logs_or_runs_nor_reaches_her_sockets(
    hub: Hub, alice_server: Server
) -> None:
    """Debian's homes are 0755: what alice's server writes and runs must be closed on its own. Her
    job's log, jobs.json, usage.jsonl, mlflow.db, the built-in machine's job folder, her recorder's
    and MLflow's UI's sockets; and the MLflow tab's page, through the hub with her token, may be framed
    by her JupyterLab (the single-user server forbids every frame)."""
    alice = pwd.getpwnam("rcalice")
    home = Path(alice.pw_dir)
    headers = {"Authorization": f"token {hub.user_token('rcalice')}"}
    api, session = f"{alice_server.url}remote-compute/", loopback_session()
    os.chmod(home, 0o755)
    try:
        body = {"machine": "local", "command": "echo hello from alice", "name": "isolated"}
        made = session.post(api + "jobs", json=body, headers=headers, timeout=60)
        assert made.ok, made.text
        job_id = made.json()["job"]["id"]

        def recorded() -> dict | None:  # type: ignore[type-arg]
            job = session.get(api + f"jobs/{job_id}", headers=headers, timeout=30).json()
            ended = job["state"] in ("succeeded", "failed", "cancelled", "lost")
            return job if ended and (job.get("mlflow_run_id") or job["state"] != "succeeded") else None

        job = wait_for(recorded, 120, "alice's job to end with its MLflow run")
        assert job["state"] == "succeeded", job
        page = session.get(api + "mlflow-ui/", headers=headers, timeout=150)
        assert page.status_code == 200 and "<title>MLflow</title>" in page.text, page.text[:300]
        policy = page.headers["Content-Security-Policy"]
        assert "frame-ancestors 'self'" in policy and "'none'" not in policy, policy
        run = session.get(
            api + f"mlflow-ui/ajax-api/2.0/mlflow/runs/get?run_id={job['mlflow_run_id']}", headers=headers, timeout=60
        )
        assert run.status_code == 200 and job_id in run.text, run.text[:300]

        punica = home / ".punica"
        scratch = home / ".local" / "share" / "jupyter" / "remote-compute" / "jobs" / job_id
        closed = (punica / "jobs" / job_id / "log", punica / "jobs.json", punica / "usage.jsonl", home / "mlflow.db")
        read = ("sh", "-c", 'cat -- "$1" > /dev/null', "read")
        for path in closed:
            assert _as_user("rcalice", *read, str(path)).returncode == 0, path
            refused = _as_user("rcbob", *read, str(path))
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, (path, refused)
        assert _as_user("rcalice", "ls", str(scratch)).returncode == 0
        assert _as_user("rcbob", "ls", str(scratch)).returncode != 0

        # Those listening now: a recorder of an earlier run (another Python, whose name it bears) that was
        # killed leaves its socket file behind, which no one can connect to.
        sockets = [s for s in sorted(Path(f"/tmp/jupyter-remote-compute-{alice.pw_uid}").glob("*.sock")) if _listens(s)]
        assert {s.name.split("-")[0] for s in sockets} >= {"recorder", "mlflow"}, sockets
        python = str(hub.build.python)
        for path in sockets:
            assert _as_user("rcalice", python, "-c", CONNECT, str(path)).returncode == 0, path
            refused = _as_user("rcbob", python, "-c", CONNECT, str(path))
            assert refused.returncode != 0 and "PermissionError" in refused.stderr, (path, refused)
        assert not _listening_addresses_of_user(alice.pw_uid, but=alice_server.pid), "only her server listens on a port"
    finally:
        os.chmod(home, 0o700)


def _listening_addresses_of_user(uid: int, but: int) -> list[str]:
    """The TCP listening addresses of every process of ``uid`` except ``but`` (her server, on loopback)."""
    found = []
    for pid, _ in proc_stats():
        try:
            if pid != but and Path(f"/proc/{pid}").stat().st_uid == uid:
                found += _listening_addresses(pid)
        except OSError:
            continue  # it ended meanwhile
    return found


def _as_user(name: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as a Linux user with their groups (rcteam too), as their own shell would."""
    entry = pwd.getpwnam(name)
    groups = os.getgrouplist(name, entry.pw_gid)
    return subprocess.run(
        list(argv),
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=groups,
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
    )


def _listening_addresses(pid: int) -> list[str]:
    """The local addresses of the TCP sockets ``pid`` listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                addresses.append(_address(fields[1].split(":")[0], width))
    return addresses


def _address(hexed: str, width: int) -> str:
    if width == 8:
        return ".".join(str(int(hexed[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return hexed  # an IPv6 listener: never loopback's 127.0.0.1, so the test fails naming it


def test_a_stopped_hub_leaves_no_process_of_its_users_and_no_folder(hub_bed: HubBed) -> None:
    other = hub_bed.start([str(hub_bed.build.python), str(PROBE)])
    server = other.start_server("rcbob")
    bob = pwd.getpwnam("rcbob")
    # A process the server's user left behind in a session of its own, as a detached job would be.
    left = subprocess.Popen(
        ["sleep", "600"], user=bob.pw_uid, group=bob.pw_gid, env=server.environment, cwd="/", start_new_session=True
    )
    try:
        other.stop()
        assert left.wait(10) == -signal.SIGKILL
    finally:
        left.kill()
        left.wait()
    assert not Path(f"/proc/{server.pid}").exists() or _state(server.pid) == "Z"
    assert not other.workdir.exists()
    assert other.proc.poll() is not None


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_hub_whose_service_exits_says_why_and_leaves_no_proxy(hub_bed: HubBed) -> None:
    with pytest.raises(HubExited) as failed:
        hub_bed.start(["python", "-c", "raise SystemExit(3)"])
    assert "Service remote-compute exited with status 3" in str(failed.value)
    error_target = f"--error-target {failed.value.hub.hub_url}hub/error"
    assert not [pid for pid, _ in proc_stats() if error_target in cmdline_of(pid)]
    assert not failed.value.hub.workdir.exists()
