"""The guards hold through every face: the REST API of a real server, the CLI, the magic in a real
kernel and the pipeline step. A secret typed into a job is refused and kept nowhere; a
``deny egress: remote`` policy stops an SSH job before a single byte leaves (no connection, no job
folder on the far side). And for the local and SSH engines as for the jupyter one: a secret
referenced by a job reaches it and no file, and an output damaged on its way back never lands.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd_fixture
from jupyter_client.manager import KernelManager
from server_process import ApiError, Server
from sshd_fixture import TestBed
from test_magic import Kernel
from waiting import wait_for

from jupyter_remote_compute.engines import ssh_transfer
from jupyter_remote_compute.errors import PolicyDenied, SecretInSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.jobs.store import JobStore
from jupyter_remote_compute.machines.registry import MachineRegistry
from jupyter_remote_compute.steps import run_step

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

FACES = ("rest", "cli", "magic", "step")
DENY_REMOTE = "# nothing leaves this workspace\nrules:\n  - deny egress: remote\n"


class Faces:
    """One workspace reached through all four faces; each ``submit`` returns the error it answered with."""

    def __init__(self, root: Path, scratch: Path, tracking_uri: str, tmp: Path) -> None:
        self.root, self.tmp = root, tmp
        self.env = {
            **os.environ,
            "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch),
            "MLFLOW_TRACKING_URI": tracking_uri,
            "IPYTHONDIR": str(tmp / "ipython"),
        }
        self.server = Server(root, scratch, tracking_uri, tmp / "server.log", env=self.env)
        self.kernel: Kernel | None = None
        self.cli_output = tmp / "cli.log"

    def start(self) -> None:
        self.server.start()
        manager = KernelManager(kernel_name="python3")
        manager.start_kernel(cwd=str(self.root), env=self.env)
        self.kernel = Kernel(manager)
        self.kernel.client.start_channels()
        self.kernel.client.wait_for_ready(timeout=120)
        loaded = self.kernel.run("%load_ext jupyter_remote_compute")
        assert loaded.error is None, loaded.error

    def stop(self) -> None:
        self.server.stop()
        if self.kernel is not None:
            self.kernel.client.stop_channels()
            self.kernel.manager.shutdown_kernel(now=True)

    def submit(self, face: str, machine: str, env: dict[str, str]) -> tuple[str, str]:
        """Submit ``true`` through one face; the refusal's (code or exception name, message)."""
        spec = {"machine": machine, "command": "true", "send": ["train.py"], "env": env}
        if face == "rest":
            with pytest.raises(ApiError) as info:
                self.server.request("POST", "jobs", spec)
            return info.value.body["code"], info.value.body["message"]
        if face == "cli":
            args = [f"--env={k}={v}" for k, v in env.items()]
            cmd = [
                sys.executable,
                "-m",
                "jupyter_remote_compute.cli",
                "run",
                "--machine",
                machine,
                "--send",
                "train.py",
            ]
            done = subprocess.run(
                [*cmd, *args, "--", "true"], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=180
            )
            with open(self.cli_output, "a") as log:  # kept with the other logs, to be searched too
                log.write(done.stdout + done.stderr)
            assert done.returncode == 1, done.stderr
            return "cli", done.stderr
        if face == "magic":
            assert self.kernel is not None
            line = " ".join(f"--env {k}={v}" for k, v in env.items())
            cell = self.kernel.run(f"%remote_train --machine {machine} --send train.py {line} -- true", timeout=180)
            assert cell.error is not None, cell.stdout
            return cell.error["ename"], cell.error["evalue"]
        if face == "step":
            with pytest.raises((SecretInSettings, PolicyDenied)) as raised:
                run_step(spec, {"workspace": str(self.root)})
            return type(raised.value).__name__, raised.value.message
        raise AssertionError(face)


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory, sshd_bed: TestBed) -> Iterator[Faces]:
    from conftest import QUICKSTART

    tmp = tmp_path_factory.mktemp("faces")
    root = tmp / "ws"
    shutil.copytree(QUICKSTART, root, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "*.pkl", "jobs*"))
    (tmp / "scratch").mkdir()
    MachineRegistry(root / ".punica/compute.yaml").add(
        "box", "ssh", "127.0.0.1", sshd_bed.options(base_dir=f"{sshd_bed.base_dir}/faces")
    )
    bed = Faces(root, tmp / "scratch", f"sqlite:///{tmp / 'mlflow.db'}", tmp)
    bed.env["SSH_AUTH_SOCK"] = str(sshd_bed.agent.sock)
    bed.start()
    yield bed
    bed.stop()


