"""The jupyter engine against a real second Jupyter Server on loopback, through the real lifecycle."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
import threading
import time
import tracemalloc
from pathlib import Path
from uuid import uuid4

import jupyter_server_fixture
import pytest
from conftest import job_runs
from jupyter_server_fixture import RemoteServer, store_token
from mlflow.tracking import MlflowClient
from procs import group_members
from test_engine_farside import assert_facts_shape
from waiting import wait_for

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.engines.base import EngineContext, EngineError, InputFile, LaunchSpec, RemoteJob
from jupyter_remote_compute.engines.jupyter import JupyterEngine
from jupyter_remote_compute.engines.jupyter_contents import ServerClient
from jupyter_remote_compute.engines.local import LocalEngine
from jupyter_remote_compute.engines.ssh_transfer import UnsafeArchive
from jupyter_remote_compute.errors import MachineError
from jupyter_remote_compute.jobs.service import require_trained
from jupyter_remote_compute.jobs.spec import JobSpec

# The remote-server fixtures, made visible to this module.
remote_server = jupyter_server_fixture.remote_server
own_remote_server = jupyter_server_fixture.own_remote_server

MiB = 1 << 20
JOB_SECRET = "jrc-job-secret-7f3a9c1e5b2d4a68"

QUICKSTART_SPEC = {
    "command": "python train.py",
    "send": ["train.py", "data/*.csv"],
    "bring_back": ["model.pkl", "metrics.json"],
    "name": "quickstart",
}


def _engine(server: RemoteServer, tmp_path: Path, **options: str) -> JupyterEngine:
    context = EngineContext(get_secret=lambda name: server.token, scratch_dir=tmp_path)
    return JupyterEngine("far", server.url, {"token_secret": "compute/remote", **options}, context)


def _files_holding(roots: list[Path], needle: str, skip: tuple[Path, ...] = ()) -> list[Path]:
    raw = needle.encode()
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and path not in skip:
                with open(path, "rb") as f:
                    if raw in f.read():
                        found.append(path)
    return found


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- addresses --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "normalised"),
    [
        ("http://127.0.0.1:8888", "http://127.0.0.1:8888/"),
        ("https://Hub.Example.org/user/ana", "https://hub.example.org/user/ana/"),
        ("https://hub.example.org/user/ana/", "https://hub.example.org/user/ana/"),
    ],
)
def test_address_is_an_http_url_normalised_with_a_trailing_slash(address, normalised):
    assert JupyterEngine.validate_address(address) == normalised


@pytest.mark.parametrize(
    "address",
    [
        "https://ana:hunter2hunter2@hub.example.org/",
        "https://hub.example.org/?token=abcdef0123456789",
        "https://hub.example.org/user/ana/\n",
        "https://hub.example.org/user/ana lab/",
        "ftp://hub.example.org/",
        "hub.example.org",
        "https://",
    ],
)
def test_address_refuses_credentials_other_schemes_and_whitespace(address):
    with pytest.raises(ValueError) as info:
        JupyterEngine.validate_address(address)
    for secretish in ("hunter2", "abcdef0123456789"):
        assert secretish not in str(info.value)


def test_saved_machine_keeps_only_the_secret_name(workspace, make_service, remote_server):
    service = make_service(workspace)
    service.machines.add("far", "jupyter", remote_server.url.rstrip("/"), {"token_secret": "compute/remote"})
    text = (workspace / ".punica" / "compute.yaml").read_text()
    assert "token_secret: compute/remote" in text and remote_server.token not in text
    assert service.machines.get("far").address == remote_server.url


# -- archive safety -----------------------------------------------------------------------
def _archive(tmp_path, evil: str):
    """manifest.sh's stream as a file, with one good MLflow file and then one ``evil`` entry."""
    tar_path = tmp_path / "fetch.tar"
    with tarfile.open(tar_path, "w") as t:

        def add(info, data=b""):
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))

        add(tarfile.TarInfo(".fetch-x"), b"")
        add(tarfile.TarInfo("mlruns/0/meta.yaml"), b"ok")
        if evil in ("../escape", "/abs", "mlruns/0/../../up", "work/unasked"):
            add(tarfile.TarInfo(evil), b"x")
        elif evil == "symlink":
            link = tarfile.TarInfo("mlruns/0/link")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            t.addfile(link)
        elif evil == "device":
            device = tarfile.TarInfo("mlruns/0/dev")
            device.type = tarfile.CHRTYPE
            t.addfile(device)
    return tar_path


