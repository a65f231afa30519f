"""The ssh engine against a real OpenSSH sshd and ssh-agent on loopback (see sshd_fixture.py).

The far side is this same machine, reached as a dedicated user, so a test may
check what landed there by looking at the user's files directly.
"""

from __future__ import annotations

import gc
import hashlib
import io
import os
import subprocess
import tarfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ports
import pytest
import sshd_fixture
from procs import group_members
from sshd_fixture import TestBed, keygen, wait_for

from jupyter_remote_compute.engines import ssh_config
from jupyter_remote_compute.engines.base import EngineContext, EngineError, InputFile, LaunchSpec, RemoteJob
from jupyter_remote_compute.engines.ssh import (
    AuthenticationFailed,
    HostKeyChanged,
    HostKeyUnknown,
    SSHEngine,
    input_set_digest,
)
from jupyter_remote_compute.engines.ssh_openssh import _Master
from jupyter_remote_compute.engines.ssh_transfer import (
    SafeExtractor,
    TarReader,
    UnsafeArchive,
    check_digests,
    check_relpaths,
    parse_sha256sum,
    tar_header,
)
from jupyter_remote_compute.engines.transport import ProcessChannel, dropped_under, sh_script

# the shared fixtures, by name
sshd_bed = sshd_fixture.sshd_bed
ssh_agent_env = sshd_fixture.ssh_agent_env


TRANSPORTS = ["openssh", "paramiko"]
# Cases whose code path is the same whichever transport carries the bytes (the tar checks of this side)
# run on the default transport only.
DEFAULT_ONLY = pytest.mark.parametrize("transport", ["openssh"])


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs once per transport: the user's OpenSSH client, and paramiko."""
    return request.param


def make_engine(
    bed: TestBed, tmp_path: Path, address: str = "127.0.0.1", *, transport: str | None = None, **options
) -> SSHEngine:
    """An engine for the test bed; ``transport`` None leaves the choice to the machine's default (auto)."""
    if transport is not None:
        options.setdefault("ssh_transport", transport)
        # A far-side input cache per transport: what one transport's test sent is not already there for the other's.
        options.setdefault("base_dir", f"{bed.base_dir}/{transport}")
    ctx = EngineContext(get_secret=lambda name: None, scratch_dir=tmp_path)
    opts = (
        bed.options(**options)
        if address == "127.0.0.1"
        else {
            "known_hosts": str(bed.known_hosts),
            "ssh_config": str(bed.ssh_config),
            "base_dir": bed.base_dir,
            **options,
        }
    )
    return SSHEngine("testmachine", address, opts, ctx)


@pytest.fixture
def engine(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport)
    yield eng
    eng.close()


def new_job() -> RemoteJob:
    return RemoteJob(job_id=f"job-{uuid.uuid4().hex[:12]}", key=uuid.uuid4().hex, handle={})


def input_file(root: Path, relpath: str, data: bytes, mode: int = 0o644) -> InputFile:
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return InputFile(relpath, path, len(data), hashlib.sha256(data).hexdigest(), mode)


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def wait_exited(engine: SSHEngine, job: RemoteJob, timeout: float = 30):
    def done():
        status = engine.poll([job])[job.job_id]
        return status if status.state != "running" else None

    return wait_for(done, timeout, f"job {job.job_id} to end", interval=0.1)


def far(bed: TestBed, job: RemoteJob) -> Path:
    """The job directory as seen from this side (same machine)."""
    return Path(job.handle["dir"])


def run_job(engine: SSHEngine, files: list[InputFile], command: str, **env) -> RemoteJob:
    job = engine.prepare(new_job())
    engine.send(job, files)
    return engine.start(job, LaunchSpec(command=command, env=env, secret_env={}))


# -- the whole life of a job ------------------------------------------------------------


