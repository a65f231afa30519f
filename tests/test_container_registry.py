"""Images from a private registry: credentials from the Secret Manager, the pull's progress and timeout, eviction.

A real registry (Debian's docker-registry, distribution 2.8) on 127.0.0.1 with a bcrypt htpasswd holds
the offline-made test image. Podman is told the loopback registry speaks plain HTTP through a
registries.conf of the tests' own (CONTAINERS_REGISTRIES_CONF): the test bed's setting, not the product's.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import ports
import pytest
import sshd_fixture
import test_containers
from mlflow.tracking import MlflowClient
from required import require
from test_containers import MARKER, _containers, _far_dir, _podman
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.machines.options import check_options

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env
test_image = test_containers.test_image
rootless_user = test_containers.rootless_user
docker_image = test_containers.docker_image

USER = "jrc-puller"


class Registry:
    def __init__(self, host: str, password: str, ref: str) -> None:
        self.host, self.password, self.ref = host, password, ref

    @property
    def credentials(self) -> str:
        return f"{USER}:{self.password}"

    def forget_locally(self, user: str | None = None) -> None:
        """The pushed image out of the local store, so the next job has to pull it."""
        _podman("rmi", "-f", self.ref, user=user, check=False)

    @contextlib.contextmanager
    def known_to(self, user: str) -> Iterator[None]:
        """``user``'s rootless podman told that this loopback registry speaks plain HTTP (the test bed's
        word, in the user's own registries.conf), the image out of their store before and after. The
        caller holds ``rootless_user``, so no other test uses that store meanwhile."""
        conf = Path(pwd.getpwnam(user).pw_dir) / ".config/containers/registries.conf"
        made = not conf.exists()
        if made:
            conf.write_text(f'[[registry]]\nlocation = "{self.host}"\ninsecure = true\n')
            shutil.chown(conf, user, user)
        self.forget_locally(user=user)
        try:
            yield
        finally:
            self.forget_locally(user=user)
            if made:
                conf.unlink(missing_ok=True)


def _registry_answers(host: str) -> bool:
    try:
        urllib.request.urlopen(f"http://{host}/v2/", timeout=2)
    except urllib.error.HTTPError as e:
        return e.code == 401  # up, and asking for credentials
    except OSError:
        return False
    return False


@contextlib.contextmanager
def serving_registry(rootfs: Path) -> Iterator[Registry]:
    """A registry on loopback with htpasswd auth, ``rootfs`` pushed to it as ``<host>/jrc/pybase:1``."""
    root = Path(tempfile.mkdtemp(prefix="jrc-registry-"))
    password = "pw-" + uuid.uuid4().hex
    subprocess.run(["htpasswd", "-Bbc", str(root / "htpasswd"), USER, password], check=True, capture_output=True)
    port = ports.free_port()
    host = f"127.0.0.1:{port}"
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: {host}\nauth:\n  htpasswd:\n    realm: jrc-tests\n    path: {root / 'htpasswd'}\n"
    )
    conf = root / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{host}"\ninsecure = true\n')
    os.chmod(root, 0o755)
    os.chmod(conf, 0o644)  # the rootless user reads it too
    before = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    os.environ["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    daemon = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=(root / "registry.log").open("wb"),
    )  # fmt: skip
    ref = f"{host}/jrc/pybase:1"
    try:
        wait_for(lambda: _registry_answers(host), timeout=30, message="the registry to answer")
        auth = root / "push-auth.json"
        # an image id of its own: the test image's, tagged twice, would be one image to the runtime
        _podman("import", "--change", "LABEL jrc.pushed=1", str(rootfs), ref)
        _podman("login", "--authfile", str(auth), "-u", USER, "--password-stdin", host, stdin=password)
        _podman("push", "--authfile", str(auth), ref)
        auth.unlink()
        _podman("rmi", "-f", ref)
        yield Registry(host, password, ref)
    finally:
        sshd_fixture.terminate(daemon)
        _podman("rmi", "-f", ref, check=False)
        if before is None:
            os.environ.pop("CONTAINERS_REGISTRIES_CONF", None)
        else:
            os.environ["CONTAINERS_REGISTRIES_CONF"] = before
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def registry(test_image) -> Iterator[Registry]:  # type: ignore[no-untyped-def]
    """The test image in a registry on loopback that asks for a password."""
    require(shutil.which("docker-registry") is not None, "docker-registry (apt-get install docker-registry)")
    require(shutil.which("htpasswd") is not None, "htpasswd (apt-get install apache2-utils)")
    with serving_registry(test_image.rootfs) as served:
        yield served


#: Where podman and docker keep credentials of their own (a login's): the job must write none of them.
def _runtime_auth_files() -> list[Path]:
    home = Path.home()
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return [
        home / ".config/containers/auth.json",
        Path(runtime_dir) / "containers/auth.json",
        Path(f"/run/containers/{os.getuid()}/auth.json"),
        home / ".docker/config.json",
    ]


def _snapshot(paths: list[Path]) -> dict[Path, bytes | None]:
    return {p: (p.read_bytes() if p.is_file() else None) for p in paths}


def _files_holding(needle: bytes, *roots: Path) -> list[Path]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(path)
    return found


def test_a_job_with_the_registry_secret_pulls_and_runs_and_the_secret_stays_out(
    registry, test_image, workspace, make_service, scratch_dir, tracking_uri, tmp_path
):
    registry.forget_locally()
    service = make_service(workspace)
    service.secrets.set("registry/test", registry.credentials)
    auth_files = _runtime_auth_files()
    before = _snapshot(auth_files)
    spec = JobSpec.from_json(
        {"command": f"cat {MARKER}; echo waiting; while [ ! -f go ]; do sleep 0.05; done",
         "environment": {"image": registry.ref}, "registry_secret": "registry/test"}
    )  # fmt: skip
    job = service.advance(service.submit(spec).job.id)
    assert job.spec.registry_secret == "registry/test"
    wait_for(
        lambda: service.get(job.id).state == "running" and _containers(job.id)
        and b"waiting" in service.read_log(job.id).data,
        timeout=180, message="the pulled image's container to run",
    )  # fmt: skip
    far = _far_dir(service.get(job.id))
    secret = registry.password.encode()
    assert secret not in _podman("inspect", f"jrc-{job.id}").stdout.encode()
    assert secret not in _podman("image", "inspect", registry.ref).stdout.encode()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert registry.password not in ps
    assert not list(far.glob(".registry-auth*")), "the auth file is removed once the pull ends"
    (far / "work/go").touch()
    done = service.wait(job.id, timeout=180)
    assert done.state == "succeeded", done.reason

    log = service.read_log(job.id).data.decode()
    assert test_image.marker in log
    assert f"container: pulling {registry.ref} from {registry.host}" in log
    # the pull's own progress lines (podman prints one per layer and the config without a terminal)
    assert "Copying blob" in log and "Writing manifest" in log
    assert _files_holding(secret, workspace / ".punica", scratch_dir) == []
    assert secret not in (far / "log").read_bytes(), "not even the far side's raw log"
    assert secret not in Path(tracking_uri.removeprefix("sqlite:///")).read_bytes()
    run = MlflowClient(tracking_uri).get_run(done.mlflow_run_id)
    assert not [v for v in (*run.data.params.values(), *run.data.tags.values()) if registry.password in v]
    assert _snapshot(auth_files) == before, "the runtime's own credential files are untouched"


def test_without_the_secret_the_pull_fails_naming_the_registry(registry, workspace, make_service):
    registry.forget_locally()
    service = make_service(workspace)
    job = service.wait(
        service.submit(JobSpec.from_json({"command": "true", "environment": {"image": registry.ref}})).job.id, 180
    )
    assert job.state == "failed", job.state
    # the runtime's own words, and the registry named
    assert f"pulling {registry.ref} from {registry.host} failed" in job.reason
    assert "unauthorized" in job.reason or "authentication required" in job.reason, job.reason


def test_a_refused_password_fails_with_the_registrys_words_and_is_masked(registry, workspace, make_service):
    registry.forget_locally()
    service = make_service(workspace)
    wrong = "wrong-" + uuid.uuid4().hex
    service.secrets.set("registry/wrong", f"{USER}:{wrong}")
    spec = JobSpec.from_json(
        {"command": "true", "environment": {"image": registry.ref}, "registry_secret": "registry/wrong"}
    )
    job = service.wait(service.submit(spec).job.id, 180)
    assert job.state == "failed", job.state
    assert registry.host in job.reason and "unauthorized" in job.reason, job.reason
    assert wrong not in job.reason and wrong not in service.read_log(job.id).data.decode()


def test_a_registry_secret_that_is_not_user_and_password_is_refused_naming_only_the_secret(workspace, make_service):
    service = make_service(workspace)
    value = "just-a-token-" + uuid.uuid4().hex
    service.secrets.set("registry/bad", value)
    for settings, words in (
        (
            {"environment": {"image": "127.0.0.1:1/x:1"}, "registry_secret": "registry/bad"},
            "'registry/bad' must hold user:password",
        ),
        (
            {"environment": {"image": "127.0.0.1:1/x:1"}, "registry_secret": "registry/none"},
            "no secret named 'registry/none'",
        ),
        ({"registry_secret": "registry/bad"}, "runs in no image"),
    ):
        with pytest.raises(InvalidSettings) as e:
            service.submit(JobSpec.from_json({"command": "true", **settings}))
        assert e.value.field == "registry_secret" and words in str(e.value), str(e.value)
        assert value not in str(e.value)
    for bad in ("secret:registry/bad", "has space", 3):
        with pytest.raises(InvalidSettings) as e:
            JobSpec.from_json({"command": "true", "environment": {"image": "x:1"}, "registry_secret": bad})
        assert e.value.field == "registry_secret"
    with pytest.raises(InvalidSettings) as e:
        JobSpec.from_json({"command": "true", "env": {"REMOTE_COMPUTE_REGISTRY_AUTH": "u:p"}})
    assert e.value.field == "env.REMOTE_COMPUTE_REGISTRY_AUTH"
    assert service.list_jobs() == [], "nothing is stored for a refused job"


def test_the_pull_options_are_checked_when_a_machine_is_saved():
    from jupyter_remote_compute.engines import engine_class

    ssh = engine_class("ssh")
    base = {"user": "u"}
    for options, field in (
        ({"registry_secret": "secret:reg"}, "options.registry_secret"),
        ({"registry_secret": "ab12" * 10}, "options.registry_secret"),  # a pasted value, not a name
        ({"pull_timeout": 0}, "options.pull_timeout"),
        ({"pull_timeout": "10m"}, "options.pull_timeout"),
        ({"image_max_age_days": -1}, "options.image_max_age_days"),
    ):
        with pytest.raises(InvalidSettings) as e:
            check_options(ssh, {**base, **options}, changing=None)
        assert e.value.field == field, (options, e.value.field)
    saved = check_options(ssh, {**base, "registry_secret": "registry/team", "pull_timeout": 30}, changing=None)
    assert saved["registry_secret"] == "registry/team" and saved["pull_timeout"] == 30


def test_a_registry_secret_cannot_be_deleted_while_a_machine_or_a_job_names_it(workspace, make_service):
    from jupyter_remote_compute.errors import SecretInUse

    require(shutil.which("podman") is not None, "podman (apt-get install podman)")  # the job's image is admitted
    service = make_service(workspace)
    service.secrets.set("registry/team", "u:p")
    service.machines.add("lab", "ssh", "127.0.0.1", {"user": "u", "registry_secret": "registry/team"})
    with pytest.raises(SecretInUse, match="machine lab"):
        service.delete_secret("registry/team")
    service.secrets.set("registry/job", "u:p")
    spec = JobSpec.from_json(
        {"command": "true", "environment": {"image": "127.0.0.1:1/x:1"}, "registry_secret": "registry/job"}
    )
    queued = service.submit(spec).job  # queued, not started: nothing is pulled
    with pytest.raises(SecretInUse, match=queued.id):
        service.delete_secret("registry/job")


class SilentRegistry:
    """A TCP port on loopback that accepts connections and never says a word: a pull there makes no progress."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.host = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        for conn in self.held:
            conn.close()
        self.sock.close()