@pytest.mark.parametrize("evil", ["../escape", "/abs", "mlruns/0/../../up", "work/unasked", "symlink", "device"])
def test_an_archive_with_any_escaping_entry_is_refused_whole(tmp_path, evil):
    tar_path = _archive(tmp_path, evil)
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchive, match="refused"):
        farside.extract_archive(tar_path, ["wanted"], dest, ".fetch-x", "far")
    # Nothing of it stays, not even the good file that came first.
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [tar_path]
    assert not (tmp_path / "escape").exists() and not (tmp_path / "up").exists()


# -- check ------------------------------------------------------------------------------------
def test_check_reports_server_kernels_and_host(remote_server, tmp_path):
    engine = _engine(remote_server, tmp_path)
    try:
        facts = engine.check()
    finally:
        engine.close()
    assert facts["server_version"]
    assert "python3" in facts["kernelspecs"]
    assert facts["python"].count(".") == 2
    assert facts["disk_free_bytes"] > 0 and facts["rtt_ms"] >= 0
    assert facts["transfer"] in ("contents", "kernel")
    # One shape for every kind: the OS kernel stays the OS kernel, the Jupyter kernel has its own name.
    assert_facts_shape(facts)
    assert facts["kernel_name"] == "python3"
    local = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path / "s"))
    local_facts = local.check()
    assert set(local_facts) <= set(facts)
    for key in ("os", "kernel", "cpus", "memory_bytes", "gpus"):  # the server runs on this same machine
        assert facts[key] == local_facts[key], key


