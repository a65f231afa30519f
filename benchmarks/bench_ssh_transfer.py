"""The ssh engine's transfers, on each transport, against raw ssh, scp and rsync on one loopback sshd.

Not a test: it prints figures and their ratios against the goals of issue 11. It
starts its own sshd and ssh-agent (the test bed of tests/sshd_fixture.py) and
stops them. Every ssh here uses one cipher (aes128-gcm): the raw tools by ``-c``,
the engine's OpenSSH transport through the ssh config it is given, paramiko by
its own first choice.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ssh_transfer.py [--size MiB] [--files N] [--wan]

``--size``: the big file (default 1024 MiB); ``--files`` and ``--tree-size``: the
small-file tree (default 10,000 files, 256 MiB in all); ``--wan``: also the big
file through benchmarks/wan_relay.py (``--rtt`` ms, default 40), against raw ssh
through the same relay; ``--transports``: which of the engine's to measure; ``--rounds``:
how many times the loopback rows are measured, engine and references in turn (each row prints
its median and every round's time: one round on this VM can be twice another).

Each row also shows the CPU time the whole machine spent during it (both ends share these cores on
loopback) and how many cores that kept busy: where that is all of them, the cores set the pace.
Before each one, every file it may read is read and as much memory as it writes is written and
freed again (warm_pages.py: this VM pages out files unread for a minute, and a page cache that grows
into memory the host took back costs ten times as much to write).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import warm_pages  # noqa: E402
from sshd_fixture import TestBed, build_testbed  # noqa: E402
from wan_relay import WanRelay  # noqa: E402

from jupyter_remote_compute.engines.base import EngineContext, InputFile, RemoteJob  # noqa: E402
from jupyter_remote_compute.engines.ssh import SSHEngine  # noqa: E402
from jupyter_remote_compute.engines.transport import quote, sh_script  # noqa: E402

CIPHER = "aes128-gcm@openssh.com"
MiB = 1 << 20


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Sample this process's resident set every 5 ms while a block runs."""

    def __enter__(self):
        self.base = rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def extra(self) -> int:
        return self.peak - self.base


def make_file(path: Path, size: int) -> InputFile:
    block = os.urandom(MiB)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left, i = size, 0
        while left:
            chunk = (block[i % 4096 :] + block[: i % 4096])[: min(MiB, left)]
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
            i += 1
    return InputFile(path.name, path, size, h.hexdigest())


def make_tree(root: Path, total: int, count: int) -> list[InputFile]:
    each = total // count
    files = []
    block = os.urandom(each + 4096)
    for i in range(count):
        rel = f"tree/d{i // 500:03d}/f{i:05d}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = block[i % 4096 : i % 4096 + each]
        path.write_bytes(data)
        files.append(InputFile(rel, path, each, hashlib.sha256(data).hexdigest()))
    return files


