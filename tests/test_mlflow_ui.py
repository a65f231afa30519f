"""MLflow's UI for the workspace's own store: behind Jupyter's authentication, on a Unix socket only its
user can open, framed by JupyterLab only, started ahead of use, stopped with the server.

A real ``jupyter server`` process (server_process.py) on a real sqlite MLflow store with one run;
the UI is MLflow 3's own ``mlflow server``, started by the first proxied request (or at the server's
start, ``mlflow_ui_prestart``).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import stat
import time
from pathlib import Path

import pytest
from server_process import Server
from waiting import wait_for

from jupyter_remote_compute.mlflow_ui import MlflowUI

RUN_NAME = "mnist-small"


def _raw(port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None):  # type: ignore[no-untyped-def]
    """One request without following redirects: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=150)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def _all_headers(port: int, path: str) -> list[tuple[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=150)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return [(k.lower(), v) for k, v in response.getheaders()]
    finally:
        conn.close()


def _group(pgid: int) -> list[int]:
    """The processes of a process group (MLflow's UI: its wrapper, MLflow's server, uvicorn)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                found.append(int(entry.name))
    return found


def _tcp_listeners(pids: list[int]) -> list[str]:
    """The TCP sockets (as /proc/net/tcp{,6} write their local address) any of ``pids`` listens on."""
    inodes = set()
    for pid in pids:
        with_fds = Path(f"/proc/{pid}/fd")
        try:
            targets = [os.readlink(fd) for fd in with_fds.iterdir()]
        except OSError:
            continue
        inodes |= {t[8:-1] for t in targets if t.startswith("socket:[")}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                found.append(fields[1])
    return found


def _started(log: Path) -> tuple[int, Path]:
    """The UI's pid and socket, from the server's log line on starting it."""
    started = re.search(r"starting MLflow's UI \(pid (\d+)\) on (\S+) ", log.read_text())
    assert started, log.read_text()[-3000:]
    return int(started.group(1)), Path(started.group(2))


def _only_mine(path: Path) -> bool:
    """A socket in a folder that only this user can open."""
    folder = path.parent.lstat()
    return (
        stat.S_ISSOCK(path.lstat().st_mode)
        and stat.S_ISDIR(folder.st_mode)
        and folder.st_uid == os.getuid()
        and stat.S_IMODE(folder.st_mode) == 0o700
    )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(400)
def test_the_workspace_ui_shows_its_runs_only_with_jupyter_credentials_and_stops_with_the_server(
    quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.create_experiment("tests", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment, run_name=RUN_NAME)
    client.log_metric(run.info.run_id, "loss", 0.25, step=3)
    client.set_terminated(run.info.run_id)

    # As a JupyterHub single-user server sets it: no page of the server may be framed.
    no_frames = '--ServerApp.tornado_settings={"headers": {"Content-Security-Policy": "frame-ancestors \'none\'"}}'
    server = Server(quickstart, scratch_dir, tracking_uri, tmp_path / "server.log", extra_args=(no_frames,))
    server.start()
    try:
        where = server.request("GET", "mlflow")
        assert where == {"url": "/remote-compute/mlflow-ui/", "proxied": True, "running": False}
        page = "/remote-compute/mlflow-ui/"
        search = page + "ajax-api/2.0/mlflow/runs/search"
        query = json.dumps({"experiment_ids": [experiment]}).encode()

        # Without Jupyter's credentials: a page is sent to the login, a write is forbidden, MLflow never asked.
        status, headers, _ = _raw(server.port, "GET", page)
        assert status == 302 and "/login" in headers["Location"], (status, headers)
        status, _, body = _raw(server.port, "POST", search, {"Content-Type": "application/json"}, query)
        assert status == 403 and RUN_NAME.encode() not in body
        assert server.request("GET", "mlflow")["running"] is False

        auth = {"Authorization": f"token {server.token}"}
        status, headers, body = _raw(server.port, "GET", page, auth)
        assert status == 200 and b"<title>MLflow</title>" in body, body[:300]
        # JupyterLab's tab (this origin) may frame it, nobody else: the server's own policy is "none".
        assert "frame-ancestors 'self'" in headers["Content-Security-Policy"], headers
        assert headers.get("X-Frame-Options", "SAMEORIGIN") == "SAMEORIGIN", headers
        _, other, _ = _raw(server.port, "GET", "/remote-compute/kinds", auth)
        assert "frame-ancestors 'none'" in other["Content-Security-Policy"], other
        status, _, body = _raw(server.port, "POST", search, {**auth, "Content-Type": "application/json"}, query)
        assert status == 200, body[:500]
        (found,) = json.loads(body)["runs"]
        assert found["info"]["run_name"] == RUN_NAME
        (metric,) = found["data"]["metrics"]
        assert (metric["key"], metric["value"], metric["step"]) == ("loss", 0.25, 3)
        assert server.request("GET", "mlflow")["running"] is True

        # Signed in with a cookie (as a browser is): MLflow's page may post its searches from this
        # origin without Jupyter's XSRF token, another site may not.
        status, headers, _ = _raw(server.port, "GET", f"{page}?token={server.token}")
        cookies = "; ".join(
            v.split(";", 1)[0]
            for k, v in _all_headers(server.port, f"{page}?token={server.token}")
            if k == "set-cookie"
        )
        assert cookies, headers
        json_type = {"Content-Type": "application/json", "Cookie": cookies}
        origin = f"http://127.0.0.1:{server.port}"
        status, _, body = _raw(server.port, "POST", search, {**json_type, "Origin": "http://evil.example"}, query)
        assert status in (403, 404) and RUN_NAME.encode() not in body, status
        status, _, body = _raw(server.port, "POST", search, {**json_type, "Origin": origin}, query)
        assert status == 200 and RUN_NAME.encode() in body, body[:300]

        pid, path = _started(server.log)
        assert _group_alive(pid) and _only_mine(path), path
        assert _tcp_listeners(_group(pid)) == [], "MLflow's UI must listen on its Unix socket only, on no port"
    finally:
        server.stop()
    assert not _group_alive(pid), "MLflow's UI (or its worker) outlived the server"
    assert not path.exists()


def test_a_tracking_server_is_linked_to_and_never_started(tmp_path: Path) -> None:
    ui = MlflowUI("https://mlflow.example.org/", "/", tmp_path, tmp_path / "ui.log")
    assert ui.describe() == {"url": "https://mlflow.example.org/", "proxied": False, "running": True}
    assert not (tmp_path / "ui.log").exists()


def test_the_ui_lives_under_the_servers_base_url(tmp_path: Path) -> None:
    ui = MlflowUI(f"sqlite:///{tmp_path / 'mlflow.db'}", "/user/ana/", tmp_path, tmp_path / "ui.log")
    assert ui.describe()["url"] == "/user/ana/remote-compute/mlflow-ui/"
    command = ui.command(tmp_path / "ui.sock")
    assert command[command.index("--static-prefix") + 1] == "/user/ana/remote-compute/mlflow-ui"
    assert command[command.index("--uvicorn-opts") + 1] == f"--uds {tmp_path / 'ui.sock'}"
    assert "--host" not in command and "--port" not in command
    assert command[command.index("--allowed-hosts") + 1] == "localhost"


def test_remote_trains_result_has_an_open_in_mlflow_link_for_jupyterlabs_command_linker(
    make_service, quickstart: Path
) -> None:
    import html

    from jupyter_remote_compute.jobs.spec import JobSpec
    from jupyter_remote_compute.jobview import RemoteTrainJob

    service = make_service(quickstart)
    job = service.submit(JobSpec.from_json({"machine": "local", "command": "true", "name": "linked"})).job
    result = RemoteTrainJob(service, job.id).wait(timeout=180)
    assert result.state == "succeeded" and result.mlflow_run_id, result.reason
    shown = result._repr_mimebundle_()["text/html"]
    found = re.search(
        r'<a href="#" data-commandlinker-command="remote-compute:open-mlflow" data-commandlinker-args="([^"]+)">'
        r"Open in MLflow</a>",
        shown,
    )
    assert found, shown
    assert json.loads(html.unescape(found.group(1))) == {"runId": result.mlflow_run_id, "label": "linked"}


def _niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.timeout(400)
def test_with_a_store_the_ui_starts_ahead_at_low_priority_answers_the_first_click_at_once_ends_with_a_killed_server(
    quickstart: Path, scratch_dir: Path, tracking_uri: str, tmp_path: Path
) -> None:
    """A SIGKILL of the server leaves no stop hook or atexit to run: the UI's group still goes."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run = client.create_run(client.create_experiment("tests"), run_name=RUN_NAME)
    client.set_terminated(run.info.run_id)
    prestart = ("--RemoteComputeApp.mlflow_ui_prestart=True",)
    server = Server(quickstart, scratch_dir, tracking_uri, tmp_path / "server.log", extra_args=prestart)
    server.start()
    try:
        # Nobody asked for it: the server started it, at a low priority, and it is up.
        wait_for(lambda: "MLflow's UI is ready" in server.log.read_text(), 180, "MLflow's UI to start ahead of use")
        pid, path = _started(server.log)
        assert _niceness(pid) == 10
        auth = {"Authorization": f"token {server.token}"}
        clicked = time.monotonic()
        status, _, body = _raw(server.port, "GET", "/remote-compute/mlflow-ui/", auth)
        assert status == 200 and b"<title>MLflow</title>" in body, body[:300]
        run_page = f"/remote-compute/mlflow-ui/ajax-api/2.0/mlflow/runs/get?run_id={run.info.run_id}"
        status, _, body = _raw(server.port, "GET", run_page, auth)
        answered = time.monotonic() - clicked
        assert status == 200 and RUN_NAME.encode() in body, body[:300]
        assert answered < 5, f"the run's page took {answered:.1f} s with the UI started ahead"
        server.kill()
    finally:
        server.stop()
    wait_for(lambda: not _group_alive(pid), 60, "MLflow's UI to end with the killed server")
    with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(path))