def test_a_pull_that_makes_no_progress_fails_after_the_machines_pull_timeout(
    rootless_user, ssh_agent_env, workspace, make_service
):
    silent = SilentRegistry()
    try:
        service = make_service(workspace)
        service.machines.add(
            "box", "ssh", "127.0.0.1",
            ssh_agent_env.options(container_runtime="podman", container_network="none", pull_timeout=3),
        )  # fmt: skip
        ref = f"{silent.host}/jrc/never:1"
        started = time.monotonic()
        job = service.wait(
            service.submit(
                JobSpec.from_json({"machine": "box", "command": "true", "environment": {"image": ref}})
            ).job.id,
            120,
        )
        took = time.monotonic() - started
        assert job.state == "failed", job.state
        assert f"pulling {ref} from {silent.host} made no progress for 3 s" in job.reason, job.reason
        assert silent.held, "the pull did reach the registry"
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert ref not in ps, "the stalled pull is ended, not left running"
        print(f"stalled pull failed after {took:.1f} s (pull_timeout 3 s)")
    finally:
        silent.close()


def test_eviction_removes_an_old_unused_pulled_image_and_keeps_one_a_running_job_uses(
    registry, test_image, workspace, make_service
):
    registry.forget_locally()
    service = make_service(workspace)
    service.secrets.set("registry/test", registry.credentials)
    pulled = service.wait(
        service.submit(
            JobSpec.from_json(
                {"command": "true", "environment": {"image": registry.ref}, "registry_secret": "registry/test"}
            )
        ).job.id,
        180,
    )
    assert pulled.state == "succeeded", pulled.reason
    pins = _far_dir(pulled).parent / "images"
    busy = service.advance(
        service.submit(
            JobSpec.from_json(
                {
                    "command": "echo waiting; while [ ! -f go ]; do sleep 0.05; done",
                    "environment": {"image": test_image.ref},
                }
            )
        ).job.id
    )
    wait_for(
        lambda: b"waiting" in service.read_log(busy.id).data, timeout=180, message="the busy job's container to run"
    )
    used = {p.read_text().split()[1]: p for p in pins.glob("*.used")}
    assert set(used) == {registry.ref, test_image.ref}
    old = time.time() - 40 * 86400  # both unused for 40 days, as far as their pins say
    for path in used.values():
        os.utime(path, (old, old))

    third = f"localhost/jrc-evict-{uuid.uuid4().hex[:8]}:1"
    _podman("import", "--change", "LABEL third=1", str(test_image.rootfs), third)
    try:
        evicting = service.wait(
            service.submit(JobSpec.from_json({"command": "true", "environment": {"image": third}})).job.id, 180
        )
        assert evicting.state == "succeeded", evicting.reason
        log = service.read_log(evicting.id).data.decode()
        assert f"container: removed image {registry.ref} (podman), unused for more than 30 days" in log
        assert _podman("image", "exists", registry.ref, check=False).returncode == 1, "the old pulled image is gone"
        assert not used[registry.ref].exists() and not used[registry.ref].with_suffix("").exists()
        assert _podman("image", "exists", test_image.ref, check=False).returncode == 0, "a running job's is kept"
        assert used[test_image.ref].exists()
        (_far_dir(busy) / "work/go").touch()
        assert service.wait(busy.id, timeout=120).state == "succeeded"
    finally:
        _podman("rmi", "-f", third, check=False)


