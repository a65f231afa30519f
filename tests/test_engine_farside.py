"""The far-side contract (engines/farside/*.sh): run here on real files, and through the engines.

The scripts are what every push engine runs on its machine, so they are tested
once, directly, and then as each engine uses them (ssh against a real sshd).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import sshd_fixture
from sshd_fixture import TestBed
from test_engine_ssh import input_file, make_engine, new_job, wait_exited
from tool_path import only_these_tools

from jupyter_remote_compute.engines import farside
from jupyter_remote_compute.engines.base import EngineContext, EngineError, Facts, InputFile, LaunchSpec, RemoteJob
from jupyter_remote_compute.engines.launcher import launch_input
from jupyter_remote_compute.engines.local import LocalEngine
from jupyter_remote_compute.engines.ssh_transfer import ArchiveCut, UnsafeArchive
from jupyter_remote_compute.engines.transport import LocalTransport, Result, Transport

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


def test_an_entry_asked_for_counts_as_used_without_looking_edited(tmp_path: Path):
    cache = tmp_path / "cache"
    cache.mkdir()
    asked = put_entry(cache, b"asked" * 100, age_days=20)
    idle = put_entry(cache, b"idle" * 100, age_days=20)
    made = (cache / asked).stat().st_mtime
    assert farside.parse_have(cache_sh("have", str(tmp_path), stdin=farside.have_input([asked]))) == {asked: 500}
    cache_sh("evict", str(tmp_path), "14", str(1 << 30))
    assert sorted(p.name for p in cache.iterdir()) == [asked] and idle != asked
    assert (cache / asked).stat().st_mtime == made  # a kept tree holding this inode still trusts it


def test_kept_input_sets_go_by_age_and_beyond_the_newest_eight_renamed_away_first(tmp_path: Path):
    sets = tmp_path / "sets"
    names = [f"{i:064x}" for i in range(11)]
    for age, name in enumerate(names):  # names[0] is the newest
        tree = sets / name / "tree"
        tree.mkdir(parents=True)
        (tree / "train.py").write_text("print(1)\n")
        then = time.time() - (age * 60 if age < 10 else 20 * DAY)
        os.utime(sets / name, (then, then))
    cache_sh("evict", str(tmp_path), "14", str(1 << 30))
    # The one unused for the age and all but the newest eight are gone, and nothing half-deleted stays
    # under another name (each is renamed away before it is deleted).
    assert sorted(p.name for p in sets.iterdir()) == sorted(names[:8])


def test_a_kept_set_whose_spare_builder_died_goes(tmp_path: Path):
    sets = tmp_path / "sets"
    stale, building = f"{1:064x}", f"{2:064x}"
    for name in (stale, building):
        (sets / name / "tree").mkdir(parents=True)
        (sets / name / "lock").mkdir()
    then = time.time() - 2 * DAY  # the builder died two days ago; the set itself was used since
    os.utime(sets / stale / "lock", (then, then))
    cache_sh("evict", str(tmp_path), "14", str(1 << 30))
    assert sorted(p.name for p in sets.iterdir()) == [building]


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


def test_prepares_of_one_job_at_once_all_succeed(tmp_path: Path) -> None:
    """A prepare left running by a sender that died meets the next one in the same folder: neither may fail
    or take the other's half-written marker for another job's (they shared one temporary name before)."""
    marker = '{"job_id": "j", "key": "k"}'
    for _ in range(5):
        procs = [
            subprocess.Popen(farside.argv("prepare", str(tmp_path / "j"), marker, "", ""), stderr=subprocess.PIPE)
            for _ in range(12)
        ]
        failed = [p.stderr.read().decode() for p in procs if p.wait() != 0]  # type: ignore[union-attr]
        assert not failed, failed
    assert (tmp_path / "j/job.json").read_text() == marker
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == ["job.json", "launch.sh", "run.sh", "work"]


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


class DiesWritingStdin(LocalTransport):
    """This computer, as seen from a server SIGKILLed while it writes a call's stdin: the far side
    reads the first ``keep`` bytes, then the end of its input."""

    def __init__(self, name: str, keep: int) -> None:
        super().__init__(name)
        self.keep = keep

    def run(self, body: str, stdin: bytes = b"", **kw: Any) -> Result:
        return super().run(body, stdin[: self.keep], **kw)


_WHOLE = LaunchSpec(command='echo "$WORD $TOKEN" >> ran.txt', env={"WORD": "word"}, secret_env={"TOKEN": "token"})
_STDIN = launch_input(_WHOLE.env, _WHOLE.secret_env)


@pytest.mark.parametrize(
    "keep",
    [0, 3, _STDIN.index(b"\n") + 1, len(_STDIN) - len(b"@@end\n"), len(_STDIN) - 1],
    ids=["nothing", "half-a-line", "one-line", "all-but-the-end-line", "all-but-the-last-newline"],
)
def test_a_launcher_whose_environment_was_cut_short_starts_nothing(tmp_path: Path, keep: int):
    """A server killed while it hands the launcher the environment must not leave a command running
    without its variables (it "succeeds" with none of its outputs): that launcher starts nothing, and
    the restarted server's start runs the command once, with all of them."""

    class Dying(LocalEngine):
        def make_transport(self) -> Transport:
            return DiesWritingStdin(self.name, keep)

    ctx = EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path / "s")
    engine = LocalEngine("local", "", {}, ctx)
    job = engine.prepare(RemoteJob("cut", "k", {}))
    d = Path(job.handle["dir"])
    with pytest.raises(EngineError, match="cut short"):
        Dying("local", "", {}, ctx).start(job, _WHOLE)
    assert not (d / "pid").exists() and not (d / "log").exists()
    assert engine.poll([job])["cut"].detail == "never started"

    started = engine.start(job, _WHOLE)  # the next start, on the machine as the dead one left it
    assert wait_exited(engine, started).exit_code == 0
    assert (d / "work" / "ran.txt").read_text() == "word token\n"


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