def test_end_to_end(engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path):
    src = tmp_path / "src"
    files = [
        input_file(src, "train.sh", b"#!/bin/sh\necho trained\n", 0o755),
        input_file(src, "data/a.txt", b"alpha\n" * 1000),
        input_file(src, "data/nested/b.bin", os.urandom(200_000)),
    ]
    job = engine.prepare(new_job())
    d = far(ssh_agent_env, job)
    # mlruns/ is left for MLflow to create (an empty one stops it making its Default experiment)
    assert d.is_absolute() and (d / "work").is_dir() and not (d / "mlruns").exists()
    marker = (d / "job.json").read_text()
    assert job.job_id in marker and job.key in marker
    assert engine.prepare(job).handle["dir"] == job.handle["dir"]  # idempotent

    seen = []
    stats = engine.send(job, files, progress=lambda done, total: seen.append((done, total)))
    assert stats.files_sent == 3 and stats.files_reused == 0
    assert stats.bytes_sent == sum(f.size for f in files)
    assert seen and seen[-1][0] == seen[-1][1] == stats.bytes_sent
    assert sha(d / "work/data/nested/b.bin") == files[2].sha256
    assert os.access(d / "work/train.sh", os.X_OK)

    secret = "s3cr3t-" + uuid.uuid4().hex
    command = r"""
set -e
echo "starting $GREETING"
./train.sh
mkdir -p out/model
cat data/a.txt data/nested/b.bin > out/model/weights.bin
printf '%s' "$API_TOKEN" | sha256sum | cut -c1-64 > out/token.sha
store=${MLFLOW_TRACKING_URI#file://}
mkdir -p "$store/0/run1/metrics"
echo "1700000000000 0.5 1" > "$store/0/run1/metrics/loss"
i=0; while [ $i -lt 200 ]; do echo "line $i"; i=$((i+1)); done
exit 3
"""
    job = engine.start(job, LaunchSpec(command=command, env={"GREETING": "hello"}, secret_env={"API_TOKEN": secret}))
    assert isinstance(job.handle["pid"], int)
    status = wait_exited(engine, job)
    assert status.state == "exited" and status.exit_code == 3
    log = (d / "log").read_bytes()
    assert status.log_size == len(log)
    assert log.startswith(b"starting hello\ntrained\n")

    # read_log from offsets, in pieces, gives back the whole log
    pieces, offset = [], 0
    while chunk := engine.read_log(job, offset, 97):
        pieces.append(chunk)
        offset += len(chunk)
    assert b"".join(pieces) == log
    assert engine.read_log(job, 6, 5) == log[6:11]
    assert engine.read_log(job, len(log) + 10, 100) == b""

    # the secret reached the command, and no file of the job holds it
    dest = tmp_path / "fetched"
    result = engine.fetch(job, ["out", "missing.txt"], dest)
    assert result.missing == ["missing.txt"]
    assert (dest / "work/out/token.sha").read_text().strip() == hashlib.sha256(secret.encode()).hexdigest()
    for path in d.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path

    # digests name the declared outputs only (FetchResult); mlruns/ comes along beside them
    assert set(result.digests) == {"out/model/weights.bin", "out/token.sha"}
    for name, digest in result.digests.items():
        assert sha(dest / f"work/{name}") == digest, name
    assert (dest / "mlruns/0/run1/metrics/loss").is_file()
    assert (dest / "work/out/model/weights.bin").read_bytes() == b"alpha\n" * 1000 + files[2].source.read_bytes()

    engine.cleanup(job)
    assert not d.exists()
    engine.cleanup(job)  # idempotent


def test_check_reports_facts(engine: SSHEngine):
    facts = engine.check()
    assert set(facts) >= {"os", "kernel", "python", "cpus", "memory_bytes", "gpus", "disk_free_bytes", "rtt_ms"}
    assert "Linux" in facts["kernel"]
    assert facts["cpus"] >= 1 and facts["memory_bytes"] > 1 << 20 and facts["disk_free_bytes"] > 0
    assert isinstance(facts["gpus"], list)
    assert facts["python"] and facts["python"][0] == "3"
    assert facts["rtt_ms"] > 0  # measured (a round trip over OpenSSH is a whole session: no upper bound)


def test_resend_reuses_cache(engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path):
    src = tmp_path / "src"
    files = [input_file(src, f"d/f{i}.bin", os.urandom(50_000 + i)) for i in range(20)]
    files.append(input_file(src, "dup.bin", files[0].source.read_bytes()))  # same content twice
    first = engine.prepare(new_job())
    s1 = engine.send(first, files)
    assert s1.files_sent == 20 and s1.files_reused == 1
    second = engine.prepare(new_job())
    s2 = engine.send(second, files)
    assert s2.files_sent == 0 and s2.bytes_sent == 0 and s2.files_reused == 21
    for f in files:
        landed = far(ssh_agent_env, second) / "work" / f.relpath
        assert sha(landed) == f.sha256
        # a hard link to the read-only cache object, not a copy
        assert landed.stat().st_nlink >= 3 and not landed.stat().st_mode & 0o222
    # a changed file is sent again, by content, whatever its mtime
    changed = input_file(src, "d/f0.bin", b"new content")
    os.utime(changed.source, (files[0].source.stat().st_mtime,) * 2)
    s3 = engine.send(engine.prepare(new_job()), [changed, *files[1:]])
    assert s3.files_sent == 1 and s3.bytes_sent == len(b"new content")


def test_unchanged_resend_takes_the_kept_tree_and_distrusts_an_altered_or_vanished_entry(
    engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path
):
    src = tmp_path / "src"
    files = [input_file(src, f"d/f{i}.bin", os.urandom(3000 + i)) for i in range(30)]
    files.append(input_file(src, "bin/run me", b"#!/bin/sh\necho hi\n", mode=0o755))

    def send_and_check(expect_sent: int) -> RemoteJob:
        job = engine.prepare(new_job())
        stats = engine.send(job, files)
        assert (stats.files_sent, stats.files_reused) == (expect_sent, len(files) - expect_sent)
        for f in files:
            landed = far(ssh_agent_env, job) / "work" / f.relpath
            # an executable is its own copy with its own mode; the rest are the read-only cache objects
            mode = f.mode & 0o777 if f.mode & 0o111 else 0o444
            assert sha(landed) == f.sha256 and landed.stat().st_mode & 0o777 == mode
        return job

    first = send_and_check(len(files))
    base = far(ssh_agent_env, first).parent.parent
    kept = base / "sets" / input_set_digest(files)
    spare = kept / "tree"
    assert spare.is_dir()  # kept for the next send of the same set
    spare_inode = spare.stat().st_ino
    second = send_and_check(0)
    # the kept tree itself became the job's work tree: one rename, no link per file
    assert (far(ssh_agent_env, second) / "work").stat().st_ino == spare_inode

    def spare_ready() -> bool:
        return spare.is_dir() and not (kept / "lock").exists()

    wait_for(spare_ready, message="a new spare tree built in the background")
    # An altered cache entry (the spare shares its inode) is not trusted: that file is sent again.
    victim = base / "cache" / files[3].sha256
    victim.chmod(0o644)
    victim.write_bytes(b"altered")
    send_and_check(1)
    assert spare_ready() and sha(spare / files[3].relpath) == files[3].sha256
    # A vanished cache entry: the spare still holds its (unaltered) content, but no new spare can be
    # built without the entry, so the next send asks again and sends it.
    (base / "cache" / files[5].sha256).unlink()
    send_and_check(0)
    wait_for(lambda: not (kept / "lock").exists(), message="the background rebuild to finish")
    assert not spare.exists()
    send_and_check(1)
    assert sha(base / "cache" / files[5].sha256) == files[5].sha256