def test_a_machines_registry_secret_pulls_for_a_rootless_ssh_job(
    registry, rootless_user, test_image, ssh_agent_env, workspace, make_service
):
    """The machine's option is the default of its jobs; rootless podman gets the auth file the same way."""
    home = Path(pwd.getpwnam(rootless_user).pw_dir)
    uid = pwd.getpwnam(rootless_user).pw_uid
    auth_files = [home / ".config/containers/auth.json", Path(f"/run/user/{uid}/containers/auth.json"),
                  home / ".docker/config.json"]  # fmt: skip
    before = _snapshot(auth_files)
    with registry.known_to(rootless_user):
        service = make_service(workspace)
        service.secrets.set("registry/team", registry.credentials)
        options = {"container_runtime": "podman", "container_network": "none", "registry_secret": "registry/team"}
        service.machines.add("box", "ssh", "127.0.0.1", ssh_agent_env.options(**options))
        spec = JobSpec.from_json({"machine": "box", "command": f"cat {MARKER}", "environment": {"image": registry.ref}})
        job = service.wait(service.submit(spec).job.id, timeout=300)
        assert job.state == "succeeded", job.reason
        assert job.spec.registry_secret == "registry/team"
        log = service.read_log(job.id).data.decode()
        assert test_image.marker in log and f"container: pulling {registry.ref} from {registry.host}" in log
        assert registry.password.encode() not in (_far_dir(job) / "log").read_bytes()
        assert not list(_far_dir(job).glob(".registry-auth*"))
        assert _snapshot(auth_files) == before, "the user's own podman credentials are untouched"


