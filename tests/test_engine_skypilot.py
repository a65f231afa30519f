"""The ``skypilot`` kind against the real SkyPilot SDK.

Without any cloud: the task and resources built from machine settings and job resources, bad
settings, the kind without SkyPilot installed. With the single-node Slurm test bed as SkyPilot's
infra (``skypilot_fixture``): one launch shared by the module's tests — a job pending while the
cluster provisions, its outputs verified and its MLflow run recorded, a second job on the same
cluster, a cancel, autostop configured, a restart of this side while a job waits, the cluster
taken away (``sky down``) under a running job, whose retry launches it again — and ``sky down``
at the end. What a cluster gone means for a spot cluster (``preempted``) is decided on SkyPilot's
own record types: the bed has no spot capacity.
"""

from __future__ import annotations

import hashlib
import json
import pwd
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import slurm_fixture
import sshd_fixture
import test_containers
import test_live_metrics
from conftest import job_runs
from mlflow.tracking import MlflowClient
from procs import group_members
from required import require
from skypilot_fixture import SkyBed, ensure_up, sky_client, sky_home, skypilot_bed, timed
from waiting import wait_for

from jupyter_remote_compute.engines import engine_class, engine_kinds
from jupyter_remote_compute.engines.base import EngineContext, EngineError
from jupyter_remote_compute.engines.resources import Resources
from jupyter_remote_compute.engines.skypilot_cluster import cluster_state
from jupyter_remote_compute.environments import image as images
from jupyter_remote_compute.errors import InvalidSettings, RemoteComputeError
from jupyter_remote_compute.jobs.service import JobService, require_trained
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
slurm_bed = slurm_fixture.slurm_bed
test_image = test_containers.test_image
__all__ = ["sky_client", "sky_home", "skypilot_bed"]  # fixtures used by name


@pytest.fixture
def sky_sdk(sky_client: Path):
    from jupyter_remote_compute.engines import skypilot

    return skypilot


def _engine(name: str = "gpu box", address: str = "aws", **options: object):
    context = EngineContext(get_secret=lambda _name: None, scratch_dir=Path("/nonexistent"))
    return engine_class("skypilot")(name, address, options, context)


# -- settings, task and resources (the real SDK, no cloud) ------------------------------------


def test_settings_become_the_launch_task_skypilot_would_run(sky_sdk) -> None:
    engine = _engine(accelerator="A100", use_spot=True, autostop=45, down=True)
    settings = engine.settings
    assert settings.cluster == "jrc-gpu-box"  # from the machine's name, valid for SkyPilot
    assert (settings.infra, settings.autostop, settings.down, settings.use_spot) == ("aws", 45, True, True)
    task = sky_sdk.launch_task(settings, Resources(gpus=4, cpus=16, memory_mb=64 * 1024 + 1))
    [res] = list(task.resources)
    assert res.cloud is not None and str(res.cloud) == "AWS"
    assert res.accelerators == {"A100": 4}
    assert res.use_spot is True
    assert res.cpus == "16" and res.memory == "65"  # memory rounded up to whole GB
    # No GPUs asked: the machine's accelerator still counts once (it is a GPU machine).
    [res] = list(sky_sdk.launch_task(settings, None).resources)
    assert res.accelerators == {"A100": 1} and res.cpus is None


def test_machine_default_resources_apply_under_the_jobs(sky_sdk) -> None:
    engine = _engine(address="slurm/hpc", resources={"cpus": 1, "memory": "1G"}, cluster="team-a")
    [res] = list(sky_sdk.launch_task(engine.settings, Resources(cpus=2)).resources)
    assert str(res.cloud) == "Slurm" and res.region == "hpc"
    assert (res.cpus, res.memory) == ("2", "1")
    assert engine.settings.cluster == "team-a" and engine.settings.autostop == 30