def test_another_set_using_the_same_files_leaves_a_kept_tree_trusted(
    engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path
):
    """Sending set B marks the cache entries it shares with set A as used; A's kept tree holds those
    very inodes, so the mark must not look like an edit to A's check (it did: every re-send of A after
    B went the slow way)."""
    src = tmp_path / "src"
    shared = [input_file(src, f"data/f{i}.bin", os.urandom(2000 + i)) for i in range(5)]
    set_a = [*shared, input_file(src, "train_a.py", b"print('a')\n")]
    set_b = [*shared, input_file(src, "train_b.py", b"print('b')\n")]

    def send(files: list[InputFile]) -> RemoteJob:
        job = engine.prepare(new_job())
        engine.send(job, files)
        return job

    first = send(set_a)
    kept_a = far(ssh_agent_env, first).parent.parent / "sets" / input_set_digest(set_a)
    spare_inode = (kept_a / "tree").stat().st_ino
    send(set_b)
    again = send(set_a)
    assert (far(ssh_agent_env, again) / "work").stat().st_ino == spare_inode  # A's kept tree, taken whole


@pytest.mark.parametrize("size", [1000, 1024, 600_000], ids=["small", "block-aligned", "large"])
def test_file_changed_while_sending_is_not_cached(engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path, size):
    ok = input_file(tmp_path, "ok.bin", os.urandom(2048))
    f = input_file(tmp_path, "a.bin", b"x" * size)
    f.source.write_bytes(b"y" * size)  # the digest no longer matches the content
    job = engine.prepare(new_job())
    with pytest.raises(EngineError, match="changed while it was being sent"):
        engine.send(job, [ok, f])
    cache = Path(job.handle["dir"]).parent.parent / "cache"
    assert not (cache / f.sha256).exists()
    assert not list(cache.glob(".incoming-*"))


def test_start_is_not_repeated(engine: SSHEngine):
    job = run_job(engine, [], "sleep 30")
    again = engine.start(job, LaunchSpec(command="sleep 30", env={}, secret_env={}))
    assert again.handle["pid"] == job.handle["pid"]
    engine.cancel(job, grace=1)


def test_poll_many_jobs_is_one_round_trip(engine: SSHEngine, tmp_path: Path):
    jobs = [run_job(engine, [], f"exit {i}") for i in range(3)]
    running = run_job(engine, [], "sleep 30")
    vanished = RemoteJob("job-gone", "k", {"dir": "/nonexistent/jrc/jobs/job-gone"})
    for j in jobs:
        wait_exited(engine, j)
    before = engine.channels_opened
    status = engine.poll([*jobs, running, vanished])
    assert engine.channels_opened == before + 1
    assert [status[j.job_id].exit_code for j in jobs] == [0, 1, 2]
    assert status[running.job_id].state == "running"
    assert status["job-gone"].state == "gone"
    engine.cancel(running, grace=1)
    after = engine.poll([running])[running.job_id]
    assert after.state == "gone" and after.detail == "cancelled"


@pytest.mark.timeout(60)
def test_cancel_kills_background_children(engine: SSHEngine):
    # children in the background, one of which ignores TERM: KILL after the grace period gets it
    command = "sleep 300 & (sleep 301; echo) & sh -c 'trap \"\" TERM; sleep 302' & echo started; wait"
    job = run_job(engine, [], command)
    pgid = job.handle["pid"]
    wait_for(lambda: len(group_members(pgid)) >= 5, 10, "the children to start")
    engine.cancel(job, grace=1.0)  # a cancel that waited on the TERM-proof child would hit the test's timeout
    assert group_members(pgid) == []
    assert engine.poll([job])[job.job_id].state == "gone"


def test_connection_dropped_mid_run(engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path):
    job = run_job(engine, [], "while [ ! -e go ]; do sleep 0.1; done; echo finished > done.txt")
    assert engine.poll([job])[job.job_id].state == "running"
    made = engine.connections_made
    # kill the sshd processes serving this connection: the network drops, the job must not care
    assert ssh_agent_env.sshd.cut_sessions()
    wait_for(lambda: not engine.connection.active(), 10, "the client to notice the drop")
    (far(ssh_agent_env, job) / "work/go").touch()
    status = wait_exited(engine, job)
    assert status.state == "exited" and status.exit_code == 0
    assert engine.connections_made == made + 1
    assert (far(ssh_agent_env, job) / "work/done.txt").read_text() == "finished\n"


def test_dropped_connection_is_transient_for_streams(engine: SSHEngine, ssh_agent_env: TestBed):
    engine.check()
    _drop_under(engine)
    # read-only calls reconnect by themselves
    assert engine.check()["cpus"] >= 1


def test_a_commands_own_exit_code_255_is_not_a_lost_connection(engine: SSHEngine):
    # The ssh client exits 255 when its connection goes: a far-side command may say 255 too.
    res = engine.connection.run("echo 'Broken pipe' >&2; exit 255", retry=False)
    assert res.code == 255 and b"Broken pipe" in res.err
    assert engine.connection.active()


