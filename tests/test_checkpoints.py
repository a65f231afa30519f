"""A running job's checkpoint folder comes home while it runs: complete files only, changed ones again,
the newest whole set at ``.punica/checkpoints/<job id>``, on the built-in machine and over a real sshd."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import sshd_fixture
from waiting import wait_for

from jupyter_remote_compute.errors import InvalidSettings
from jupyter_remote_compute.jobs.spec import JobSpec

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

# A training loop as training code writes checkpoints: to a temporary name, then renamed into place
# (torch.save(state, tmp); os.replace(tmp, path)). The test says when each step may end (go-N in the
# job's folder, else it gives up); meanwhile a log it appends to all along is never whole, and a .tmp
# stays half-written.
TRAIN = """\
import os, threading, time
d = os.environ["REMOTE_COMPUTE_CHECKPOINT_DIR"]
def save(name, data):
    with open(os.path.join(d, name + ".tmp"), "wb") as f:
        f.write(data)
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
stop = threading.Event()
def grow():
    with open(os.path.join(d, "growing.log"), "ab") as f:
        while not stop.is_set():
            f.write(b"step line\\n"); f.flush(); time.sleep(0.01)
writer = threading.Thread(target=grow); writer.start()
save("config.json", b'{"lr": 0.1}' * 1000)
half = open(os.path.join(d, "next.pt.tmp"), "wb"); half.write(b"half")
given_up = time.monotonic() + 300  # a test that failed never says go: the job ends, not orphaned
for step in (1, 2, 3):
    save("model.pt", bytes([step]) * 200000)
    while not os.path.exists("go-%d" % step):
        if time.monotonic() > given_up:
            stop.set(); raise SystemExit("no go-%d within 300 s" % step)
        time.sleep(0.02)