class Tools:
    """Raw ssh, scp and rsync with the same key, host key file and cipher as far as they allow."""

    def __init__(self, bed: TestBed, port: int | None = None, known_hosts: Path | None = None):
        self.bed = bed
        self.port = port or bed.sshd.port
        self.opts = [
            "-F",
            "/dev/null",
            "-i",
            str(bed.user_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or bed.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-c",
            CIPHER,
        ]
        self.target = f"{bed.user}@127.0.0.1"

    def ssh(self, command: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", *self.opts, "-p", str(self.port), self.target, command], check=True, **kw)

    def scp(self, *args: str) -> None:
        subprocess.run(["scp", "-q", *self.opts, "-P", str(self.port), *args], check=True)

    def rsync(self, *args: str) -> None:
        rsh = "ssh " + " ".join(self.opts) + f" -p {self.port}"
        subprocess.run(["rsync", "-a", "-e", rsh, *args], check=True)

    def remote(self, rel: str) -> str:
        return f"{self.target}:{rel}"


def drain(eng: SSHEngine, path: str) -> None:
    """``cat`` a far-side file down one of the engine's channels into nothing."""
    with eng.connection.channel(sh_script(f"cat {quote(path)}"), 120) as ch:
        ch.shutdown_write()
        got = 0
        while data := ch.recv(MiB):
            got += len(data)
        assert eng.connection.finish(ch, bytearray(), 120) == 0 and got > 0


def cpu_busy() -> float:
    """Seconds the machine's CPUs have been busy so far, every core and process (``/proc/stat``)."""
    ticks = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # not idle, not iowait


class Timing(NamedTuple):
    seconds: float
    #: CPU time the whole machine spent meanwhile, both ends of the loopback included: on 2 cores, a
    #: transfer whose cpu / seconds is near 2 is bound by the cores, not by the way the bytes move.
    cpu: float


#: (scratch folder, bytes, files): each measured transfer first recycles that many bytes of memory and
#: reads the files it may read, so all start from warm pages and a warm page cache (warm_pages.py)
WARM: tuple[Path, int, list[Path]] | None = None


def timed(fn, *args, **kw) -> Timing:
    if WARM:
        warm_pages.before_transfer(*WARM)
    c0, t0 = cpu_busy(), time.perf_counter()
    fn(*args, **kw)
    return Timing(time.perf_counter() - t0, cpu_busy() - c0)


GOALS = {"file": 0.9, "tree": 1.2, "wan": 0.9}  # issue 11: x raw ssh (file, wan), x rsync (tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024, help="MiB of the big file")
    parser.add_argument("--files", type=int, default=10_000, help="files in the small-file tree")
    parser.add_argument("--tree-size", type=int, default=256, help="MiB of the small-file tree in all")
    parser.add_argument("--wan", action="store_true", help="also the big file through a delaying relay")
    parser.add_argument("--rtt", type=float, default=40, help="the relay's round trip, ms")
    parser.add_argument("--rounds", type=int, default=3, help="loopback rounds; each row shows their median")
    parser.add_argument("--transports", default="openssh,paramiko", help="the engine's transports to measure")
    args = parser.parse_args()
    size = args.size * MiB
    global WARM
    transports = [t for t in args.transports.split(",") if t]

    bed = build_testbed()
    local = Path(tempfile.mkdtemp(prefix="jrc-bench-"))
    os.environ["SSH_AUTH_SOCK"] = str(bed.agent.sock)
    ctx = EngineContext(get_secret=lambda n: None, scratch_dir=local)
    # The engine's ssh config: the test bed's, with the cipher the raw tools use.
    config = local / "ssh_config"
    config.write_text(f"Host *\n    Ciphers {CIPHER}\n\nInclude {bed.ssh_config}\n")
    rows: list[tuple[str, str, Timing, int]] = []  # (what, method, time taken, bytes)
    # transport: (re-send, first send) of the file and of the tree, a pair per round
    resends: dict[str, list[tuple[float, float, float, float]]] = {t: [] for t in transports}
    memory: dict[str, tuple[int, int]] = {}  # this process's peak extra RSS sending and fetching the big file
    try:
        print(f"making data: {args.size} MiB file, {args.files} files of {args.tree_size} MiB in all …", flush=True)
        big = make_file(local / "big.bin", size)
        tree = make_tree(local / "src", args.tree_size * MiB, args.files)
        tree_bytes = sum(f.size for f in tree)
        WARM = (local, max(size, args.tree_size * MiB), [local / "big.bin", local / "src", bed.home])
        tools = Tools(bed)
        far_home = bed.home
        raw_dir = "bench-raw"
        bases = []

        def fresh_raw(t: Tools = tools):
            shutil.rmtree(far_home / raw_dir, ignore_errors=True)
            t.ssh(f"mkdir -p {raw_dir}/big {raw_dir}/tree")

        def engine(transport: str, **over) -> SSHEngine:
            base = f"~/.jrc-bench-{uuid.uuid4().hex[:6]}"
            bases.append(base)
            opts = bed.options(base_dir=base, ssh_config=str(config), ssh_transport=transport, **over)
            return SSHEngine("bench", "127.0.0.1", opts, ctx)

        def new_job(eng: SSHEngine) -> RemoteJob:
            return eng.prepare(RemoteJob(f"b-{uuid.uuid4().hex[:10]}", "k", {}))

        def big_both_ways(eng: SSHEngine, label: str, what: str) -> float:
            """Send and fetch the big file (and drain it through the bare channel); the send's seconds."""
            job = new_job(eng)
            with PeakRSS() as up:
                sent = timed(eng.send, job, [big])
                rows.append((f"{what} up", label, sent, size))
            dest = local / "fetch-big"
            with PeakRSS() as down:
                rows.append((f"{what} down", label, timed(eng.fetch, job, ["big.bin"], dest), size))
            memory[f"{what}, {label}"] = (up.extra, down.extra)
            # The transport alone: the same file's bytes down a channel, without the fetch's far-side hashing
            # and tar, nor this side's extraction: what the transport costs against raw ssh.
            far_file = f"{job.handle['dir']}/work/big.bin"
            rows.append((f"{what} down", f"{label} channel", timed(drain, eng, far_file), size))
            shutil.rmtree(dest)
            eng.cleanup(job)
            return sent.seconds

        def raw_big(t: Tools, what: str) -> None:
            fresh_raw(t)
            with open(big.source, "rb") as src:
                rows.append(
                    (f"{what} up", "raw ssh cat", timed(t.ssh, f"cat > {raw_dir}/big/big.bin", stdin=src), size)
                )
            with open(local / "raw-down.bin", "wb") as out:
                rows.append(
                    (f"{what} down", "raw ssh cat", timed(t.ssh, f"cat {raw_dir}/big/big.bin", stdout=out), size)
                )
            os.unlink(local / "raw-down.bin")

        # ---- loopback: the engine, each transport, then the references, in rounds ---------------------
        for round_ in range(1, args.rounds + 1):
            print(f"round {round_} of {args.rounds}", flush=True)
            for transport in transports:
                print(f"engine over {transport} …", flush=True)
                eng = engine(transport)
                assert eng.check()["transport"] == transport
                first_big = big_both_ways(eng, f"ours/{transport}", "big file")
                t_resend = timed(eng.send, new_job(eng), [big]).seconds
                job_t = new_job(eng)
                first_tree = timed(eng.send, job_t, tree)
                rows.append(("tree up", f"ours/{transport}", first_tree, tree_bytes))
                t_resend_tree = timed(eng.send, new_job(eng), tree).seconds
                resends[transport].append((t_resend, first_big, t_resend_tree, first_tree.seconds))
                dest = local / "fetch-tree"
                rows.append(("tree down", f"ours/{transport}", timed(eng.fetch, job_t, ["tree"], dest), tree_bytes))
                shutil.rmtree(dest)
                eng.close()

            # ---- the references ------------------------------------------------------------------------
            print("raw ssh, scp, rsync …", flush=True)
            raw_big(tools, "big file")
            src_tree = str(local / "src" / "tree")
            fresh_raw()
            rows.append(
                ("tree up", "scp -r", timed(tools.scp, "-r", src_tree, tools.remote(f"{raw_dir}/tree/")), tree_bytes)
            )
            rows.append(
                (
                    "tree down",
                    "scp -r",
                    timed(tools.scp, "-r", tools.remote(f"{raw_dir}/tree/tree"), str(local / "scp")),
                    tree_bytes,
                )
            )
            fresh_raw()
            rsync_up = timed(tools.rsync, src_tree, tools.remote(f"{raw_dir}/tree/"))
            rows.append(("tree up", "rsync -a", rsync_up, tree_bytes))
            rows.append(
                (
                    "tree down",
                    "rsync -a",
                    timed(tools.rsync, tools.remote(f"{raw_dir}/tree/tree"), str(local / "rsync")),
                    tree_bytes,
                )
            )
            for name in ("scp", "rsync"):
                shutil.rmtree(local / name, ignore_errors=True)

        # ---- an emulated WAN link ------------------------------------------------------------------
        if args.wan:
            print(f"through a relay with {args.rtt:.0f} ms round trips …", flush=True)
            with WanRelay(target_port=bed.sshd.port, rtt=args.rtt / 1000) as relay:
                known = local / "known_hosts_wan"
                known.write_text(bed.known_hosts.read_text() + f"[127.0.0.1]:{relay.port} {bed.sshd.host_pub}\n")
                wan_tools = Tools(bed, port=relay.port, known_hosts=known)
                raw_big(wan_tools, "WAN big file")
                for transport in transports:
                    eng = engine(transport, port=relay.port, known_hosts=str(known))
                    big_both_ways(eng, f"ours/{transport}", "WAN big file")
                    eng.close()
    finally:
        for base in bases:
            shutil.rmtree(bed.home / base.removeprefix("~/"), ignore_errors=True)
        shutil.rmtree(bed.home / "bench-raw", ignore_errors=True)
        bed.stop()
        shutil.rmtree(local, ignore_errors=True)

    # ---- report ------------------------------------------------------------------------------------
    # Each (transfer, method) as the median of its rounds, by time; its CPU is that round's.
    grouped: dict[tuple[str, str], list[tuple[Timing, int]]] = {}
    for what, method, timing, nbytes in rows:
        grouped.setdefault((what, method), []).append((timing, nbytes))
    table = {}
    print()
    cores = os.cpu_count() or 1
    print(f"{'transfer':<18}{'method':<18}{'seconds':>9}{'MB/s':>9}{'CPU s':>8}  cores busy of {cores}   (rounds)")
    for (what, method), runs in grouped.items():
        (secs, cpu), nbytes = sorted(runs)[len(runs) // 2]
        table[(what, method)] = secs
        spread = ", ".join(f"{t.seconds:.2f}" for t, _ in runs)
        mbps = nbytes / secs / 1e6
        print(f"{what:<18}{method:<18}{secs:>9.2f}{mbps:>9.0f}{cpu:>8.2f}{cpu / secs:>8.2f}   ({spread})")
    print()
    for transport, pairs in resends.items():
        rb, fb, rt, ft = (statistics.median(p[i] for p in pairs) for i in range(4))
        print(f"re-send unchanged, {transport} (medians of {len(pairs)}): file {rb:.3f} s ({rb / fb:.1%} of its first "
              f"send), tree {rt:.3f} s ({rt / ft:.1%})")  # fmt: skip
    for label, (up, down) in memory.items():
        print(f"peak extra RSS, {label}: send {up / MiB:.1f} MiB, fetch {down / MiB:.1f} MiB")
    print()

    def goal(name: str, value: float, target: float) -> None:
        print(f"{'PASS' if value >= target else 'MISS'}  {name:<52}{value:>6.2f}x  (goal >= {target}x)")

    for transport in transports:
        ours = f"ours/{transport}"
        for direction in ("up", "down"):
            r = table[(f"big file {direction}", "raw ssh cat")] / table[(f"big file {direction}", ours)]
            goal(f"{transport}: {args.size} MiB file {direction} vs raw cat|ssh", r, GOALS["file"])
        r = table[("big file down", "raw ssh cat")] / table[("big file down", f"{ours} channel")]
        goal(f"{transport}: file down, the channel alone, vs raw cat|ssh", r, GOALS["file"])
        for direction in ("up", "down"):
            for tool in ("rsync -a", "scp -r"):
                r = table[(f"tree {direction}", tool)] / table[(f"tree {direction}", ours)]
                goal(f"{transport}: {args.files}-file tree {direction} vs {tool}", r, GOALS["tree"])
        if args.wan:
            for direction in ("up", "down"):
                r = table[(f"WAN big file {direction}", "raw ssh cat")] / table[(f"WAN big file {direction}", ours)]
                goal(f"{transport}: WAN {args.rtt:.0f} ms file {direction} vs raw ssh", r, GOALS["wan"])
            r = table[("WAN big file down", "raw ssh cat")] / table[("WAN big file down", f"{ours} channel")]
            goal(f"{transport}: WAN file down, the channel alone, vs raw ssh", r, GOALS["wan"])


if __name__ == "__main__":
    main()