def test_a_session_that_sees_its_master_go_before_the_master_has_exited_is_lost(tmp_path: Path):
    # The race a cut connection makes: the master closes its sessions as it exits, so a session's 255
    # can be read while the master process is still there. Stand-ins for both ssh processes make the
    # order certain; the classification under test is the real channel's.
    master = subprocess.Popen(["sleep", "0.5"])
    session = subprocess.Popen(
        ["sh", "-c", "exit 255"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    ch = ProcessChannel(session, _Master(master, str(tmp_path / "master")), timeout=10)
    try:
        assert ch.recv_exit_status() == -1  # "no exit status": the connection went away
        assert not ch.get_transport().is_active()
    finally:
        ch.close()


def test_a_channel_without_exit_status_is_a_drop_once_its_connection_goes(ssh_agent_env: TestBed, tmp_path: Path):
    # paramiko ends a dropped connection's channels (no exit status) before it marks the transport
    # inactive: a look at the transport at that moment must not call it the far side's failure.
    engine = make_engine(ssh_agent_env, tmp_path, transport="paramiko")
    try:
        with engine.connection.channel(sh_script("sleep 60"), 30) as ch:
            assert not dropped_under(ch, 0) and not dropped_under(ch, 255)  # an exit status is the far side's
            closing = threading.Timer(0.5, ch.get_transport().close)
            closing.start()
            assert dropped_under(ch, -1)
            closing.join()
    finally:
        engine.close()


def test_concurrent_calls_share_one_connection(engine: SSHEngine):
    job = run_job(engine, [], "echo hi; sleep 1")
    made = engine.connections_made

    def call(i: int):
        if i % 2:
            return engine.poll([job])[job.job_id].state
        return engine.read_log(job, 0, 10)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(24)))
    assert len(results) == 24
    assert engine.connections_made == made
    wait_exited(engine, job)


def _drop_under(engine: SSHEngine) -> None:
    """End the engine's connection under it, from this side, without telling the engine."""
    if engine.connection.transport_name == "paramiko":
        engine.connection.link.target.close()
    else:
        master = engine.connection._master.proc  # the ssh master this test's engine started
        master.kill()
        master.wait(10)


# -- names that a shell would mangle ----------------------------------------------------------

HOSTILE = [
    "with space.txt",
    'quote\'s "double".txt',
    "$HOME and `id` and $(id).txt",
    "new\nline.txt",
    "-leading-dash.txt",
    "back\\slash.txt",
    "ünïcødé ✓.txt",
    "dir with space/-sub/*glob?[x].txt",
    "semi;colon&amp|pipe>.txt",
]


def test_hostile_file_names(engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path):
    src = tmp_path / "src"
    files = [input_file(src, name, f"content of {name}".encode()) for name in HOSTILE]
    job = run_job(engine, files, "true")
    for f in files:
        assert (far(ssh_agent_env, job) / "work" / f.relpath).read_bytes() == f.source.read_bytes()
    wait_exited(engine, job)
    dest = tmp_path / "back"
    result = engine.fetch(job, HOSTILE, dest)
    assert result.missing == []
    for f in files:
        assert result.digests[f.relpath] == f.sha256
        assert (dest / "work" / f.relpath).read_bytes() == f.source.read_bytes()


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", "a/", "./a", "a/.", "a/../b", "..", ".", "nul\0byte", "/"])
def test_checking_a_whole_input_set_refuses_each_bad_name_by_name(bad: str) -> None:
    # The send checks every name in one scan: it must refuse what the check of one name refuses,
    # wherever the name sits, and say which; names that only look odd pass.
    fine = [f"tree/d{i % 7}/f{i}.bin" for i in range(1000)] + HOSTILE + ["...", "a/..b", ".hidden/.x", "a./b"]
    check_relpaths(fine, "input")
    for at in (0, 500, len(fine)):
        with pytest.raises(ValueError) as refused:
            check_relpaths([*fine[:at], bad, *fine[at:]], "input")
        assert str(refused.value).startswith(f"input: {bad!r} ")
    with pytest.raises(ValueError, match=r"input: 'tree/d3/f3.bin' is listed twice"):
        check_relpaths([*fine, "tree/d3/f3.bin"], "input")


@pytest.mark.parametrize("bad", ["A" * 64, "a" * 63, "a" * 65, "g" * 64, "a" * 63 + "\n", "é" * 64, ""])
def test_checking_a_whole_input_set_refuses_each_bad_digest(bad: str) -> None:
    fine = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(1000)]
    check_digests(fine)
    with pytest.raises(ValueError, match="is not a lowercase hex sha256 digest") as refused:
        check_digests([*fine[:500], bad, *fine[500:]])
    assert repr(bad) in str(refused.value)


