"""Jobs in a container image: real podman (root here, rootless for the ssh test user), an image made offline.

The image is a Debian rootfs from mmdebstrap (made once per machine, ``ROOTFS_CACHE``), imported with
``podman import`` once per session and marked with /etc/jrc-image-marker, so a job that reads the
marker ran inside it. Podman's own
settings for this machine (runc, cgroupfs, ulimits it may set; ../shared/TESTBED.md "Containers") go
into a private containers.conf: CONTAINERS_CONF for root, the test user's ~/.config/containers/.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import agent_fixture
import nbformat
import package_index
import pytest
import slurm_fixture
import sshd_fixture
from filelock import FileLock
from mlflow.tracking import MlflowClient
from required import require
from waiting import wait_for

from jupyter_remote_compute.engines.launcher import STORE_PLUGIN_DIR
from jupyter_remote_compute.environments import image as images
from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
slurm_bed = slurm_fixture.slurm_bed
agent_bed = agent_fixture.agent_bed
index = package_index.index
notebook_index = package_index.notebook_index

MARKER = "/etc/jrc-image-marker"
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def _podman(
    *args: str, user: str | None = None, check: bool = True, home: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """podman as root, or as ``user`` with only that user's own environment (their rootless store;
    ``home``: the one under that folder, as the user's processes with that HOME see it)."""
    cmd = ["podman", *args]
    if user is not None:
        home = home or Path(pwd.getpwnam(user).pw_dir)
        cmd = ["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, input=stdin or "", timeout=300)
    if user is not None and "podman system migrate" in done.stderr:
        # The user's pause process is gone (the sshd bed ends its sessions' processes, and a job's podman
        # started it) while its pid file stays: podman's own remedy, then the call once more.
        subprocess.run([*cmd[: cmd.index("podman")], "podman", "system", "migrate"], capture_output=True, timeout=300)
        done = subprocess.run(cmd, capture_output=True, text=True, input=stdin or "", timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


#: The ssh test user's rootless store and pause process are one per machine, used by the group "containers"
#: and by test_org_images.py (group "hub") on the other worker: a test holds this lock while it uses them,
#: and so does an image's removal, which ends the pause process (a job's podman stop then failed, and a
#: cancelled Slurm job's container was left behind).
ROOTLESS_LOCK = "/tmp/jrc-rootless-store.lock"


class BuiltImage:
    def __init__(self, ref: str, marker: str, rootfs: Path) -> None:
        self.ref, self.marker, self.rootfs = ref, marker, rootfs
        self.users: list[str] = []

    def digest(self, user: str | None = None) -> str:
        found = _podman("image", "inspect", "--format", "{{.Id}}", self.ref, user=user).stdout.strip()
        return found if found.startswith("sha256:") else "sha256:" + found

    def import_for(self, user: str) -> None:
        """The same image in ``user``'s rootless store (each user has a store of their own)."""
        if user not in self.users:
            _podman("import", str(self.rootfs), self.ref, user=user)
            self.users.append(user)

    def remove(self) -> None:
        """Out of every store it was imported into; the rootless users' pause processes ended."""
        _podman("rmi", "-f", self.ref, check=False)
        with FileLock(ROOTLESS_LOCK, timeout=900):
            for user in self.users:
                _podman("rmi", "-f", self.ref, user=user, check=False)
                _stop_pause_process(user)


#: The image's rootfs, made once per machine and kept by a digest of what made it (mmdebstrap, the suite,
#: the package sources): every worker and every later run imports the same file, under a ref of its own.
ROOTFS_CACHE = Path("/var/tmp/jrc-test-image")
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")


def _rootfs() -> tuple[Path, str]:
    """The marked rootfs (readable by the rootless test user too) and its marker, made if missing."""
    mmdebstrap = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True).stdout
    made_by = json.dumps([mmdebstrap, "bookworm", "python3", MARKER, SOURCES.read_text()])
    folder = ROOTFS_CACHE / hashlib.sha256(made_by.encode()).hexdigest()[:16]
    ROOTFS_CACHE.mkdir(mode=0o755, exist_ok=True)
    with FileLock(str(ROOTFS_CACHE / ".build.lock"), timeout=900):
        if not (folder / "marker").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(mode=0o755)
            marker = f"jrc-{uuid.uuid4().hex[:8]}"
            subprocess.run(
                ["mmdebstrap", "--quiet", "--variant=apt", "--include=python3",
                 f"--customize-hook=echo {marker} > \"$1{MARKER}\"",
                 "bookworm", str(folder / "rootfs.tar"), str(SOURCES)],
                check=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=600,
            )  # fmt: skip
            os.chmod(folder / "rootfs.tar", 0o644)  # the rootless user imports the same rootfs
            (folder / "marker").write_text(marker)  # last: the rootfs is whole once this exists
    return folder / "rootfs.tar", (folder / "marker").read_text()


def build_image(work: Path) -> BuiltImage:
    """The marked image, imported into root's store under a ref of this session's own (``remove`` takes
    it out again); podman's settings for this machine in ``work/containers.conf``, named by
    CONTAINERS_CONF for this process."""
    conf = work / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    os.environ["CONTAINERS_CONF"] = str(conf)
    rootfs, marker = _rootfs()
    image = BuiltImage(f"localhost/jrc-test-{uuid.uuid4().hex[:8]}:1", marker, rootfs)
    _podman("import", "--change", 'CMD ["/usr/bin/python3"]', str(rootfs), image.ref)
    return image


@pytest.fixture(scope="session")
def test_image() -> Iterator[BuiltImage]:
    require(shutil.which("podman") is not None, "podman (apt-get install podman runc uidmap slirp4netns)")
    require(shutil.which("mmdebstrap") is not None, "mmdebstrap (apt-get install mmdebstrap)")
    work = Path(tempfile.mkdtemp(prefix="jrc-image-"))
    os.chmod(work, 0o755)
    before = os.environ.get("CONTAINERS_CONF")
    try:
        image = build_image(work)
        yield image
        image.remove()
    finally:
        if before is None:
            os.environ.pop("CONTAINERS_CONF", None)
        else:
            os.environ["CONTAINERS_CONF"] = before
        shutil.rmtree(work, ignore_errors=True)


def _stop_pause_process(user: str) -> None:
    """Rootless podman leaves a pause process holding the user's namespaces: end it (its pid file names it)."""
    runroot = _podman("info", "--format", "{{.Store.RunRoot}}", user=user).stdout.strip()
    pid_file = Path(runroot).parent / "libpod/tmp/pause.pid"
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


def _digest_of(ref: str) -> str:
    found = _podman("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
    return found if found.startswith("sha256:") else "sha256:" + found


def _containers(label: str, user: str | None = None, home: Path | None = None) -> list[str]:
    out = _podman(
        "ps", "-a", "--filter", f"label=jrc.job={label}", "--format", "{{.Names}}", user=user, home=home
    ).stdout
    return out.split()


def _far_dir(job) -> Path:  # type: ignore[no-untyped-def]
    return Path(job.handle["dir"])


# -- local: root podman -------------------------------------------------------------------------


def test_a_local_job_runs_in_its_image_and_records_the_digest(test_image, workspace, make_service, tracking_uri):
    (workspace / "job.sh").write_text(
        f'mkdir -p out; cat {MARKER} > out/marker.txt; id -u > out/uid.txt; echo "in $PWD"; exit 0\n'
    )
    service = make_service(workspace)
    spec = JobSpec.from_json(
        {"command": "sh job.sh", "send": ["job.sh"], "bring_back": ["out/"], "environment": {"image": test_image.ref}}
    )
    job = service.wait(service.submit(spec).job.id, timeout=180)
    assert job.state == "succeeded", job.reason
    assert (workspace / "out/marker.txt").read_text().strip() == test_image.marker
    assert (workspace / "out/uid.txt").read_text().strip() == str(os.getuid())
    log = service.read_log(job.id).data.decode()
    digest = test_image.digest()
    assert f"image {test_image.ref} {digest} (podman " in log
    # the work folder is the working directory, at the path it has outside
    assert f"in {_far_dir(job)}/work" in log
    run = MlflowClient(tracking_uri).get_run(job.mlflow_run_id)
    assert run.data.tags[images.TAG_IMAGE] == test_image.ref
    assert run.data.tags[images.TAG_DIGEST] == digest
    assert not _containers(job.id), "the container is removed once its outcome is read"
    assert not (_far_dir(job) / ".container-env").exists()

    # The image was pinned on first use: the next job runs the pinned id, pulling nothing.
    again = service.wait(service.submit(spec, new=True).job.id, timeout=180)
    assert again.state == "succeeded", again.reason
    later = service.read_log(again.id).data.decode()
    assert f"image {test_image.ref} {digest} " in later and "pulling" not in later
    # the local machine's base is its scratch folder; beside each pin, its last use (<pin>.used)
    pins = [p for p in (_far_dir(again).parent / "images").iterdir() if p.suffix != ".used"]
    assert len(pins) == 1 and pins[0].read_text().split()[0] in (digest, digest.removeprefix("sha256:"))


def test_an_images_own_pythonpath_stays_behind_the_job_stores_plugin(test_image, workspace, make_service):
    """The store here is sqlite: the job's store has the launcher's scheme, whose plugin's folder goes ahead
    of the image's own PYTHONPATH inside the container (the outer one is never passed in), and Python there
    finds the plugin's entry points."""
    ref = f"localhost/jrc-test-pythonpath-{uuid.uuid4().hex[:8]}:1"
    _podman("import", "--change", "ENV PYTHONPATH=/opt/image-lib", str(test_image.rootfs), ref)
    try:
        (workspace / "job.sh").write_text(
            'echo "pythonpath: $PYTHONPATH"; echo "uri: $MLFLOW_TRACKING_URI"\n'
            "exec python3 -c 'import importlib.metadata as m; "
            'print("stores:", sorted(e.name for e in m.entry_points(group="mlflow.tracking_store")))\'\n'
        )
        service = make_service(workspace)
        spec = JobSpec.from_json({"command": "sh job.sh", "send": ["job.sh"], "environment": {"image": ref}})
        job = service.wait(service.submit(spec).job.id, timeout=180)
        assert job.state == "succeeded", job.reason
        log = service.read_log(job.id).data.decode()
        far = _far_dir(job)
        assert f"pythonpath: {far}/{STORE_PLUGIN_DIR}:/opt/image-lib\n" in log, log
        assert f"uri: remote-compute://{far}/mlruns\n" in log, log
        assert "stores: ['remote-compute']" in log, log
    finally:
        _podman("rmi", "-f", ref, check=False)


def test_a_python_environment_is_built_inside_the_image_once_and_is_the_images_own(
    test_image, index, workspace, make_service, scratch_dir, tracking_uri
):
    """The image has python3 but neither uv nor venv: this side's uv, mounted, builds the environment in
    it, under the machine's env cache; the next job takes it cached; the same content outside the image
    is another environment."""
    from jupyter_remote_compute.recording.environment import TAG as TAG_ENVIRONMENT

    (workspace / "fit.py").write_text(
        f"import os, rcdemo_a, sys\nm = open({MARKER!r}).read().strip() if os.path.exists({MARKER!r}) else '-'\n"
        "print('value', rcdemo_a.VALUE, 'prefix', sys.prefix, 'marker', m)\n"
    )
    (workspace / "requirements.txt").write_text(f"# {uuid.uuid4()}\nrcdemo-b\n")
    service = make_service(workspace)
    data = {
        "command": ["python", "fit.py"], "send": ["fit.py"],
        "env": {"UV_DEFAULT_INDEX": index.url},  # the built-in machine's installer reads the index here
        "environment": {"requirements": "requirements.txt", "image": test_image.ref},
    }  # fmt: skip
    spec = JobSpec.from_json(data)
    first = service.wait(service.submit(spec).job.id, timeout=300)
    log = service.read_log(first.id).data.decode()
    assert first.state == "succeeded", (first.reason, log)
    digest = test_image.digest()
    assert f"image {test_image.ref} {digest} (podman " in log
    assert "building with uv " in log and ": built in " in log, log
    assert f"value a1 prefix {scratch_dir.resolve()}/envs/" in log  # rcdemo-b brought rcdemo-a 1.0, in the image
    assert f"marker {test_image.marker}" in log
    prefix = Path(log.split("prefix ", 1)[1].split()[0])
    assert prefix.name.endswith("-" + digest.removeprefix("sha256:")[:16]), "named by the image's digest too"
    assert (prefix / "complete").is_file() and prefix.parent == scratch_dir.resolve() / "envs"
    run = MlflowClient(tracking_uri).get_run(first.mlflow_run_id)
    assert run.data.tags[images.TAG_DIGEST] == digest
    assert prefix.name.startswith(run.data.tags[TAG_ENVIRONMENT]), "the environment's tag is its content digest"

    again = service.wait(service.submit(spec, new=True).job.id, timeout=300)
    later = service.read_log(again.id).data.decode()
    assert again.state == "succeeded", (again.reason, later)
    assert ": cached (" in later and "built in" not in later and f"value a1 prefix {prefix} " in later

    # The same content with no image: the machine's own Python, an environment of its own.
    outside = {**data, "environment": {"requirements": "requirements.txt"}}
    bare = service.wait(service.submit(JobSpec.from_json(outside)).job.id, timeout=300)
    bare_log = service.read_log(bare.id).data.decode()
    assert bare.state == "succeeded", (bare.reason, bare_log)
    assert ": built in " in bare_log and f"prefix {prefix} " not in bare_log and "value a1" in bare_log
    assert "marker -" in bare_log


def test_a_notebook_runs_in_its_image_with_its_kernel_built_inside_it(
    test_image, notebook_index, workspace, make_service
):
    """The image has python3 and no nbclient: alone, the runner names what it lacks and how to add it;
    with packages beside the image, the runner's are built inside it and the kernel runs there."""
    from jupyter_remote_compute.pipelines.notebook import notebook_spec

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import sys; print('kernel', sys.prefix, open({MARKER!r}).read().strip())")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, workspace / "nb.ipynb")
    service = make_service(workspace)
    env = {"UV_DEFAULT_INDEX": notebook_index.url, "UV_NO_CACHE": "1"}
    alone, _ = notebook_spec({"notebook": "nb.ipynb", "environment": {"image": test_image.ref}, "env": env})
    bare = service.wait(service.submit(alone).job.id, timeout=300)
    assert bare.state == "failed" and bare.exit_code == 3, (bare.state, bare.reason)
    assert "the image's python (/usr/bin/python3) lacks nbformat, nbclient, ipykernel" in (bare.reason or "")
    assert "add nbclient and ipykernel to the job's environment packages" in (bare.reason or "")

    environment = {"image": test_image.ref, "packages": ["traitlets"]}
    spec, _ = notebook_spec({"notebook": "nb.ipynb", "environment": environment, "env": env})
    job = service.wait(service.submit(spec).job.id, timeout=600)
    assert job.state == "succeeded", (job.reason, service.read_log(job.id).data.decode()[-3000:])
    executed = nbformat.read(workspace / "nb.executed.ipynb", as_version=4)
    said = "".join(o.get("text", "") for o in executed.cells[-1].outputs).split()
    digest = test_image.digest().removeprefix("sha256:")
    assert said[0] == "kernel" and "/envs/" in said[1] and said[1].endswith("-" + digest[:16]), said
    assert said[2] == test_image.marker, "the kernel ran inside the image"


def test_the_exit_code_is_the_commands(test_image, workspace, make_service):
    service = make_service(workspace)
    job = service.wait(
        service.submit(JobSpec.from_json({"command": "exit 7", "environment": {"image": test_image.ref}})).job.id, 180
    )
    assert job.state == "failed" and job.exit_code == 7, (job.state, job.exit_code, job.reason)
    assert not _containers(job.id)


def test_a_missing_image_fails_the_job_with_the_runtimes_words(test_image, workspace, make_service):
    service = make_service(workspace)
    spec = JobSpec.from_json({"command": "true", "environment": {"image": "localhost/jrc-no-such-image:1"}})
    job = service.wait(service.submit(spec).job.id, 180)
    assert job.state == "failed", job.state
    log = service.read_log(job.id).data.decode()
    assert "pulling localhost/jrc-no-such-image:1" in log and "container: pulling" in log
    # the runtime's own words end the line that names the registry
    assert "pulling localhost/jrc-no-such-image:1 from localhost failed: Error: " in log


def test_a_moved_tag_does_not_move_the_pin(test_image, workspace, make_service):
    """The pinned id is gone and the tag names other content now: the job fails naming the pin, not
    running whatever the tag is; removing the pin, as the error says, pins the new content."""
    ref = test_image.ref.replace(":1", "-moved:1")
    _podman("import", str(test_image.rootfs), ref)
    try:
        service = make_service(workspace)
        spec = JobSpec.from_json({"command": f"cat {MARKER}", "environment": {"image": ref}})
        first = service.wait(service.submit(spec).job.id, 180)
        assert first.state == "succeeded", first.reason
        pinned = _digest_of(ref)
        _podman("rmi", "-f", ref)
        _podman("import", "--change", "LABEL moved=1", str(test_image.rootfs), ref)
        assert _digest_of(ref) != pinned
        second = service.wait(service.submit(spec, new=True).job.id, 180)
        assert second.state == "failed", second.state
        log = service.read_log(second.id).data.decode()
        assert f"pinned as {pinned.removeprefix('sha256:')}" in log and "remove " in log
        pin = Path(log.split("remove ", 1)[1].split(" to pin it again")[0])
        assert pin.parent == _far_dir(second).parent / "images"
        pin.unlink()
        third = service.wait(service.submit(spec, new=True).job.id, 180)
        assert third.state == "succeeded", third.reason
        assert f"image {ref} {_digest_of(ref)} " in service.read_log(third.id).data.decode()
    finally:
        _podman("rmi", "-f", ref, check=False)


def test_a_leftover_container_of_the_same_job_is_replaced(test_image, workspace, make_service):
    """A start that made its container but died before it ran leaves the name taken: the next start runs."""
    service = make_service(workspace)
    job = service.submit(JobSpec.from_json({"command": "echo fresh", "environment": {"image": test_image.ref}})).job
    _podman("create", "--name", f"jrc-{job.id}", "--label", f"jrc.job={job.id}", test_image.ref, "true")
    done = service.wait(job.id, 180)
    assert done.state == "succeeded", done.reason
    assert "fresh" in service.read_log(job.id).data.decode()
    assert not _containers(job.id)


def test_a_secret_reaches_the_command_and_no_inspect_output(test_image, workspace, make_service):
    secret = "s3cr3t-" + uuid.uuid4().hex
    (workspace / "job.sh").write_text(
        'mkdir -p out; printf %s "$API_KEY" | sha256sum | cut -d" " -f1 > out/key.sha\n'
        "echo waiting; while [ ! -f go ]; do sleep 0.05; done\n"
    )
    service = make_service(workspace)
    service.secrets.set("test/api", secret)
    spec = JobSpec.from_json(
        {"command": "sh job.sh", "send": ["job.sh"], "bring_back": ["out/key.sha"],
         "env": {"API_KEY": "secret:test/api", "PLAIN": "visible"}, "environment": {"image": test_image.ref}}
    )  # fmt: skip
    job = service.advance(service.submit(spec).job.id)
    running = wait_for(
        lambda: (j := service.get(job.id)).state == "running" and _containers(job.id) and j,
        timeout=180,
        message="the job's container to run",
    )
    far = _far_dir(running)
    wait_for(lambda: (far / "work/out/key.sha").exists(), timeout=60, message="the command to start")
    inspect = _podman("inspect", f"jrc-{job.id}").stdout
    assert secret not in inspect
    assert json.loads(inspect)[0]["State"]["Running"] is True
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert secret not in ps
    assert not (far / ".container-env").exists(), "the environment file is removed before the command runs"
    (far / "work/go").touch()
    done = service.wait(job.id, timeout=120)
    assert done.state == "succeeded", done.reason
    import hashlib

    assert (workspace / "out/key.sha").read_text().strip() == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in service.read_log(job.id).data.decode()


def _started_in_image(service, image: str):  # type: ignore[no-untyped-def]
    """A job that says "started" in ``image`` and sleeps, once it has said so."""
    spec = JobSpec.from_json({"command": "echo started; sleep 600", "environment": {"image": image}})
    job = service.advance(service.submit(spec).job.id)
    wait_for(
        lambda: service.get(job.id).state == "running" and b"started" in service.read_log(job.id).data,
        timeout=180,
        message="the job to run in its container",
    )
    return service.get(job.id)


def test_cancel_stops_and_removes_the_container(test_image, workspace, make_service):
    service = make_service(workspace)
    job = _started_in_image(service, test_image.ref)
    assert _containers(job.id) == [f"jrc-{job.id}"]
    service.cancel(job.id)
    done = service.wait(job.id, timeout=120)
    assert done.state == "cancelled", done.state
    assert not _containers(job.id), "cancel leaves no container behind"
    assert not (_far_dir(done) / "container").exists()


def test_check_names_the_container_runtimes(test_image, workspace, make_service):
    facts = make_service(workspace).engine("local").check()
    podman = next(c for c in facts["containers"] if c["runtime"] == "podman")
    version = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=True).stdout
    assert podman["rootless"] is False and podman["version"] in version


def test_run_image_from_the_cli(test_image, workspace, scratch_dir, tracking_uri):
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_remote_compute.cli", "run", "--image", test_image.ref, "--runtime", "podman",
         "--", "cat", MARKER],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert test_image.marker in done.stdout