# -- manifest.sh: the outputs' stream, hashed in the pass that sends it -----------------------------

# The tools manifest.sh's fallback needs, and no python3: a machine without Python.
# A far side without Python: POSIX sh and the tools every such machine has (prepare.sh makes the job folder).
_SH_TOOLS = ("sh", "tar", "find", "du", "rm", "sha256sum", "mkdir", "mv", "cmp")


def _output_tree(work: Path) -> dict[str, bytes]:
    """Outputs with awkward names, a hard link and an empty file; what each file holds, by path."""
    names = {
        "out/big.bin": os.urandom(3 * (1 << 20) + 7),  # more than one chunk of the far-side reader
        "out/new\nline.txt": b"n",
        "out/back\\slash.txt": b"b",
        "out/ünï ✓ $(id).txt": b"u",
        "out/" + "d" * 120 + "/" + "f" * 120: b"long name",  # needs pax records
        "out/empty": b"",
        "model.pkl": b"model",
    }
    for rel, data in names.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    raw = os.fsencode(work / "out") + b"/latin1-\xe9.txt"  # not UTF-8: travels as its bytes
    with open(raw, "wb") as f:
        f.write(b"l")
    names["out/" + os.fsdecode(b"latin1-\xe9.txt")] = b"l"
    os.link(work / "out" / "big.bin", work / "out" / "same.bin")
    names["out/same.bin"] = names["out/big.bin"]
    return names


@pytest.mark.parametrize("far_python", [True, False], ids=["python3", "sh-only"])
def test_outputs_stream_with_their_digests_last(tmp_path: Path, monkeypatch, far_python: bool):
    """Both writers (python3's one pass, tar beside sha256sum) give the same verified result."""
    if not far_python:
        only_these_tools(tmp_path / "bin-no-python", _SH_TOOLS, monkeypatch)
    engine = LocalEngine("local", "", {}, EngineContext(get_secret=lambda n: None, scratch_dir=tmp_path / "s"))
    job = engine.prepare(RemoteJob("streamed", "k", {}))
    jobdir = Path(job.handle["dir"])
    files = _output_tree(jobdir / "work")
    (jobdir / "mlruns" / "0").mkdir(parents=True)
    (jobdir / "mlruns" / "0" / "meta.yaml").write_text("name: Default\n")
    seen: list[tuple[int, int]] = []
    result = engine.fetch(job, ["out", "model.pkl", "absent"], tmp_path / "in", lambda d, t: seen.append((d, t)))
    expected = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    assert result.digests == expected  # computed on the far side
    assert result.received == expected  # hashed here as the files landed
    assert result.missing == ["absent"]
    for rel, data in files.items():
        assert (tmp_path / "in" / "work" / rel).read_bytes() == data
    assert (tmp_path / "in" / "mlruns" / "0" / "meta.yaml").read_text() == "name: Default\n"
    streamed = sum(len(d) for rel, d in files.items() if rel != "out/same.bin")  # a hard link carries no bytes
    assert seen and seen[-1][0] == streamed + len("name: Default\n")
    assert not list(jobdir.glob(".fetch-*"))  # the far side's own files are gone


def _stream(tmp_path: Path, outputs: list[str]) -> tuple[bytes, str, Path]:
    """manifest.sh's whole stream for a job dir with ``out/a.bin`` and ``out/b.bin``; (stream, its name, job dir)."""
    jobdir = tmp_path / "job"
    (jobdir / "work" / "out").mkdir(parents=True, exist_ok=True)
    (jobdir / "work" / "out" / "a.bin").write_bytes(os.urandom(100_000))
    (jobdir / "work" / "out" / "b.bin").write_bytes(os.urandom(5_000))
    name = ".fetch-test"
    out = subprocess.run(farside.argv("manifest", str(jobdir), name, *outputs), capture_output=True, check=True)
    return out.stdout, name, jobdir


def _receive(data: bytes, name: str, dest: Path) -> farside.FetchResult:
    view = memoryview(data)
    at = 0

    def read(n: int) -> bytes:
        nonlocal at
        chunk = bytes(view[at : at + min(n, 7000)])  # short reads, as a pipe gives them
        at += len(chunk)
        return chunk

    return farside.receive_outputs(read, ["out"], dest, name, "test")


def test_a_stream_cut_anywhere_before_its_digests_is_never_taken_as_whole(tmp_path: Path):
    data, name, _ = _stream(tmp_path, ["out"])
    whole = _receive(data, name, tmp_path / "whole")
    assert set(whole.digests) == {"out/a.bin", "out/b.bin"} and whole.digests == whole.received
    sums_at = data.index((name + farside.SUMS_SUFFIX).encode())
    # Cut inside the first file, on a block boundary between the files, and just before the digests.
    for cut in (600, 50_000, 101_376, 512 * (sums_at // 512)):
        with pytest.raises(ArchiveCut) as caught:
            _receive(data[:cut], name, tmp_path / f"cut-{cut}")
        assert caught.value.transient  # fetched again, not failed


def test_an_entry_after_the_digests_refuses_the_archive(tmp_path: Path):
    data, name, _ = _stream(tmp_path, ["out"])
    extra = tarfile.TarInfo("work/out/late.bin")
    extra.size = 4
    appended = data + extra.tobuf(tarfile.PAX_FORMAT) + b"late" + b"\0" * 508 + b"\0" * 1024
    with pytest.raises(UnsafeArchive, match="after its list of digests"):
        _receive(appended, name, tmp_path / "dest")
    assert not list((tmp_path / "dest").rglob("*.bin"))  # nothing of it was kept