def test_a_docker_job_pulls_with_the_registry_secret(registry, docker_image, workspace, make_service):
    """docker gets the credentials as a --config folder of its own for the pull, never ~/.docker."""
    subprocess.run(["docker", "rmi", "-f", registry.ref], capture_output=True)
    docker_config = Path.home() / ".docker/config.json"
    before = _snapshot([docker_config])
    service = make_service(workspace)
    service.secrets.set("registry/test", registry.credentials)
    image = {"image": registry.ref, "runtime": "docker"}
    spec = JobSpec.from_json({"command": "echo in-docker", "environment": image, "registry_secret": "registry/test"})
    job = service.wait(service.submit(spec).job.id, 300)
    assert job.state == "succeeded", job.reason
    log = service.read_log(job.id).data.decode()
    assert "in-docker" in log and f"container: pulling {registry.ref} from {registry.host}" in log
    assert "Pull complete" in log or "Download complete" in log, log  # docker's per-layer lines
    assert registry.password.encode() not in (_far_dir(job) / "log").read_bytes()
    assert _snapshot([docker_config]) == before
    again = service.wait(
        service.submit(JobSpec.from_json({"command": "true", "environment": image}), new=True).job.id, 300
    )
    subprocess.run(["docker", "rmi", "-f", registry.ref], capture_output=True)
    assert again.state == "succeeded", "pinned: a later job runs the pinned id, pulling nothing, no secret needed"