def test_autostop_and_down_go_to_the_launch_except_where_skypilot_refuses_them(sky_sdk) -> None:
    assert _engine(autostop=45, down=True).launch_arguments() == {
        "cluster_name": "jrc-gpu-box",
        "idle_minutes_to_autostop": 45,
        "down": True,
    }
    assert _engine(autostop=-1).launch_arguments()["idle_minutes_to_autostop"] is None
    assert _engine().launch_arguments()["idle_minutes_to_autostop"] == 30  # the default: idle costs nothing
    # "Autostop is supported only for container clusters on Slurm clusters with Pyxis installed":
    # SkyPilot tears a Slurm cluster down when idle instead (what stopping would do to the allocation).
    assert _engine(address="slurm/hpc").launch_arguments() == {
        "cluster_name": "jrc-gpu-box",
        "idle_minutes_to_autostop": 30,
        "down": True,
    }
    assert _engine(address="slurm/hpc", autostop=-1).launch_arguments()["idle_minutes_to_autostop"] is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cluster": "9-starts-with-a-digit"}, "cluster"),
        ({"autostop": "soon"}, "autostop"),
        ({"use_spot": "maybe"}, "use_spot"),
        ({"accelerator": "A100; rm -rf"}, "accelerator"),
        ({"infra": "aws us-east"}, "infra"),
        ({"resources": {"gpu": 1}}, "resources.gpu"),
    ],
)
def test_bad_settings_name_their_field(sky_sdk, options: dict, field: str) -> None:
    with pytest.raises(EngineError) as e:
        _engine(**options)
    assert field in str(e.value)


def test_resources_skypilot_cannot_give_are_refused_at_submit(sky_sdk) -> None:
    engine = _engine()  # no accelerator named
    with pytest.raises(InvalidSettings) as e:
        engine.admit(Resources(gpus=1))
    assert e.value.field == "resources.gpus"
    with pytest.raises(InvalidSettings) as e:
        engine.admit(Resources(nodes=2))
    assert e.value.field == "resources.nodes"
    with pytest.raises(InvalidSettings) as e:
        _engine(address="nocloud").admit(Resources(cpus=1))
    assert "nocloud" in str(e.value)  # SkyPilot's own words name the unknown infra
    _engine(accelerator="L4").admit(Resources(gpus=2, cpus=4))