def test_a_container_outlives_the_process_that_started_it(
    test_image, workspace, make_service, scratch_dir, tracking_uri
):
    """The CLI that submitted the job is SIGKILLed while its container runs; another process ends the job once."""
    from conftest import job_runs

    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "JUPYTER_REMOTE_COMPUTE_SCRATCH": str(scratch_dir)}
    cli = subprocess.Popen(
        [sys.executable, "-m", "jupyter_remote_compute.cli", "run", "--image", test_image.ref, "--",
         "sh", "-c", f"echo waiting; while [ ! -f go ]; do sleep 0.05; done; cat {MARKER}"],
        cwd=workspace, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    service = make_service(workspace)
    try:
        job = wait_for(
            lambda: next((j for j in service.list_jobs() if j.state == "running" and _containers(j.id)), None),
            timeout=180,
            message="the CLI's job to run in its container",
        )
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
    finally:
        cli.kill()
    assert _containers(job.id) == [f"jrc-{job.id}"], "the container runs on without the process that started it"
    (_far_dir(job) / "work/go").touch()
    done = service.wait(job.id, timeout=120)
    assert done.state == "succeeded", done.reason
    assert test_image.marker in service.read_log(job.id).data.decode()
    assert len(job_runs(tracking_uri, job.id)) == 1
    assert not _containers(job.id)


def test_a_job_whose_launcher_was_killed_is_lost_and_its_container_goes_with_it(test_image, workspace, make_service):
    """A reboot or the OOM killer ends the launcher's group at once: container.sh never sees its container
    end. The job is lost (nothing can read its outcome) and the container, which would run on, is removed."""
    service = make_service(workspace)
    job = _started_in_image(service, test_image.ref)
    far = _far_dir(job)
    group = int((far / "pid").read_text().split()[0])
    os.killpg(group, signal.SIGKILL)
    assert _containers(job.id) == [f"jrc-{job.id}"], "the container outlives its launcher"
    done = service.wait(job.id, timeout=120)
    assert done.state == "lost" and "vanished" in (done.reason or ""), (done.state, done.reason)
    assert not _containers(job.id), "no container is left running for a lost job"
    assert not (far / "container").exists()


def test_a_server_sigkilled_while_its_container_runs_ends_the_job_once_after_the_restart(
    test_image, workspace, scratch_dir, tracking_uri, tmp_path
):
    """The Jupyter server that started the job dies at once; the container runs on, and the server
    started again ends the job once: one outcome, one MLflow run, no container left."""
    from conftest import job_runs
    from server_process import Server

    server = Server(workspace, scratch_dir, tracking_uri, tmp_path / "server.log")
    wait_go = f"echo waiting; while [ ! -f go ]; do sleep 0.05; done; cat {MARKER}"
    body = {"command": ["sh", "-c", wait_go], "environment": {"image": test_image.ref}}
    try:
        server.start()
        job_id = server.request("POST", "jobs", body)["job"]["id"]
        wait_for(
            lambda: _containers(job_id) and "waiting" in server.request("GET", f"jobs/{job_id}/log")["data"],
            timeout=180,
            message="the job to run in its container",
        )
        server.kill()
        assert _containers(job_id) == [f"jrc-{job_id}"], "the container runs on without the server"
        server.start()
        (far,) = scratch_dir.glob(f"**/{job_id}/work")
        (far / "go").touch()

        def ended() -> dict | None:  # type: ignore[type-arg]
            job = server.request("GET", f"jobs/{job_id}")
            return job if job["state"] in ("succeeded", "failed", "lost", "cancelled") else None

        job = wait_for(ended, 180, "the job to end after the restart")
        log = server.request("GET", f"jobs/{job_id}/log")["data"]
    finally:
        server.stop()
    assert job["state"] == "succeeded", job["reason"]
    assert log.count(f"\n{test_image.marker}\n") == 1, log  # the command ran once
    assert len(job_runs(tracking_uri, job_id)) == 1
    assert not _containers(job_id)


def test_an_image_is_refused_at_submit_on_a_kind_that_runs_none(workspace, make_service):
    service = make_service(workspace)
    service.machines.add("nb", "jupyter", "http://127.0.0.1:9", {"token_secret": "compute/remote"})
    with pytest.raises(InvalidSettings) as e:
        service.submit(JobSpec.from_json({"machine": "nb", "command": "true", "environment": {"image": "python:3.12"}}))
    assert e.value.field == "environment.image" and "jupyter machine" in str(e.value)
    assert service.list_jobs() == [], "nothing is stored for a refused job"


# -- docker: its own daemon on a private socket ----------------------------------------------------


@pytest.fixture(scope="session")
def docker_image(test_image) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A dockerd of the tests' own (no bridge, no firewall rules: the host's network is left as it is)
    with the same rootfs imported; DOCKER_HOST names its socket for this process and its far sides."""
    require(shutil.which("dockerd") is not None, "dockerd (apt-get install docker.io)")
    root = Path(tempfile.mkdtemp(prefix="jrc-docker-"))
    sock = root / "docker.sock"
    daemon = subprocess.Popen(
        ["dockerd", "--iptables=false", "--ip-forward=false", "--bridge=none", "--data-root", str(root / "data"),
         "--exec-root", str(root / "exec"), "-H", f"unix://{sock}", "--pidfile", str(root / "docker.pid")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=(root / "dockerd.log").open("wb"),
    )  # fmt: skip
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = f"unix://{sock}"
    try:

        def answers() -> bool:
            return subprocess.run(["docker", "version"], capture_output=True).returncode == 0

        wait_for(answers, timeout=60, message="dockerd to answer")
        ref = test_image.ref.replace("localhost/", "localhost/docker-")
        subprocess.run(["docker", "import", str(test_image.rootfs), ref], check=True, capture_output=True)
        yield ref
    finally:
        sshd_fixture.terminate(daemon)
        # dockerd leaves its network namespace mounted under its exec root
        for mount in reversed(Path("/proc/mounts").read_text().splitlines()):
            point = mount.split()[1]
            if point.startswith(f"{root}/"):
                subprocess.run(["umount", point], capture_output=True)
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before
        shutil.rmtree(root, ignore_errors=True)


def _docker_containers(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=jrc.job={label}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split()


def test_a_job_runs_in_docker_keeps_its_exit_code_and_cancel_removes_it(
    docker_image, test_image, workspace, make_service, tracking_uri
):
    service = make_service(workspace)
    image = {"image": docker_image, "runtime": "docker"}
    job = service.wait(
        service.submit(JobSpec.from_json({"command": f"cat {MARKER}; id -u; exit 3", "environment": image})).job.id,
        180,
    )
    assert job.state == "failed" and job.exit_code == 3, (job.state, job.exit_code, job.reason)
    log = service.read_log(job.id).data.decode()
    assert test_image.marker in log and f"\n{os.getuid()}\n" in log
    digest = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", docker_image], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert f"image {docker_image} {digest} (docker " in log and ", rootful)" in log
    assert MlflowClient(tracking_uri).get_run(job.mlflow_run_id).data.tags[images.TAG_DIGEST] == digest
    assert not _docker_containers(job.id)

    running = service.advance(
        service.submit(JobSpec.from_json({"command": "echo started; sleep 600", "environment": image})).job.id
    )
    wait_for(lambda: b"started" in service.read_log(running.id).data, timeout=180, message="the docker job to start")
    assert _docker_containers(running.id) == [f"jrc-{running.id}"]
    service.cancel(running.id)
    assert service.wait(running.id, timeout=120).state == "cancelled"
    assert not _docker_containers(running.id), "cancel leaves no container behind"


def test_a_python_environment_is_built_inside_a_docker_image_as_the_user(
    docker_image, index, workspace, make_service, scratch_dir
):
    """docker runs the container as the user (--user UID:GID), with the env cache and this side's uv
    mounted as for podman: the environment is built once, named by docker's id of the image."""
    (workspace / "fit.py").write_text("import rcdemo_a, sys\nprint('value', rcdemo_a.VALUE, 'prefix', sys.prefix)\n")
    service = make_service(workspace)
    spec = JobSpec.from_json(
        {"command": ["python", "fit.py"], "send": ["fit.py"], "env": {"UV_DEFAULT_INDEX": index.url},
         "environment": {"packages": ["rcdemo-b"], "image": docker_image, "runtime": "docker"}}
    )  # fmt: skip
    first = service.wait(service.submit(spec).job.id, timeout=300)
    log = service.read_log(first.id).data.decode()
    assert first.state == "succeeded", (first.reason, log)
    digest = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", docker_image], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert f"image {docker_image} {digest} (docker " in log and "building with uv " in log, log
    assert f"value a1 prefix {scratch_dir.resolve()}/envs/" in log
    prefix = Path(log.split("prefix ", 1)[1].split()[0])
    assert prefix.name.endswith("-" + digest.removeprefix("sha256:")[:16])
    assert prefix.stat().st_uid == os.getuid(), "the environment is the user's, not the daemon's root"
    again = service.wait(service.submit(spec, new=True).job.id, timeout=300)
    later = service.read_log(again.id).data.decode()
    assert again.state == "succeeded" and ": cached (" in later and f"prefix {prefix}\n" in later, later
    assert not _docker_containers(first.id) and not _docker_containers(again.id)


# -- ssh: rootless podman for the test user ----------------------------------------------------------


def configure_rootless(user: str) -> Path | None:
    """Podman's settings for this machine in ``user``'s own config; the file made (None: it was there)."""
    home = Path(pwd.getpwnam(user).pw_dir)
    conf = home / ".config/containers/containers.conf"
    if conf.exists():
        return None
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(CONTAINERS_CONF)
    for path in (home / ".config", conf.parent, conf):
        shutil.chown(path, user, user)
    return conf


@pytest.fixture
def rootless_user(test_image, sshd_bed) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The ssh test user with podman's settings for this machine in its own config, and the image; the
    user's store is this test's alone while it runs (``ROOTLESS_LOCK``)."""
    user = sshd_bed.user
    with FileLock(ROOTLESS_LOCK, timeout=900):
        made = configure_rootless(user)
        test_image.import_for(user)
        yield user
        if made:
            made.unlink(missing_ok=True)


def test_an_ssh_job_runs_rootless_and_its_files_are_the_users(
    rootless_user, test_image, ssh_agent_env, workspace, make_service, tracking_uri
):
    (workspace / "job.sh").write_text(f"mkdir -p out; cat {MARKER} > out/marker.txt; id -u > out/uid.txt\n")
    service = make_service(workspace)
    # The machine's default image, runtime and network: the job names none of them.
    options = {"image": test_image.ref, "container_runtime": "podman", "container_network": "none"}
    service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options(**options))
    podman = next(c for c in service.engine("box").check()["containers"] if c["runtime"] == "podman")
    assert podman["rootless"] is True
    spec = JobSpec.from_json({"machine": "box", "command": "sh job.sh", "send": ["job.sh"], "bring_back": ["out/"]})
    job = service.wait(service.submit(spec).job.id, timeout=180)
    assert job.state == "succeeded", job.reason
    assert job.spec.image == images.Image(test_image.ref, "podman")
    uid = pwd.getpwnam(rootless_user).pw_uid
    assert (workspace / "out/marker.txt").read_text().strip() == test_image.marker
    assert (workspace / "out/uid.txt").read_text().strip() == str(uid)
    far = _far_dir(job) / "work/out/marker.txt"
    assert far.stat().st_uid == uid, "a file the job wrote belongs to the user, not to a mapped id"
    digest = test_image.digest(user=rootless_user)
    assert (
        f"image {test_image.ref} {digest} (podman {podman['version']}, rootless)"
        in service.read_log(job.id).data.decode()
    )
    run = MlflowClient(tracking_uri).get_run(job.mlflow_run_id)
    assert run.data.tags[images.TAG_DIGEST] == digest
    assert not _containers(job.id, user=rootless_user)


# -- slurm: rootless podman in the batch job --------------------------------------------------------


@pytest.fixture
def hpc(rootless_user, slurm_bed, workspace, make_service):  # type: ignore[no-untyped-def]
    """A service with the test cluster as machine ``hpc``; the cluster's jobs are cancelled after."""
    service = make_service(workspace)
    service.machines.add("hpc", "slurm", "127.0.0.1", slurm_bed.machine_options())
    yield service
    service.close()
    slurm_bed.cancel_all()


def test_a_slurm_job_runs_in_its_image_inside_the_batch_job(
    hpc, slurm_bed, rootless_user, test_image, workspace, tracking_uri
):
    (workspace / "job.sh").write_text(
        f"mkdir -p out; cat {MARKER} > out/marker.txt; id -u > out/uid.txt\n"
        'echo "node=$SLURMD_NODENAME world=$WORLD_SIZE rank=$NODE_RANK job=$SLURM_JOB_ID"\n'
    )
    podman = next(c for c in hpc.engine("hpc").check()["containers"] if c["runtime"] == "podman")
    assert podman["rootless"] is True, "the login node's facts name the runtime the job's user has"
    spec = JobSpec.from_json(
        {
            "machine": "hpc",
            "command": "sh job.sh",
            "send": ["job.sh"],
            "bring_back": ["out/"],
            "environment": {"image": test_image.ref},
        }
    )
    job = hpc.wait(hpc.submit(spec).job.id, timeout=240)
    assert job.state == "succeeded", job.reason
    slurm_id = job.handle["slurm_job_id"]
    uid = pwd.getpwnam(rootless_user).pw_uid
    assert (workspace / "out/marker.txt").read_text().strip() == test_image.marker
    assert (workspace / "out/uid.txt").read_text().strip() == str(uid)
    assert (_far_dir(job) / "work/out/marker.txt").stat().st_uid == uid, "the job's files are the user's"
    log = hpc.read_log(job.id).data.decode()
    digest = test_image.digest(user=rootless_user)
    assert f"Slurm job {slurm_id} on {slurm_bed.node}" in log  # the batch script ran it...
    assert f"image {test_image.ref} {digest} (podman {podman['version']}, rootless)" in log  # ...in the image,
    # which sees the variables Slurm and the batch script give the job
    assert f"node={slurm_bed.node} world=1 rank=0 job={slurm_id}" in log
    assert MlflowClient(tracking_uri).get_run(job.mlflow_run_id).data.tags[images.TAG_DIGEST] == digest
    assert not _containers(job.id, user=rootless_user)


def test_scancel_stops_and_removes_the_slurm_jobs_container(hpc, rootless_user, test_image):
    job = hpc.advance(
        hpc.submit(
            JobSpec.from_json(
                {"machine": "hpc", "command": "echo started; sleep 600", "environment": {"image": test_image.ref}}
            )
        ).job.id
    )
    wait_for(lambda: b"started" in hpc.read_log(job.id).data, timeout=240, message="the Slurm job's container to run")
    assert _containers(job.id, user=rootless_user) == [f"jrc-{job.id}"]
    hpc.cancel(job.id)
    done = hpc.wait(job.id, timeout=120)
    assert done.state == "cancelled", (done.state, done.reason)
    left = _podman(
        "ps", "-a", "--filter", f"label=jrc.job={job.id}", "--format", "{{.Names}} {{.Status}}", user=rootless_user
    ).stdout
    assert not left.strip(), f"scancel left {left.strip()}; the job's log ends: {hpc.read_log(job.id).data[-2000:]!r}"
    assert not (_far_dir(done) / "container").exists()


def test_a_slurm_machine_refuses_docker_at_submit(hpc, workspace):
    spec = {"machine": "hpc", "command": "true", "environment": {"image": "python:3.12", "runtime": "docker"}}
    with pytest.raises(InvalidSettings) as e:
        hpc.submit(JobSpec.from_json(spec))
    assert e.value.field == "environment.runtime" and "podman" in str(e.value)
    assert hpc.list_jobs() == []


# -- agent: the agent runs command.sh, container.sh for an image ----------------------------------


def agent_podman(home: Path, user: str) -> None:
    """Podman's settings for this machine under the agent's HOME, with a store and run folder of its own
    (the user's other stores share /tmp/podman-run-UID otherwise)."""
    conf = home / ".config/containers"
    conf.mkdir(parents=True, exist_ok=True)
    run = home / ".run"
    run.mkdir(mode=0o700, exist_ok=True)
    (conf / "containers.conf").write_text(CONTAINERS_CONF + f'tmp_dir = "{run}/libpod"\n')
    (conf / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\nrunroot = "{run}/containers"\n'
        f'graphroot = "{home}/.local/share/containers/storage"\n'
    )
    for path in (home / ".config", conf, conf / "containers.conf", conf / "storage.conf", run):
        shutil.chown(path, user, user)


def test_an_agent_job_runs_in_its_image_and_cancel_removes_its_container(agent_bed, test_image, quickstart):
    server, user, home = agent_bed.server, agent_bed.user, agent_bed.home
    agent_podman(home, user)
    _podman("import", str(test_image.rootfs), test_image.ref, user=user, home=home)
    try:
        agent_bed.add_machine("lab")
        agent = agent_bed.start_agent("lab")
        (quickstart / "job.sh").write_text(f"mkdir -p out; cat {MARKER} > out/marker.txt; id -u > out/uid.txt\n")
        body = {"machine": "lab", "command": "sh job.sh", "send": ["job.sh"], "bring_back": ["out/"]}
        job = server.request("POST", "jobs", {**body, "environment": {"image": test_image.ref}})["job"]
        done = wait_for(
            lambda: (j := server.request("GET", f"jobs/{job['id']}"))["state"] in ("succeeded", "failed") and j,
            timeout=240,
            message="the agent's job in its image to end",
        )
        assert done["state"] == "succeeded", done["reason"]
        assert (quickstart / "out/marker.txt").read_text().strip() == test_image.marker
        assert (quickstart / "out/uid.txt").read_text().strip() == str(agent_bed.uid)
        log = server.request("GET", f"jobs/{job['id']}/log")["data"]
        digest = _podman("image", "inspect", "--format", "{{.Id}}", test_image.ref, user=user, home=home).stdout
        assert f"image {test_image.ref} sha256:{digest.strip().removeprefix('sha256:')} (podman " in log
        assert ", rootless)" in log
        pins = [p for p in (agent.state / "images").iterdir() if p.suffix != ".used"]  # in the agent's own state
        assert len(pins) == 1

        running = server.request("POST", "jobs", {"machine": "lab", "command": "echo started; sleep 600",
                                                  "environment": {"image": test_image.ref}})["job"]  # fmt: skip
        wait_for(
            lambda: "started" in server.request("GET", f"jobs/{running['id']}/log")["data"],
            timeout=240,
            message="the agent's container to run",
        )
        assert _containers(running["id"], user=user, home=home) == [f"jrc-{running['id']}"]
        server.request("POST", f"jobs/{running['id']}/cancel")
        ended = wait_for(
            lambda: (j := server.request("GET", f"jobs/{running['id']}"))["state"] in ("cancelled", "failed") and j,
            timeout=120,
            message="the cancel to end the job",
        )
        assert ended["state"] == "cancelled", ended["reason"]
        assert not _containers(running["id"], user=user, home=home), "cancel leaves no container behind"
    finally:
        _podman("system", "reset", "--force", user=user, home=home, check=False)


def test_an_ssh_job_builds_its_environment_inside_the_image_rootless_with_the_uv_sent(
    rootless_user, test_image, index, ssh_agent_env, workspace, make_service
):
    """The machine's environment option names the image; the job's requirements are built in it by the
    uv this side sent (the user has none, the image neither), as the user, in the machine's env cache."""
    (workspace / "fit.py").write_text("import rcdemo_a, sys\nprint('value', rcdemo_a.VALUE, 'prefix', sys.prefix)\n")
    (workspace / "requirements.txt").write_text(f"# {uuid.uuid4()}\nrcdemo-b\n")
    service = make_service(workspace)
    options = {"environment": {"image": test_image.ref, "runtime": "podman"}, "index_url": index.url}
    service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options(ssh_transport="openssh", **options))
    spec = JobSpec.from_json(
        {"machine": "box", "command": ["python", "fit.py"], "send": ["fit.py"],
         "environment": {"requirements": "requirements.txt"}}
    )  # fmt: skip
    job = service.wait(service.submit(spec).job.id, timeout=300)
    log = service.read_log(job.id).data.decode()
    assert job.state == "succeeded", (job.reason, log)
    assert job.spec.image == images.Image(test_image.ref, "podman")
    assert ", rootless)" in log and "building with uv " in log and "value a1" in log
    prefix = Path(log.split("prefix ", 1)[1].split()[0])
    envs = ssh_agent_env.far_path(ssh_agent_env.base_dir.removeprefix("~/")) / "envs"
    assert prefix.parent == envs.resolve() and prefix.name.endswith(test_image.digest(user=rootless_user)[7:23])
    assert prefix.stat().st_uid == pwd.getpwnam(rootless_user).pw_uid, "built as the user, not a mapped id"
    again = service.wait(service.submit(spec, new=True).job.id, timeout=300)
    assert again.state == "succeeded", again.reason
    assert ": cached (" in service.read_log(again.id).data.decode()
    assert not _containers(job.id, user=rootless_user)