def test_parse_sha256sum_escapes():
    data = b"\\" + b"a" * 64 + b"  work/new\\nline\\\\x\n" + b"b" * 64 + b"  plain name\n"
    assert parse_sha256sum(data) == {"work/new\nline\\x": "a" * 64, "plain name": "b" * 64}


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("jobs/j/work/d/f.bin", {"linkname": "cache/" + "a" * 64}),
        ("f.bin", {"size": 12345, "mode": 0o100755, "mtime": 1712345678.9}),
        ("x" * 100, {"size": 8**11 - 1, "mtime": 8**11 - 1, "linkname": None}),
        ("a b\\c$`'\"", {"linkname": "y" * 100}),
        ("x" * 101, {"size": 1}),  # the rest need pax records: tarfile builds them
        ("d/é.bin", {"size": 2}),
        ("n\udcff", {}),
        ("f", {"size": 8**11}),
        ("f", {"linkname": "y" * 101}),
    ],
)
def test_tar_header_fast_path_matches_tarfile(name: str, kw: dict, tmp_path: Path):
    header = tar_header(name, **kw)
    info = tarfile.TarInfo(name)
    info.size = 0 if kw.get("linkname") else kw.get("size", 0)
    info.mode = kw.get("mode", 0o644)
    info.mtime = int(kw.get("mtime", 0))
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if kw.get("linkname"):
        info.type = tarfile.LNKTYPE
        info.linkname = kw["linkname"]
    assert header == info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
    # The whole archive (its member's content, then the end blocks) as a sparse file: a member of 8 GiB
    # costs no memory nor disk, where bytes in memory took two workers' RAM at once.
    archive = tmp_path / "one.tar"
    with open(archive, "wb") as f:
        f.write(header)
        f.truncate(len(header) + info.size + -info.size % 512 + 1024)
    with tarfile.open(archive) as tar:
        (member,) = tar.getmembers()
    assert (member.name, member.linkname, member.size, member.mode) == (
        name,
        info.linkname,
        info.size,
        info.mode & 0o7777,
    )
    assert (member.mtime, member.type) == (info.mtime, info.type)


# -- archives that try to escape ---------------------------------------------------------------


def _evil_tar(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:

        def add(info: tarfile.TarInfo, data: bytes = b""):
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))

        add(tarfile.TarInfo("work/out/ok.txt"), b"fine")
        if kind == "dotdot":
            add(tarfile.TarInfo("work/out/../../../escaped.txt"), b"evil")
        elif kind == "absolute":
            add(tarfile.TarInfo("/tmp/jrc-escaped.txt"), b"evil")
        elif kind == "symlink":
            info = tarfile.TarInfo("work/out/link")
            info.type, info.linkname = tarfile.SYMTYPE, "/etc"
            add(info)
            add(tarfile.TarInfo("work/out/link/passwd"), b"evil")
        elif kind == "hardlink":
            info = tarfile.TarInfo("work/out/hard")
            info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"
            add(info)
        elif kind == "device":
            info = tarfile.TarInfo("work/out/dev")
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            add(info)
        elif kind == "unrequested":
            add(tarfile.TarInfo("work/other/secret.txt"), b"not asked for")
    return buf.getvalue()


def extract_command(engine: SSHEngine, command: str, dest: Path, allowed: Callable[[str], bool]) -> list[str]:
    """Extract the tar stream a far-side command prints under the policy every fetch goes through."""
    extractor = SafeExtractor(Path(dest), allowed, engine.name)
    with engine.transport.channel(sh_script(command), 120) as ch:
        ch.shutdown_write()
        reader = TarReader(ch.recv)
        for info in reader.members():
            extractor.extract(reader, info)
        engine.transport.finish(ch, bytearray(), 120)
    return sorted(extractor.files)


@DEFAULT_ONLY
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink", "hardlink", "device", "unrequested"])
def test_escaping_tar_entries_are_refused(engine: SSHEngine, tmp_path: Path, kind: str):
    evil = input_file(tmp_path / "src", "evil.tar", _evil_tar(kind))
    job = run_job(engine, [evil], "true")
    dest = tmp_path / "dest"
    dest.mkdir()
    wanted = ("work/out",)
    with pytest.raises(UnsafeArchive, match="refused"):
        extract_command(
            engine, f"cat {job.handle['dir']}/work/evil.tar", dest, lambda n: n.startswith(wanted) or n == "work"
        )
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/jrc-escaped.txt").exists()
    outside = [p for p in dest.rglob("*") if not str(p.resolve()).startswith(str(dest.resolve()))]
    assert outside == []
    assert not any(p.is_symlink() for p in dest.rglob("*"))


def test_fetch_refuses_symlinked_output(engine: SSHEngine, tmp_path: Path):
    job = run_job(engine, [], "mkdir -p out && echo x > out/a && ln -s /etc/passwd out/link")
    wait_exited(engine, job)
    with pytest.raises(UnsafeArchive, match="symbolic link"):
        engine.fetch(job, ["out"], tmp_path / "dest")
    assert not (tmp_path / "dest/work/out/link").exists()


def test_fetch_hard_linked_outputs(engine: SSHEngine, tmp_path: Path):
    # two names of one inode come back as a tar hard link: accepted as a copy of the first one
    data = input_file(tmp_path / "src", "same.bin", b"z" * 5000)
    job = run_job(engine, [data], "mkdir out && ln same.bin out/a && ln same.bin out/b")
    wait_exited(engine, job)
    result = engine.fetch(job, ["out"], tmp_path / "dest")
    assert (tmp_path / "dest/work/out/a").read_bytes() == (tmp_path / "dest/work/out/b").read_bytes() == b"z" * 5000
    assert result.digests["out/a"] == result.digests["out/b"] == data.sha256


# -- host keys -----------------------------------------------------------------------------------


