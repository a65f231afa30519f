"""How fast the jupyter engine moves files, next to what JupyterLab itself does, on one loopback server.

Starts a private Jupyter Server (the test fixture's ``RemoteServer``), makes a 256 MiB file and
measures, in one run:

* upload: JupyterLab's own path (Contents API, chunked, 1 MiB per chunk, as the file browser
  does) against ``JupyterEngine.send`` with a visible base_dir (Contents API) and with the default
  hidden base_dir (through the kernel);
* download: a plain streamed ``GET /files/`` against ``JupyterEngine.fetch`` (far-side hashing,
  streamed download) for both transports.

Engine figures include the far-side sha256 passes (the skip check before, the verification
after). Before each measured transfer, every file of the benchmark is read and 256 MiB is written
and freed again, so each one starts from a warm page cache and writes into warm pages
(warm_pages.py says why this VM needs both).
Prints MB/s and ratios; not a test.
Run: ``.venv/bin/python benchmarks/bench_jupyter_transfer.py``.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import warm_pages
from jupyter_server_fixture import RemoteServer

from jupyter_remote_compute.engines.base import EngineContext, InputFile, RemoteJob
from jupyter_remote_compute.engines.jupyter import JupyterEngine

MiB = 1 << 20
SIZE = 256 * MiB
ROUNDS = 5


def make_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(SIZE // (4 * MiB)):
            block = os.urandom(4 * MiB)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def lab_upload(server: RemoteServer, source: Path, remote: str, chunk: int = MiB) -> None:
    """What JupyterLab's file browser sends: chunk 1..n-1, then -1, each a JSON body with base64."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port)
    headers = {"Authorization": f"token {server.token}", "Content-Type": "application/json"}
    size = source.stat().st_size
    with open(source, "rb") as f:
        number, sent = 1, 0
        while data := f.read(chunk):
            sent += len(data)
            body = json.dumps(
                {
                    "type": "file",
                    "format": "base64",
                    "chunk": -1 if sent >= size else number,
                    "content": base64.b64encode(data).decode(),
                }
            )
            conn.request("PUT", f"/api/contents/{remote}", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            assert response.status in (200, 201), response.status
            number += 1
    conn.close()


def plain_get(server: RemoteServer, remote: str, dest: Path) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port)
    conn.request("GET", f"/files/{remote}", headers={"Authorization": f"token {server.token}"})
    response = conn.getresponse()
    assert response.status == 200, response.status
    with open(dest, "wb") as f:
        while block := response.read(MiB):
            f.write(block)
    conn.close()


#: the benchmark's folder (the source, the server's root): before each measured transfer, every file
#: in it is read and SIZE bytes of memory are recycled (warm_pages.py), set by main
SCRATCH: Path | None = None


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    if SCRATCH is not None:
        warm_pages.before_transfer(SCRATCH, SIZE, [SCRATCH])
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def report(label: str, times: list[float]) -> float:
    best = min(times)
    middle = statistics.median(times)
    spread = f"{best:.2f}-{max(times):.2f} s"
    print(f"  {label:<52} median {middle:6.2f} s {SIZE / middle / 1e6:7.1f} MB/s   best {SIZE / best / 1e6:7.1f} MB/s"
          f"   ({spread})")  # fmt: skip
    return middle


def main() -> None:
    global SCRATCH
    tmp = Path(tempfile.mkdtemp(prefix="bench-jupyter-"))
    SCRATCH = tmp
    source = tmp / "big.bin"
    sha = make_file(source)
    big = InputFile("data/big.bin", source, SIZE, sha)
    with RemoteServer(tmp / "server") as server:
        (server.root_dir / "lab").mkdir()
        context = EngineContext(get_secret=lambda name: server.token, scratch_dir=tmp)
        engines = {
            "contents": JupyterEngine("bench", server.url, {"token_secret": "bench", "base_dir": "jrc"}, context),
            "kernel": JupyterEngine("bench", server.url, {"token_secret": "bench"}, context),
        }
        print(f"256 MiB, loopback Jupyter Server {server.url}, {ROUNDS} interleaved rounds (kernel transfer: 1)")
        times: dict[str, list[float]] = {
            k: [] for k in ("lab", "contents", "kernel", "resend", "get", "fetch-c", "fetch-k")
        }
        jobs: dict[str, RemoteJob] = {}
        for round_ in range(ROUNDS):
            times["lab"].append(timed(lambda: lab_upload(server, source, "lab/big.bin")))
            for transport, engine in engines.items():
                if transport == "kernel" and round_:
                    continue
                # A fresh job and an empty far-side cache, so every round really moves the bytes.
                for cache in (server.root_dir / "jrc" / "cache", server.root_dir / ".jupyter-remote-compute" / "cache"):
                    shutil.rmtree(cache, ignore_errors=True)
                job = engine.prepare(RemoteJob(f"bench-{transport}-{round_}", "k", {}))
                engine.send(job, [])  # the kernel is up before the clock starts, as on a machine in use
                times[transport].append(timed(lambda e=engine, j=job: e.send(j, [big])))
                jobs[transport] = job
            times["resend"].append(timed(lambda: engines["contents"].send(jobs["contents"], [big])))
            times["get"].append(timed(lambda: plain_get(server, "lab/big.bin", tmp / "get.bin")))
            for transport, engine in engines.items():
                if transport == "kernel" and round_:
                    continue
                dest = tmp / f"fetch-{transport}-{round_}"
                key = "fetch-c" if transport == "contents" else "fetch-k"
                times[key].append(timed(lambda e=engine, j=jobs[transport], d=dest: e.fetch(j, ["data/big.bin"], d)))
                with open(dest / "work" / "data" / "big.bin", "rb") as f:
                    assert hashlib.file_digest(f, "sha256").hexdigest() == sha
                shutil.rmtree(dest)
        print("upload")
        lab = report("JupyterLab path: Contents API, 1 MiB chunks", times["lab"])
        up_c = report("engine send, Contents API (4 MiB chunks)", times["contents"])
        up_k = report("engine send, through the kernel (hidden base_dir)", times["kernel"])
        resend = report("engine send again (already there: one far-side hash)", times["resend"])
        print("download")
        get = report("plain GET /files/ streamed", times["get"])
        down_c = report("engine fetch, /files/ (incl. far-side sha256)", times["fetch-c"])
        down_k = report("engine fetch, through the kernel", times["fetch-k"])
        print("ratios (time of the reference / time of the engine; higher is better)")
        print(f"  upload   engine (Contents) vs JupyterLab path   {lab / up_c:5.2f}x   (goal >= 1.0x)")
        print(f"  upload   engine (kernel)   vs JupyterLab path   {lab / up_k:5.2f}x")
        print(f"  upload   re-send of an unchanged file           {lab / resend:5.2f}x")
        print(f"  download engine (/files/)  vs plain GET         {get / down_c:5.2f}x")
        print(f"  download engine (kernel)   vs plain GET         {get / down_k:5.2f}x")
        for engine in engines.values():
            engine.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