# -- what is refused at submit, and the arguments built ---------------------------------------------


def test_an_image_is_refused_where_no_runtime_runs_it():
    both = ("podman", "docker")
    with pytest.raises(InvalidSettings) as e:
        images.admit(images.Image("python:3.12"), "gpu1", "ssh", both, {"containers": []})
    assert e.value.field == "environment.image" and "apt-get install podman" in str(e.value) and "gpu1" in str(e.value)
    with pytest.raises(InvalidSettings, match=r"docker\.io"):
        images.admit(
            images.Image("python:3.12", "docker"), "gpu1", "ssh", both,
            {"containers": [{"runtime": "podman", "version": "4.3.1", "rootless": False}]},
        )  # fmt: skip
    with pytest.raises(InvalidSettings, match="jupyter machine"):
        images.admit(images.Image("python:3.12"), "nb", "jupyter", (), None)
    images.admit(
        images.Image("python:3.12"), "gpu1", "ssh", both,
        {"containers": [{"runtime": "docker", "version": "20.10", "rootless": False}]},
    )  # fmt: skip


def test_a_slurm_machine_runs_images_in_podman_only_and_names_what_it_lacks():
    """Docker's containers are its daemon's, outside the job's allocation: on Slurm only podman runs them."""
    apptainer = {"containers": [{"runtime": "apptainer", "version": "1.2.5", "rootless": True}]}
    with pytest.raises(InvalidSettings) as e:
        images.admit(images.Image("python:3.12"), "hpc", "slurm", ("podman",), apptainer)
    assert e.value.field == "environment.image"
    assert "it has apptainer" in str(e.value) and "install podman (apt-get install podman)" in str(e.value)
    assert "docker" not in str(e.value)
    docker = {"containers": [{"runtime": "docker", "version": "20.10", "rootless": False}]}
    with pytest.raises(InvalidSettings) as e:
        images.admit(images.Image("python:3.12", "docker"), "hpc", "slurm", ("podman",), docker)
    assert e.value.field == "environment.runtime" and "podman" in str(e.value)
    with pytest.raises(InvalidSettings, match="install podman"):
        images.admit(images.Image("python:3.12"), "hpc", "slurm", ("podman",), docker)


