"""The ssh engine's transfers against raw ssh, scp and rsync, side by side on one loopback sshd.

Not a test: it prints figures and their ratios against the goals. It starts its
own sshd and ssh-agent (the test bed of tests/sshd_fixture.py) and stops them.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ssh_transfer.py [--size MiB] [--files N]

``--size`` is the big file's size and the small-file tree's total (default 1024 MiB);
``--files`` the number of files in the tree (default 10,000).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sshd_fixture import TestBed, build_testbed  # noqa: E402

from jupyter_remote_compute.engines.base import EngineContext, InputFile, LaunchSpec, RemoteJob  # noqa: E402
from jupyter_remote_compute.engines.ssh import SSHEngine  # noqa: E402

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

    def __init__(self, bed: TestBed):
        self.bed = bed
        self.opts = [
            "-F",
            "/dev/null",
            "-i",
            str(bed.user_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={bed.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-c",
            CIPHER,
        ]
        self.target = f"{bed.user}@127.0.0.1"

    def ssh(self, command: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", *self.opts, "-p", str(self.bed.sshd.port), self.target, command], check=True, **kw
        )

    def scp(self, *args: str) -> None:
        subprocess.run(["scp", "-q", *self.opts, "-P", str(self.bed.sshd.port), *args], check=True)

    def rsync(self, *args: str) -> None:
        rsh = "ssh " + " ".join(self.opts) + f" -p {self.bed.sshd.port}"
        subprocess.run(["rsync", "-a", "-e", rsh, *args], check=True)

    def remote(self, rel: str) -> str:
        return f"{self.target}:{rel}"


def timed(fn, *args, **kw) -> float:
    t0 = time.perf_counter()
    fn(*args, **kw)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024, help="MiB for the big file and for the tree")
    parser.add_argument("--files", type=int, default=10_000, help="files in the small-file tree")
    args = parser.parse_args()
    size = args.size * MiB

    bed = build_testbed()
    local = Path(tempfile.mkdtemp(prefix="jrc-bench-"))
    os.environ["SSH_AUTH_SOCK"] = str(bed.agent.sock)
    ctx = EngineContext(get_secret=lambda n: None, scratch_dir=local)
    rows: list[tuple[str, str, float, int]] = []  # (what, method, seconds, bytes)
    try:
        print(f"making data: {args.size} MiB file, {args.files} files totalling {args.size} MiB …", flush=True)
        big = make_file(local / "big.bin", size)
        tree = make_tree(local / "src", size, args.files)
        tree_bytes = sum(f.size for f in tree)
        tools = Tools(bed)
        far_home = bed.home
        raw_dir = "bench-raw"

        def fresh_raw():
            shutil.rmtree(far_home / raw_dir, ignore_errors=True)
            tools.ssh(f"mkdir -p {raw_dir}/big {raw_dir}/tree")

        def engine(base: str) -> SSHEngine:
            return SSHEngine("bench", "127.0.0.1", bed.options(base_dir=base), ctx)

        def new_job(eng: SSHEngine) -> RemoteJob:
            return eng.prepare(RemoteJob(f"b-{uuid.uuid4().hex[:10]}", "k", {}))

        # ---- big file ------------------------------------------------------------------------
        print("big file …", flush=True)
        base = f"~/.jrc-bench-{uuid.uuid4().hex[:6]}"
        eng = engine(base)
        job = new_job(eng)
        with PeakRSS() as mem:
            t = timed(eng.send, job, [big])
        rows.append(("big file up", "ours", t, size))
        send_rss = mem.extra
        job2 = new_job(eng)
        t0 = time.perf_counter()
        stats = eng.send(job2, [big])
        resend_big = time.perf_counter() - t0
        assert stats.bytes_sent == 0, stats
        dest = local / "fetch-big"
        with PeakRSS() as mem_down:
            t = timed(eng.fetch, job, ["big.bin"], dest)
        rows.append(("big file down", "ours", t, size))
        fetch_rss = mem_down.extra
        shutil.rmtree(dest)

        fresh_raw()
        with open(big.source, "rb") as src:
            rows.append(
                ("big file up", "raw ssh cat", timed(tools.ssh, f"cat > {raw_dir}/big/big.bin", stdin=src), size)
            )
        with open(local / "raw-down.bin", "wb") as out:
            rows.append(
                ("big file down", "raw ssh cat", timed(tools.ssh, f"cat {raw_dir}/big/big.bin", stdout=out), size)
            )
        fresh_raw()
        rows.append(("big file up", "scp", timed(tools.scp, str(big.source), tools.remote(f"{raw_dir}/big/")), size))
        rows.append(
            (
                "big file down",
                "scp",
                timed(tools.scp, tools.remote(f"{raw_dir}/big/big.bin"), str(local / "scp-down.bin")),
                size,
            )
        )
        fresh_raw()
        rows.append(
            ("big file up", "rsync", timed(tools.rsync, str(big.source), tools.remote(f"{raw_dir}/big/")), size)
        )
        os.unlink(local / "scp-down.bin")
        rows.append(
            (
                "big file down",
                "rsync",
                timed(tools.rsync, tools.remote(f"{raw_dir}/big/big.bin"), str(local / "rsync-down.bin")),
                size,
            )
        )
        for name in ("raw-down.bin", "rsync-down.bin"):
            os.unlink(local / name)

        # ---- small-file tree -------------------------------------------------------------------
        print("small-file tree …", flush=True)
        job_t = new_job(eng)
        t = timed(eng.send, job_t, tree)
        rows.append(("tree up", "ours", t, tree_bytes))
        job_t2 = new_job(eng)
        t0 = time.perf_counter()
        stats_tree = eng.send(job_t2, tree)
        resend_tree = time.perf_counter() - t0
        assert stats_tree.bytes_sent == 0, stats_tree
        dest = local / "fetch-tree"
        rows.append(("tree down", "ours", timed(eng.fetch, job_t, ["tree"], dest), tree_bytes))
        shutil.rmtree(dest)

        src_tree = str(local / "src" / "tree")
        fresh_raw()

        def tar_up():
            tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(local / "src"), "tree"], stdout=subprocess.PIPE)
            tools.ssh(f"tar -xf - -C {raw_dir}/tree", stdin=tar.stdout)
            tar.stdout.close()
            assert tar.wait() == 0

        def tar_down(dest: Path):
            dest.mkdir()
            ssh = subprocess.Popen(
                ["ssh", *tools.opts, "-p", str(bed.sshd.port), tools.target, f"tar -cf - -C {raw_dir}/tree tree"],
                stdout=subprocess.PIPE,
            )
            subprocess.run(["tar", "-xf", "-", "-C", str(dest)], stdin=ssh.stdout, check=True)
            ssh.stdout.close()
            assert ssh.wait() == 0

        rows.append(("tree up", "raw tar|ssh", timed(tar_up), tree_bytes))
        rows.append(("tree down", "raw tar|ssh", timed(tar_down, local / "tar-down"), tree_bytes))
        fresh_raw()
        rows.append(("tree up", "scp", timed(tools.scp, "-r", src_tree, tools.remote(f"{raw_dir}/tree/")), tree_bytes))
        rows.append(
            (
                "tree down",
                "scp",
                timed(tools.scp, "-r", tools.remote(f"{raw_dir}/tree/tree"), str(local / "scp-tree")),
                tree_bytes,
            )
        )
        fresh_raw()
        rows.append(("tree up", "rsync", timed(tools.rsync, src_tree, tools.remote(f"{raw_dir}/tree/")), tree_bytes))
        rows.append(
            (
                "tree down",
                "rsync",
                timed(tools.rsync, tools.remote(f"{raw_dir}/tree/tree"), str(local / "rsync-tree")),
                tree_bytes,
            )
        )
        # rsync's own unchanged re-send (size+mtime quick check), for reference
        rsync_resend = timed(tools.rsync, src_tree, tools.remote(f"{raw_dir}/tree/"))
        for name in ("tar-down", "scp-tree", "rsync-tree"):
            shutil.rmtree(local / name, ignore_errors=True)

        # ---- start latency -------------------------------------------------------------------------
        print("start latency …", flush=True)
        warm, cold = [], []
        launch = LaunchSpec(command="true", env={"A": "1"}, secret_env={})
        for _ in range(10):
            j = new_job(eng)
            warm.append(timed(eng.start, j, launch))
        for _ in range(5):
            fresh = engine(base)
            j = RemoteJob(f"b-{uuid.uuid4().hex[:10]}", "k", {"dir": new_job(eng).handle["dir"]})
            cold.append(timed(fresh.start, j, launch))
            fresh.close()
        eng.close()
        shutil.rmtree(far_home / base.removeprefix("~/"), ignore_errors=True)
        shutil.rmtree(far_home / raw_dir, ignore_errors=True)
    finally:
        bed.stop()
        shutil.rmtree(local, ignore_errors=True)

    # ---- report ------------------------------------------------------------------------------------
    table = {}
    print()
    print(f"{'transfer':<15}{'method':<14}{'seconds':>9}{'MB/s':>9}")
    for what, method, secs, nbytes in rows:
        table[(what, method)] = secs
        print(f"{what:<15}{method:<14}{secs:>9.2f}{nbytes / secs / 1e6:>9.0f}")
    print()
    first_big = table[("big file up", "ours")]
    first_tree = table[("tree up", "ours")]
    print(f"re-send unchanged big file:  {resend_big:.3f} s (first send {first_big:.2f} s)")
    print(
        f"re-send unchanged tree:      {resend_tree:.3f} s "
        f"(first send {first_tree:.2f} s; rsync's own: {rsync_resend:.2f} s)"
    )
    print(f"start latency warm: median {statistics.median(warm) * 1000:.0f} ms, max {max(warm) * 1000:.0f} ms")
    print(f"start latency cold: median {statistics.median(cold) * 1000:.0f} ms, max {max(cold) * 1000:.0f} ms")
    print(f"peak extra RSS: send {send_rss / MiB:.1f} MiB, fetch {fetch_rss / MiB:.1f} MiB (1 file of {args.size} MiB)")
    print()

    def goal(name: str, value: float, target: str, ok: bool) -> None:
        print(f"{'PASS' if ok else 'MISS'}  {name:<48}{value:>8.2f}  (goal {target})")

    up_ratio = table[("big file up", "raw ssh cat")] / first_big
    down_ratio = table[("big file down", "raw ssh cat")] / table[("big file down", "ours")]
    goal("big file up, speed vs raw ssh", up_ratio, ">= 0.8x", up_ratio >= 0.8)
    goal("big file down, speed vs raw ssh", down_ratio, ">= 0.8x", down_ratio >= 0.8)
    for direction in ("up", "down"):
        for tool in ("rsync", "scp"):
            r = table[(f"tree {direction}", tool)] / table[(f"tree {direction}", "ours")]
            goal(f"tree {direction}, speed vs {tool}", r, "> 1x", r > 1)
    goal(
        "re-send unchanged big file, time vs first send",
        resend_big / first_big * 100,
        "<= 2 %",
        resend_big / first_big <= 0.02,
    )
    goal(
        "re-send unchanged tree, time vs first send",
        resend_tree / first_tree * 100,
        "<= 2 %",
        resend_tree / first_tree <= 0.02,
    )
    goal("warm start, seconds (median)", statistics.median(warm), "<= 0.3 s", statistics.median(warm) <= 0.3)
    goal("memory during big send, extra MiB", send_rss / MiB, "<= 64 MiB", send_rss <= 64 * MiB)
    goal("memory during big fetch, extra MiB", fetch_rss / MiB, "<= 64 MiB", fetch_rss <= 64 * MiB)


if __name__ == "__main__":
    main()