def _fingerprint(pub_line: str) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", "-"], input=pub_line, capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def test_unknown_host_refused_then_trusted(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    known = tmp_path / "kh" / "known_hosts"  # does not exist yet
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, known_hosts=str(known))
    fp = _fingerprint(ssh_agent_env.sshd.host_pub)
    with pytest.raises(HostKeyUnknown) as err:
        eng.check()
    assert fp in str(err.value) and "ssh-ed25519" in str(err.value) and "trust" in str(err.value)
    assert err.value.fingerprint == fp and not err.value.transient
    assert eng.host_key() == ("ssh-ed25519", fp)
    # A fingerprint the user compared that the machine does not present: refused, nothing recorded.
    with pytest.raises(EngineError) as wrong:
        eng.trust_host("SHA256:" + "A" * 43)
    assert wrong.value.details["host_key"]["fingerprint"] == fp and not known.exists()
    assert eng.trust_host(fp) == fp
    # recorded so that OpenSSH itself finds it (hashed here: Debian's ssh_config says HashKnownHosts yes)
    found = subprocess.run(
        ["ssh-keygen", "-F", f"[127.0.0.1]:{ssh_agent_env.sshd.port}", "-f", str(known)], capture_output=True, text=True
    )
    assert found.returncode == 0 and "ssh-ed25519" in found.stdout
    assert eng.check()["cpus"] >= 1
    assert eng.trust_host() == fp  # already trusted: nothing added
    assert known.read_text().count("ssh-ed25519") == 1
    eng.close()


def test_hashed_known_hosts_entry(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    known = tmp_path / "known_hosts"
    known.write_text(ssh_agent_env.sshd.known_hosts_line)
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|")
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, known_hosts=str(known))
    assert eng.check()["cpus"] >= 1
    eng.close()


def test_changed_host_key_refused_and_not_trusted(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    other = keygen(tmp_path / "other_host_key", "impostor")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{ssh_agent_env.sshd.port} {' '.join(other.split()[:2])}\n")
    before = known.read_text()
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, known_hosts=str(known))
    with pytest.raises(HostKeyChanged, match="CHANGED") as err:
        eng.check()
    assert _fingerprint(ssh_agent_env.sshd.host_pub) in str(err.value)
    assert _fingerprint(other) in str(err.value)
    with pytest.raises(HostKeyChanged):
        eng.trust_host()
    assert known.read_text() == before


def test_known_hosts_patterns(tmp_path: Path):
    blob = b"\x00\x00\x00\x0bssh-ed25519" + b"\x00\x00\x00\x20" + b"k" * 32
    import base64

    b64 = base64.b64encode(blob).decode()
    known = tmp_path / "kh"
    known.write_text(f"# comment\n*.lab,!bad.lab {b64[:4]}x ssh-ed25519\n*.lab,!bad.lab ssh-ed25519 {b64}\n")
    hop = ssh_config.Hop("a", "gpu.lab", 22, "u", (), False, 0, 5, (str(known),), False)
    assert ssh_config.check_host_key(hop, blob)[0] == "ok"
    bad = ssh_config.Hop("a", "bad.lab", 22, "u", (), False, 0, 5, (str(known),), False)
    assert ssh_config.check_host_key(bad, blob)[0] == "unknown"
    port = ssh_config.Hop("a", "gpu.lab", 2222, "u", (), False, 0, 5, (str(known),), False)
    assert port.known_hosts_name == "[gpu.lab]:2222"
    assert ssh_config.check_host_key(port, blob)[0] == "unknown"


# -- sign-in and routes --------------------------------------------------------------------------


def test_alias_with_user_port_identity_file_and_no_agent(
    sshd_bed: TestBed, tmp_path: Path, monkeypatch, transport: str
):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    eng = make_engine(sshd_bed, tmp_path, transport=transport, address="testbox")
    hop = eng.hop()
    assert (hop.hostname, hop.port, hop.user) == ("127.0.0.1", sshd_bed.sshd.port, sshd_bed.user)
    assert hop.identity_files == (str(sshd_bed.user_key),) and hop.identities_only
    assert hop.keepalive == 5
    assert eng.check()["cpus"] >= 1
    eng.close()


@pytest.mark.parametrize("transport", ["paramiko"])  # no connection is made: the same resolution for both
def test_explicit_options_override_the_config(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, address="testbox", port=1, user="nobody-else")
    hop = eng.hop()
    assert hop.port == 1 and hop.user == "nobody-else" and hop.hostname == "127.0.0.1"


def test_encrypted_key_without_agent_is_a_clear_error(sshd_bed: TestBed, tmp_path: Path, monkeypatch, transport: str):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    eng = make_engine(sshd_bed, tmp_path, transport=transport, address="lockedbox")
    with pytest.raises(AuthenticationFailed) as err:
        eng.check()
    msg = str(err.value)
    assert "encrypted" in msg and f"ssh-add {sshd_bed.locked_key}" in msg and not err.value.transient


def test_authentication_failure_lists_what_was_tried(sshd_bed: TestBed, tmp_path: Path, monkeypatch, transport: str):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    stranger = tmp_path / "id_stranger"
    keygen(stranger, "stranger")
    eng = make_engine(sshd_bed, tmp_path, transport=transport, identity_file=str(stranger))
    with pytest.raises(AuthenticationFailed) as err:
        eng.check()
    msg = str(err.value)
    assert "authentication failed" in msg and str(stranger) in msg and "publickey" in msg