def test_wrong_token_is_refused_naming_the_secret_not_the_token(workspace, make_service, remote_server, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "0123456789abcdef-wrong-token-fedcba9876543210"
    store_token("compute/stale", wrong)
    service = make_service(workspace)
    service.machines.add("stale", "jupyter", remote_server.url, {"token_secret": "compute/stale"})
    with pytest.raises(MachineError) as info:
        service.admin.check("stale")
    message = str(info.value)
    assert "the token in secret 'compute/stale' was refused" in message
    assert "jupyter remote-compute secrets set compute/stale" in message
    assert wrong not in message and remote_server.token not in message

    (workspace / "a.txt").write_text("a")
    job = service.submit(JobSpec.from_json({"machine": "stale", "command": "true", "send": ["a.txt"]})).job
    job = service.wait(job.id, timeout=60)
    assert job.state == "failed"
    assert "compute/stale" in job.reason and wrong not in job.reason
    assert wrong not in caplog.text
    assert not _files_holding([workspace], wrong)


def test_unreachable_server_is_a_transient_error(tmp_path):
    server = RemoteServer(tmp_path / "never-started")
    engine = _engine(server, tmp_path)
    with pytest.raises(EngineError) as info:
        engine.check()
    assert info.value.transient and "cannot reach" in str(info.value)
    with pytest.raises(EngineError) as info:
        engine.poll([RemoteJob("j", "k", {"abs_dir": "/nowhere/jobs/j", "pid": 1})])
    assert info.value.transient


# -- the whole lifecycle --------------------------------------------------------------------
@pytest.mark.parametrize("base_dir", [".jrc-hidden", None], ids=["hidden-base-kernel", "default-base-contents"])
def test_quickstart_runs_remotely_lands_verified_outputs_and_one_mlflow_run(
    base_dir, quickstart, make_service, tracking_uri, remote_server, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    store_token("jobs/api-key", JOB_SECRET)
    service = make_service(quickstart)
    options = {"token_secret": "compute/remote", **({"base_dir": base_dir} if base_dir else {})}
    service.machines.add("far", "jupyter", remote_server.url, options)
    spec = {
        **QUICKSTART_SPEC,
        "machine": "far",
        # The secret reaches the command's environment; the command checks its start without printing it.
        "command": 'case "$API_KEY" in "$(cat expected)"*) ;; *) exit 9;; esac; python train.py',
        "send": [*QUICKSTART_SPEC["send"], "expected"],
        "env": {"API_KEY": "secret:jobs/api-key", "PLAIN": "1"},
    }
    (quickstart / "expected").write_text(JOB_SECRET[:8])
    job = service.submit(JobSpec.from_json(spec)).job
    job = service.wait(job.id, timeout=180)

    assert job.state == "succeeded", job.reason
    require_trained(job)
    transport = job.handle["transport"]
    assert transport == ("kernel" if base_dir else "contents")
    assert job.transfer["files_sent"] == 3
    for name in ("model.pkl", "metrics.json"):
        landed = quickstart / name
        assert job.outputs[name]["sha256"] == hashlib.sha256(landed.read_bytes()).hexdigest()
    runs = job_runs(tracking_uri, job.id)
    assert len(runs) == 1 and runs[0].info.run_id == job.mlflow_run_id
    assert runs[0].data.params["rows"] == "40"
    history = MlflowClient(tracking_uri).get_metric_history(runs[0].info.run_id, "residual")
    assert sorted(m.step for m in history) == list(range(40))
    assert runs[0].data.tags["remote_compute.engine"] == "jupyter"
    assert (quickstart / ".punica").is_dir()
    assert "trained on 40 rows" in (service.workspace.job_dir(job.id) / "log").read_text()

    # The job directory is where the handle says, under the server's root_dir.
    jobdir = remote_server.root_dir / job.handle["dir"]
    assert jobdir.resolve() == Path(job.handle["abs_dir"]).resolve()
    assert (jobdir / "work" / "model.pkl").is_file()

    # Neither the server token nor the job's secret is written anywhere we or the far side keep files.
    roots = [tmp_path, remote_server.root_dir, remote_server.ipython_dir]
    for needle in (remote_server.token, JOB_SECRET):
        assert not _files_holding(roots, needle, skip=(remote_server.log_path,)), needle
        assert needle not in caplog.text
    # The server's own log holds its token only in the URLs it prints at start-up, never from our requests.
    for line in remote_server.log_path.read_text().splitlines():
        if remote_server.token in line:
            assert "?token=" in line

    service.delete(job.id)
    assert not jobdir.exists()


def test_a_directory_output_arrives_and_damage_in_transit_is_caught(
    workspace, make_service, remote_server, monkeypatch
):
    service = make_service(workspace)
    service.machines.add(
        "far", "jupyter", remote_server.url, {"token_secret": "compute/remote", "base_dir": "jrc-jobs"}
    )
    spec = {
        "machine": "far",
        "command": "mkdir -p out/sub && echo one > out/a && echo two > out/sub/b",
        "bring_back": ["out"],
    }
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    assert job.state == "succeeded", job.reason
    assert (workspace / "out" / "a").read_text() == "one\n" and (workspace / "out" / "sub" / "b").read_text() == "two\n"
    assert set(job.outputs) == {"out/a", "out/sub/b"}

    original = ServerClient.stream

    def tampering(self, path):  # one flipped byte on the way
        for block in original(self, path):
            yield block.replace(b"two\n", b"tw0\n") if path.endswith("fetch.tar") else block

    monkeypatch.setattr(ServerClient, "stream", tampering)
    spec = {"machine": "far", "command": "echo two > b2", "bring_back": ["b2"]}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    assert job.state == "failed"
    assert "damaged in transit" in job.reason and "b2" in job.reason
    assert not (workspace / "b2").exists()


def test_missing_output_is_reported(workspace, make_service, remote_server):
    service = make_service(workspace)
    service.machines.add("far", "jupyter", remote_server.url, {"token_secret": "compute/remote"})
    spec = {"machine": "far", "command": "echo hi > a.txt", "bring_back": ["a.txt", "b.txt"]}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    assert job.state == "failed" and job.reason == "missing outputs: b.txt"
    assert not (workspace / "a.txt").exists()


def test_nonzero_exit_fails_with_the_log_tail(workspace, make_service, remote_server):
    service = make_service(workspace)
    service.machines.add("far", "jupyter", remote_server.url, {"token_secret": "compute/remote"})
    spec = {"machine": "far", "command": "echo 'bad input' >&2; exit 3"}
    job = service.wait(service.submit(JobSpec.from_json(spec)).job.id, timeout=120)
    assert job.state == "failed" and job.reason.startswith("exit code 3:") and "bad input" in job.reason


def test_cancel_kills_the_whole_process_group(workspace, make_service, remote_server):
    service = make_service(workspace, cancel_grace=1.0)
    service.machines.add("far", "jupyter", remote_server.url, {"token_secret": "compute/remote"})
    # A child in the background and a parent that ignores TERM: KILL after the grace must take both.
    command = "sleep 300 & trap '' TERM; echo started; while true; do sleep 0.1; done"
    job = service.submit(JobSpec.from_json({"machine": "far", "command": command})).job
    wait_for(lambda: service.advance(job.id).state == "running", 60, message="the job to run")
    job = service.get(job.id)
    pgid = job.handle["pid"]
    wait_for(lambda: len(group_members(pgid)) >= 3, 30, message="the job's processes")
    wait_for(lambda: b"started" in service.read_log(job.id).data, 30, message="the job's log")
    job = service.cancel(job.id)
    job = service.wait(job.id, timeout=60)
    assert job.state == "cancelled"
    assert group_members(pgid) == []


def test_log_is_read_by_range_from_an_offset(remote_server, tmp_path):
    for base_dir in ("jrc-jobs", ".jrc-hidden"):
        engine = _engine(remote_server, tmp_path, base_dir=base_dir)
        try:
            job = engine.prepare(RemoteJob(f"log-{base_dir.strip('.')}", "k", {}))
            job = engine.start(job, LaunchSpec("printf 'abcdefghij'", {}, {}))
            wait_for(lambda e=engine, j=job: e.poll([j])[j.job_id].state == "exited", 30, message="exit")
            assert engine.read_log(job, 0, 4) == b"abcd"
            assert engine.read_log(job, 3, 100) == b"defghij"
            assert engine.read_log(job, 10, 100) == b""
            assert engine.read_log(job, 50, 100) == b""
            engine.cleanup(job)
        finally:
            engine.close()


# -- big inputs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("base_dir", ["jrc-jobs", ".jrc-hidden"], ids=["contents", "kernel"])
def test_a_200_mib_input_streams_with_flat_memory_and_is_not_sent_twice(base_dir, remote_server, tmp_path):
    source = tmp_path / "big.bin"
    digest = hashlib.sha256()
    with open(source, "wb") as f:
        for i in range(200):
            block = (i.to_bytes(4, "big") * (MiB // 4))[:-8] + os.urandom(8)
            digest.update(block)
            f.write(block)
    big = InputFile("data/big.bin", source, 200 * MiB, digest.hexdigest())
    engine = _engine(remote_server, tmp_path, base_dir=base_dir)
    peak_rss = 0
    stop = threading.Event()

    def watch_rss() -> None:
        nonlocal peak_rss
        while not stop.is_set():
            peak_rss = max(peak_rss, _rss())
            stop.wait(0.02)

    try:
        job = engine.prepare(RemoteJob(f"big-{base_dir.strip('.')}", "k", {}))
        engine.send(job, [])  # warm up: the kernel and the connection exist before we measure
        rss_before = _rss()
        watcher = threading.Thread(target=watch_rss)
        watcher.start()
        tracemalloc.start()
        progress = []
        started = time.monotonic()
        try:
            stats = engine.send(job, [big], lambda done, total: progress.append((done, total)))
        finally:
            _, traced_peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            stop.set()
            watcher.join()
        elapsed = time.monotonic() - started
        assert stats.files_sent == 1 and stats.bytes_sent == 200 * MiB and stats.files_reused == 0
        assert traced_peak < 64 * MiB, f"tracemalloc peak {traced_peak / MiB:.0f} MiB"
        assert peak_rss - rss_before < 64 * MiB, f"RSS grew {(peak_rss - rss_before) / MiB:.0f} MiB"
        assert progress[-1] == (200 * MiB, 200 * MiB)
        landed = Path(job.handle["abs_dir"]) / "work" / "data" / "big.bin"
        assert landed.stat().st_size == 200 * MiB
        print(f"\n{base_dir}: 200 MiB sent in {elapsed:.1f}s, traced peak {traced_peak / MiB:.1f} MiB")

        # The same job again (a retry): nothing moves.
        again = engine.send(job, [big])
        assert again.files_sent == 0 and again.files_reused == 1
        # Another job with the same bytes: copied from the far side's cache, not sent.
        other = engine.prepare(RemoteJob(f"big2-{base_dir.strip('.')}", "k", {}))
        reused = engine.send(other, [big])
        assert reused.files_sent == 0 and reused.files_reused == 1
        assert (Path(other.handle["abs_dir"]) / "work" / "data" / "big.bin").stat().st_size == 200 * MiB
        for j in (job, other):
            engine.cleanup(j)
    finally:
        engine.close()


# -- the far server restarts ---------------------------------------------------------------------
def test_job_survives_a_restart_of_the_remote_server(workspace, make_service, own_remote_server):
    server = own_remote_server
    service = make_service(workspace)
    service.machines.add("own", "jupyter", server.url, {"token_secret": "compute/own"})
    command = "echo waiting; while [ ! -f go ]; do sleep 0.05; done; echo done > out.txt"
    job = service.submit(JobSpec.from_json({"machine": "own", "command": command, "bring_back": ["out.txt"]})).job
    wait_for(lambda: service.advance(job.id).state == "running", 60, message="the job to run")
    job = service.get(job.id)
    pgid = job.handle["pid"]

    server.stop()
    # While the server is down the job is not declared dead: polls fail as transient errors.
    with pytest.raises(EngineError) as info:
        service.engine("own").poll([RemoteJob(job.id, job.key, job.handle)])
    assert info.value.transient
    assert service.advance(job.id).state == "running"
    assert group_members(pgid), "the detached command died with the server"

    server.start()
    assert service.advance(job.id).state == "running"  # a new kernel answers for the old job
    (Path(job.handle["abs_dir"]) / "work" / "go").touch()
    job = service.wait(job.id, timeout=120)
    assert job.state == "succeeded", job.reason
    assert (workspace / "out.txt").read_text() == "done\n"


# -- the input cache ----------------------------------------------------------------------------
@pytest.mark.parametrize("base_dir", ["jrc-cache", ".jrc-cache-hidden"], ids=["contents", "kernel"])
def test_the_input_cache_links_reuses_and_evicts_beyond_its_cap(base_dir, remote_server, tmp_path):
    def made(name: str, data: bytes, mode: int = 0o644) -> InputFile:
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return InputFile(f"in/{name}", path, len(data), hashlib.sha256(data).hexdigest(), mode)

    engine = _engine(remote_server, tmp_path, base_dir=base_dir, cache_max_bytes="150000")
    first = [made("a.bin", os.urandom(100_000)), made("b.bin", os.urandom(100_000))]
    run = made("run.sh", b"#!/bin/sh\necho ran\n", 0o755)
    try:
        job_a = engine.prepare(RemoteJob(f"a-{uuid4().hex[:8]}", "k", {}))
        assert engine.send(job_a, [*first, run]).files_sent == 3
        cache = remote_server.root_dir / base_dir / "cache"
        work_a = remote_server.root_dir / job_a.handle["dir"] / "work"
        # One read-only copy: the work tree's name is a link to the cache entry...
        assert os.stat(work_a / "in/a.bin").st_ino == os.stat(cache / first[0].sha256).st_ino
        assert (cache / first[0].sha256).stat().st_mode & 0o777 == 0o444
        # ...except an executable input, which keeps its own copy and its mode.
        assert (work_a / "in/run.sh").stat().st_mode & 0o777 == 0o755
        assert os.stat(work_a / "in/run.sh").st_ino != os.stat(cache / run.sha256).st_ino

        job_b = engine.prepare(RemoteJob(f"b-{uuid4().hex[:8]}", "k", {}))
        stats = engine.send(job_b, [*first, run])
        assert (stats.files_sent, stats.files_reused) == (0, 3)
        work_b = remote_server.root_dir / job_b.handle["dir"] / "work"
        assert (work_b / "in/b.bin").read_bytes() == first[1].source.read_bytes()
        assert (work_b / "in/run.sh").stat().st_mode & 0o777 == 0o755

        engine.cleanup(job_a)
        engine.cleanup(job_b)
        later = made("c.bin", os.urandom(100_000))
        job_c = engine.prepare(RemoteJob(f"c-{uuid4().hex[:8]}", "k", {}))
        engine.send(job_c, [later])
        kept = {p.name for p in cache.iterdir() if not p.name.startswith(".")}
        assert later.sha256 in kept  # linked from job c
        unlinked = [cache / n for n in kept if (cache / n).stat().st_nlink == 1]
        assert sum(p.stat().st_size for p in unlinked) <= 150_000
        assert len(kept & {f.sha256 for f in first}) <= 1  # the cap pushed out the least recently used
        engine.cleanup(job_c)
    finally:
        engine.close()


# -- fetching big outputs: parallel ranged GETs while the kernel hashes them --------------------------
def _far_outputs(job: RemoteJob) -> dict[str, bytes]:
    """Outputs written straight into the far job directory: two big files (one in a hidden folder), a small one."""
    work = Path(job.handle["abs_dir"]) / "work"
    files = {
        "out/big.bin": os.urandom(40 * MiB + 123),  # five ranged pieces and a bit
        "out/.hidden/run.bin": os.urandom(20 * MiB),  # /files/ will not serve it: the kernel reads it
        "out/small.txt": b"small",
    }
    for rel, data in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    (work / "out" / ".hidden" / "run.bin").chmod(0o755)
    return files


@pytest.mark.parametrize("streams", ["1", "3"])
def test_big_outputs_come_down_by_themselves_verified_against_the_far_side(remote_server, tmp_path, streams):
    engine = _engine(remote_server, tmp_path, base_dir="jrc-big", fetch_streams=streams)
    requests: list[str] = []
    original = ServerClient._piece

    def counting(self, path, start, end):  # type: ignore[no-untyped-def]
        requests.append(path)
        return original(self, path, start, end)

    try:
        job = engine.prepare(RemoteJob(f"big-out-{streams}", "k", {}))
        assert job.handle["transport"] == "contents"
        files = _far_outputs(job)
        progress: list[tuple[int, int]] = []
        ServerClient._piece = counting  # type: ignore[method-assign]
        tracemalloc.start()
        try:
            result = engine.fetch(job, ["out"], tmp_path / "in", lambda d, t: progress.append((d, t)))
            _, traced_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            ServerClient._piece = original  # type: ignore[method-assign]
        expected = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
        assert result.digests == expected  # the far side's, the big ones hashed by the kernel
        assert result.received == expected  # this side's, hashed as they landed
        for rel, data in files.items():
            assert (tmp_path / "in" / "work" / rel).read_bytes() == data
        assert os.access(tmp_path / "in" / "work" / "out" / ".hidden" / "run.bin", os.X_OK)
        # big.bin came as ranged pieces; the hidden file was refused by /files/ (one try) and read otherwise
        where = f"{job.handle['dir']}/work/out"
        # With ranges, big.bin came as six pieces, and the hidden file was refused by /files/ once and read otherwise.
        if streams == "3":
            assert requests.count(f"{where}/big.bin") == 6 and requests.count(f"{where}/.hidden/run.bin") == 1
        else:
            assert requests == []  # one plain GET each
        assert progress[-1][0] == progress[-1][1] >= sum(len(d) for d in files.values())
        assert traced_peak < 64 * MiB, f"tracemalloc peak {traced_peak / MiB:.0f} MiB"
    finally:
        engine.close()


def test_a_big_output_damaged_on_the_way_does_not_match_the_far_digest(remote_server, tmp_path, monkeypatch):
    with pytest.raises(EngineError, match="fetch_streams"):
        _engine(remote_server, tmp_path, fetch_streams="0")
    engine = _engine(remote_server, tmp_path, base_dir="jrc-big", fetch_streams="3")
    original = ServerClient._piece

    def flipping(self, path, start, end):  # type: ignore[no-untyped-def]
        data = original(self, path, start, end)
        if data is not None and start == 16 * MiB:
            data[5] ^= 1
        return data

    try:
        job = engine.prepare(RemoteJob("big-damaged", "k", {}))
        files = _far_outputs(job)
        monkeypatch.setattr(ServerClient, "_piece", flipping)
        result = engine.fetch(job, ["out"], tmp_path / "in")
        rel = "out/big.bin"
        assert result.digests[rel] == hashlib.sha256(files[rel]).hexdigest()
        assert result.received[rel] != result.digests[rel]  # collection refuses it: damaged in transit
    finally:
        engine.close()