def test_bad_image_settings_name_the_field():
    for bad, field in (
        ({"image": "has space"}, "environment.image"),
        ({"image": "x; rm -rf /"}, "environment.image"),
        ({"image": "python:3", "runtime": "lxc"}, "environment.runtime"),
        ({"image": "python:3", "runtime": {}}, "environment.runtime"),  # not taken for "auto"
        ({"image": "python:3", "runtime": 0}, "environment.runtime"),
        ({"image": {"ref": "python:3"}}, "environment.image"),  # a reference, not an object
        ({"image": 3}, "environment.image"),
        ({"runtime": "podman"}, "environment.runtime"),  # a runtime runs an image: name one
    ):
        with pytest.raises(InvalidSettings) as e:
            JobSpec.from_json({"command": "true", "environment": bad})
        assert e.value.field == field, (bad, e.value.field)
    # One way only: the image's old place is refused, saying where it went.
    with pytest.raises(InvalidSettings, match=r"environment\.image") as e:
        JobSpec.from_json({"command": "true", "image": "python:3.12"})
    assert e.value.field == "image"
    with pytest.raises(InvalidSettings) as e:
        images.network_of({"container_network": "bridge"})
    assert e.value.field == "options.container_network"


def test_the_image_is_part_of_the_key():
    from jupyter_remote_compute.jobs.key import job_key

    plain = JobSpec.from_json({"command": "true"})
    boxed = JobSpec.from_json({"command": "true", "environment": {"image": "python:3.12"}})
    other = JobSpec.from_json({"command": "true", "environment": {"image": "python:3.12", "runtime": "docker"}})
    keys = {job_key(s, []) for s in (plain, boxed, other)}
    assert len(keys) == 3
    assert JobSpec.from_stored(boxed.to_json()) == boxed and "image" not in plain.to_json()
    assert boxed.to_json()["environment"] == {"image": "python:3.12"} and "image" not in boxed.to_json()
    # A job stored when the image was a field of its own reads into the environment, with the same key.
    legacy = {**plain.to_json(), "image": {"ref": "python:3.12", "runtime": "docker"}}
    assert JobSpec.from_stored(legacy) == other and job_key(JobSpec.from_stored(legacy), []) == job_key(other, [])
    both = {**legacy, "environment": {"packages": ["numpy"]}}
    assert (
        JobSpec.from_stored(both).environment
        == JobSpec.from_json(
            {"command": "true", "environment": {"packages": ["numpy"], "image": "python:3.12", "runtime": "docker"}}
        ).environment
    )


