"""A machine reached through a Jupyter Server's REST API (a JupyterHub user server, a lab box, …).

Bulk data moves over HTTP: inputs up through the Contents API with JupyterLab's chunked-upload
protocol, outputs down from ``/files/`` (streamed, ranged for the log). Everything that needs the
far host itself — directories, hashes, starting the detached command, process groups, cancelling,
a tar of ``mlruns/`` — runs as a few lines of Python in a kernel, one execution per operation:

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
import json
import logging
import posixpath
import shutil
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .base import (
    TRACKING_DIR,
    WORK_DIR,
    Engine,
    EngineContext,
    EngineError,
    FetchResult,
    InputFile,
    LaunchSpec,
    OptionField,
    ProgressCallback,
    RemoteJob,
    RemoteStatus,
    SendStats,
)
from .jupyter_contents import (
    KernelChannel,
    KernelGone,
    NotFoundOnServer,
    RemoteCodeError,
    ServerClient,
    Token,
    progress_adder,
)
from .launcher import LAUNCH_SH, RUN_SH, command_script, launch_input

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
MLRUNS_TAR = "mlruns.tar"

# The far side: stdlib-only Python the kernel runs. Every call execs this source in a fresh
# namespace and calls one function with JSON arguments; the answer is JSON (or bytes), base64'd
# so IPython's pretty printer cannot reshape it. Paths are absolute (learned in ``prepare``)
# except ``prepare``'s base, which is relative to the kernel's cwd, the server's root_dir.
FAR_SIDE = r"""
import base64, hashlib, json, os, shutil, signal, subprocess, sys, tarfile, time

BLOCK = 1 << 20
CACHE_MAX_AGE = 7 * 86400


def _sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(BLOCK)
            if not b:
                return h.hexdigest()
            h.update(b)


def _inside(root, path):
    root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def _under(root, rel):
    # A work-relative POSIX path; refuse anything that climbs out or is absolute.
    if rel.startswith("/") or ".." in rel.split("/"):
        raise ValueError("path leaves the job directory: " + rel)
    return os.path.join(root, *rel.split("/"))


def _write(path, text, mode=0o644):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _jobdir(d):
    # Every absolute job directory we are handed must look like one of ours.
    if not (os.path.isabs(d) and os.path.basename(os.path.dirname(d)) == "jobs"):
        raise ValueError("not a job directory: " + d)
    return d


def prepare(base, job_id, key, scripts):
    jobdir = os.path.abspath(os.path.join(base, "jobs", job_id))
    # mlruns/ is left for MLflow to make: its file store only creates the default experiment
    # when the folder does not exist yet.
    os.makedirs(os.path.join(jobdir, "work"), exist_ok=True)
    for name, text in scripts.items():
        _write(os.path.join(jobdir, name), text, 0o755 if name.endswith(".sh") else 0o644)
    _write(os.path.join(jobdir, "job.json"), json.dumps({"job_id": job_id, "key": key}) + "\n")
    return {"abs_dir": jobdir, "root": os.getcwd()}


def _cache_path(cache, sha):
    return os.path.join(cache, sha[:2], sha)