stop.set(); writer.join(); half.close()
"""
MODEL = 200_000
CONFIG = len(b'{"lr": 0.1}' * 1000)


@pytest.fixture(params=["local", "ssh"])
def machine(request: pytest.FixtureRequest, workspace: Path, make_service):  # type: ignore[no-untyped-def]
    (workspace / "train.py").write_text(TRAIN)
    service = make_service(workspace)
    if request.param == "ssh":
        bed = request.getfixturevalue("ssh_agent_env")
        service.machines.add("box", "ssh", "127.0.0.1", bed.options(ssh_transport="openssh"))
        return "box", service
    return "local", service


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoints_come_home_while_the_job_runs_changed_files_only_and_whole(machine, workspace):
    name, service = machine
    spec = JobSpec.from_json(
        {
            "machine": name,
            "command": "python3 train.py",
            "send": ["train.py"],
            "checkpoints": "ckpt",
            "checkpoint_every": 0.3,
        }
    )
    job = service.submit(spec).job
    home = workspace / ".punica/checkpoints" / job.id

    def step_landed(step: int) -> object:
        current = service.advance(job.id)
        model = home / "model.pt"
        if not model.is_file() or model.read_bytes()[:1] != bytes([step]):
            return None
        # Never a file still being written: not the one appended to, not a temporary name.
        names = sorted(p.name for p in home.iterdir())
        assert names == ["config.json", "model.pt"], names
        return current

    running = wait_for(lambda: step_landed(1), timeout=90, message="the first checkpoint set to land")
    assert running.state == "running", running.reason
    far = Path(running.handle["dir"]) / "work" / "ckpt"
    assert _sha(home / "model.pt") == _sha(far / "model.pt")
    assert _sha(home / "config.json") == _sha(far / "config.json")
    first = wait_for(lambda: service.advance(job.id).checkpoint, timeout=30, message="the set's summary")
    assert first["files"] == 2 and first["bytes"] == MODEL + CONFIG
    assert first["fetched_bytes"] == MODEL + CONFIG

    (far.parent / "go-1").write_text("")
    second = wait_for(lambda: step_landed(2), timeout=60, message="the second step's checkpoint to land")
    assert second.state == "running"
    summary = wait_for(
        lambda: (c := service.advance(job.id).checkpoint) and c["fetched_bytes"] > first["fetched_bytes"] and c,
        timeout=30,
        message="the second set's summary",
    )
    # Only the changed file came again: config.json was not fetched a second time.
    assert summary["fetched_bytes"] == first["fetched_bytes"] + MODEL
    assert summary["files"] == 2

    (far.parent / "go-2").write_text("")
    (far.parent / "go-3").write_text("")
    done = service.wait(job.id, timeout=90)
    assert done.state == "succeeded", done.reason
    # The last set, taken after the job ended: every file whole, the log that grew all along included.
    assert sorted(p.name for p in home.iterdir()) == ["config.json", "growing.log", "model.pt"]
    assert (home / "model.pt").read_bytes() == bytes([3]) * MODEL
    assert _sha(home / "growing.log") == _sha(far / "growing.log")
    assert done.checkpoint is not None and done.checkpoint["files"] == 3
    assert service.get(job.id).public_json()["checkpoint"] == done.checkpoint  # the API's and the CLI's JSON
    assert done.checkpoint["bytes"] == MODEL + CONFIG + (far / "growing.log").stat().st_size


def test_a_checkpoint_damaged_on_its_way_home_never_lands_and_is_fetched_again(
    machine, workspace, monkeypatch: pytest.MonkeyPatch
):
    from jupyter_remote_compute.engines import ssh_transfer

    name, service = machine
    # Every kind brings checkpoints home through the verified tar stream (engines/farside): the first
    # time model.pt arrives, one byte of it is flipped here, after the far side computed its digest.
    original = ssh_transfer.SafeExtractor._write
    arrivals: list[bool] = []

    def tamper(self, path, mode, chunks, progress):  # type: ignore[no-untyped-def]
        if path.endswith("/model.pt"):
            arrivals.append(len(arrivals) == 0)
            if arrivals[-1]:
                chunks = (bytes(b"".join(chunks)[:-1]) + b"\xff",)
        original(self, path, mode, chunks, progress)

    monkeypatch.setattr(ssh_transfer.SafeExtractor, "_write", tamper)
    spec = {"machine": name, "command": "python3 train.py", "send": ["train.py"], "checkpoints": "ckpt"}
    job = service.submit(JobSpec.from_json({**spec, "checkpoint_every": 0.2})).job
    home = workspace / ".punica/checkpoints" / job.id

    def landed() -> object:
        current = service.advance(job.id)
        model = home / "model.pt"
        if model.is_file():
            # Never the damaged copy: what is at home is the step's bytes.
            assert model.read_bytes() == bytes([1]) * MODEL
            return current
        return None

    running = wait_for(landed, timeout=90, message="the first checkpoint set to land")
    assert arrivals[:2] == [True, False], arrivals  # damaged once, then fetched again
    summary = wait_for(
        lambda: (c := service.advance(job.id).checkpoint) and c["files"] == 2 and c,
        timeout=30,
        message="the set's summary",
    )
    assert summary["fetched_bytes"] == MODEL + CONFIG  # the damaged copy is not counted: it never landed
    for step in (1, 2, 3):
        (Path(running.handle["dir"]) / "work" / f"go-{step}").write_text("")
    assert service.wait(job.id, timeout=60).state == "succeeded"


def test_a_kind_whose_checkpoints_do_not_come_home_is_refused_at_submit(workspace, make_service):
    service = make_service(workspace)
    service.machines.add("nb", "jupyter", "http://127.0.0.1:9", {"token_secret": "nb-token"})
    with pytest.raises(InvalidSettings) as info:
        service.submit(JobSpec.from_json({"machine": "nb", "command": "true", "checkpoints": "ckpt"}))
    assert info.value.field == "checkpoints"


def test_the_cli_and_the_magic_take_the_checkpoint_folder_and_its_period():
    from jupyter_remote_compute.cli import build_parser
    from jupyter_remote_compute.magics import build_train_parser
    from jupyter_remote_compute.run_options import command_of, spec_settings

    words = ["--checkpoints", "ckpt", "--checkpoint-every", "30s", "--", "python", "train.py"]
    for args in (build_parser(plugins=False).parse_args(["run", *words]), build_train_parser().parse_args(words)):
        spec = JobSpec.from_json(spec_settings(args, command_of(args)))
        assert (spec.checkpoints, spec.checkpoint_every) == ("ckpt", 30.0)
    assert spec.to_json()["checkpoints"] == "ckpt"
    with pytest.raises(InvalidSettings) as info:
        JobSpec.from_json({"command": "true", "checkpoints": "../elsewhere"})
    assert info.value.field == "checkpoints"


def test_a_look_that_died_between_its_swap_and_its_record_is_followed_by_a_new_set(workspace, make_service, capsys):
    """The set landed and the link swapped, but the record of it was never written (the process died):
    the next look lands a new set beside it rather than failing on the folder it left."""
    (workspace / "train.py").write_text(TRAIN)
    service = make_service(workspace)
    spec = {"command": "python3 train.py", "send": ["train.py"], "checkpoints": "ckpt", "checkpoint_every": 0.2}
    job = service.submit(JobSpec.from_json(spec)).job
    home = workspace / ".punica/checkpoints" / job.id

    def landed(step: int) -> object:
        current = service.advance(job.id)
        model = home / "model.pt"
        return model.is_file() and model.read_bytes()[:1] == bytes([step]) and current

    running = wait_for(lambda: landed(1), timeout=60, message="the first set")
    record = workspace / ".punica/jobs" / job.id / "checkpoints.json"
    seen = json.loads(record.read_text())["seen"]
    record.write_text(json.dumps({"seen": seen}))  # as the record was before that look
    far = Path(running.handle["dir"]) / "work"
    (far / "go-1").write_text("")
    wait_for(lambda: landed(2), timeout=30, message="a new set after the lost record")
    assert sorted(p.name for p in home.iterdir()) == ["config.json", "model.pt"]
    (far / "go-2").write_text("")
    (far / "go-3").write_text("")
    assert service.wait(job.id, timeout=60).state == "succeeded"
    from jupyter_remote_compute.cli import main

    assert main(["--workspace", str(workspace), "jobs", "show", job.id]) == 0
    shown = capsys.readouterr().out
    assert "checkpoints: 3 files" in shown and f".punica/checkpoints/{job.id}/" in shown
