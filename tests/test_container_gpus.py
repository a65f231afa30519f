"""GPUs for a job's container: the flags container.sh gives each runtime, the refusal at submit, the
runtime's own words where a machine has no NVIDIA support, and the line the job's log opens with.

This machine has no GPU and no NVIDIA container toolkit (../shared/TESTBED.md "Containers"): the flags
are read from a runtime that records its arguments and runs the entry on the host (with an
nvidia-smi that answers like the driver's), and real root podman shows what a machine without CDI
devices says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import agent_fixture
import pytest
import sshd_fixture
from required import require
from test_containers import CONTAINERS_CONF, _podman, agent_podman
from waiting import wait_for

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.engines.farside import parse_facts
from jupyter_remote_compute.engines.resources import Resources
from jupyter_remote_compute.environments import image as images
from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
agent_bed = agent_fixture.agent_bed

IMAGE_ID = "sha256:" + "ab" * 32
# A runtime that records `run`'s arguments (one a line) and runs the entry on the host, as the
# foreground `run --rm` would: the image's sh with the env file, the command, the log and the started
# marker, its exit code the command's.
FAKE_RUNTIME = f"""#!/bin/sh
case $1 in
  --version) echo "fake version 1.0" ;;
  image) case "$*" in *RepoDigests*) ;; *) echo {IMAGE_ID} ;; esac ;;
  container) exit 125 ;;  # inspect once the run ended: its --rm removed it
  run)
    shift
    : > "$FAKE_DIR/run.args"
    while [ "$1" != --entrypoint ]; do printf '%s\\n' "$1" >> "$FAKE_DIR/run.args"; shift; done
    shift 3
    exec sh "$@" ;;