@pytest.mark.parametrize("transport", ["openssh"])  # paramiko writes no files
@pytest.mark.parametrize("closed", [True, False])
def test_a_failed_sign_in_leaves_no_files(sshd_bed: TestBed, tmp_path: Path, monkeypatch, transport: str, closed: bool):
    # The OpenSSH transport writes its config and the master's log before it knows whether the sign-in
    # works; those go with close() or, for a connection no one closes, with the object.
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    stranger = tmp_path / "id_stranger"
    keygen(stranger, "stranger")
    eng = make_engine(sshd_bed, tmp_path, transport=transport, identity_file=str(stranger))
    with pytest.raises(AuthenticationFailed):
        eng.check()
    private = Path(eng.connection._dir)
    assert (private / "master.log").is_file()
    if closed:
        eng.close()
    else:
        del eng
        gc.collect()
    assert not private.exists()


def test_agent_key_is_used(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    # no IdentityFile anywhere: only the agent holds the key
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, ssh_config=str(tmp_path / "no-config"))
    assert eng.check()["cpus"] >= 1
    eng.close()


def test_proxyjump(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    log = ssh_agent_env.jump.log
    before = log.read_text().count("direct-tcpip")
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, address="viajump")
    assert [h.port for h in eng.hop().via] == [ssh_agent_env.jump.port]
    job = run_job(eng, [], "echo via jump")
    assert wait_exited(eng, job).exit_code == 0
    assert eng.read_log(job, 0, 100) == b"via jump\n"
    if transport == "paramiko":
        assert len(eng.connection.link.transports) == 2
    assert log.read_text().count("direct-tcpip") > before
    eng.close()


def test_proxyjump_two_hops(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, address="viatwojumps")
    assert len(eng.hop().via) == 2
    assert eng.check()["cpus"] >= 1
    if transport == "paramiko":
        assert len(eng.connection.link.transports) == 3
    eng.close()


def test_proxycommand_host(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    """A ProxyCommand from the ssh config is run by the user's ssh; paramiko says plainly that it cannot."""
    log = ssh_agent_env.jump.log
    before = log.read_text().count("direct-tcpip")
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, address="viaproxycommand")
    if transport == "paramiko":
        with pytest.raises(EngineError, match="ProxyCommand, which only the OpenSSH transport runs") as err:
            eng.check()
        assert not err.value.transient
        return
    job = run_job(eng, [input_file(tmp_path, "in.txt", b"through a command\n")], "cat in.txt")
    assert wait_exited(eng, job).exit_code == 0
    assert eng.read_log(job, 0, 100) == b"through a command\n"
    assert log.read_text().count("direct-tcpip") > before  # the bytes went through the command's ssh -W
    eng.close()


@pytest.mark.parametrize("transport", ["openssh"])  # paramiko reads only SSH_AUTH_SOCK, not IdentityAgent
def test_identity_agent_from_the_config(sshd_bed: TestBed, tmp_path: Path, monkeypatch, transport: str):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    eng = make_engine(sshd_bed, tmp_path, transport=transport, address="agentbox")
    assert eng.check()["cpus"] >= 1
    eng.close()
    # the same machine, not through that alias: no agent, no key file it accepts, so refused
    refused = make_engine(sshd_bed, tmp_path, transport=transport)
    with pytest.raises(AuthenticationFailed):
        refused.check()


@pytest.mark.parametrize("transport", ["openssh"])  # the paramiko transport offers plain keys only
def test_certificate_signs_in(sshd_bed: TestBed, tmp_path: Path, monkeypatch, transport: str):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    assert sshd_bed.cert_key is not None
    eng = make_engine(sshd_bed, tmp_path, transport=transport, address="certbox")
    assert eng.check()["cpus"] >= 1
    eng.close()
    assert "jrc-test-cert" in sshd_bed.sshd.log.read_text()  # sshd accepted the certificate (its key id)
    # the key alone, without its certificate, is in no authorized_keys file
    (tmp_path / "no-cert").mkdir()
    bare_key = tmp_path / "no-cert" / "id"
    bare_key.write_bytes(sshd_bed.cert_key.read_bytes())
    bare_key.chmod(0o600)
    bare = make_engine(sshd_bed, tmp_path, transport=transport, identity_file=str(bare_key))
    with pytest.raises(AuthenticationFailed):
        bare.check()