def test_run_takes_the_registry_secret():
    import argparse

    from jupyter_remote_compute.run_options import add_run_options, command_of, spec_settings

    parser = argparse.ArgumentParser()
    add_run_options(parser)
    args = parser.parse_args(["--image", "ghcr.io/team/train:2", "--registry-secret", "registry/ghcr", "--", "true"])
    spec = JobSpec.from_json(spec_settings(args, command_of(args)))
    assert spec.registry_secret == "registry/ghcr" and spec.image.ref == "ghcr.io/team/train:2"
    assert JobSpec.from_stored(spec.to_json()) == spec
    plain = parser.parse_args(["--", "true"])
    assert "registry_secret" not in JobSpec.from_json(spec_settings(plain, command_of(plain))).to_json()


def test_the_registry_of_a_reference():
    from jupyter_remote_compute.environments.image_registry import registry_of, split_credentials

    assert registry_of("python:3.12") == registry_of("library/python") == "docker.io"
    assert registry_of("ghcr.io/team/train:2") == "ghcr.io"
    assert registry_of("127.0.0.1:5000/x") == "127.0.0.1:5000" and registry_of("localhost/x:1") == "localhost"
    assert split_credentials("u:p:with:colons") == ("u", "p:with:colons")
    assert split_credentials("u:") is None and split_credentials(":p") is None and split_credentials("u:p\nq") is None
