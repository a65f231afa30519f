"""A job's Python environment, built on the far side from a package index the tests serve themselves.

The index is PEP 503 on 127.0.0.1 (``http.server``), holding a few wheels written here; machines reach
it through their ``index_url`` option, so no test uses the public index. The built-in machine builds
with this side's uv; the ssh test user has no uv on its PATH, so there the build is venv + pip.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import re
import signal
import threading
import uuid
from pathlib import Path

import agent_fixture
import jupyter_server_fixture
import nbformat
import package_index
import pytest
import slurm_fixture
import sshd_fixture
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.machines.facts import remember_facts

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
slurm_bed = slurm_fixture.slurm_bed
remote_server = jupyter_server_fixture.remote_server
agent_bed = agent_fixture.agent_bed
index = package_index.index
notebook_index = package_index.notebook_index
Index = package_index.Index

#: Imports the package only the environment holds and prints what it found.
SCRIPT = "import rcdemo_a, sys\nprint('value', rcdemo_a.VALUE, 'prefix', sys.prefix)\n"


#: The job env that reaches the test's index, by machine: the built-in machine takes no options, so
#: its installer finds the index in the job's env, as a user's own UV_DEFAULT_INDEX would.
JOB_ENV: dict[str, dict[str, str]] = {}


@pytest.fixture(params=["local", "ssh"])
def box(request, workspace: Path, make_service, index: Index, scratch_dir: Path):  # type: ignore[no-untyped-def]
    """(service, workspace, machine, the far side's envs folder): the built-in machine, or ssh with ``index_url``."""
    if request.param == "local":
        JOB_ENV["local"] = {"UV_DEFAULT_INDEX": index.url, "UV_CACHE_DIR": str(index.uv_cache)}
        service = make_service(workspace)
        (workspace / "fit.py").write_text(SCRIPT)
        return service, workspace, "local", scratch_dir / "envs"
    return request.getfixturevalue("ssh_box")


@pytest.fixture
def ssh_box(workspace: Path, make_service, index: Index, ssh_agent_env):  # type: ignore[no-untyped-def]
    service = make_service(workspace)
    (workspace / "fit.py").write_text(SCRIPT)
    options = ssh_agent_env.options(ssh_transport="openssh", index_url=index.url)
    service.machines.add("box", "ssh", "127.0.0.1", options)
    return service, workspace, "box", ssh_agent_env.far_path(ssh_agent_env.base_dir.removeprefix("~/")) / "envs"


def _requirements(workspace: Path, *lines: str, name: str = "requirements.txt") -> str:
    """A requirements file of its own content (a fresh comment line), so each test builds its own."""
    (workspace / name).write_text(f"# {uuid.uuid4()}\n" + "".join(line + "\n" for line in lines))
    return name


def _spec(machine: str, environment: dict, **more) -> JobSpec:  # type: ignore[type-arg]
    data = {"machine": machine, "command": ["python", "fit.py"], "send": ["fit.py"], "environment": environment}
    return JobSpec.from_json({**data, "env": JOB_ENV.get(machine, {}), **more})


def _log(service, job_id: str) -> str:  # type: ignore[no-untyped-def]
    return service.read_log(job_id).data.decode()


def test_a_script_imports_what_only_its_environment_holds_and_a_second_job_builds_nothing(box):
    service, workspace, machine, envs = box
    req = _requirements(workspace, "rcdemo-b")
    first = service.wait(service.submit(_spec(machine, {"requirements": req, "packages": ["rcdemo-c"]})).job.id)
    log = _log(service, first.id)
    assert first.state == "succeeded", first.reason
    assert "value a1" in log  # rcdemo-b pulled rcdemo-a 1.0 in from the test's index
    assert log.startswith("environment ") and ": built in " in log and "Python 3." in log
    built = [d for d in envs.iterdir() if (d / "complete").is_file()]
    assert any(f"prefix {d.resolve()}" in log for d in built)

    again = service.wait(
        service.submit(_spec(machine, {"requirements": req, "packages": ["rcdemo-c"]}), new=True).job.id
    )
    assert again.state == "succeeded", again.reason
    assert ": cached (" in _log(service, again.id) and "built in" not in _log(service, again.id)
    assert "value a1" in _log(service, again.id)
    assert again.key == first.key


def test_a_lock_is_synced_as_it_is_and_packages_on_top_are_resolved_after(workspace, make_service, index):
    import subprocess

    from uv import find_uv_bin

    JOB_ENV["local"] = {"UV_DEFAULT_INDEX": index.url, "UV_CACHE_DIR": str(index.uv_cache)}
    service = make_service(workspace)
    (workspace / "fit.py").write_text(SCRIPT)
    (workspace / "in.txt").write_text(f"# {uuid.uuid4()}\nrcdemo-b\n")
    compile_ = [find_uv_bin(), "pip", "compile", "-q", "--format", "pylock.toml", "--default-index", index.url]
    subprocess.run([*compile_, "in.txt", "-o", "pylock.toml"], cwd=workspace, check=True, capture_output=True)
    synced = service.wait(service.submit(_spec("local", {"requirements": "pylock.toml"})).job.id)
    assert synced.state == "succeeded", synced.reason
    assert "pylock.toml is a closed set: synced as it is" in _log(service, synced.id)
    assert "value a1" in _log(service, synced.id)  # rcdemo-b's dependency came from the lock, not a resolution
    more = service.wait(
        service.submit(_spec("local", {"requirements": "pylock.toml", "packages": ["rcdemo-c"]})).job.id
    )
    assert more.state == "succeeded", more.reason
    # the lock is synced, then the package on top is resolved against it
    assert re.search(r"synced as it is\n(.*\n)*Resolved 1 package(.*\n)* \+ rcdemo-c==1\.0", _log(service, more.id))


def test_same_as_here_alone_is_a_closed_set_and_with_packages_is_not(workspace):
    from jupyter_remote_compute.environments.environment import CLOSED_SET, Environment, resolve

    alone = resolve(Environment(same_as_here=True), workspace)
    assert set(alone.files) == {CLOSED_SET}
    more = resolve(Environment(same_as_here=True, packages=("rcdemo-c",)), workspace)
    assert set(more.files) == {"packages.txt"} and more.files["packages.txt"].endswith("rcdemo-c\n")
    assert more.files["packages.txt"].startswith(alone.files[CLOSED_SET])


def test_a_changed_requirement_builds_a_new_environment(box):
    service, workspace, machine, _ = box
    req = _requirements(workspace, "rcdemo-a==1.0")
    first = service.wait(service.submit(_spec(machine, {"requirements": req})).job.id)
    assert first.state == "succeeded" and "value a1" in _log(service, first.id), first.reason
    (workspace / req).write_text((workspace / req).read_text().replace("1.0", "2.0"))
    second = service.wait(service.submit(_spec(machine, {"requirements": req})).job.id)
    assert second.state == "succeeded", second.reason
    assert second.key != first.key
    assert ": built in " in _log(service, second.id) and "value a2" in _log(service, second.id)


def test_two_jobs_needing_the_same_new_environment_build_it_once(box):
    service, workspace, machine, _ = box
    req = _requirements(workspace, "rcdemo-a==2.0")
    one = service.submit(_spec(machine, {"requirements": req}, name="one")).job
    two = service.submit(_spec(machine, {"requirements": req}, name="two"), new=True).job
    jobs = [service.wait(one.id), service.wait(two.id)]
    assert [j.state for j in jobs] == ["succeeded", "succeeded"], [j.reason for j in jobs]
    logs = [_log(service, j.id) for j in jobs]
    assert sum(": built in " in log for log in logs) == 1
    assert sum(": cached (" in log for log in logs) == 1


def test_an_unresolvable_requirement_fails_the_job_with_the_installers_message(box):
    service, workspace, machine, _ = box
    req = _requirements(workspace, "rcdemo-a==9.9")
    job = service.wait(service.submit(_spec(machine, {"requirements": req})).job.id)
    assert job.state == "failed"
    assert "rcdemo-a" in job.reason and "could not be built" in job.reason
    # the installer's own words, whichever it was (uv: "No solution found"; pip: "No matching distribution")
    assert "No solution found" in job.reason or "No matching distribution" in job.reason
    assert "value" not in _log(service, job.id)


def test_a_build_killed_half_way_is_redone_by_the_next_job(box, index):
    service, workspace, machine, envs = box
    req = _requirements(workspace, "rcdemo-slow", "rcdemo-a")
    index.hold("rcdemo-slow")
    spec = _spec(machine, {"requirements": req})
    # no uv cache: an earlier test's answer for the held project would spare uv from asking again
    spec = dataclasses.replace(spec, env={**spec.env, "UV_NO_CACHE": "1"})
    try:
        job = service.submit(spec).job
        driver = threading.Thread(target=service.wait, args=(job.id,), daemon=True)  # sends and starts it
        driver.start()
        assert index.asked.wait(120), "the build never asked the index"
        pid = int(wait_for(lambda: _far_pid(service, job.id), message="the job's pid"))
        os.killpg(pid, signal.SIGKILL)  # the job, its shell and the installer, in the middle of the build
    finally:
        index.release()
    driver.join(180)
    dead = service.wait(job.id)
    assert dead.state == "lost"  # its whole process group was killed: nothing wrote an exit code
    half = [d for d in envs.iterdir() if d.is_dir() and not d.name.startswith(".") and not (d / "complete").exists()]
    assert half, "the killed build left its folder unmarked"
    again = service.wait(service.submit(_spec(machine, {"requirements": req}), new=True).job.id)
    assert again.state == "succeeded", again.reason
    assert ": built in " in _log(service, again.id) and "value a" in _log(service, again.id)


def _far_pid(service, job_id: str) -> str | None:  # type: ignore[no-untyped-def]
    job = service.get(job_id)
    d = (job.handle or {}).get("dir")  # a physical absolute path on both kinds, readable from here
    if not d or job.state != "running":
        return None
    try:
        return Path(d, "pid").read_text().strip()
    except OSError:
        return None


def test_eviction_keeps_the_environment_a_running_job_uses(ssh_box):
    service, workspace, machine, envs = ssh_box
    (workspace / "wait.py").write_text("import os, rcdemo_a\nwhile not os.path.exists('go'):\n    os.sched_yield()\n")
    unused = service.wait(service.submit(_spec(machine, {"packages": ["rcdemo-a", "rcdemo-c"]})).job.id)
    assert unused.state == "succeeded", unused.reason
    unused_env = {d.name for d in envs.iterdir() if (d / ".users" / unused.id).exists()}
    held_req = _requirements(workspace, "rcdemo-a==1.0", name="held.txt")
    spec = dataclasses.replace(
        _spec(machine, {"requirements": held_req}), command=("python", "wait.py"), send=("wait.py",)
    )
    held = service.submit(spec).job
    driver = threading.Thread(target=service.wait, args=(held.id,), daemon=True)  # sends and starts it
    driver.start()
    # env.sh says which environment the job has once it has marked it as in use
    wait_for(lambda: ": built in " in _log(service, held.id), 120, "the held job to take its environment")
    held_env = {d.name for d in envs.iterdir() if (d / "complete").exists() and (d / ".users" / held.id).exists()}
    assert len(held_env) == 1
    # A machine that keeps no bytes of unused environments: the next job evicts everything but its own
    # and the one the held job runs in.
    service.machines.update(machine, options={"env_max_bytes": 0})
    other = service.wait(service.submit(_spec(machine, {"requirements": _requirements(workspace, "rcdemo-a")})).job.id)
    assert other.state == "succeeded", other.reason
    left = {d.name for d in envs.iterdir() if (d / "complete").exists()}
    assert held_env <= left and len(unused_env) == 1
    assert not unused_env & left  # the unused one went
    assert len(left) == 2
    go = Path(service.get(held.id).handle.get("dir", "")) / "work" / "go"
    go.write_text("")
    driver.join(120)
    assert service.wait(held.id).state == "succeeded"


def test_a_requirements_file_outside_the_workspace_is_refused_at_submit(box, tmp_path):
    service, workspace, machine, _ = box
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("rcdemo-a\n")
    (workspace / "linked.txt").symlink_to(outside)
    with pytest.raises(InvalidSettings, match=r"linked\.txt leads out of the workspace"):
        service.submit(_spec(machine, {"requirements": "linked.txt"}))
    with pytest.raises(InvalidSettings, match=r"missing\.txt is not a file"):
        service.submit(_spec(machine, {"requirements": "missing.txt"}))
    (workspace / "private.txt").write_text("--index-url https://me:hunter2@pypi.example/simple\nrcdemo-a\n")
    with pytest.raises(InvalidSettings, match=r"private\.txt has a URL with a user name or password") as refused:
        service.submit(_spec(machine, {"requirements": "private.txt"}))
    assert "hunter2" not in str(refused.value)
    with pytest.raises(InvalidSettings, match="leads out of the workspace"):
        _spec(machine, {"requirements": "../elsewhere.txt"})
    assert service.list_jobs() == []


def test_the_mlflow_run_names_the_environment_and_what_it_held(box, tracking_uri):
    from mlflow.tracking import MlflowClient

    service, workspace, machine, _ = box
    req = _requirements(workspace, "rcdemo-a==2.0", "rcdemo-c")
    job = service.wait(service.submit(_spec(machine, {"requirements": req})).job.id)
    assert job.state == "succeeded", job.reason
    client = MlflowClient(tracking_uri)
    run = wait_for(lambda: job_run(client, service, job.id), 120, "the job's MLflow run")
    digest = run.data.tags["remote_compute.environment"]
    assert len(digest) == 32 and f"environment {digest[:12]}: built in" in _log(service, job.id)
    assert "remote_compute.environment_build_seconds" in run.data.metrics
    listing = Path(client.download_artifacts(run.info.run_id, "remote_compute/environment.txt", str(workspace)))
    installed = listing.read_text().lower()
    assert "rcdemo-a==2.0" in installed.replace("_", "-") and "rcdemo-c==1.0" in installed.replace("_", "-")
    # pip is in it, as in a venv python -m venv makes: MLflow pins it in a model's environment files
    assert re.search(r"^pip==", installed, re.MULTILINE), installed


def job_run(client, service, job_id: str):  # type: ignore[no-untyped-def]
    """The job's run once it is recorded (with its replay done), else None."""
    run_id = service.get(job_id).mlflow_run_id
    if not run_id:
        return None
    run = client.get_run(run_id)
    return run if run.data.tags.get("remote_compute.environment") else None


def test_same_as_here_pins_this_interpreters_distributions_and_leaves_local_installs_out(workspace):

    from jupyter_remote_compute.environments.environment import Environment, resolve

    resolved = resolve(Environment(same_as_here=True), workspace)
    pinned = resolved.files["pinned.txt"].splitlines()
    assert f"mlflow=={importlib.metadata.version('mlflow')}" in pinned
    # this product is installed editable here (from a checkout): no index has that, so it is named and left out
    assert "jupyter-remote-compute" in {n.lower().replace("_", "-") for n in resolved.left_out}
    assert not any(p.lower().startswith(("jupyter-remote-compute==", "jupyter_remote_compute==")) for p in pinned)
    again = resolve(Environment(same_as_here=True, python="3.11"), workspace)
    assert again.digest != resolved.digest  # the Python version is part of the content


def test_the_cli_run_takes_the_environment_options(workspace):
    import argparse

    from jupyter_remote_compute.run_options import add_run_options, command_of, spec_settings

    parser = argparse.ArgumentParser()
    add_run_options(parser)
    args = parser.parse_args(
        ["--requirements", "req.txt", "--package", "a>=1", "--package", "b", "--python", "3.11", "--", "python", "x.py"]
    )
    spec = JobSpec.from_json(spec_settings(args, command_of(args)))
    assert spec.environment is not None
    assert spec.environment.to_json() == {"requirements": "req.txt", "packages": ["a>=1", "b"], "python": "3.11"}
    plain = parser.parse_args(["--", "python", "x.py"])
    assert JobSpec.from_json(spec_settings(plain, command_of(plain))).environment is None
    from jupyter_remote_compute.magics import build_train_parser

    magic = build_train_parser().parse_args(["--same-env", "--package", "c", "--", "python", "x.py"])
    asked = JobSpec.from_json(spec_settings(magic, command_of(magic))).environment
    assert asked is not None and asked.to_json() == {"packages": ["c"], "same_as_here": True}
    wrong = parser.parse_args(["--python", "python3", "--", "python", "x.py"])
    with pytest.raises(InvalidSettings, match=r"environment\.python: expected a version"):
        JobSpec.from_json(spec_settings(wrong, command_of(wrong)))
    with pytest.raises(InvalidSettings, match=r"environment\.python"):
        JobSpec.from_json({"command": "true", "environment": {"python": "three"}})


async def test_the_rest_api_runs_a_job_in_its_environment_and_refuses_a_file_outside(
    jp_fetch, server_workspace, index, tmp_path
):
    import asyncio
    import json

    from tornado.httpclient import HTTPClientError

    (server_workspace / "fit.py").write_text(SCRIPT)
    (tmp_path / "outside.txt").write_text("rcdemo-a\n")
    (server_workspace / "linked.txt").symlink_to(tmp_path / "outside.txt")
    body = {"command": ["python", "fit.py"], "send": ["fit.py"], "environment": {"requirements": "linked.txt"}}
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("remote-compute", "jobs", method="POST", body=json.dumps(body))
    error = json.loads(refused.value.response.body)
    assert refused.value.code == 400 and "linked.txt leads out of the workspace" in error["message"]
    assert error["field"] == "environment.requirements"

    env = {"UV_DEFAULT_INDEX": index.url, "UV_CACHE_DIR": str(index.uv_cache)}
    body = {**body, "environment": {"packages": ["rcdemo-b"]}, "env": env}
    response = await jp_fetch("remote-compute", "jobs", method="POST", body=json.dumps(body))
    job_id = json.loads(response.body)["job"]["id"]

    async def ended() -> dict:  # type: ignore[type-arg]
        while True:
            job = json.loads((await jp_fetch("remote-compute", "jobs", job_id)).body)
            if job["state"] in ("succeeded", "failed", "lost", "cancelled"):
                return job
            await asyncio.sleep(0.1)  # the server's poller drives the job; this only looks

    job = await asyncio.wait_for(ended(), 180)
    assert job["state"] == "succeeded", job["reason"]
    assert job["spec"]["environment"] == {"packages": ["rcdemo-b"]}
    log = (await jp_fetch("remote-compute", "jobs", job_id, "log")).body.decode()
    assert "value a1" in log and "environment " in log


def test_the_machines_environment_is_the_default_and_the_jobs_own_wins_and_uv_is_sent_once(ssh_box):
    service, _, machine, envs = ssh_box
    facts = service.admin.check(machine)  # the ssh test user has no uv: the check says so, and what builds
    assert facts["uv"] is None and facts["arch"] == platform.machine(), facts
    sent = f"uv {importlib.metadata.version('uv')}, jupyter-remote-compute's, sent with the first job that builds one"
    assert facts["environments"] == sent
    service.machines.update(machine, options={"environment": {"packages": ["rcdemo-a==2.0"]}})
    plain = JobSpec.from_json({"machine": machine, "command": ["python", "fit.py"], "send": ["fit.py"]})
    default = service.wait(service.submit(plain).job.id)
    assert default.state == "succeeded", default.reason
    assert "value a2" in _log(service, default.id)
    own = service.wait(service.submit(_spec(machine, {"packages": ["rcdemo-a==1.0"]})).job.id)
    assert own.state == "succeeded", own.reason
    assert "value a1" in _log(service, own.id)
    # The ssh test user has no uv: this side's was sent through the machine's input cache (by the first
    # job of the session with an environment), left the work tree for <base>/tools, and built both;
    # the second job sent nothing of it again.
    from uv import find_uv_bin

    assert "building with uv " in _log(service, default.id) and "building with uv " in _log(service, own.id)
    assert own.transfer["bytes_sent"] < 1_000_000 < os.path.getsize(find_uv_bin())
    assert [p.stat().st_size for p in envs.parent.joinpath("tools").glob("uv-*")] == [os.path.getsize(find_uv_bin())]
    # Its bytes are stored once on the machine: the input cache's entry and tools/ name one file.
    size = os.path.getsize(find_uv_bin())
    files = [p for p in envs.parent.rglob("*") if p.is_file() and not p.is_symlink()]
    found = [st for st in (p.stat() for p in files) if st.st_size == size]
    assert len({(st.st_dev, st.st_ino) for st in found}) == 1, found
    assert not (Path(own.handle["dir"]) / "work" / "_remote_compute_tools").exists()
    with pytest.raises(InvalidSettings, match=r"options\.environment"):
        service.machines.update(machine, options={"environment": {"python": "three"}})
        service.submit(JobSpec.from_json({"machine": machine, "command": "true"}))


def test_where_no_uv_can_run_the_far_side_builds_with_venv_and_pip_and_says_so(index, tmp_path):
    """env.sh itself, as a job's command.sh runs it, on a PATH with no uv and no uv passed or sent."""
    import subprocess

    from jupyter_remote_compute.environments.environment import Environment, far_command, resolve

    (tmp_path / "ws").mkdir()
    resolved = resolve(Environment(packages=("rcdemo-a==1.0",)), tmp_path)
    work = tmp_path / "base" / "job-1" / "work"
    (work / "_remote_compute_env").mkdir(parents=True)  # as environment_inputs sends them
    for name, text in resolved.files.items():
        (work / "_remote_compute_env" / name).write_text(text)
    script = far_command(
        ["python", "-c", "import rcdemo_a; print('value', rcdemo_a.VALUE)"], resolved, {"index_url": index.url}
    )
    (work.parent / "command.sh").write_text("#!/bin/sh\n" + script)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run(["sh", "../command.sh"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "building with venv+pip (no uv on this machine)" in run.stdout
    assert "value a1" in run.stdout
    assert (tmp_path / "base" / "envs" / resolved.digest / "complete").is_file()


def test_a_slurm_job_builds_its_environment_on_the_shared_file_system_once(
    workspace, make_service, index, slurm_bed, ssh_agent_env
):
    service = make_service(workspace)
    (workspace / "fit.py").write_text(SCRIPT)
    service.machines.add("hpc", "slurm", "127.0.0.1", slurm_bed.machine_options(index_url=index.url))
    req = _requirements(workspace, "rcdemo-b")
    first = service.wait(service.submit(_spec("hpc", {"requirements": req})).job.id, timeout=300)
    assert first.state == "succeeded", first.reason
    envs = slurm_bed.far_path(slurm_bed.base_dir.removeprefix("~/")) / "envs"
    log = _log(service, first.id)
    assert "value a1" in log and ": built in " in log
    assert f"prefix {envs.resolve()}/" in log
    again = service.wait(service.submit(_spec("hpc", {"requirements": req}), new=True).job.id, timeout=300)
    assert again.state == "succeeded", again.reason
    assert ": cached (" in _log(service, again.id) and "value a1" in _log(service, again.id)


def test_a_machine_whose_check_found_a_uv_builds_with_it_and_gets_none_sent(
    remote_server, make_service, quickstart: Path, index: Index
):
    """The remote Jupyter Server's kernels run with this side's venv on PATH: a uv there."""
    service = make_service(quickstart)
    service.machines.add("far", "jupyter", remote_server.url, {"token_secret": "compute/remote"})
    facts = service.admin.check("far")
    assert facts["uv"] and facts["arch"] == platform.machine(), facts
    (quickstart / "fit.py").write_text(SCRIPT)
    env = {"UV_DEFAULT_INDEX": index.url, "UV_CACHE_DIR": str(index.uv_cache)}
    job = service.wait(service.submit(_spec("far", {"packages": ["rcdemo-a==1.0"]}, env=env)).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    assert f"building with uv {facts['uv']}" in _log(service, job.id) and "value a1" in _log(service, job.id)
    assert job.transfer["files_sent"] + job.transfer["files_reused"] == 2, job.transfer  # fit.py, packages.txt


def test_a_lock_file_larger_than_one_command_line_argument_reaches_a_slurm_job(
    workspace, make_service, index, slurm_bed, ssh_agent_env
):
    """Slurm's start passes command.sh as one argument (at most 128 KiB on Linux): the environment's files
    travel as inputs, so a requirements file of 300 KB builds as a small one does."""
    service = make_service(workspace)
    (workspace / "fit.py").write_text(SCRIPT)
    service.machines.add("hpc", "slurm", "127.0.0.1", slurm_bed.machine_options(index_url=index.url))
    padding = [f"# {i:06d} {'x' * 60}" for i in range(4500)]  # what a long lock's hashes would weigh
    req = _requirements(workspace, *padding, "rcdemo-a==2.0", name="big-requirements.txt")
    assert (workspace / req).stat().st_size > 300_000
    job = service.wait(service.submit(_spec("hpc", {"requirements": req})).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    assert "value a2" in _log(service, job.id)
    far = Path(job.handle["dir"])
    assert (far / "environment" / "requirements.txt").stat().st_size > 300_000
    assert not (far / "work" / "_remote_compute_env").exists()  # moved out of the work tree


@pytest.fixture
def far_kind(request, make_service, quickstart: Path, index: Index):  # type: ignore[no-untyped-def]
    """(service, machine) of the kinds whose far side the tests reach only through the product: a remote
    Jupyter Server, or a pull agent run as another user (no uv there: venv + pip, as it says)."""
    if request.param == "jupyter":
        server = request.getfixturevalue("remote_server")
        service = make_service(quickstart)
        service.machines.add("far", "jupyter", server.url, {"token_secret": "compute/remote"})
        return service, "far"
    bed = request.getfixturevalue("agent_bed")
    bed.add_machine("lab")
    bed.start_agent("lab")
    return make_service(quickstart), "lab"


@pytest.mark.parametrize("far_kind", ["jupyter", "agent"], indirect=True)
def test_jupyter_and_agent_jobs_build_their_environment_once_too(far_kind, quickstart: Path, index: Index):
    service, machine = far_kind
    (quickstart / "fit.py").write_text(SCRIPT)
    env = {"UV_DEFAULT_INDEX": index.url, "PIP_INDEX_URL": index.url, "UV_CACHE_DIR": str(index.uv_cache)}
    environment = {"packages": ["rcdemo-b"], "requirements": _requirements(quickstart, "rcdemo-c")}
    first = service.wait(service.submit(_spec(machine, environment, env=env)).job.id, timeout=300)
    assert first.state == "succeeded", first.reason
    assert "value a1" in _log(service, first.id) and ": built in " in _log(service, first.id)
    again = service.wait(service.submit(_spec(machine, environment, env=env), new=True).job.id, timeout=300)
    assert again.state == "succeeded", again.reason
    assert ": cached (" in _log(service, again.id) and "value a1" in _log(service, again.id)


def test_a_pipeline_step_takes_an_environment_that_its_schema_describes():
    import jsonschema

    from jupyter_remote_compute.pipelines.notebook import notebook_spec
    from jupyter_remote_compute.steps import TRAIN_ON_REMOTE_MACHINE
    from jupyter_remote_compute.steps.executor import parse_settings

    settings = {"command": "python fit.py", "environment": {"requirements": "requirements.txt", "python": "3.11"}}
    jsonschema.validate(settings, TRAIN_ON_REMOTE_MACHINE["settings"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**settings, "environment": {"python": "three"}}, TRAIN_ON_REMOTE_MACHINE["settings"])
    spec, _ = parse_settings(settings)
    assert spec.environment is not None and spec.environment.python == "3.11"
    notebook, _ = notebook_spec({"notebook": "train.ipynb", "environment": {"packages": ["nbclient"]}})
    assert notebook.environment is not None and notebook.environment.packages == ("nbclient", "ipykernel")


def test_an_index_url_with_credentials_is_refused_for_compute_yaml(workspace, make_service):
    service = make_service(workspace)
    with pytest.raises(InvalidSettings, match=r"options\.index_url holds a user name or password") as refused:
        service.machines.add("box", "ssh", "127.0.0.1", {"index_url": "https://me:hunter2@pypi.example/simple"})
    assert "hunter2" not in str(refused.value)
    assert (
        not (workspace / ".punica/compute.yaml").exists()
        or "hunter2" not in (workspace / ".punica/compute.yaml").read_text()
    )


def test_a_python_the_machine_cannot_have_fails_the_job_naming_the_pythons_it_has(box):
    service, _, machine, _ = box
    spec = _spec(machine, {"packages": ["rcdemo-a"], "python": "3.99"})
    # the built-in machine's uv would otherwise look for a 3.99 to download
    spec = dataclasses.replace(spec, env={**spec.env, "UV_PYTHON_DOWNLOADS": "never"})
    job = service.wait(service.submit(spec).job.id)
    assert job.state == "failed"
    assert "Python 3.99 was asked for; this machine has: " in job.reason and "python3.11" in job.reason


def test_a_server_sigkilled_during_a_build_ends_the_job_once_with_the_environment_complete(
    workspace, scratch_dir, tracking_uri, index, tmp_path
):
    """The build is the job's own far-side process: the server that started it may die and come back."""
    from server_process import Server

    (workspace / "fit.py").write_text(SCRIPT)
    server = Server(workspace, scratch_dir, tracking_uri, tmp_path / "server.log")
    # no uv cache: an earlier test's answer for the held project would spare uv from asking again
    env = {"UV_DEFAULT_INDEX": index.url, "UV_NO_CACHE": "1"}
    body = {"command": ["python", "fit.py"], "send": ["fit.py"], "env": env}
    body["environment"] = {"packages": ["rcdemo-slow", "rcdemo-a==2.0"], "python": "3.11"}
    index.hold("rcdemo-slow")
    try:
        server.start()
        job_id = server.request("POST", "jobs", body)["job"]["id"]
        assert index.asked.wait(120), "the build never asked the index"
        server.kill()
        index.release()
        server.start()

        def ended() -> dict | None:  # type: ignore[type-arg]
            job = server.request("GET", f"jobs/{job_id}")
            return job if job["state"] in ("succeeded", "failed", "lost", "cancelled") else None

        job = wait_for(ended, 180, "the job to end after the restart")
    finally:
        index.release()
        server.stop()
    assert job["state"] == "succeeded", job["reason"]
    far_log = _far_log(scratch_dir, job_id)  # the built-in machine's job folder keeps the whole log
    assert far_log.count(": built in ") == 1 and far_log.count("value a2") == 1  # built once, ran once
    complete = [d for d in (scratch_dir / "envs").iterdir() if (d / "complete").is_file()]
    assert len(complete) == 1 and (complete[0] / ".users" / job_id).exists()


def _far_log(scratch: Path, job_id: str) -> str:
    found = list(scratch.glob(f"**/{job_id}/log"))
    return found[0].read_text(errors="replace") if found else ""


def test_wheels_from_here_builds_where_no_index_can_be_reached_and_sends_each_wheel_once(
    workspace, make_service, index, ssh_agent_env, monkeypatch
):
    """A machine whose index points nowhere: this side resolves against its own index (here the test's,
    as a user's UV_DEFAULT_INDEX), sends the wheels, and the far side installs offline."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: the far side has no way out
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}/simple/"
    monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
    monkeypatch.setenv("UV_NO_CACHE", "1")
    service = make_service(workspace)
    (workspace / "fit.py").write_text(SCRIPT)
    options = ssh_agent_env.options(ssh_transport="openssh", index_url=nowhere, wheels="from_here")
    service.machines.add("island", "ssh", "127.0.0.1", options)
    req = _requirements(workspace, "rcdemo-b")
    first = service.wait(service.submit(_spec("island", {"requirements": req})).job.id, timeout=300)
    assert first.state == "succeeded", first.reason
    log = _log(service, first.id)
    assert "value a1" in log and ": built in " in log  # rcdemo-b and the rcdemo-a it needs, both sent
    sent = sorted(p.name for p in (workspace / ".punica" / "wheels").glob("*/*.whl"))
    assert sent == ["rcdemo_a-1.0-py3-none-any.whl", "rcdemo_b-1.0-py3-none-any.whl"]
    assert not (Path(first.handle["dir"]) / "work" / "_remote_compute_wheels").exists()
    # Another environment with the same wheels: built again, offline, and no wheel crosses again.
    again = service.wait(service.submit(_spec("island", {"requirements": req, "packages": ["rcdemo-a"]})).job.id)
    assert again.state == "succeeded", again.reason
    assert ": built in " in _log(service, again.id) and "value a1" in _log(service, again.id)
    # (the one file it may send is its packages.txt, which an earlier job on the machine may have sent)
    assert again.transfer["files_sent"] <= 1 and again.transfer["files_reused"] >= 3, again.transfer
    # The same environment again resolves nothing: this side's index may be gone, its answer is kept.
    (index.root / "simple").rename(index.root / "simple.gone")
    try:
        same = service.wait(service.submit(_spec("island", {"requirements": req}), new=True).job.id)
    finally:
        (index.root / "simple.gone").rename(index.root / "simple")
    assert same.state == "succeeded", same.reason
    assert ": cached (" in _log(service, same.id) and "value a1" in _log(service, same.id)
    answers = list((workspace / ".punica" / "wheels" / "resolutions").glob("*.json"))
    assert len(answers) == 2
    # the wheels' URLs are the index's, which may hold credentials: readable by the user only
    assert {p.stat().st_mode & 0o777 for p in answers} == {0o600}
    with pytest.raises(InvalidSettings, match=r"options\.wheels"):
        service.machines.update("island", options={"wheels": "yes"})
    # A machine of another platform: a package with no wheel for it fails the job, named, before anything is
    # sent; the platform is the architecture the machine's last check found (as an aarch64 machine's would
    # read), when the machine names none itself.
    facts = service.admin.check("island")
    assert facts["arch"] == platform.machine()
    remember_facts(workspace / ".punica", "island", {**facts, "arch": "aarch64"})
    native = _spec(
        "island", {"packages": ["rcdemo-native"], "python": "3.11"}, command=["python", "-c", "import rcdemo_native"]
    )
    other = service.wait(service.submit(native).job.id)
    assert other.state == "failed" and "rcdemo-native" in (other.reason or ""), other.reason
    assert "on aarch64-manylinux_2_28" in (other.reason or ""), other.reason
    service.machines.update("island", options={"wheels_platform": f"{platform.machine()}-manylinux_2_28"})  # it wins
    fits = service.wait(service.submit(native, new=True).job.id)
    assert fits.state == "succeeded", fits.reason


def test_an_agent_machine_with_wheels_from_here_needs_no_index(agent_bed, make_service, quickstart, index, monkeypatch):
    """The agent fetches the wheels by digest from the server like any input; its job env names no index."""
    monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
    monkeypatch.setenv("UV_NO_CACHE", "1")
    agent_bed.add_machine("lab")
    agent_bed.start_agent("lab")
    service = make_service(quickstart)
    service.machines.update("lab", options={"wheels": "from_here"})
    (quickstart / "fit.py").write_text(SCRIPT)
    job = service.wait(service.submit(_spec("lab", {"packages": ["rcdemo-b"]})).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    assert "value a1" in _log(service, job.id) and ": built in " in _log(service, job.id)


def test_while_the_far_side_builds_the_jobs_reason_says_so_and_after_it_does_not(workspace, make_service, index):
    """The built-in machine: the build waits on the index; the job's reason reads the build meanwhile."""
    service = make_service(workspace)
    (workspace / "fit.py").write_text(SCRIPT)
    req = _requirements(workspace, "rcdemo-slow", "rcdemo-a")
    index.hold("rcdemo-slow")
    spec = _spec("local", {"requirements": req, "packages": ["rcdemo-c"]})
    spec = dataclasses.replace(spec, env={"UV_DEFAULT_INDEX": index.url, "UV_NO_CACHE": "1"})
    try:
        job = service.submit(spec).job
        driver = threading.Thread(target=service.wait, args=(job.id,), daemon=True)  # sends, starts, polls it
        driver.start()
        assert index.asked.wait(120), "the build never asked the index"
        building = wait_for(lambda: service.get(job.id).reason, message="the job's reason while it builds")
        assert building == "building the environment (uv, 3 packages)"
        assert service.get(job.id).state == "running"
    finally:
        index.release()
    driver.join(180)
    done = service.wait(job.id)
    assert done.state == "succeeded" and done.reason is None, done.reason
    assert not (Path(done.handle["dir"]) / "env.state").exists()


def test_the_building_reason_counts_the_packages_the_requirements_resolved_to(workspace, make_service, index):
    """One requirement that pulls a dependency: the reason ends up counting both."""
    service = make_service(workspace)
    req = _requirements(workspace, "rcdemo-top")
    index.hold("files/rcdemo_dep")  # resolved, not yet downloaded
    spec = _spec("local", {"requirements": req}, command=["python", "-c", "import rcdemo_dep, rcdemo_top"], send=[])
    spec = dataclasses.replace(spec, env={"UV_DEFAULT_INDEX": index.url, "UV_NO_CACHE": "1"})
    try:
        job = service.submit(spec).job
        driver = threading.Thread(target=service.wait, args=(job.id,), daemon=True)
        driver.start()
        assert index.asked.wait(120), "the build never asked for the dependency's wheel"
        resolved = "building the environment (uv, 2 packages)"
        wait_for(lambda: service.get(job.id).reason == resolved, 60, "the reason to count the resolved set")
    finally:
        index.release()
    driver.join(180)
    done = service.wait(job.id)
    assert done.state == "succeeded" and done.reason is None, done.reason
    assert "Resolved 2 packages" in _log(service, job.id)


def test_an_agent_jobs_reason_says_it_builds_its_environment_too(agent_bed, make_service, quickstart, index):
    """The agent reads env.sh's build from status.sh and reports it with its heartbeat."""
    agent_bed.add_machine("builder")
    agent_bed.start_agent("builder")
    service = make_service(quickstart)
    env = {"PIP_INDEX_URL": index.url, "PIP_NO_CACHE_DIR": "1"}  # no uv there: venv + pip
    environment = {"packages": ["rcdemo-slow"]}
    spec = _spec("builder", environment, command=["python", "-c", "import rcdemo_slow"], send=[], env=env)
    index.hold("rcdemo-slow")
    try:
        job = service.submit(spec).job
        driver = threading.Thread(target=service.wait, args=(job.id,), kwargs={"timeout": 300}, daemon=True)
        driver.start()
        assert index.asked.wait(120), "the build never asked the index"
        building = "building the environment (pip, 1 package)"
        wait_for(lambda: service.get(job.id).reason == building, 60, "the agent job's reason while it builds")
        assert service.get(job.id).state == "running"
    finally:
        index.release()
    driver.join(300)
    done = service.wait(job.id, timeout=300)
    assert done.state == "succeeded" and done.reason is None, done.reason


def test_a_notebook_job_with_an_environment_gets_nbclient_and_ipykernel_in_it(workspace, make_service, notebook_index):
    """The environment asks for neither; the notebook runs in it, with its kernel from it."""
    from jupyter_remote_compute.pipelines.notebook import notebook_spec

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import sys; print('kernel', sys.prefix)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, workspace / "nb.ipynb")
    env = {"UV_DEFAULT_INDEX": notebook_index.url, "UV_NO_CACHE": "1"}
    spec, _ = notebook_spec({"notebook": "nb.ipynb", "environment": {"packages": ["traitlets"]}, "env": env})
    assert spec.environment is not None and spec.environment.packages == ("traitlets", "nbclient", "ipykernel")
    service = make_service(workspace)
    job = service.wait(service.submit(spec).job.id, timeout=300)
    assert job.state == "succeeded", job.reason
    executed = nbformat.read(workspace / "nb.executed.ipynb", as_version=4)
    kernel = "".join(o.get("text", "") for o in executed.cells[-1].outputs).split()
    assert kernel[0] == "kernel" and "/envs/" in kernel[1]  # the kernel ran in the job's environment
    # the job's own packages win: one named already is not asked for twice
    again, _ = notebook_spec({"notebook": "nb.ipynb", "environment": {"packages": ["ipykernel>=6"]}})
    assert again.environment is not None and again.environment.packages == ("ipykernel>=6", "nbclient")
