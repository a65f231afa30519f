"""The far-side contract (engines/farside/*.sh): run here on real files, and through the engines.

The scripts are what every push engine runs on its machine, so they are tested
once, directly, and then as each engine uses them (ssh against a real sshd).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest
import sshd_fixture
from sshd_fixture import TestBed
from test_engine_ssh import input_file, make_engine, new_job

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.engines.base import EngineContext, Facts, InputFile, RemoteJob
from jupyter_remote_compute.engines.local import LocalEngine

sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env

DAY = 86400


def cache_sh(*args: str, stdin: bytes = b"") -> str:
    proc = subprocess.run(farside.argv("cache", *args), input=stdin, capture_output=True, check=True)
    return proc.stdout.decode()


def put_entry(cache: Path, data: bytes, age_days: float) -> str:
    sha = hashlib.sha256(data).hexdigest()
    path = cache / sha
    path.write_bytes(data)
    path.chmod(0o444)
    then = time.time() - age_days * DAY
    os.utime(path, (then, then))
    return sha


def test_every_script_is_posix_sh():
    for name in farside.SCRIPTS:
        subprocess.run(["sh", "-n", "-c", farside.script(name)], check=True)
        if Path("/usr/bin/dash").exists():  # Debian's sh is dash already; elsewhere check it too
            subprocess.run(["/usr/bin/dash", "-n", "-c", farside.script(name)], check=True)


def test_eviction_drops_entries_unused_for_the_age(tmp_path: Path):
    cache = tmp_path / "cache"
    cache.mkdir()
    old = put_entry(cache, b"old" * 100, age_days=20)
    fresh = put_entry(cache, b"fresh" * 100, age_days=1)
    cache_sh("evict", str(tmp_path), "14", str(1 << 30))
    assert sorted(p.name for p in cache.iterdir()) == [fresh]
    assert old != fresh


def test_eviction_keeps_the_cache_under_its_cap_dropping_the_least_recently_used(tmp_path: Path):
    cache = tmp_path / "cache"
    cache.mkdir()
    oldest = put_entry(cache, b"a" * 4000, age_days=3)
    older = put_entry(cache, b"b" * 4000, age_days=2)
    newer = put_entry(cache, b"c" * 4000, age_days=1)
    # Linked from a job: removing it would free nothing, so it neither counts nor goes.
    in_use = put_entry(cache, b"d" * 4000, age_days=5)
    os.link(cache / in_use, tmp_path / "job-input")
    (cache / ".incoming-cut").mkdir()  # a send cut short, long ago
    os.utime(cache / ".incoming-cut", (time.time() - 3 * DAY,) * 2)
    cache_sh("evict", str(tmp_path), "14", "8500")
    assert sorted(p.name for p in cache.iterdir()) == sorted([older, newer, in_use])
    cache_sh("evict", str(tmp_path), "14", "4000")
    assert sorted(p.name for p in cache.iterdir()) == sorted([newer, in_use])
    assert oldest not in {p.name for p in cache.iterdir()}


def test_have_link_and_adopt_keep_one_read_only_copy(tmp_path: Path):
    base = tmp_path / "base"
    job = base / "jobs" / "j1"
    (job / "work" / "odd name\nwith newline").mkdir(parents=True)
    data = b"payload\n"
    sha = hashlib.sha256(data).hexdigest()
    arrived = job / "work" / "odd name\nwith newline" / "in.txt"
    arrived.write_bytes(data)
    f = InputFile("odd name\nwith newline/in.txt", arrived, len(data), sha, 0o644)
    assert farside.parse_have(cache_sh("have", str(base), stdin=farside.have_input([sha]))) == {}
    assert farside.parse_marked(cache_sh("adopt", str(base), str(job), stdin=farside.adopt_input([f])), "bad") == []
    cached = base / "cache" / sha
    assert cached.read_bytes() == data and os.stat(cached).st_ino == os.stat(arrived).st_ino
    assert cached.stat().st_mode & 0o777 == 0o444
    assert farside.parse_have(cache_sh("have", str(base), stdin=farside.have_input([sha]))) == {sha: len(data)}
    # A second job gets the same content as a link, an executable one as its own copy.
    other = base / "jobs" / "j2"
    run = InputFile("bin/run", arrived, len(data), sha, 0o755)
    out = cache_sh("link", str(base), str(other), stdin=farside.link_input([f, run]))
    assert farside.parse_marked(out, "missing") == []
    assert os.stat(other / "work" / f.relpath).st_ino == os.stat(cached).st_ino
    assert (other / "work/bin/run").stat().st_mode & 0o777 == 0o755
    assert os.stat(other / "work/bin/run").st_ino != os.stat(cached).st_ino
    # A file of the wrong size is not adopted.
    short = InputFile("short.txt", arrived, 99, "0" * 64, 0o644)
    (job / "work/short.txt").write_bytes(b"x")
    assert farside.parse_marked(cache_sh("adopt", str(base), str(job), stdin=farside.adopt_input([short])), "bad") == [
        "short.txt"
    ]


def test_ssh_send_evicts_what_no_job_uses_beyond_the_cap(ssh_agent_env: TestBed, tmp_path: Path):
    engine = make_engine(ssh_agent_env, tmp_path, cache_max_bytes=150_000)
    try:
        first = [input_file(tmp_path / "a", f"f{i}.bin", os.urandom(100_000)) for i in range(2)]
        job = engine.prepare(new_job())
        engine.send(job, first)
        cache = Path(job.handle["dir"]).parent.parent / "cache"
        assert {f.sha256 for f in first} <= {p.name for p in cache.iterdir()}  # linked from the job: kept
        engine.cleanup(job)
        later = [input_file(tmp_path / "b", "g.bin", os.urandom(100_000))]
        job2 = engine.prepare(new_job())
        engine.send(job2, later)
        kept = {p.name for p in cache.iterdir() if not p.name.startswith(".")}
        # The first job's inputs are no longer linked (nlink 1): 200 kB over a 150 kB cap, so the
        # older goes; the new input is linked from job2 and stays.
        assert later[0].sha256 in kept
        assert sum((cache / name).stat().st_size for name in kept if (cache / name).stat().st_nlink == 1) <= 150_000
        assert len(kept & {f.sha256 for f in first}) <= 1
        engine.cleanup(job2)
    finally:
        engine.close()


FACT_KEYS = {"os", "kernel", "python", "cpus", "memory_bytes", "gpus", "disk_free_bytes", "rtt_ms"}


def assert_facts_shape(facts: dict) -> None:
    assert set(facts) >= FACT_KEYS
    assert isinstance(facts["os"], str) and facts["os"]
    assert facts["kernel"].startswith(os.uname().sysname)  # the OS kernel, never a Jupyter kernel's name
    assert facts["python"] and facts["python"].count(".") == 2
    assert isinstance(facts["cpus"], int) and facts["cpus"] >= 1
    assert facts["memory_bytes"] > 0 and facts["disk_free_bytes"] > 0
    assert isinstance(facts["gpus"], list)
    for gpu in facts["gpus"]:
        assert set(gpu) == {"name", "memory_bytes"}


def test_local_and_ssh_facts_have_one_shape(ssh_agent_env: TestBed, tmp_path: Path):
    local = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path / "s"))
    ssh = make_engine(ssh_agent_env, tmp_path)
    try:
        local_facts, ssh_facts = local.check(), ssh.check()
    finally:
        ssh.close()
    for facts in (local_facts, ssh_facts):
        assert_facts_shape(facts)
    common = {f for f in Facts.__dataclass_fields__ if f != "extras"}
    assert common == FACT_KEYS
    # The same machine seen both ways reports the same facts (bar the round trip).
    for key in ("os", "kernel", "cpus", "memory_bytes", "gpus"):
        assert local_facts[key] == ssh_facts[key], key


@pytest.mark.parametrize("gpus", [["NVIDIA A100-SXM4-40GB, 40960", "Tesla T4, 15360"], []])
def test_gpus_come_from_nvidia_smi_where_it_is_installed(tmp_path: Path, monkeypatch, gpus):
    # A stand-in nvidia-smi on PATH answers as the real one does with the query facts.sh makes.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if gpus:
        fake = bindir / "nvidia-smi"
        fake.write_text(
            '#!/bin/sh\ncase "$*" in *"--query-gpu=name,memory.total --format=csv,noheader,nounits"*) '
            + "printf '%s\\n' "
            + " ".join(f"'{g}'" for g in gpus)
            + " ;; *) exit 9 ;; esac\n"
        )
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    engine = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path / "s"))
    facts = engine.check()
    expected = [{"name": name, "memory_bytes": int(mib) * (1 << 20)} for name, mib in (g.rsplit(", ", 1) for g in gpus)]
    if gpus or not any(Path(p, "nvidia-smi").exists() for p in os.environ["PATH"].split(os.pathsep)):
        assert facts["gpus"] == expected


def test_status_answers_for_every_job_in_one_call(tmp_path: Path):
    def jobdir(name: str, **files: str) -> Path:
        d = tmp_path / "base dir" / name  # a space in the path is data, not a separator
        d.mkdir(parents=True)
        for file, text in files.items():
            (d / file).write_text(text)
        return d

    alive = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        dirs = [
            jobdir("exited", exit_code="3\n", log="abc"),
            jobdir("running", pid=f"{alive.pid}\n", log="12345"),
            jobdir("vanished", pid="999999999\n"),
            jobdir("cancelled", pid="999999999\n", cancelled="", log=""),
            jobdir("never"),
            tmp_path / "base dir" / "no-such-job",
        ]
        jobs = [RemoteJob(d.name, "k", {"dir": str(d)}) for d in dirs]
        out = subprocess.run(farside.argv("status", *map(str, dirs)), capture_output=True, check=True).stdout
        found = farside.parse_status(out.decode(), jobs, "here")
    finally:
        alive.kill()
        alive.wait()
    assert (found["exited"].state, found["exited"].exit_code, found["exited"].log_size) == ("exited", 3, 3)
    assert (found["running"].state, found["running"].log_size) == ("running", 5)
    assert found["vanished"].state == "gone" and "vanished" in found["vanished"].detail
    assert (found["cancelled"].state, found["cancelled"].detail, found["cancelled"].log_size) == (
        "gone",
        "cancelled",
        0,
    )
    assert found["never"].detail == "never started" and found["never"].log_size is None
    assert "missing" in found["no-such-job"].detail


def test_outputs_are_hashed_as_they_land_hard_links_included(tmp_path: Path):
    """receive_outputs gives the sha256 of every file it wrote, so collection does not read them again."""
    engine = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path / "s"))
    job = engine.prepare(RemoteJob("hashing", "k", {}))
    work = Path(job.handle["dir"]) / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "a.bin").write_bytes(os.urandom(3 * (1 << 20) + 5))  # more than one chunk
    os.link(work / "out" / "a.bin", work / "out" / "same.bin")  # travels as a tar hard link
    (work / "model.pkl").write_bytes(b"")
    result = engine.fetch(job, ["out", "model.pkl"], tmp_path / "incoming")
    landed = {
        p.relative_to(tmp_path / "incoming" / "work").as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (tmp_path / "incoming" / "work").rglob("*")
        if p.is_file()
    }
    assert set(landed) == {"out/a.bin", "out/same.bin", "model.pkl"}
    assert result.received == landed == result.digests