def test_network_errors_are_specific_and_transient(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    closed = make_engine(ssh_agent_env, tmp_path, transport=transport, port=ports.free_port())
    with pytest.raises(EngineError, match="connection refused") as err:
        closed.check()
    assert err.value.transient
    nowhere = make_engine(ssh_agent_env, tmp_path, transport=transport, address="no-such-host.invalid")
    with pytest.raises(EngineError, match="cannot resolve host name") as err:
        nowhere.check()
    assert err.value.transient


@pytest.mark.parametrize(
    "address", ["a b", "-oProxyCommand=x", "host;rm -rf", "h\nx", "$(id)", "`id`", "h|x", "", "h'q"]
)
def test_validate_address_refuses_shell_characters(address: str):
    with pytest.raises(ValueError):
        SSHEngine.validate_address(address)


def test_validate_address_accepts_hosts():
    for address in ("gpu-box.lab", "10.0.0.5", "ana@gpu-box", "my_alias", "::1"):
        assert SSHEngine.validate_address(address) == address


def test_prepare_refuses_a_directory_of_another_job(engine: SSHEngine):
    job = engine.prepare(new_job())
    with pytest.raises(EngineError, match="another job") as err:
        engine.prepare(RemoteJob(job.job_id, "other-key", {}))
    assert err.value.transient is False  # trying again cannot help


def test_ssh_config_include_and_jump_parsing(tmp_path: Path):
    inc = tmp_path / "inc.conf"
    inc.write_text("Host inner\n  HostName 10.1.1.1\n  Port 2200\n  User bob\n")
    cfg = tmp_path / "config"
    cfg.write_text(f"Include {inc}\nHost outer\n  HostName 10.2.2.2\n  ProxyJump inner,carol@10.3.3.3:2201\n")
    config = ssh_config.load_config(str(cfg))
    hop = ssh_config.resolve("outer", config=config, known_hosts=str(tmp_path / "kh"))
    assert [(h.hostname, h.port, h.user) for h in hop.via] == [("10.1.1.1", 2200, "bob"), ("10.3.3.3", 2201, "carol")]
    assert hop.hostname == "10.2.2.2"


# -- big transfers -----------------------------------------------------------------------------


@pytest.mark.timeout(180)
# paramiko's hazard (its own re-key at 2^29 bytes). Through OpenSSH a big file takes the same pipe loop as the
# 128 MiB cut-connection cases of test_faults_ssh.py, and re-keys are OpenSSH's: one transport keeps this slow case.
@pytest.mark.parametrize("transport", ["paramiko"])
def test_transfer_over_512_mib_both_ways(engine: SSHEngine, ssh_agent_env: TestBed, tmp_path: Path):
    """600 MiB up and 600 MiB down on one connection: past paramiko's 2^29-byte re-key point each way."""
    size = 600 << 20
    block = os.urandom(1 << 20)
    path = tmp_path / "big.bin"
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(size >> 20):
            chunk = block[i:] + block[:i]  # not one repeated block: every MiB differs
            f.write(chunk)
            h.update(chunk)
    big = InputFile("big.bin", path, size, h.hexdigest())
    job = engine.prepare(new_job())
    stats = engine.send(job, [big])
    assert stats.bytes_sent == size
    job = engine.start(job, LaunchSpec(command="cp big.bin copy.bin", env={}, secret_env={}))
    assert wait_exited(engine, job, 60).exit_code == 0
    result = engine.fetch(job, ["copy.bin"], tmp_path / "back")
    assert result.digests["copy.bin"] == big.sha256 == sha(tmp_path / "back/work/copy.bin")
    assert engine.connections_made == 1  # no re-key deadlock, no reconnect
    engine.cleanup(job)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", ["paramiko"])  # paramiko's own re-key trap; OpenSSH re-keys by itself
def test_rekey_point_at_the_end_of_a_channel(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    """The case that deadlocks paramiko: its 2^29-byte re-key fires while a channel's last window is in flight.

    The server's CLOSE then reaches paramiko inside its own key exchange, whose answer it can no longer
    read ("Key-exchange timed out waiting for key negotiation" after 30 s). Each read below is sized from
    the transport's byte counter so that 2^29 is crossed just before the channel ends. Without the
    engine's defence one of these fails (seen here at 1 MiB before the end); with it, all pass at speed.
    """
    size = 700_000_000
    setup = make_engine(ssh_agent_env, tmp_path, transport=transport)
    job = run_job(setup, [], f"head -c {size} /dev/zero")
    assert wait_exited(setup, job, 60).exit_code == 0
    setup.close()
    for tail_kib in (512, 1024, 1536):
        eng = make_engine(ssh_agent_env, tmp_path, transport=transport)
        first = len(eng.read_log(job, 0, 32 << 20))
        counter = getattr(eng.connection.link.target.packetizer, "_Packetizer__received_bytes", None)
        if counter is None:  # paramiko renamed its counter: still move > 512 MiB through one channel
            want = 520 << 20
        else:
            ratio = counter / first  # wire bytes per log byte (packet framing, MAC)
            want = int(((1 << 29) - counter) / ratio) + tail_kib * 1024
        assert eng.read_log(job, first, want) == b"\0" * want
        assert eng.connections_made == 1  # a stalled re-key times out after 30 s and reconnects
        eng.close()
    setup.cleanup(job)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["paramiko"])  # paramiko's handling of them; OpenSSH's client does its own
def test_server_initiated_rekeys(ssh_agent_env: TestBed, tmp_path: Path, transport: str):
    """The jump sshd re-keys every 64 MiB by itself: 300 MiB each way crosses several re-keys."""
    eng = make_engine(ssh_agent_env, tmp_path, transport=transport, port=ssh_agent_env.jump.port)
    data = input_file(tmp_path, "mid.bin", os.urandom(1 << 20) * 300)
    job = run_job(eng, [data], "cp mid.bin out.bin")
    assert wait_exited(eng, job, 60).exit_code == 0
    result = eng.fetch(job, ["out.bin"], tmp_path / "back")
    assert result.digests["out.bin"] == data.sha256 == sha(tmp_path / "back/work/out.bin")
    assert eng.connections_made == 1
    eng.cleanup(job)
    eng.close()


def test_close_ends_the_connection_threads(engine: SSHEngine, transport: str):
    facts = engine.check()
    assert facts["transport"] == transport
    if transport == "paramiko":
        transports = list(engine.connection.link.transports)
        engine.close()
        wait_for(lambda: not any(t.is_alive() for t in transports), 10, "the transport threads to end")
    else:
        master = engine.connection._master.proc
        private = Path(engine.connection._dir)
        assert private.stat().st_mode & 0o777 == 0o700  # the ControlPath's directory is ours alone
        assert (private / "master").is_socket()
        engine.close()
        assert master.poll() is not None and not private.exists()  # the master is gone, and its files
    assert engine.check()["cpus"] >= 1  # usable again after close: it reconnects