def test_the_kind_loads_and_says_what_to_install_without_skypilot() -> None:
    """With ``sky`` not importable the kind is still listed; using it names the extra to install."""
    script = textwrap.dedent(
        """
        import importlib.abc, sys
        class NoSky(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "sky" or name.startswith("sky."):
                    raise ImportError("No module named 'sky'")
        sys.meta_path.insert(0, NoSky())
        from pathlib import Path
        from jupyter_remote_compute.engines import engine_class, engine_kinds
        from jupyter_remote_compute.engines.base import EngineContext, EngineError
        from jupyter_remote_compute.machine_handlers import kinds_json
        assert "skypilot" in engine_kinds(), engine_kinds()
        cls = engine_class("skypilot")
        kind = next(k for k in kinds_json() if k["kind"] == "skypilot")
        print("LISTED", kind.get("unavailable"))
        engine = cls("box", "aws", {}, EngineContext(lambda n: None, Path("/nonexistent")))
        try:
            engine.check()
        except EngineError as e:
            print("CHECK", e)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "LISTED install jupyter-remote-compute[skypilot]" in done.stdout
    assert "CHECK" in done.stdout and "install jupyter-remote-compute[skypilot]" in done.stdout
    assert "Traceback" not in done.stdout


def test_skypilot_is_a_registered_kind() -> None:
    assert "skypilot" in engine_kinds()


# -- end to end on the Slurm test bed: one launch for the module -----------------------------

E2E_TIMEOUT = 1800  # the first launch installs SkyPilot's runtime on the node (~90 MB from PyPI)


def _service(make_service, workspace: Path, bed: SkyBed) -> JobService:
    service = make_service(workspace)
    service.machines.add("sky", "skypilot", bed.infra, bed.machine_options())
    return service


def _record(bed: SkyBed):
    from jupyter_remote_compute.engines.skypilot import load_sdk

    sdk = load_sdk()
    records = sdk.get(sdk.status([bed.cluster]))
    return records[0] if records else None


# Started in a child process: submit the quickstart job and drive it until it waits for the
# cluster, print its id and handle, then wait to be killed (the server dying mid-provisioning).
_SUBMIT_AND_DIE = """
import json, sys, time
from pathlib import Path
from jupyter_remote_compute.jobs.service import JobService, ServiceSettings
from jupyter_remote_compute.jobs.spec import JobSpec
from jupyter_remote_compute.recording.tracking import TrackingSettings
from jupyter_remote_compute.workspace import Workspace
root, scratch, uri = sys.argv[1:4]
service = JobService(Workspace(Path(root)), ServiceSettings(
    poll_interval=0.2, scratch_dir=Path(scratch), tracking=TrackingSettings(tracking_uri=uri, experiment="tests")))
spec = {"machine": "sky", "command": "python train.py", "send": ["train.py", "data/*.csv"],
        "bring_back": ["model.pkl", "metrics.json"], "name": "first on the cluster"}
job = service.submit(JobSpec.from_json(spec)).job
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    job = service.advance(job.id)
    if job.state == "pending" and job.handle.get("launch_request"):
        break
    time.sleep(0.5)
print(json.dumps({"id": job.id, "state": job.state, "reason": job.reason, "handle": job.handle}), flush=True)
time.sleep(3600)
"""


@pytest.mark.timeout(E2E_TIMEOUT + 600)
def test_the_first_job_waits_for_the_launch_survives_a_restart_and_lands_here(
    skypilot_bed: SkyBed, sky_client: Path, make_service, quickstart: Path, tracking_uri: str, scratch_dir: Path
) -> None:
    require(_record(skypilot_bed) is None, "a fresh cluster (this test runs before any other job on it)")
    # Adding and checking the machine first, as a user would: SkyPilot's view, no cluster yet.
    service = _service(make_service, quickstart, skypilot_bed)
    facts = service.admin.check("sky")
    assert "Slurm" in facts["sky_check"] and facts["cluster_state"] == "absent"
    service.close()
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", _SUBMIT_AND_DIE, str(quickstart), str(scratch_dir), tracking_uri],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # SkyPilot prints lines of its own ("Running on cluster: ..."); the child's report is JSON.
        line = next((text for text in iter(child.stdout.readline, "") if text.startswith("{")), "")
    finally:
        child.kill()  # SIGKILL: nothing of that process's memory survives, only the state file
        child.wait()
    seen = json.loads(line)
    assert seen["state"] == "pending", seen
    assert "SkyPilot cluster" in seen["reason"] and skypilot_bed.cluster in seen["reason"]
    assert seen["handle"]["launch_request"]  # what a restart needs to follow the launch

    # "After the restart": a new service (new engines, no memory of the launch) picks the job up.
    service = make_service(quickstart)
    reasons: list[str] = []
    job = service.wait(seen["id"], timeout=E2E_TIMEOUT, on_wait=lambda j: reasons.append(j.reason or ""))
    timed("first job, launch included", start)
    assert job.state == "succeeded", job.reason
    require_trained(job)
    for output in ("model.pkl", "metrics.json"):
        assert job.outputs[output]["sha256"] == hashlib.sha256((quickstart / output).read_bytes()).hexdigest()
    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].data.params["rows"] == "40"
    assert runs[0].data.tags["remote_compute.engine"] == "skypilot"
    # The same launch request was followed after the restart: SkyPilot made one cluster.
    record = _record(skypilot_bed)
    assert record is not None and str(record["status"].value) == "UP"
    # Autostop configured by the launch; on Slurm (no Pyxis containers) SkyPilot can only tear down.
    assert (record["autostop"], record["to_down"]) == (30, True)


@pytest.mark.timeout(900)
def test_a_second_job_reuses_the_cluster(skypilot_bed: SkyBed, sky_client: Path, make_service, quickstart: Path):
    service = _service(make_service, quickstart, skypilot_bed)
    ensure_up(service.engine("sky"))  # launched by the first test, unless this one runs alone
    before = _record(skypilot_bed)
    (quickstart / "again.py").write_text("import os\nopen('out.txt', 'w').write(os.environ['GREETING'])\n")
    spec = {"machine": "sky", "command": "python again.py", "send": ["again.py"], "bring_back": ["out.txt"]}
    spec["env"] = {"GREETING": "hello from the head"}
    start = time.monotonic()
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=600)
    timed("second job on the running cluster", start)
    assert job.state == "succeeded", job.reason
    assert (quickstart / "out.txt").read_text() == "hello from the head"
    assert "launch_request" not in job.handle and job.handle["exec_request"]
    after = _record(skypilot_bed)
    assert after["launched_at"] == before["launched_at"]


@pytest.mark.timeout(900)
def test_a_job_runs_in_its_image_where_skypilot_runs_it(
    skypilot_bed: SkyBed, sky_client: Path, make_service, workspace: Path, tracking_uri: str, test_image
) -> None:
    """container.sh in the Slurm allocation SkyPilot runs the command in: rootless podman as the node's user,
    whose HOME there is the cluster's own folder (so is podman's store: an image is pulled per cluster)."""
    service = _service(make_service, workspace, skypilot_bed)
    ensure_up(service.engine("sky"))
    user = skypilot_bed.node_user
    (home,) = (skypilot_bed.node_home / ".sky_clusters").glob(f"{skypilot_bed.cluster}-*")
    test_containers.agent_podman(home, user)
    test_containers._podman("import", str(test_image.rootfs), test_image.ref, user=user, home=home)
    try:
        (workspace / "job.sh").write_text(
            f"mkdir -p out; cat {test_containers.MARKER} > out/marker.txt; id -u > out/uid.txt\n"
        )
        docker = {"machine": "sky", "command": "true", "environment": {"image": test_image.ref, "runtime": "docker"}}
        with pytest.raises(InvalidSettings) as e:
            service.submit(JobSpec.from_json(docker))
        assert e.value.field == "environment.runtime" and "podman" in str(e.value)
        spec = {"machine": "sky", "command": "sh job.sh", "send": ["job.sh"], "bring_back": ["out/"],
                "environment": {"image": test_image.ref}}  # fmt: skip
        job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=600)
        assert job.state == "succeeded", job.reason
        assert (workspace / "out/marker.txt").read_text().strip() == test_image.marker
        assert (workspace / "out/uid.txt").read_text().strip() == str(pwd.getpwnam(user).pw_uid)
        found = test_containers._podman("image", "inspect", "--format", "{{.Id}}", test_image.ref, user=user, home=home)
        digest = "sha256:" + found.stdout.strip().removeprefix("sha256:")
        assert f"image {test_image.ref} {digest} (podman " in service.read_log(job.id).data.decode()
        assert MlflowClient(tracking_uri).get_run(job.mlflow_run_id).data.tags[images.TAG_DIGEST] == digest
        assert not test_containers._containers(job.id, user=user, home=home)
    finally:
        test_containers._podman("system", "reset", "--force", user=user, home=home, check=False)


def test_gpus_in_an_image_on_skypilot_slurm_are_not_judged_by_the_login_nodes_runtime(sky_sdk, monkeypatch) -> None:
    """On Slurm the head is the login node: its runtimes are what the nodes have, but its podman
    without NVIDIA support says nothing of the GPU nodes', so a GPU job in an image is let go there
    (the runtime's own words fail it on a node without); on a cloud the head is where the job runs."""
    login = {"containers": [{"runtime": "podman", "version": "4.3.1", "rootless": True, "nvidia": False}]}

    class Head:
        def check(self) -> dict:  # type: ignore[type-arg]
            return json.loads(json.dumps(login))

    image = images.Image("nvcr.io/nvidia/pytorch:24.01-py3", "podman")
    for address, refused in (("slurm/hpc", False), ("aws", True)):
        engine = _engine(address=address)
        monkeypatch.setattr(engine, "cluster_record", lambda fresh=False: {"status": "UP"})
        monkeypatch.setattr(engine, "head", Head)
        facts = engine.image_facts()
        images.admit(image, "sky", "skypilot", engine.image_runtimes(), facts)
        if refused:
            with pytest.raises(InvalidSettings, match="cannot give a container GPUs"):
                images.admit_gpus(image, "1", "sky", "skypilot", engine.image_runtimes(), facts)
        else:
            images.admit_gpus(image, "1", "sky", "skypilot", engine.image_runtimes(), facts)


def test_an_image_waits_for_the_cluster_to_say_what_runs_it(sky_sdk) -> None:
    """Before the cluster is up nothing is known of its runtimes: submit lets the image go (container.sh
    names what is missing there); on Slurm the runtime is podman only, as for the slurm kind."""
    slurm, cloud = _engine(address="slurm/hpc"), _engine(address="aws")
    assert slurm.image_runtimes() == ("podman",) and cloud.image_runtimes() == ("podman", "docker")
    images.admit(images.Image("localhost/trainer:1", "podman"), "sky", "skypilot", slurm.image_runtimes(), None)
    with pytest.raises(InvalidSettings) as e:
        images.admit(images.Image("localhost/trainer:1", "docker"), "sky", "skypilot", slurm.image_runtimes(), None)
    assert e.value.field == "environment.runtime"


def _cluster_record(status: str, *, use_spot: bool, init_status_reason: str | None = None):
    """A cluster record as SkyPilot 0.14's ``status`` returns it (its StatusResponse), holding a handle of
    its own type with the resources SkyPilot launched: spot or not is read where SkyPilot records it."""
    import sky
    from sky.backends.cloud_vm_ray_backend import CloudVmRayResourceHandle
    from sky.schemas.api.responses import StatusResponse
    from sky.utils.status_lib import ClusterStatus

    handle = CloudVmRayResourceHandle(
        cluster_name="jrc-a100",
        cluster_name_on_cloud="jrc-a100-2ea4",
        cluster_yaml=None,
        launched_nodes=1,
        launched_resources=sky.Resources(use_spot=use_spot),
    )
    return StatusResponse(
        name="jrc-a100", launched_at=1_765_000_000, handle=handle, status=ClusterStatus(status), autostop=30,
        to_down=False, cluster_hash="2ea4", cluster_ever_up=True, user_hash="u1", user_name="me",
        workspace="default", is_managed=False, nodes=1, init_status_reason=init_status_reason,
    )  # fmt: skip


def test_a_cluster_that_went_away_ends_its_job_lost_or_for_spot_preempted(sky_sdk) -> None:
    """What a job's end says once SkyPilot, asked afresh, reports its cluster not UP. Spot capacity cannot be
    had on the Slurm bed (SkyPilot refuses use_spot there): a reclaim itself is not tried, only this decision."""
    from jupyter_remote_compute.engines.skypilot_cluster import cluster_gone, on_spot

    for spot in (False, True):
        assert cluster_gone("jrc-a100", _cluster_record("UP", use_spot=spot), spot) is None
    stopped = _cluster_record("STOPPED", use_spot=False)
    assert cluster_gone("jrc-a100", stopped, on_spot(stopped, False)) == (
        "lost",
        "SkyPilot cluster jrc-a100 is STOPPED (it went away while the job ran)",
    )
    unhealthy = _cluster_record("INIT", use_spot=False, init_status_reason="Cluster is abnormal: node\n terminated")
    cause, words = cluster_gone("jrc-a100", unhealthy, on_spot(unhealthy, False))
    assert cause == "lost"
    assert words.startswith("SkyPilot cluster jrc-a100 is INIT: Cluster is abnormal: node terminated")
    cause, words = cluster_gone("jrc-a100", None, on_spot(None, False))
    assert cause == "lost" and "jrc-a100 is absent" in words
    # Spot: as SkyPilot recorded the launch, whatever the machine's option says now; torn down (no record
    # left), as the machine's option says.
    reclaimed = _cluster_record("STOPPED", use_spot=True)
    assert on_spot(reclaimed, False) and not on_spot(stopped, True) and on_spot(None, True)
    assert cluster_gone("jrc-a100", reclaimed, on_spot(reclaimed, False)) == (
        "preempted",
        "the spot cluster jrc-a100 was reclaimed (SkyPilot says it is STOPPED)",
    )
    assert cluster_gone("jrc-a100", None, on_spot(None, True))[0] == "preempted"


def test_skypilot_is_asked_only_when_the_heads_answer_is_bad(sky_sdk, monkeypatch) -> None:
    """A healthy poll costs no SkyPilot call; a vanished process, or a head that does not answer, asks for the
    cluster's refreshed status once, and a spot cluster gone ends the job preempted."""
    from jupyter_remote_compute.engines.base import RemoteJob, RemoteStatus

    engine = _engine(address="aws", use_spot=True)
    job = RemoteJob("j1", "k1", {"dir": "/home/me/.jupyter-remote-compute/jobs/j1"})
    answers: list[object] = []
    asked: list[bool] = []

    class Head:
        def poll_watched(self, jobs, watched):  # type: ignore[no-untyped-def]
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return {j.job_id: answer for j in jobs}, {}

    records = {"now": _cluster_record("UP", use_spot=True)}

    def cluster_record(fresh: bool = False, refresh: bool = False):  # type: ignore[no-untyped-def]
        asked.append(refresh)
        return records["now"]

    monkeypatch.setattr(engine, "head", Head)
    monkeypatch.setattr(engine, "cluster_record", cluster_record)
    answers += [RemoteStatus("running", log_size=10)] * 3
    for _ in range(3):
        assert engine.poll([job])["j1"].state == "running"
    assert asked == []
    # The head not answering, the cluster UP: the head's error; SkyPilot refreshes at most every REFRESH_TTL
    # (a head that stays unreachable would otherwise cost a refresh every poll), its last record between.
    answers += [EngineError("gpu box: ssh: connect timed out", transient=True)] * 2
    for _ in range(2):
        with pytest.raises(EngineError, match="timed out"):
            engine.poll([job])
    assert asked == [True, False]
    # The command's own end (cluster UP): the head's answer stands. It ends the job: refreshed now, whatever the TTL.
    answers.append(RemoteStatus("gone", detail="process vanished on gpu box", log_size=12))
    assert engine.poll([job])["j1"] == RemoteStatus("gone", detail="process vanished on gpu box", log_size=12)
    assert asked == [True, False, True]
    # The spot cluster reclaimed: the job ends preempted, its log size kept.
    records["now"] = _cluster_record("STOPPED", use_spot=True)
    answers.append(RemoteStatus("exited", exit_code=143, log_size=14))
    status = engine.poll([job])["j1"]
    assert (status.state, status.cause, status.log_size) == ("gone", "preempted", 14)
    assert status.detail == "the spot cluster jrc-gpu-box was reclaimed (SkyPilot says it is STOPPED)"


@pytest.mark.timeout(900)
def test_live_metrics_come_with_the_poll(skypilot_bed: SkyBed, sky_client: Path, make_service, workspace: Path) -> None:
    """A watched job's MLflow points reach this side while it runs, as for an ssh machine."""
    (workspace / "train.py").write_text(test_live_metrics.TRAIN)
    service = _service(make_service, workspace, skypilot_bed)
    ensure_up(service.engine("sky"))
    spec = JobSpec.from_json({"machine": "sky", "command": "python train.py", "send": ["train.py"]})
    job = service.submit(spec).job
    try:
        # Starting a SkyPilot job took up to ~2 min on the loaded test machine: wait for it to run first.
        wait_for(lambda: service.advance(job.id).state == "running", 600, "the job to run", interval=0.5)
        page = test_live_metrics._watch_until(service, job.id, 3)
        assert service.get(job.id).state == "running"  # seen while the job still waits for the go file
        assert test_live_metrics._points(page) == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
        # The Slurm bed's node is this machine: the job's folder on the head is reachable from here.
        (Path(service.get(job.id).handle["dir"]) / "work" / "go").write_text("")
        done = service.wait(job.id, timeout=300)
        assert done.state == "succeeded", done.reason
        last, active = service.read_metrics(job.id, page.cursor)
        assert not active and test_live_metrics._points(last) == [(3, 0.125)]
    finally:
        # A job left waiting for its go file would hold the bed's one CPU from every later test.
        if service.get(job.id).active:
            service.cancel(job.id)


@pytest.mark.timeout(900)
def test_cancel_stops_the_command_on_the_cluster(
    skypilot_bed: SkyBed, sky_client: Path, make_service, quickstart: Path
) -> None:
    service = _service(make_service, quickstart, skypilot_bed)
    spec = {"machine": "sky", "command": "echo started; sleep 600", "name": "to cancel"}
    job = service.submit(JobSpec.from_json(spec)).job

    def running() -> bool:
        return service.advance(job.id).state == "running"

    wait_for(running, 600, "the job to run on the cluster", interval=0.5)
    handle = service.get(job.id).handle
    # The launcher, started by the SkyPilot job, wrote its process group where ssh's does.
    pid = int((Path(handle["dir"]) / "pid").read_text().split()[0])
    assert group_members(pid)
    service.cancel(job.id)
    job = service.wait(job.id, timeout=300)
    assert job.state == "cancelled", job.reason
    # The node is this machine: no process of the job's group runs any more. Zombies are not counted
    # (as cancel.sh does not count them): they have ended and wait to be reaped, orphans by this
    # machine's PID 1, which does so only every few seconds, after the cancel has returned.
    assert group_members(pid) == []
    # And SkyPilot's job, which held the cluster busy for the command, ended with it (idle again).
    from jupyter_remote_compute.engines.skypilot import load_sdk

    sdk = load_sdk()
    sky_job_id = sdk.get(handle["exec_request"])[0]

    def sky_job_ended() -> str | None:
        states = sdk.get(sdk.job_status(skypilot_bed.cluster, [sky_job_id]))
        state = states.get(sky_job_id) or states.get(str(sky_job_id))
        return state.value if state is not None and state.is_terminal() else None

    assert wait_for(sky_job_ended, 120, "SkyPilot's job to end", interval=1.0) == "SUCCEEDED"


@pytest.mark.timeout(900)
def test_check_shows_skypilots_view_and_a_missing_infra_names_sky_check(
    skypilot_bed: SkyBed, sky_client: Path, make_service, quickstart: Path
) -> None:
    service = _service(make_service, quickstart, skypilot_bed)
    ensure_up(service.engine("sky"))
    facts = service.admin.check("sky")
    assert "Slurm" in facts["sky_check"]
    assert facts["cluster"] == skypilot_bed.cluster and facts["cluster_state"] == "UP"
    assert (facts["autostop_minutes"], facts["autostop_down"]) == (30, True)
    assert "torn down" in facts["autostop_note"]
    assert facts["cpus"] >= 1 and facts["os"]  # the head node's own facts, as for ssh

    service.machines.add("cloud", "skypilot", "aws", {})
    with pytest.raises(RemoteComputeError) as e:
        service.admin.check("cloud")
    assert "sky check" in str(e.value) and "Traceback" not in str(e.value)


# Last of the module: it takes the cluster away; the job's retry launches it again for the tests after it.
@pytest.mark.timeout(E2E_TIMEOUT + 600)
def test_a_job_whose_cluster_goes_away_ends_lost_naming_it_and_its_retry_launches_it_again(
    skypilot_bed: SkyBed, sky_client: Path, make_service, workspace: Path, monkeypatch
) -> None:
    """``sky down`` while a job runs (as an ended allocation or a reclaimed VM would take it): the attempt ends
    ``lost`` naming the cluster and what SkyPilot says of it, and the next attempt relaunches the cluster."""
    from jupyter_remote_compute.engines.skypilot import load_sdk

    service = _service(make_service, workspace, skypilot_bed)
    engine = service.engine("sky")
    ensure_up(engine)
    refreshes: list[bool] = []
    read = engine.cluster_record

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        refreshes.append(bool(kwargs.get("refresh")))
        return read(*args, **kwargs)

    monkeypatch.setattr(engine, "cluster_record", counted)
    # The first attempt leaves a mark in the node user's home and waits; the second finds it and ends.
    mark = skypilot_bed.node_home / f"went-away-{time.time_ns()}"
    command = f"if [ -e {mark} ]; then echo again; else touch {mark}; echo started; sleep 300; fi"
    spec = {"machine": "sky", "command": command, "retry": {"max": 1, "on": ["lost"]}, "name": "cluster goes away"}
    job = service.submit(JobSpec.from_json(spec)).job
    pid: int | None = None
    try:

        def started() -> bool:
            return service.advance(job.id).state == "running" and b"started" in service.read_log(job.id).data

        wait_for(started, 600, "the job to run on the cluster", interval=0.5)
        pid = int((Path(service.get(job.id).handle["dir"]) / "pid").read_text().split()[0])
        for _ in range(3):
            assert service.advance(job.id).state == "running"
        assert not any(refreshes)  # healthy polls ask SkyPilot nothing afresh
        sdk = load_sdk()
        start = time.monotonic()
        sdk.get(sdk.down(skypilot_bed.cluster))
        timed("sky down under a running job", start)

        def first_ended() -> list:  # type: ignore[type-arg]
            return service.advance(job.id).attempts

        [first] = wait_for(first_ended, 300, "the first attempt to end", interval=0.5)
        timed("from sky down to the attempt's end", start)
        assert first["end"] == "lost", first
        assert first["reason"] == (
            f"lost: SkyPilot cluster {skypilot_bed.cluster} is absent (`sky status` no longer lists it) "
            "(it went away while the job ran)"
        )
        assert any(refreshes)
        # What the head saw: on this bed the login node stays, so a process the allocation took with it
        # shows as vanished; one that outlived it (Slurm's proctrack here follows parents only) as still
        # there, until the head is no longer SkyPilot's.
        print(f"[skypilot bed] the first attempt's processes after sky down: {group_members(pid)}")
        done = service.wait(job.id, timeout=E2E_TIMEOUT)
        timed("from sky down to the retried job's success, launch included", start)
        assert done.state == "succeeded", done.reason
        assert [a["end"] for a in done.attempts] == ["lost", "succeeded"]
        assert b"again" in service.read_log(job.id).data
        assert done.handle.get("launch_request")  # the second attempt launched the cluster again
        assert cluster_state(_record(skypilot_bed)) == "UP"  # launched again, for the tests after this one
    finally:
        if pid is not None and group_members(pid):  # a first attempt that outlived its cluster: not left behind
            subprocess.run(["kill", "-KILL", "--", f"-{pid}"], check=False)
        mark.unlink(missing_ok=True)
        if service.get(job.id).active:
            service.cancel(job.id)