def test_the_machines_image_options_and_environment_option_are_defaults_the_jobs_own_win():
    from jupyter_remote_compute.environments.environment import with_machine_default

    bare = JobSpec.from_json({"command": "true"})
    own = JobSpec.from_json({"command": "true", "environment": {"image": "mine:1", "packages": ["a"]}})
    old_options = {"image": "old:1", "container_runtime": "docker"}
    assert with_machine_default(bare, old_options).image == images.Image("old:1", "docker")
    folded = {**old_options, "environment": {"image": "new:1", "packages": ["b"]}}
    assert with_machine_default(bare, folded).environment.to_json() == {"packages": ["b"], "image": "new:1"}
    assert with_machine_default(own, folded).environment == own.environment
    # the job's Python part with the machine's image: a lock file on the machine's CUDA image
    python_only = JobSpec.from_json({"command": "true", "environment": {"packages": ["a"]}})
    assert with_machine_default(python_only, folded).environment.to_json() == {"packages": ["a"], "image": "new:1"}


def test_a_pipeline_step_takes_an_image_in_its_environment_that_its_schema_describes():
    import jsonschema

    from jupyter_remote_compute.steps import TRAIN_ON_REMOTE_MACHINE
    from jupyter_remote_compute.steps.executor import parse_settings

    schema = TRAIN_ON_REMOTE_MACHINE["settings"]
    settings = {"command": "python fit.py", "environment": {"requirements": "r.txt", "image": "python:3.12"}}
    jsonschema.validate(settings, schema)
    jsonschema.validate({**settings, "environment": {"image": "python:3.12", "runtime": "docker"}}, schema)
    for bad in ({"image": "x; rm -rf /"}, {"image": ""}, {"image": "python:3.12", "runtime": "lxc"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**settings, "environment": bad}, schema)
    with pytest.raises(jsonschema.ValidationError):  # the image's old place is no setting of a step
        jsonschema.validate({**settings, "image": "python:3.12"}, schema)
    spec, _ = parse_settings(settings)
    assert spec.image == images.Image("python:3.12") and spec.environment.requirements == "r.txt"