def plan(jobdir, cache, entries):
    # What the far side already holds: the file in place (a retry), or the same bytes in the cache.
    work = os.path.join(_jobdir(jobdir), "work")
    out = {}
    now = time.time()
    for rel, size, sha, mode in entries:
        path = _under(work, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.isfile(path) and os.path.getsize(path) == size and _sha(path) == sha:
            os.chmod(path, mode)
            out[rel] = "have"
            continue
        cached = _cache_path(cache, sha)
        if os.path.isfile(cached) and os.path.getsize(cached) == size and _sha(cached) == sha:
            tmp = path + ".jrc-part"
            shutil.copyfile(cached, tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
            os.utime(cached, (now, now))
            out[rel] = "reused"
            continue
        out[rel] = "need"
    _prune(cache, now)
    return out


def _prune(cache, now):
    try:
        shards = os.listdir(cache)
    except OSError:
        return
    for shard in shards:
        try:
            for entry in os.scandir(os.path.join(cache, shard)):
                if now - entry.stat().st_mtime > CACHE_MAX_AGE:
                    os.unlink(entry.path)
        except OSError:
            pass


def finish(jobdir, cache, entries):
    # Check what arrived, set modes (the Contents API cannot) and remember the bytes for next time.
    # The sender hashed the bytes it sent; here a full size says they all arrived. Whatever is
    # reused later (in place or from the cache) is re-hashed by plan first.
    work = os.path.join(_jobdir(jobdir), "work")
    bad = []
    for rel, size, sha, mode in entries:
        path = _under(work, rel)
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            bad.append(rel)
            continue
        os.chmod(path, mode)
        target = _cache_path(cache, sha)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = target + "." + str(os.getpid()) + ".tmp"
            os.link(path, tmp)  # no extra space; a job that edits its input is caught by plan's re-hash
            os.replace(tmp, target)
        except OSError:
            pass
    return {"bad": bad}


def put(path, first, last, data):
    # Kernel transport, upload: append one chunk to <path>.jrc-part, rename it into place at the end.
    part = path + ".jrc-part"
    with open(part, "wb" if first else "ab") as f:
        f.write(data)
    if last:
        os.replace(part, path)
    return {}


def read(path, offset, limit):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""


def _groups():
    # Live (not zombie) members per process group, from /proc.
    counts = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            counts[int(fields[2])] = counts.get(int(fields[2]), 0) + 1
    return counts


def _alive(pgid, groups):
    if groups is not None:
        return groups.get(pgid, 0) > 0
    try:  # no /proc (macOS): the group exists; a zombie-only group counts as alive here
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _exit_code(jobdir):
    try:
        with open(os.path.join(jobdir, "exit_code")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def status(jobs):
    groups = _groups() if os.path.isdir("/proc") else None
    out = {}
    for job_id, jobdir, pid in jobs:
        try:
            size = os.path.getsize(os.path.join(jobdir, "log"))
        except OSError:
            size = 0
        code = _exit_code(jobdir)
        if code is not None:
            out[job_id] = ["exited", code, size]
        elif pid and _alive(pid, groups):
            out[job_id] = ["running", None, size]
        else:
            code = _exit_code(jobdir)  # it may have ended between the two looks
            out[job_id] = ["exited", code, size] if code is not None else ["gone", None, size]
    return out


def launch(jobdir, command, stdin):
    _jobdir(jobdir)
    _write(os.path.join(jobdir, "command.sh"), command, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "PYDEVD_")) and k != "MPLBACKEND"}
    # `python` in the command is the kernel's interpreter, as it is in a notebook on that server.
    bindir = os.path.dirname(sys.executable)
    path = env.get("PATH", "")
    if path.split(os.pathsep)[:1] != [bindir]:
        env["PATH"] = bindir + os.pathsep + path
    try:
        proc = subprocess.run(
            ["sh", os.path.join(jobdir, "launch.sh"), jobdir],
            input=base64.b64decode(stdin), capture_output=True, timeout=60, env=env,
        )
    except Exception as e:
        return {"error": type(e).__name__}
    if proc.returncode != 0:
        return {"error": "launcher exit %d: %s" % (proc.returncode, proc.stderr.decode(errors="replace")[-500:])}
    return {"pid": int(proc.stdout.split()[-1])}


def cancel(pgid, grace):
    def members():
        groups = _groups() if os.path.isdir("/proc") else None
        return _alive(pgid, groups)

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return {"survivors": False}
        deadline = time.time() + wait
        while members() and time.time() < deadline:
            time.sleep(0.05)
        if not members():
            return {"survivors": False}
    return {"survivors": True}


def manifest(jobdir, outputs):
    # sha256 of every file under each declared output (inside work/ only), and mlruns/ as one tar.
    work = os.path.join(_jobdir(jobdir), "work")
    files = {}
    missing = []
    for out in outputs:
        try:
            path = _under(work, out)
        except ValueError:
            missing.append(out)
            continue
        if not os.path.exists(path) or not _inside(work, path):
            missing.append(out)
        elif os.path.isfile(path):
            files[out] = [os.path.getsize(path), _sha(path)]
        else:
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames.sort()
                for name in sorted(filenames):
                    full = os.path.join(dirpath, name)
                    if os.path.isfile(full) and _inside(work, full):
                        rel = os.path.relpath(full, work).replace(os.sep, "/")
                        files[rel] = [os.path.getsize(full), _sha(full)]
    tar = None
    mlruns = os.path.join(jobdir, "mlruns")
    if os.path.isdir(mlruns):
        part = os.path.join(jobdir, "mlruns.tar.part")
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as t:
            t.add(mlruns, arcname=".")
        os.replace(part, os.path.join(jobdir, "mlruns.tar"))
        tar = [os.path.getsize(os.path.join(jobdir, "mlruns.tar")), _sha(os.path.join(jobdir, "mlruns.tar"))]
    return {"files": files, "missing": missing, "tar": tar}


def cleanup(jobdir, job_id):
    _jobdir(jobdir)
    try:
        with open(os.path.join(jobdir, "job.json")) as f:
            if json.load(f).get("job_id") != job_id:
                return {"removed": False}
    except (OSError, ValueError):
        return {"removed": False}
    shutil.rmtree(jobdir, ignore_errors=True)
    return {"removed": True}


def facts(base):
    import platform
    gpus = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, timeout=20, text=True).stdout
            gpus = [line.strip() for line in out.splitlines() if line.strip()]
        except Exception:
            pass
    where = base if os.path.isdir(base) else os.getcwd()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {
        "os": platform.system(), "kernel": platform.release(), "python": platform.python_version(),
        "python_executable": sys.executable, "cpus": os.cpu_count(), "memory_bytes": memory, "gpus": gpus,
        "disk_free_bytes": shutil.disk_usage(where).free, "root_dir": os.getcwd(),
    }