def _files_holding(roots: list[Path], needle: bytes) -> list[Path]:
    return [p for r in roots for p in r.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("face", FACES)
def test_a_secret_typed_into_a_job_is_refused_and_kept_nowhere(faces: Faces, face: str) -> None:
    token = "ghp_" + secrets.token_hex(18)  # a GitHub token's shape, new for every face
    code, message = faces.submit(face, "local", {"GH_TOKEN": token, "PLAIN": "1"})
    assert code in ("secret_in_settings", "SecretInSettings", "cli"), (code, message)
    assert "env.GH_TOKEN" in message and "GitHub" in message, message
    assert token not in message
    # Not in the state file, compute.yaml, the server's or the CLI's log, MLflow, the scratch: nowhere
    # but the kernel's IPython history, where IPython keeps whatever was typed into a cell.
    holding = _files_holding([faces.tmp], token.encode())
    assert all((faces.tmp / "ipython") in p.parents for p in holding), holding


def _jobs(root: Path) -> list[dict[str, Any]]:
    return [job.to_json() for job in JobStore(root / ".punica/jobs.json").jobs().values()]


@pytest.fixture
def deny_remote(faces: Faces) -> Iterator[Path]:
    policy = faces.root / ".punica/policy.yaml"
    policy.write_text(DENY_REMOTE)
    yield policy
    policy.unlink()


def _accepted(bed: TestBed) -> int:
    """SSH logins the far side has accepted so far (its sshd logs each one)."""
    return bed.sshd.log.read_text(errors="replace").count("Accepted publickey")


@pytest.mark.parametrize("face", FACES)
def test_deny_egress_stops_an_ssh_job_before_any_byte_leaves(
    faces: Faces, deny_remote: Path, sshd_bed: TestBed, face: str
) -> None:
    far_base = sshd_bed.far_path(f"{sshd_bed.base_dir.removeprefix('~/')}/faces")
    logins = _accepted(sshd_bed)
    jobs_before = len(_jobs(faces.root))
    code, message = faces.submit(face, "box", {"PLAIN": "1"})
    assert code in ("policy_denied", "PolicyDenied", "cli"), (code, message)
    assert ".punica/policy.yaml:3" in message and "box" in message, message
    assert not far_base.exists()  # no job folder, nor even the base, on the far side
    assert _accepted(sshd_bed) == logins  # not even a login
    assert len(_jobs(faces.root)) == jobs_before  # and nothing stored here


def test_without_the_policy_the_same_job_does_reach_the_far_side(faces: Faces, sshd_bed: TestBed) -> None:
    """The control for the test above: its far-side checks would see a job that got through."""
    far_base = sshd_bed.far_path(f"{sshd_bed.base_dir.removeprefix('~/')}/faces")
    answer = faces.server.request("POST", "jobs", {"machine": "box", "command": "true", "send": ["train.py"]})
    job = wait_for(
        lambda: (j := faces.server.request("GET", f"jobs/{answer['job']['id']}"))["state"] == "succeeded" and j,
        180,
        "the ssh job",
    )
    far_dir = Path(job["handle"]["dir"])
    assert far_base.resolve() in far_dir.resolve().parents and (far_dir / "work" / "train.py").is_file()


# -- secret in no file, damage in transit: the local and SSH engines ----------------------------
@pytest.fixture(params=["local", "ssh"])
def engine_workspace(request: pytest.FixtureRequest, workspace: Path, make_service) -> tuple[Any, str, TestBed | None]:  # type: ignore[no-untyped-def]
    service = make_service(workspace)
    if request.param == "local":
        return service, "local", None
    bed = request.getfixturevalue("ssh_agent_env")
    service.machines.add("box", "ssh", "127.0.0.1", bed.options())
    return service, "box", bed


def test_a_referenced_secret_reaches_the_job_and_no_file_here(engine_workspace, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    service, machine, bed = engine_workspace
    value = "jrc-" + secrets.token_hex(16)
    service.secrets.set("faces/api", value)
    root = service.workspace.root
    (root / "check.sh").write_text('[ "$API_KEY" = "$(cat expected)" ] && echo match; echo "key=$API_KEY"\n')
    (root / "expected").write_text(value)  # the test's own copy, sent to compare with; excluded below
    spec = {"machine": machine, "command": "sh check.sh", "send": ["check.sh", "expected"]}
    spec["env"] = {"API_KEY": "secret:faces/api"}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=180)
    assert job.state == "succeeded", job.reason
    log = service.read_log(job.id).data
    assert b"match" in log and value.encode() not in log and b"key=" + b"*" * len(value) in log
    holding = _files_holding([tmp_path], value.encode())
    # Only the test's own file and its sent copy on the far side (the local scratch is under tmp_path);
    # never the state file, the collected log, MLflow or the job's folder besides that copy.
    allowed = {root / "expected"}
    if bed is None:
        allowed.add(Path(job.handle["dir"]) / "work" / "expected")
        allowed.add(Path(job.handle["dir"]) / "log")  # the far side's raw log: what the command printed
    assert set(holding) <= allowed, holding
    if bed is not None:
        far = Path(job.handle["dir"])
        far_holding = [p for p in far.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
        assert {p.relative_to(far).as_posix() for p in far_holding} <= {"work/expected", "log"}, far_holding


def test_an_output_damaged_on_its_way_back_never_lands(  # type: ignore[no-untyped-def]
    engine_workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, machine, _ = engine_workspace
    # Every engine brings outputs back through the same verified tar stream (engines/farside):
    # damage one file's bytes as they arrive here, after the far side computed its digest.
    original = ssh_transfer.SafeExtractor._write

    def damaged(chunks):  # type: ignore[no-untyped-def]
        for chunk in chunks:
            data = bytearray(chunk)
            data[-1:] = bytes([data[-1] ^ 0x01]) if data else b""
            yield bytes(data)

    def tamper(self, name, mode, chunks, progress):  # type: ignore[no-untyped-def]
        original(self, name, mode, damaged(chunks) if name.endswith("b2") else chunks, progress)

    monkeypatch.setattr(ssh_transfer.SafeExtractor, "_write", tamper)
    spec = {"machine": machine, "command": "echo one > b1 && echo two > b2", "bring_back": ["b1", "b2"]}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=180)
    root = service.workspace.root
    assert job.state == "failed" and "damaged in transit" in job.reason and "b2" in job.reason, job.reason
    assert not (root / "b2").exists() and not (root / "b1").exists()  # nothing lands when one output is bad
    assert hashlib.sha256(b"two\n").hexdigest() not in str(job.outputs)