esac
"""
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,name,memory.total*) printf '0, NVIDIA Fake A100, 81920 MiB\\n1, NVIDIA Fake A100, 81920 MiB\\n' ;;
  *) printf '| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\\n' ;;
esac
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _container_sh(
    jobdir: Path,
    runtime: str,
    gpus: str,
    env: dict[str, str],
    command: str = "true",
    image: str = "localhost/jrc-gpu:1",
) -> subprocess.CompletedProcess[str]:
    """container.sh for one job in ``jobdir`` with the job's command, as command.sh runs it."""
    (jobdir / "work").mkdir(parents=True, exist_ok=True)
    (jobdir / "command.inner.sh").write_text(command + "\n")
    names = " ".join(images.env_names([]))
    words = [str(jobdir), str(jobdir.parent / "images"), image, runtime, "none", names]
    return subprocess.run(
        ["sh", "-c", farside.script("container"), "sh", *words, images.ENTRY_SH, gpus],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def _fake_env(fake_runtimes: Path, home: Path) -> dict[str, str]:
    return {"PATH": f"{fake_runtimes}:/usr/bin:/bin", "FAKE_DIR": str(fake_runtimes), "HOME": str(home)}


@pytest.fixture
def fake_runtimes(tmp_path: Path) -> Path:
    """A folder with podman and docker that record their arguments, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("podman", "docker"):
        _executable(bin_dir / name, FAKE_RUNTIME)
    return bin_dir


def _run_args(fake_runtimes: Path, tmp_path: Path, runtime: str, gpus: str, visible: str | None = None) -> list[str]:
    jobdir = tmp_path / "jobs" / f"j{uuid.uuid4().hex[:8]}"
    env = _fake_env(fake_runtimes, tmp_path)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    done = _container_sh(jobdir, runtime, gpus, env, 'echo "inside=${CUDA_VISIBLE_DEVICES-unset}"')
    assert done.returncode == 0, done.stderr
    log = (jobdir / "log").read_text()
    args = (fake_runtimes / "run.args").read_text().splitlines()
    flags = []
    for i, arg in enumerate(args):
        if arg.startswith("--device=nvidia.com/gpu="):
            flags.append(arg)
        elif arg == "--gpus":
            flags += [arg, args[i + 1]]
    return flags + [line for line in log.splitlines() if line.startswith("inside=")]


def test_container_sh_gives_each_runtime_its_gpu_flags(fake_runtimes, tmp_path):
    def flags(runtime: str, gpus: str, visible: str | None = None) -> list[str]:
        return _run_args(fake_runtimes, tmp_path, runtime, gpus, visible)

    assert flags("docker", "2") == ["--gpus", "2", "inside=unset"]
    assert flags("podman", "2") == ["--device=nvidia.com/gpu=0", "--device=nvidia.com/gpu=1", "inside=unset"]
    assert flags("docker", "all") == ["--gpus", "all", "inside=unset"]
    assert flags("podman", "all") == ["--device=nvidia.com/gpu=all", "inside=unset"]
    # The machine's choice (an agent's per job) names the devices; inside they are numbered from 0.
    assert flags("docker", "2", "1,3") == ["--gpus", '"device=1,3"', "inside=0,1"]
    assert flags("podman", "2", "1,3") == ["--device=nvidia.com/gpu=1", "--device=nvidia.com/gpu=3", "inside=0,1"]
    assert flags("podman", "visible", "2") == ["--device=nvidia.com/gpu=2", "inside=0"]
    assert flags("docker", "visible") == ["inside=unset"]
    # A job that asked for none gets none, whatever the machine's environment says.
    assert flags("podman", "none", "0,1") == ["inside=0,1"]
    assert flags("docker", "none") == ["inside=unset"]


def test_the_log_opens_with_the_cuda_version_and_the_gpus_seen(fake_runtimes, tmp_path):
    env = _fake_env(fake_runtimes, tmp_path)
    jobdir = tmp_path / "jobs" / "without-smi"
    assert _container_sh(jobdir, "podman", "1", env, "echo ran").returncode == 0
    log = (jobdir / "log").read_text().splitlines()
    assert log[-2:] == ["gpus: nvidia-smi is not in the image: which GPUs it sees is not known", "ran"]

    _executable(fake_runtimes / "nvidia-smi", FAKE_NVIDIA_SMI)
    jobdir = tmp_path / "jobs" / "with-smi"
    assert _container_sh(jobdir, "docker", "2", env, "echo ran").returncode == 0
    log = (jobdir / "log").read_text().splitlines()
    assert log[-2:] == ["gpus: CUDA 12.4; 0, NVIDIA Fake A100, 81920 MiB; 1, NVIDIA Fake A100, 81920 MiB", "ran"]

    jobdir = tmp_path / "jobs" / "no-gpus"
    assert _container_sh(jobdir, "docker", "none", env, "echo ran").returncode == 0
    assert not any(line.startswith("gpus:") for line in (jobdir / "log").read_text().splitlines())


def test_a_bad_gpus_word_is_refused_by_container_sh(fake_runtimes, tmp_path):
    env = _fake_env(fake_runtimes, tmp_path)
    done = _container_sh(tmp_path / "jobs" / "bad", "podman", "2;x", env)
    assert done.returncode == 125 and "GPUS is 2;x" in done.stderr
    assert not (fake_runtimes / "run.args").exists()


def test_podman_without_cdi_devices_fails_the_job_with_its_own_words(tmp_path):
    """Real root podman on a machine without NVIDIA's CDI spec: the start fails, podman's words kept."""
    require(shutil.which("podman") is not None, "podman (apt-get install podman runc uidmap slirp4netns)")
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass  # the start fails on the device before anything in the image is run
    ref = f"localhost/jrc-gpu-{uuid.uuid4().hex[:8]}:1"
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    subprocess.run(["podman", "import", str(empty), ref], env=env, check=True, capture_output=True, timeout=120)
    try:
        done = _container_sh(tmp_path / "jobs" / "gpu-job", "podman", "1", env, image=ref)
        assert done.returncode == 125, (done.returncode, done.stderr)
        assert "unresolvable CDI devices nvidia.com/gpu=0" in done.stderr
        assert "podman could not start image" in done.stderr
        left = subprocess.run(["podman", "ps", "-a", "--filter", "name=jrc-gpu-job", "-q"], env=env,
                              capture_output=True, text=True, check=True)  # fmt: skip
        assert left.stdout.strip() == ""
    finally:
        subprocess.run(["podman", "rmi", "-f", ref], env=env, capture_output=True, timeout=120)


def test_an_agent_jobs_container_gets_the_gpu_the_agent_chose(agent_bed):
    """The agent hands each job a GPU (--gpus-per-job): the job asked for none, its container is given
    that device, and rootless podman's own words (no CDI spec here) are the job's reason."""
    require(shutil.which("podman") is not None, "podman (apt-get install podman runc uidmap slirp4netns)")
    server, user, home = agent_bed.server, agent_bed.user, agent_bed.home
    agent_podman(home, user)
    empty = home / "empty.tar"  # where the agent's user can read it
    with tarfile.open(empty, "w"):
        pass
    shutil.chown(empty, user, user)
    ref = f"localhost/jrc-gpu-{uuid.uuid4().hex[:8]}:1"
    _podman("import", str(empty), ref, user=user, home=home)
    try:
        agent_bed.add_machine("lab")
        agent_bed.start_agent("lab", "--gpus-per-job", "1", "--gpu-ids", "3")
        job = server.request("POST", "jobs", {"machine": "lab", "command": "true", "environment": {"image": ref}})[
            "job"
        ]
        done = wait_for(
            lambda: (j := server.request("GET", f"jobs/{job['id']}"))["state"] in ("succeeded", "failed") and j,
            timeout=240,
            message="the agent's GPU job to end",
        )
        assert done["state"] == "failed"
        assert "unresolvable CDI devices nvidia.com/gpu=3" in done["reason"], done["reason"]
        assert "podman could not start image" in done["reason"]
    finally:
        _podman("system", "reset", "--force", user=user, home=home, check=False)


# -- at submit --------------------------------------------------------------------------------------


class _Engine:
    def __init__(self, per_job: bool = False) -> None:
        self.gpus_chosen_per_job = per_job


def test_the_gpus_a_jobs_container_asks_for():
    assert images.gpu_request(Resources(gpus=2), {}, _Engine()) == "2"
    assert images.gpu_request(Resources(gpus=2), {"container_gpus": "all"}, _Engine()) == "2"
    assert images.gpu_request(Resources(), {"container_gpus": "all"}, _Engine()) == "all"
    assert images.gpu_request(Resources(), {}, _Engine()) == "none"
    assert images.gpu_request(Resources(), {}, _Engine(per_job=True)) == "visible"
    with pytest.raises(InvalidSettings) as e:
        images.gpu_request(Resources(), {"container_gpus": "2"}, _Engine())
    assert e.value.field == "options.container_gpus" and "none, all" in str(e.value)


def test_gpus_are_refused_where_the_runtime_has_no_nvidia_support():
    both = ("podman", "docker")
    podman = {"runtime": "podman", "version": "4.3.1", "rootless": False}
    docker = {"runtime": "docker", "version": "28.2.2", "rootless": False}
    auto = images.Image("python:3.12")
    with pytest.raises(InvalidSettings) as e:
        images.admit_gpus(auto, "2", "gpu1", "ssh", both, {"containers": [{**podman, "nvidia": False}, docker]})
    assert e.value.field == "resources.gpus"
    assert "gpu1's podman" in str(e.value) and "nvidia-ctk cdi generate" in str(e.value)
    assert "NVIDIA Container Toolkit" in str(e.value)
    with pytest.raises(InvalidSettings) as e:
        images.admit_gpus(
            images.Image("python:3.12", "docker"), "all", "gpu1", "ssh", both,
            {"containers": [{**podman, "nvidia": True}, {**docker, "nvidia": False}]},
        )  # fmt: skip
    assert e.value.field == "options.container_gpus" and "nvidia-ctk runtime configure --runtime=docker" in str(e.value)
    # auto is podman where it is installed, as container.sh picks: docker's support does not count
    with pytest.raises(InvalidSettings, match="gpu1's podman"):
        images.admit_gpus(
            auto, "1", "gpu1", "ssh", both, {"containers": [{**podman, "nvidia": False}, {**docker, "nvidia": True}]}
        )
    # What lets the job go: support found, nothing known (docker's daemon did not answer), no GPUs asked,
    # the agent's own choice, a Slurm login node's facts.
    images.admit_gpus(auto, "2", "gpu1", "ssh", both, {"containers": [{**podman, "nvidia": True}]})
    images.admit_gpus(auto, "2", "gpu1", "ssh", both, {"containers": [docker]})
    images.admit_gpus(auto, "none", "gpu1", "ssh", both, {"containers": [{**podman, "nvidia": False}]})
    images.admit_gpus(auto, "visible", "lab", "agent", both, {"containers": [{**podman, "nvidia": False}]})
    images.admit_gpus(auto, "2", "hpc", "slurm", ("podman",), {"containers": [{**podman, "nvidia": False}]})


def test_facts_name_each_runtimes_nvidia_support(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(
        bin_dir / "docker",
        '#!/bin/sh\ncase $1 in --version) echo "Docker version 28.2.2, build x" ;;\n'
        'info) echo \'{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"}}\' ;;\n'
        "esac\n",
    )

    def containers() -> dict[str, dict]:
        out = subprocess.run(
            ["sh", "-c", farside.script("facts"), "sh", str(tmp_path)],
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return {c["runtime"]: c for c in parse_facts(out, 0.0).to_json()["containers"]}

    assert containers()["docker"]["nvidia"] is True
    if shutil.which("podman", path="/usr/bin:/bin"):
        # No NVIDIA CDI spec on this machine (../shared/TESTBED.md)
        assert containers()["podman"]["nvidia"] is False
    # docker's daemon not answering: nothing is known, and nothing is claimed
    _executable(bin_dir / "docker", '#!/bin/sh\n[ "$1" != --version ] || echo "Docker version 28.2.2"; exit 1\n')
    docker = containers()["docker"]
    assert "nvidia" not in docker


def test_an_ssh_machine_without_nvidia_support_refuses_a_gpu_job_at_submit(ssh_agent_env, workspace, make_service):
    require(shutil.which("podman") is not None, "podman (apt-get install podman runc uidmap slirp4netns)")
    service = make_service(workspace)
    options = {"image": "localhost/jrc-gpu:1", "container_runtime": "podman", "container_gpus": "all"}
    service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options(**options))
    with pytest.raises(InvalidSettings) as e:
        service.submit(JobSpec.from_json({"machine": "box", "command": "nvidia-smi"}))
    assert e.value.field == "options.container_gpus"
    assert "box's podman" in str(e.value) and "nvidia-ctk cdi generate" in str(e.value)
    assert service.list_jobs() == []
