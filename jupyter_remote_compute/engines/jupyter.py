"""A machine reached through a Jupyter Server's REST API (a JupyterHub user server, a lab box, …).

Bulk data moves over HTTP: inputs up through the Contents API with JupyterLab's chunked-upload
protocol, outputs down from ``/files/`` (streamed, ranged for the log). Everything that needs the
far host itself runs from a kernel, one execution per operation: the shared far-side scripts
(``farside/``: status, cancel, the output manifest and its tar, the input cache, facts) through
``sh``, and a few lines of Python for what only this kind needs (writing the job directory, chunks
through the kernel, starting the detached command):

* one kernel per engine, kept for polls and file-system work (restarted when the server restarted
  or culled it);
* a short-lived kernel for ``start``, deleted right after: its code holds the job's secret
  environment, so it is sent with ``silent`` / ``store_history=False`` and the kernel (whose
  memory saw it) does not live on.

The job directory sits at ``<base_dir>/jobs/<job id>`` under the server's root_dir (the kernel's
working directory), laid out as ``base.py`` describes. A server that will not show that folder
through the Contents API — ``base_dir`` is a dot-folder (the default) and the server keeps
``ContentsManager.allow_hidden`` off, or its contents are not the kernel's disk — gets the same
bytes through the kernel instead (base64 in execute requests), slower but correct; the handle
records which ``transport`` a job uses.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import posixpath
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import farside
from .base import (
    WORK_DIR,
    Engine,
    EngineContext,
    EngineError,
    FetchResult,
    InputFile,
    LaunchSpec,
    MetricBytes,
    MetricOffsets,
    OptionField,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from .jupyter_contents import (
    KernelGone,
    NotFoundOnServer,
    RemoteCodeError,
    ServerClient,
    Token,
    progress_adder,
)
from .jupyter_kernel import KernelChannel, decode_answer, far_expression
from .launcher import command_script, launch_input

log = logging.getLogger(__name__)

# Visible on purpose: a stock Jupyter Server hides dot-folders from its Contents API and /files, which
# would force every byte through the (4x slower) kernel route. Users also see their jobs in their lab.
DEFAULT_BASE_DIR = "jupyter-remote-compute"
#: Raw bytes per execute request when data goes through the kernel: small enough that the few
#: copies a message takes on its way (base64, JSON, websocket frame) keep memory flat, and far
#: under tornado's default 10 MiB websocket message limit.
KERNEL_CHUNK = 2 << 20
#: Seconds a quick kernel operation (poll, read) may take; file-system work gets LONG_OP.
QUICK_OP = 60.0
LONG_OP = 1800.0
FETCH_TAR = "fetch.tar"  # manifest.sh's stream, kept in the job directory until downloaded
#: Output files of at least this many bytes come down by themselves (parallel ranged GETs), not in the tar.
DIRECT_FROM = 16 << 20


class JupyterEngine(Engine):
    """A remote Jupyter Server: the far side's program runs in a kernel kept per engine, bytes move
    through the Contents API where it sees the job's folder, else through that kernel.

    Over 400 lines for a reason: it is its own transport (kernel messages, not a byte stream, so not
    a ``ShellEngine``) and each transfer has those two paths, chosen per job; splitting them would
    pass the kernel, the client and the job's transport between two classes on every call.
    """

    kind = "jupyter"
    label = "Jupyter Server"
    options: Mapping[str, OptionField] = {
        "token_secret": OptionField(
            str, "Name of the Secret Manager entry holding the server's token", required=True, secret_name=True
        ),
        "ca_bundle": OptionField(str, "Path to a CA certificate bundle, for a server with a private CA"),
        "base_dir": OptionField(
            str, f"Folder for jobs, relative to the server's root directory (default {DEFAULT_BASE_DIR})"
        ),
        "fetch_streams": OptionField(
            int,
            "Concurrent ranged GETs per big output (default 1, one streamed GET: fastest near the server; "
            "more can help over a long link)",
        ),
        **farside.CACHE_OPTIONS,
    }

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        super().__init__(name, address, options, context)
        self.url = self.validate_address(address)
        self.secret_name = str(self.machine_options.get("token_secret") or "")
        self.base_dir = _check_base_dir(str(self.machine_options.get("base_dir") or DEFAULT_BASE_DIR))
        streams = self.machine_options.get("fetch_streams") or 1
        if not (isinstance(streams, int) or str(streams).isdigit()) or not 1 <= int(streams) <= 16:
            raise EngineError("fetch_streams: must be a whole number from 1 to 16")
        self.fetch_streams = int(streams)
        self.client = ServerClient(
            self.url,
            self._token,
            refused=self._refused_message,
            ca_bundle=self.machine_options.get("ca_bundle") or None,
        )
        self._token_cache: Token | None = None
        self._lock = threading.RLock()  # one execution at a time on the kept kernel
        self._kernel_name: str | None = None
        self._kernel_id: str | None = None
        self._channel: KernelChannel | None = None

    def __repr__(self) -> str:
        return f"JupyterEngine(name={self.name!r}, url={self.url!r})"

    # -- addresses and secrets ----------------------------------------------------------
    @classmethod
    def validate_address(cls, address: str) -> str:
        address = super().validate_address(address)
        # The address is never echoed: a pasted URL may hold a token or a password.
        if any(c.isspace() for c in address):
            raise ValueError("address must be a URL without spaces or line breaks")
        try:
            parts = urlsplit(address)
            port = parts.port
        except ValueError:
            raise ValueError(
                "address must be an http:// or https:// URL, e.g. https://hub.example.org/user/ana/"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "address must be an http:// or https:// URL of a Jupyter Server, e.g. https://hub.example.org/user/ana/"
            )
        if "@" in parts.netloc:
            raise ValueError(
                "address must not hold credentials (user:password@…): store the token in the Secret Manager "
                "and name it in token_secret"
            )
        if parts.query or parts.fragment or "?" in address or "#" in address:
            raise ValueError(
                "address must not have a query or fragment (a ?token=… does not belong in it): store the token "
                "in the Secret Manager and name it in token_secret"
            )
        path = parts.path or "/"
        if not path.endswith("/"):
            path += "/"
        netloc = parts.hostname.lower() if ":" not in parts.hostname else f"[{parts.hostname.lower()}]"
        if port is not None:
            netloc += f":{port}"
        return urlunsplit((parts.scheme, netloc, path, "", ""))

    def _refused_message(self) -> str:
        self._token_cache = None  # read it again next time: the user may be updating it right now
        return (
            f"{self.url}: the token in secret '{self.secret_name}' was refused; update it with "
            f"`jupyter remote-compute secrets set {self.secret_name}`"
        )

    def _token(self) -> Token:
        if self._token_cache is None:
            value = self.context.get_secret(self.secret_name) if self.secret_name else None
            if not value:
                raise EngineError(
                    f"no token for {self.url}: the secret '{self.secret_name}' is not in the Secret Manager; "
                    f"store it with `jupyter remote-compute secrets set {self.secret_name}`"
                )
            self._token_cache = Token(value)
        return self._token_cache

    # -- kernels --------------------------------------------------------------------------
    def _python_kernel(self) -> str:
        if self._kernel_name is None:
            specs = self.client.call("GET", "api/kernelspecs")
            available = specs.get("kernelspecs") or {}
            names = [specs.get("default"), *sorted(available)]
            for name in names:
                spec = (available.get(name) or {}).get("spec") or {}
                if str(spec.get("language", "")).lower() == "python":
                    self._kernel_name = name
                    break
            else:
                raise EngineError(
                    f"no Python kernel is available on {self.url} (kernels: {', '.join(available) or 'none'})"
                )
        return self._kernel_name

    def _kept_channel(self) -> KernelChannel:
        if self._channel is None:
            if self._kernel_id is not None:
                try:
                    self._channel = KernelChannel(self.client, self._kernel_id)
                except KernelGone:
                    self._kernel_id = None  # the server restarted or culled it: start another
            if self._channel is None:
                self._kernel_id = self._start_kernel()
                self._channel = KernelChannel(self.client, self._kernel_id)
        return self._channel

    def _start_kernel(self) -> str:
        try:
            return self.client.start_kernel(self._python_kernel())
        except NotFoundOnServer:
            raise EngineError(f"{self.url} does not offer kernels (no /api/kernels): no kernel available") from None

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _far(self, op: str, *args: Any, timeout: float = QUICK_OP, blob: bytes | None = None) -> Any:
        """Run one far-side operation on the kept kernel (started or restarted as needed)."""
        expression = far_expression(op, args, blob)
        with self._lock:
            for attempt in (1, 2):
                try:
                    return decode_answer(self._kept_channel().execute(expression, timeout))
                except KernelGone:
                    self._drop_channel()
                    self._kernel_id = None
                    if attempt == 2:
                        raise EngineError(f"the kernel on {self.url} keeps going away", transient=True) from None
                except RemoteCodeError:
                    raise
                except EngineError:
                    # The websocket may be broken (server restarting): reconnect next time.
                    self._drop_channel()
                    raise
        raise AssertionError("unreachable")

    # -- the engine's operations ------------------------------------------------------------
    def check(self) -> dict[str, Any]:
        started = time.monotonic()
        self.client.call("GET", "api/status")
        rtt_ms = (time.monotonic() - started) * 1000
        version = (self.client.call("GET", "api") or {}).get("version")
        specs = self.client.call("GET", "api/kernelspecs") or {}
        found = self._sh(
            "facts", self.base_dir, *(str(self.machine_options.get(k) or "") for k in farside.INDEX_OPTIONS)
        )
        extras = {
            "server_version": version,
            "kernel_name": self._python_kernel(),
            "kernelspecs": sorted((specs.get("kernelspecs") or {}).keys()),
            "base_dir": self.base_dir,
            "transport": "kernel",  # how its far-side scripts run, as every kind reports
            "transfer": "contents" if self._contents_visible(self.base_dir) else "kernel",
        }
        return farside.parse_facts(found, rtt_ms, **extras).to_json()

    def _sh(
        self, name: str, *args: str, stdin: bytes = b"", timeout: float = QUICK_OP, out_path: str | None = None
    ) -> Any:
        """Run one far-side script from the kept kernel; its stdout, or the size of ``out_path`` it filled."""
        answer = self._far(
            "sh", farside.argv(name, *args), base64.b64encode(stdin).decode("ascii"), out_path, timeout=timeout
        )
        if answer["code"] != 0:
            raise EngineError(
                f"{self.name}: {name}.sh failed (exit code {answer['code']}): {answer['err'].strip()[-1500:]}"
            )
        return answer["size"] if out_path else base64.b64decode(answer["out"]).decode("utf-8", "replace")

    def _contents_visible(self, rel: str) -> bool:
        try:
            return self.client.exists(rel)
        except NotFoundOnServer:
            return False

    def prepare(self, job: RemoteJob) -> RemoteJob:
        rel = f"{self.base_dir}/jobs/{job.job_id}"
        # Relative to the kernel's working directory, the server's root: the script answers where it is.
        abs_dir = self._sh("prepare", *farside.prepare_args(rel, job.job_id, job.key)).strip().splitlines()[-1]
        # The Contents API must see the very job.json the kernel wrote; otherwise (a hidden base_dir,
        # contents that are not the kernel's disk) the bytes go through the kernel.
        transport = "contents" if self._contents_visible(f"{rel}/job.json") else "kernel"
        handle = {**job.handle, "dir": rel, "abs_dir": abs_dir, "transport": transport}
        return RemoteJob(job.job_id, job.key, handle)

    def _base_abs(self, job: RemoteJob) -> str:
        # <base>/jobs/<id> -> <base>, absolute on the far side
        return posixpath.dirname(posixpath.dirname(job.handle["abs_dir"]))

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        stats = SendStats()
        if not files:
            return stats
        for f in files:
            _check_relpath(f.relpath)
        jobdir, base = job.handle["abs_dir"], self._base_abs(job)
        # The one cache of farside/cache.sh: what it holds is linked into the work tree, the rest is
        # uploaded and then adopted into it.
        have = farside.parse_have(self._sh("cache", "have", base, stdin=farside.have_input(f.sha256 for f in files)))
        # Every name is linked (or, not cached, gets its folder for the upload; link says "missing").
        out = self._sh("cache", "link", base, jobdir, stdin=farside.link_input(files), timeout=LONG_OP)
        missing = set(farside.parse_marked(out, "missing"))
        total = sum(f.size for f in files)
        add = progress_adder(progress, total)
        needed = []
        for f in files:
            if have.get(f.sha256) != f.size or f.sha256 in missing:
                needed.append(f)
            else:
                stats.files_reused += 1
                add(f.size)
        for f in needed:
            self._upload(job, f, add)
            stats.files_sent += 1
            stats.bytes_sent += f.size
        if needed:
            out = self._sh("cache", "adopt", base, jobdir, stdin=farside.adopt_input(needed), timeout=LONG_OP)
            bad = farside.parse_marked(out, "bad")
            if bad:
                # Damaged or cut short on the way: the retry's plan re-sends exactly these.
                raise EngineError(f"inputs arrived damaged on {self.url}: {', '.join(bad)}", transient=True)
        days, max_bytes = farside.cache_limits(self.machine_options)
        self._sh("cache", "evict", base, str(days), str(max_bytes), timeout=LONG_OP)
        return stats

    def _upload(self, job: RemoteJob, f: InputFile, add: Any) -> None:
        if job.handle.get("transport") == "contents":
            sent = self.client.upload(f"{job.handle['dir']}/{WORK_DIR}/{f.relpath}", f.source, progress=add)
        else:
            target = posixpath.join(job.handle["abs_dir"], WORK_DIR, f.relpath)
            digest = hashlib.sha256()
            with open(f.source, "rb") as src:
                first = True
                while True:
                    data = src.read(KERNEL_CHUNK)
                    last = len(data) < KERNEL_CHUNK
                    digest.update(data)
                    self._far("put", target, first, last, timeout=LONG_OP, blob=data)
                    add(len(data))
                    first = False
                    if last:
                        break
            sent = digest.hexdigest()
        if sent != f.sha256:
            raise EngineError(f"send: {f.relpath!r} changed while it was being sent; submit the job again")

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        stdin = base64.b64encode(launch_input(launch.env, launch.secret_env)).decode("ascii")
        expression = far_expression("launch", [job.handle["abs_dir"], command_script(launch.command), stdin])
        secrets = [v for v in launch.secret_env.values() if v]
        secrets += [base64.b64encode(v.encode()).decode() for v in secrets]
        # A kernel of its own, deleted at once: its memory held the secrets.
        kernel_id = self._start_kernel()
        try:
            channel = KernelChannel(self.client, kernel_id)
            try:
                result = decode_answer(channel.execute(expression, QUICK_OP, scrub=secrets))
            finally:
                channel.close()
        finally:
            del expression
            try:
                self.client.delete_kernel(kernel_id)
            except EngineError as e:
                log.warning("%s: could not delete the launch kernel %s: %s", self.name, kernel_id, e)
        if "error" in result:
            raise EngineError(f"could not start the job on {self.url}: {result['error']}")
        return RemoteJob(job.job_id, job.key, {**job.handle, "pid": result["pid"]})

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return self.poll_watched(jobs, {})[0]

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        known = [j for j in jobs if j.handle.get("abs_dir")]
        out = {j.job_id: RemoteStatus("gone", detail="the job was never prepared") for j in jobs if j not in known}
        if not known:
            return out, {}
        watching = any(j.job_id in watched for j in known)
        words = farside.status_words([j.handle["abs_dir"] for j in known], watching)
        answer = self._sh("status", *words, stdin=farside.watch_input(known, watched) if watching else b"")
        # Metric files hold ASCII numbers only, so the text answer gives back the bytes the script sent.
        text, blob = farside.split_metrics(answer.encode("utf-8", "surrogateescape"))
        out.update(farside.parse_status(text, known, self.name))
        return out, farside.parse_metrics(blob, known)

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        if not job.handle.get("abs_dir") or limit <= 0:
            return b""
        if job.handle.get("transport") == "contents":
            data = self.client.read_range(f"{job.handle['dir']}/log", offset, limit)
            if data is not None:
                return data
        return self._far("read", posixpath.join(job.handle["abs_dir"], "log"), offset, min(limit, KERNEL_CHUNK))

    def cancel(self, job: RemoteJob, grace: float) -> None:
        if not job.handle.get("abs_dir"):
            return
        self._sh("cancel", job.handle["abs_dir"], farside.cancel_ticks(grace), timeout=grace + QUICK_OP)

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        for output in outputs:
            _check_relpath(output)
        jobdir = job.handle["abs_dir"]
        manifest = f".fetch-{uuid.uuid4().hex}"
        if job.handle.get("transport") != "contents":
            return self._fetch_through_kernel(job, outputs, dest, manifest, progress)
        # manifest.sh's stream, kept as one file there, without the big files: those come down by
        # themselves (one streamed GET each, or fetch_streams concurrent ranges) while the kernel
        # hashes them, and land under the same policy. The stream itself is read as it downloads.
        argv = farside.argv("manifest", "--direct", str(DIRECT_FROM), jobdir, manifest, *outputs)
        packed = self._far("pack", argv, posixpath.join(jobdir, FETCH_TAR), timeout=LONG_OP)
        if packed["code"] != 0:
            raise EngineError(
                f"{self.name}: manifest.sh failed (exit code {packed['code']}): {packed['err'].strip()[-1500:]}"
            )
        big = farside.direct_files(base64.b64decode(packed["head"]))
        add = progress_adder(progress, packed["size"] + sum(size for _, size, _ in big))
        outputs_big = [rel for rel, _, _ in big if rel.startswith(WORK_DIR + "/")]  # mlruns/ is not verified
        hashing = _Background(self._far, "hash_files", jobdir, outputs_big, timeout=LONG_OP) if outputs_big else None
        extractor = farside.output_extractor(outputs, dest, self.name)
        try:
            chunks = _Counted(self.client.stream(f"{job.handle['dir']}/{FETCH_TAR}"), add)
            result = farside.receive_outputs(chunks.read, outputs, dest, manifest, self.name, extractor=extractor)
            for rel, size, mode in big:
                extractor.extract_file(rel, mode, self._big_file(job, rel, size), add)
        except BaseException as e:
            if hashing is not None:
                hashing.wait()  # it holds the kernel; its own outcome no longer matters
            if isinstance(e, farside.UnsafeArchive):
                extractor.discard()
            raise
        far = hashing.result() if hashing is not None else {}
        for rel, digest in far.items():
            result.digests[rel.removeprefix(WORK_DIR + "/")] = digest
            result.received[rel.removeprefix(WORK_DIR + "/")] = extractor.digests[rel]
        return result

    def _big_file(self, job: RemoteJob, rel: str, size: int) -> Iterator[bytes | bytearray]:
        """One file of the job directory, ``size`` bytes: ranged ``/files/`` GETs, or the kernel if it is hidden."""
        try:
            yield from self.client.ranges(f"{job.handle['dir']}/{rel}", size, streams=self.fetch_streams)
            return
        except NotFoundOnServer:
            pass  # a hidden part in its path (allow_hidden is off): the kernel reads it
        source = posixpath.join(job.handle["abs_dir"], rel)
        offset = 0
        while offset < size:
            data = self._far("read", source, offset, min(KERNEL_CHUNK, size - offset), timeout=LONG_OP)
            if not data:
                raise EngineError(f"{rel} shrank on {self.url} while it was being fetched", transient=True)
            offset += len(data)
            yield data

    def _fetch_through_kernel(
        self, job: RemoteJob, outputs: Sequence[str], dest: Path, manifest: str, progress: ProgressCallback | None
    ) -> FetchResult:
        jobdir = job.handle["abs_dir"]
        # manifest.sh's tar stream, kept as one file there and downloaded whole, then read here under
        # the same policy as every other engine's.
        size = self._sh(
            "manifest", jobdir, manifest, *outputs, out_path=posixpath.join(jobdir, FETCH_TAR), timeout=LONG_OP
        )
        tar_path = dest.parent / f"{dest.name}.{FETCH_TAR}"
        try:
            self._download(job, FETCH_TAR, tar_path, progress_adder(progress, size))
            if tar_path.stat().st_size != size:
                raise EngineError(f"the outputs of job {job.job_id} arrived cut short", transient=True)
            return farside.extract_archive(tar_path, outputs, dest, manifest, self.name)
        finally:
            tar_path.unlink(missing_ok=True)

    def _download(self, job: RemoteJob, rel: str, target: Path, add: Any) -> None:
        """One file of the job directory to ``target``, streamed; through the kernel if need be."""
        with open(target, "wb") as sink:
            if job.handle.get("transport") == "contents":
                self.client.download(f"{job.handle['dir']}/{rel}", sink, progress=add)
                return
            source = posixpath.join(job.handle["abs_dir"], rel)
            offset = 0
            while True:
                data = self._far("read", source, offset, KERNEL_CHUNK, timeout=LONG_OP)
                sink.write(data)
                offset += len(data)
                add(len(data))
                if len(data) < KERNEL_CHUNK:
                    return

    def cleanup(self, job: RemoteJob) -> None:
        if job.handle.get("abs_dir"):
            self._sh("cleanup", job.handle["abs_dir"], job.job_id, timeout=LONG_OP)

    def close(self) -> None:
        with self._lock:
            self._drop_channel()
            kernel_id, self._kernel_id = self._kernel_id, None
            if kernel_id:
                try:
                    self.client.delete_kernel(kernel_id)
                except EngineError as e:
                    log.info("%s: could not shut down kernel %s: %s", self.name, kernel_id, e)


class _Background:
    """One call run in a thread; ``result()`` waits for it and returns its value or raises its error."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args, **kwargs)
            except BaseException as e:  # handed to the caller of result()
                self._error = e

        self._thread = threading.Thread(target=run, name="jrc-far-hash", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class _Counted:
    """``read(n)`` over an iterator of byte blocks, counting what passes (the tar reader's input)."""

    def __init__(self, blocks: Iterator[bytes], add: Callable[[int], None]) -> None:
        self._blocks = blocks
        self._add = add
        self._rest = b""

    def read(self, n: int) -> bytes:
        if not self._rest:
            self._rest = next(self._blocks, b"")
            self._add(len(self._rest))
        data, self._rest = self._rest[:n], self._rest[n:]
        return data


def _check_base_dir(base: str) -> str:
    p = PurePosixPath(base)
    if base.startswith(("/", "~")) or ".." in p.parts or "\\" in base or not p.parts or str(p) == ".":
        raise EngineError(f"base_dir must be a folder relative to the server's root directory, not {base!r}")
    return str(p)


def _check_relpath(rel: str) -> None:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or ".." in parts:
        raise EngineError(f"{rel!r} is not a path inside the job's work tree")