def call(op, args, blob=None):
    value = globals()[op](*args) if blob is None else globals()[op](*args, base64.b64decode(blob))
    if isinstance(value, bytes):
        return "B" + base64.b64encode(value).decode()
    return "J" + base64.b64encode(json.dumps(value).encode()).decode()
"""

_FAR_B64 = base64.b64encode(FAR_SIDE.encode()).decode()


def _far_expression(op: str, args: Sequence[Any], blob: bytes | None = None) -> str:
    """One Python expression that runs ``op(*args[, blob])`` from FAR_SIDE in a namespace of its own.

    It travels as a user expression of an otherwise empty execute request: the kernel ``eval``s
    it directly, skipping IPython's cell machinery (input transformers, which crawl over
    megabytes of base64, and the linecache copy of every cell, which would keep start's secrets).
    ``blob`` (bulk data) rides as its own base64 literal rather than inside the JSON arguments.
    """
    payload = base64.b64encode(json.dumps([op, list(args)]).encode()).decode()
    extra = "" if blob is None else ", '" + base64.b64encode(blob).decode("ascii") + "'"
    return (
        "(lambda b, j, ns: (exec(compile(b.b64decode('" + _FAR_B64 + "'), '<jupyter-remote-compute>', 'exec'), ns),"
        " ns['call'](*j.loads(b.b64decode('" + payload + "'))" + extra + "))[1])"
        "(__import__('base64'), __import__('json'), {'__name__': '__jrc_far__'})"
    )


def _decode(value: str) -> Any:
    kind, body = value[:1], value[1:]
    data = base64.b64decode(body)
    return data if kind == "B" else json.loads(data)


class JupyterEngine(Engine):
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
    }

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        super().__init__(name, address, options, context)
        self.url = self.validate_address(address)
        self.secret_name = str(self.machine_options.get("token_secret") or "")
        self.base_dir = _check_base_dir(str(self.machine_options.get("base_dir") or DEFAULT_BASE_DIR))
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
                    self._channel = self.client.connect(self._kernel_id)
                except KernelGone:
                    self._kernel_id = None  # the server restarted or culled it: start another
            if self._channel is None:
                self._kernel_id = self._start_kernel()
                self._channel = self.client.connect(self._kernel_id)
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
        expression = _far_expression(op, args, blob)
        with self._lock:
            for attempt in (1, 2):
                try:
                    return _decode(self._kept_channel().execute(expression, timeout))
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
        facts = self._far("facts", self.base_dir)
        return {
            "server_version": version,
            "kernelspecs": sorted((specs.get("kernelspecs") or {}).keys()),
            "kernel": self._python_kernel(),
            **facts,
            "rtt_ms": round(rtt_ms, 1),
            "base_dir": self.base_dir,
            "transfer": "contents" if self._contents_visible(self.base_dir) else "kernel",
        }

    def _contents_visible(self, rel: str) -> bool:
        try:
            return self.client.exists(rel)
        except NotFoundOnServer:
            return False

    def prepare(self, job: RemoteJob) -> RemoteJob:
        scripts = {"launch.sh": LAUNCH_SH, "run.sh": RUN_SH}
        made = self._far("prepare", self.base_dir, job.job_id, job.key, scripts)
        rel = f"{self.base_dir}/jobs/{job.job_id}"
        # The Contents API must see the very job.json the kernel wrote; otherwise (a hidden base_dir,
        # contents that are not the kernel's disk) the bytes go through the kernel.
        transport = "contents" if self._contents_visible(f"{rel}/job.json") else "kernel"
        handle = {**job.handle, "dir": rel, "abs_dir": made["abs_dir"], "transport": transport}
        return RemoteJob(job.job_id, job.key, handle)

    def _cache_dir(self, job: RemoteJob) -> str:
        # <base>/jobs/<id> -> <base>/cache
        return posixpath.join(posixpath.dirname(posixpath.dirname(job.handle["abs_dir"])), "cache")

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        stats = SendStats()
        if not files:
            return stats
        for f in files:
            _check_relpath(f.relpath)
        entries = [[f.relpath, f.size, f.sha256, f.mode] for f in files]
        jobdir, cache = job.handle["abs_dir"], self._cache_dir(job)
        plan = self._far("plan", jobdir, cache, entries, timeout=LONG_OP)
        total = sum(f.size for f in files)
        add = progress_adder(progress, total)
        needed = []
        for f in files:
            if plan.get(f.relpath) == "need":
                needed.append(f)
            else:
                stats.files_reused += 1
                add(f.size)
        for f in needed:
            self._upload(job, f, add)
            stats.files_sent += 1
            stats.bytes_sent += f.size
        if needed:
            done = self._far(
                "finish", jobdir, cache, [[f.relpath, f.size, f.sha256, f.mode] for f in needed], timeout=LONG_OP
            )
            if done["bad"]:
                # Damaged or cut short on the way: the retry's plan re-sends exactly these.
                raise EngineError(f"inputs arrived damaged on {self.url}: {', '.join(done['bad'])}", transient=True)
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
        expression = _far_expression("launch", [job.handle["abs_dir"], command_script(launch.command), stdin])
        secrets = [v for v in launch.secret_env.values() if v]
        secrets += [base64.b64encode(v.encode()).decode() for v in secrets]
        # A kernel of its own, deleted at once: its memory held the secrets.
        kernel_id = self._start_kernel()
        try:
            channel = self.client.connect(kernel_id)
            try:
                result = _decode(channel.execute(expression, QUICK_OP, scrub=secrets))
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
        known = [j for j in jobs if j.handle.get("abs_dir")]
        out = {j.job_id: RemoteStatus("gone", detail="the job was never prepared") for j in jobs if j not in known}
        if not known:
            return out
        raw = self._far("status", [[j.job_id, j.handle["abs_dir"], j.handle.get("pid")] for j in known])
        for j in known:
            state, code, size = raw[j.job_id]
            detail = "" if state != "gone" else f"process group {j.handle.get('pid')} is gone without an exit code"
            out[j.job_id] = RemoteStatus(state, exit_code=code, log_size=size, detail=detail)
        return out

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        if not job.handle.get("abs_dir") or limit <= 0:
            return b""
        if job.handle.get("transport") == "contents":
            data = self.client.read_range(f"{job.handle['dir']}/log", offset, limit)
            if data is not None:
                return data
        return self._far("read", posixpath.join(job.handle["abs_dir"], "log"), offset, min(limit, KERNEL_CHUNK))

    def cancel(self, job: RemoteJob, grace: float) -> None:
        pgid = job.handle.get("pid")
        if not pgid:
            return
        result = self._far("cancel", pgid, grace, timeout=grace + QUICK_OP)
        if result["survivors"]:
            raise EngineError(f"processes of job {job.job_id} (group {pgid}) survived SIGKILL on {self.url}")

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        for output in outputs:
            _check_relpath(output)
        found = self._far("manifest", job.handle["abs_dir"], list(outputs), timeout=LONG_OP)
        result = FetchResult(missing=list(found["missing"]))
        total = sum(size for size, _ in found["files"].values()) + (found["tar"][0] if found["tar"] else 0)
        add = progress_adder(progress, total)
        for rel, (_size, sha) in found["files"].items():
            _check_relpath(rel)
            target = dest / WORK_DIR / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            self._download(job, f"{WORK_DIR}/{rel}", target, add)
            result.digests[rel] = sha
        if found["tar"]:
            size, sha = found["tar"]
            tar_path = dest / (MLRUNS_TAR + ".part")
            self._download(job, MLRUNS_TAR, tar_path, add)
            from ..fsutil import sha256_file

            if tar_path.stat().st_size != size or sha256_file(tar_path) != sha:
                tar_path.unlink()
                raise EngineError(f"the MLflow records of job {job.job_id} arrived damaged", transient=True)
            try:
                _extract_safely(tar_path, dest / TRACKING_DIR)
            finally:
                tar_path.unlink()
        return result

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
            self._far("cleanup", job.handle["abs_dir"], job.job_id, timeout=LONG_OP)

    def close(self) -> None:
        with self._lock:
            self._drop_channel()
            kernel_id, self._kernel_id = self._kernel_id, None
            if kernel_id:
                try:
                    self.client.delete_kernel(kernel_id)
                except EngineError as e:
                    log.info("%s: could not shut down kernel %s: %s", self.name, kernel_id, e)


def _check_base_dir(base: str) -> str:
    p = PurePosixPath(base)
    if base.startswith(("/", "~")) or ".." in p.parts or "\\" in base or not p.parts or str(p) == ".":
        raise EngineError(f"base_dir must be a folder relative to the server's root directory, not {base!r}")
    return str(p)


def _check_relpath(rel: str) -> None:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or ".." in parts:
        raise EngineError(f"{rel!r} is not a path inside the job's work tree")


def _extract_safely(tar_path: Path, dest: Path) -> None:
    """Unpack regular files and directories only; refuse entries that would land outside ``dest``.

    Links, devices and FIFOs are skipped (an MLflow store holds none), as is anything absolute or
    climbing out with ``..``. Files are written by us, so a member cannot set modes or owners.
    """
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    with tarfile.open(tar_path, "r:") as archive:
        for member in archive:
            name = member.name
            parts = PurePosixPath(name).parts
            if name.startswith("/") or ".." in parts or "\\" in name:
                log.warning("mlruns archive: refused %r (outside the store)", name)
                continue
            parts = tuple(p for p in parts if p != ".")
            if not parts:
                continue
            target = root.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            if not member.isfile():
                log.warning("mlruns archive: refused %r (not a regular file)", name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if root not in target.parent.resolve().parents and target.parent.resolve() != root:
                log.warning("mlruns archive: refused %r (outside the store)", name)
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
