"""Machines reached over SSH, needing only POSIX sh, tar and coreutils on the far side.

Every call is an exec channel of the engine's one connection (``ssh_connection.py``:
route, sign-in, host keys, reconnecting): the user's own OpenSSH client over a
master connection this process owns where ``ssh`` is installed
(``ssh_openssh.py``), paramiko otherwise (option ``ssh_transport`` chooses);
the far-side work is the shared
contract of ``farside/`` (status, cancel, manifest, cache, facts), run over it.
Only sending inputs is ssh's own: one tar stream that answers the cache query
first and then carries just the missing objects.

Far-side layout (``base_dir``, default ``~/.jupyter-remote-compute``)::

    <base>/cache/<sha256>          inputs by content, read-only, written by rename (farside/cache.sh)
    <base>/jobs/<job id>/          the job directory of ``base.py`` (work/, mlruns/, log, ...)

Inputs are hard links into the cache, so a re-sent file costs a name, not its
bytes. Every value put into a far-side command is quoted; file names travel
inside tar headers, never through a shell.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import paramiko

from . import farside, ssh_config, ssh_openssh
from .base import (
    WORK_DIR,
    Engine,
    EngineContext,
    EngineError,
    Features,
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
from .launcher import command_script, launch_input
from .ssh_connection import (
    CALL_TIMEOUT,
    AuthenticationFailed,
    Dropped,
    HostKeyChanged,
    HostKeyUnknown,
    ParamikoConnection,
    Result,
    dropped_under,
    feed,
    quote,
    send_view,
    sh_script,
)
from .ssh_transfer import (
    BLOCK,
    CHUNK,
    END_OF_ARCHIVE,
    SafeExtractor,
    TarReader,
    UnsafeArchive,
    check_digests,
    check_relpath,
    check_relpaths,
    padding,
    tar_header,
)

DEFAULT_BASE_DIR = "~/.jupyter-remote-compute"
READ_AHEAD = 3  # chunks read and hashed ahead of the one being sent
SMALL_FILE = 256 << 10  # inputs up to this size are read whole and batched with their neighbours
_UNSAFE_ADDRESS = re.compile(r"[\s;&|<>()$`\\\"'*?\[\]{}!#~^,]")
_ONE_LINE = re.compile(r"^[^\r\n\0]+$")
TRANSPORTS = ("auto", "openssh", "paramiko")
# The process-wide default for machines that do not choose (tests that must not run a real ssh client set it).
TRANSPORT_ENV = "JUPYTER_REMOTE_COMPUTE_SSH_TRANSPORT"


def choose_transport(options: Mapping[str, Any]) -> str:
    """``openssh`` or ``paramiko``: the machine's ``ssh_transport``, else the environment's, else ``auto``.

    ``auto`` is OpenSSH where an ``ssh`` client is on PATH, paramiko otherwise.
    """
    wanted = options.get("ssh_transport") or os.environ.get(TRANSPORT_ENV) or "auto"
    if wanted not in TRANSPORTS:
        raise EngineError(f"ssh_transport: {wanted!r} is not one of {', '.join(TRANSPORTS)}")
    if wanted == "openssh" and not ssh_openssh.available():
        raise EngineError("ssh_transport: openssh was chosen, but no ssh client is on PATH (install openssh-client)")
    if wanted == "auto":
        return "openssh" if ssh_openssh.available() else "paramiko"
    return wanted


class SSHEngine(Engine):
    """A machine reached over SSH: the user's agent and ssh config, host keys from known_hosts."""

    kind = "ssh"
    label = "SSH"
    features = Features(host_keys=True)
    options = {
        **farside.CACHE_OPTIONS,
        "user": OptionField(str, "User name on the machine (default: from ssh config, else your local name)"),
        "port": OptionField(int, "SSH port (default: from ssh config, else 22)"),
        "identity_file": OptionField(str, "Private key file to sign in with (default: ssh-agent and ssh config)"),
        "base_dir": OptionField(str, f"Directory for jobs and the input cache on the machine ({DEFAULT_BASE_DIR})"),
        "known_hosts": OptionField(str, "known_hosts file checked and written (default ~/.ssh/known_hosts)"),
        "ssh_config": OptionField(str, "ssh config file read for the address (default ~/.ssh/config)"),
        "ssh_transport": OptionField(
            str, "auto (your ssh client where installed, else built-in), openssh or paramiko (built-in)"
        ),
    }

    def __init__(self, name: str, address: str, options: Mapping[str, Any], context: EngineContext) -> None:
        super().__init__(name, self.validate_address(address), options, context)
        for key in ("base_dir", "known_hosts", "ssh_config", "identity_file", "user", "ssh_transport"):
            value = self.machine_options.get(key)
            if value is not None and (not isinstance(value, str) or not _ONE_LINE.match(value)):
                raise EngineError(f"{key}: must be a non-empty single line")
        port = self.machine_options.get("port")
        if isinstance(port, str) and port.isdigit():
            port = self.machine_options["port"] = int(port)
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise EngineError("port: must be a number from 1 to 65535")
        self.base_dir = self.machine_options.get("base_dir") or DEFAULT_BASE_DIR
        transport = choose_transport(self.machine_options)
        connection = ssh_openssh.OpenSSHConnection if transport == "openssh" else ParamikoConnection
        self.connection = connection(name, self.address, self.machine_options)
        # Shorthands: the engine runs every far-side command through its connection.
        self._run = self.connection.run
        self._channel = self.connection.channel
        self._lost = self.connection.lost
        self._drain_stderr = self.connection.drain_stderr
        self._finish = self.connection.finish

    @classmethod
    def is_transient(cls, error: Exception) -> bool:
        # paramiko reports a connection that went away as SSHException or EOFError.
        return isinstance(error, paramiko.SSHException | EOFError) or super().is_transient(error)

    @property
    def channels_opened(self) -> int:
        """Exec channels opened so far (tests count round trips with it)."""
        return self.connection.channels_opened

    @property
    def connections_made(self) -> int:
        """Connections made so far (1 + reconnects)."""
        return self.connection.connections_made

    def hop(self) -> ssh_config.Hop:
        """The resolved route to the machine."""
        return self.connection.hop()

    def host_key(self) -> tuple[str, str]:
        """The machine's host key as (type, ``SHA256:`` fingerprint), without signing in to it."""
        return self.connection.host_key()

    def trust_host(self, expected_fingerprint: str | None = None) -> str:
        return self.connection.trust_host(expected_fingerprint)

    def close(self) -> None:
        self.connection.close()

    # -- address and options ------------------------------------------------------

    @classmethod
    def validate_address(cls, address: str) -> str:
        address = super().validate_address(address)
        if address.startswith("-") or _UNSAFE_ADDRESS.search(address):
            raise ValueError(
                "address: use a host name, an IP address or an ssh config alias, optionally user@host "
                "(no spaces, no shell characters, not starting with '-')"
            )
        return address

    # -- far-side paths ------------------------------------------------------------

    def _base_expr(self) -> str:
        """The base dir as a sh word: ``~`` becomes "$HOME", a relative path is under the home dir."""
        base = self.base_dir
        if base == "~":
            return '"$HOME"'
        if base.startswith("~/"):
            return '"$HOME"/' + quote(base[2:])
        if base.startswith("/"):
            return quote(base)
        return '"$HOME"/' + quote(base)

    @staticmethod
    def _dir(job: RemoteJob) -> str:
        d = job.handle.get("dir") if job.handle else None
        if not isinstance(d, str) or not d.startswith("/"):
            raise EngineError(f"job {job.job_id}: no job directory on the machine yet (prepare it first)")
        return d

    # -- the job's life -------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        rtt_ms = self.connection.round_trip() * 1000
        res = self._run(farside.command_line("facts", self._base_expr()), timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: check"))
        return farside.parse_facts(res.text(), rtt_ms, transport=self.connection.transport_name).to_json()

    def prepare(self, job: RemoteJob) -> RemoteJob:
        check_relpath(job.job_id, "job id")
        if "/" in job.job_id:
            raise ValueError(f"job id: {job.job_id!r} must be a single name")
        prepare = farside.command_line(
            "prepare", '"$d"', *(quote(a) for a in farside.prepare_args("", job.job_id, job.key)[1:])
        )
        body = f"""set -e
base={self._base_expr()}
if ! (umask 077 && mkdir -p -- "$base/jobs" "$base/cache"); then
  echo "cannot create the base folder $base (base_dir): choose a folder this user may write" >&2
  exit 3
fi
d="$base/jobs/"{quote(job.job_id)}
{prepare}
"""
        res = self._run(body, timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: preparing job {job.job_id}"))
        path = res.text().strip().splitlines()[-1]
        if not path.startswith("/"):
            raise EngineError(f"{self.name}: unexpected job directory {path!r}")
        return dataclasses.replace(job, handle={**(job.handle or {}), "dir": path})

    def send(self, job: RemoteJob, files: Sequence[InputFile], progress: ProgressCallback | None = None) -> SendStats:
        d = self._dir(job)
        stats = SendStats()
        if not files:
            return stats
        check_relpaths([f.relpath for f in files], "input")
        check_digests([f.sha256 for f in files])
        base = posixpath.dirname(posixpath.dirname(d))
        job_rel = posixpath.relpath(d, base)
        days, max_bytes = farside.cache_limits(self.machine_options)
        incoming = f"cache/.incoming-{uuid.uuid4().hex}"
        kept = f"sets/{input_set_digest(files)}"
        # One channel does it all. First the fast path of an unchanged re-send: the far side keeps, per
        # input set, a spare work tree of hard links to the cache, checked unaltered since it was made
        # (no file in it newer than its stamp; find's own errors count as a difference). Taking it is
        # one rename, and a fresh spare is built in the background for the next time (one at a time).
        # Otherwise the far side asks for the digest list, answers which digests its cache holds
        # (farside/cache.sh have: the list on stdin ends with an empty line, and sh's read takes it a
        # byte at a time, so nothing after it is consumed), then unpacks the tar stream sent after that
        # answer: objects into a private incoming dir, work-tree names as hard links to them, then
        # renames each object into the cache, keeps the set's spare, and evicts what the cache may no longer keep.
        body = f"""set -e
command -v tar >/dev/null 2>&1 || {{ echo "tar is not installed on this machine: install it" >&2; exit 3; }}
cd -- {quote(base)}
in={quote(incoming)}
kept={quote(kept)}
work={quote(job_rel + "/" + WORK_DIR)}
mkdir -p -- cache sets "$work"
# builds the spare from the set's stored link list while holding its lock (the lock dir)
respare() {{
  rm -rf -- "$kept/new" && mkdir -p -- "$kept/new" &&
    tar -xmf "$kept/links.tar" &&
    {{ [ ! -f "$kept/post.sh" ] || sh "$kept/post.sh" "$kept/new"; }} &&
    touch -- "$kept/stamp" && [ ! -e "$kept/tree" ] && mv -- "$kept/new" "$kept/tree" || rm -rf -- "$kept/new"
  rmdir -- "$kept/lock"
}}
unaltered() {{ [ -z "$(find "$kept/tree" -newer "$kept/stamp" -print 2>&1 | head -n 1)" ]; }}
if [ -d "$kept/tree" ] && [ -f "$kept/stamp" ] && unaltered && rmdir -- "$work" 2>/dev/null; then
  if mv -- "$kept/tree" "$work" 2>/dev/null; then
    touch -c -- "$kept"
    echo JRC-HAVE-ALL
    if mkdir -- "$kept/lock" 2>/dev/null; then (respare) </dev/null >/dev/null 2>&1 & fi
    exit 0
  fi
  mkdir -p -- "$work"
fi
echo JRC-LIST
trap 'rm -rf -- "$in"' EXIT
mkdir -p -- "$in"
# GNU tar reads a pipe in 10 KiB records by default, which made it the slowest part of a big upload;
# 128 KiB records read whole (-B) cost far fewer system calls. Other tars keep their defaults.
# -m: an object's mtime is the far side's own clock (its last use, and what a spare's stamp is checked against).
untar() {{ tar -xmof -; }}
case $(tar --version 2>/dev/null) in *"GNU tar"*) untar() {{ tar -B -b 256 -xmof -; }} ;; esac
{farside.command_line("cache", "have", '"$PWD"')}
echo JRC-READY
untar
# Only a stream that reached its last entry publishes anything: a cut one may end on a clean boundary.
[ -f "$in/complete" ] || {{ echo "the input stream was cut short; nothing was kept" >&2; exit 3; }}
if [ -d "$in/objects" ]; then
  (cd -- "$in/objects" && ls | xargs sh -c 'mv -f -- "$@" ../..' sh)
fi
if [ -f "$in/post.sh" ]; then sh "$in/post.sh" "$work"; fi
# Keep this set's spare for its next send (a stale or altered one is replaced); a set another send
# is building is left to it.
mkdir -p -- "$kept"
if mkdir -- "$kept/lock" 2>/dev/null; then
  # renamed away first, never deleted in place: a send taking the tree at this moment gets it whole or not at all
  if mv -- "$kept/tree" "$kept/gone.$$" 2>/dev/null; then rm -rf -- "$kept/gone.$$"; fi
  rm -f -- "$kept/post.sh"
  mv -f -- "$in/links.tar" "$kept/links.tar"
  if [ -f "$in/post.sh" ]; then mv -f -- "$in/post.sh" "$kept/post.sh"; fi
  respare
fi
{farside.command_line("cache", "evict", '"$PWD"', str(days), str(max_bytes))}
"""
        try:
            with self._channel(sh_script(body), CALL_TIMEOUT) as ch:
                err = bytearray()

                def answer_until(marks: tuple[bytes, ...], answer: bytearray) -> bytearray:
                    # a mark counts as a whole line of its own
                    while not any(answer.startswith(m) or b"\n" + m in answer for m in marks):
                        data = ch.recv(CHUNK)
                        if not data:
                            code = self._finish(ch, err, CALL_TIMEOUT)
                            raise EngineError(Result(code, b"", bytes(err)).error(f"{self.name}: sending inputs"))
                        answer += data
                        self._drain_stderr(ch, err)
                    return answer

                first = answer_until((b"JRC-HAVE-ALL\n", b"JRC-LIST\n"), bytearray())
                if first.startswith(b"JRC-HAVE-ALL\n") or b"\nJRC-HAVE-ALL\n" in first:
                    ch.shutdown_write()
                    while ch.recv(CHUNK):
                        self._drain_stderr(ch, err)
                    code = self._finish(ch, err, CALL_TIMEOUT)
                    if code != 0:
                        raise EngineError(Result(code, b"", bytes(err)).error(f"{self.name}: sending inputs"))
                    stats.files_reused = len(files)
                    return stats
                query = farside.have_input(sorted({f.sha256 for f in files}))
                # A long list goes from a thread: the answer may fill our window before the list is sent.
                writer = threading.Thread(target=feed, args=(ch, query, False), daemon=True)
                writer.start()
                answer = answer_until((b"JRC-READY\n",), first)
                writer.join(CALL_TIMEOUT)
                have = farside.parse_have(answer.decode("utf-8", "replace"))
                by_digest: dict[str, InputFile] = {}
                for f in files:
                    if have.get(f.sha256) != f.size:  # absent, or not what we expect: send again
                        by_digest.setdefault(f.sha256, f)
                stats.files_sent = len(by_digest)
                stats.bytes_sent = sum(f.size for f in by_digest.values())
                stats.files_reused = len(files) - stats.files_sent
                try:
                    self._stream_inputs(ch, err, files, by_digest, incoming, job_rel, kept, progress, stats.bytes_sent)
                    ch.shutdown_write()
                except _Changed as e:
                    # End the stream short and wait: the far side discards everything before we report.
                    ch.shutdown_write()
                    while ch.recv(CHUNK):
                        pass
                    self._finish(ch, err, CALL_TIMEOUT)
                    raise EngineError(str(e)) from None
                except OSError:
                    # The far side may have stopped reading (disk full, tar error): report its words.
                    if not (ch.exit_status_ready() or ch.closed):
                        raise
                while ch.recv(CHUNK):
                    self._drain_stderr(ch, err)
                code = self._finish(ch, err, CALL_TIMEOUT)
                if dropped_under(ch, code):
                    # "No exit status": the connection dropped under the stream, the far side did not fail.
                    raise Dropped("the connection closed while sending inputs")
        except Dropped as e:
            raise self._lost(e) from None
        if code != 0:
            raise EngineError(Result(code, b"", bytes(err)).error(f"{self.name}: sending inputs"))
        return stats

    def _stream_inputs(
        self,
        ch: paramiko.Channel,
        err: bytearray,
        files: Sequence[InputFile],
        by_digest: Mapping[str, InputFile],
        incoming: str,
        job_rel: str,
        kept: str,
        progress: ProgressCallback | None,
        total: int,
    ) -> None:
        """The tar stream of ``send``: missing objects, a hard link per work-tree name, the set's link list."""
        sink = _Sink(ch)
        done = 0
        now = time.time()  # an object's mtime is when the cache last used it (see farside/cache.sh)
        for f in by_digest.values():
            sink.write(tar_header(f"{incoming}/objects/{f.sha256}", size=f.size, mode=0o444, mtime=now))
            h = hashlib.sha256()
            left = f.size
            with open(f.source, "rb", buffering=0) as src:
                if f.size <= SMALL_FILE:
                    # Small files ride along in the shared buffer: fewer, fuller packets.
                    data = src.read(f.size + 1)
                    h.update(data)
                    if len(data) == f.size:
                        sink.write(data)
                        left = 0
                        done += f.size
                else:
                    sink.flush()
                    # Reading and hashing run in a thread (both release the GIL) while this one
                    # encrypts and sends: the digest checked below is of exactly the bytes sent.
                    with _ReadAhead(src, f.size, h) as chunks:
                        for view in chunks:
                            send_view(ch, view)
                            left -= len(view)
                            done += len(view)
                            self._drain_stderr(ch, err)
                            if progress:
                                progress(done, total)
                        if chunks.grew:
                            left = -1
            if left or h.hexdigest() != f.sha256:
                # Never let a file that changed under us land in the cache under the old digest:
                # closing without the end of the archive makes the far-side tar fail and discard it.
                raise _Changed(f"input {f.relpath!r} changed while it was being sent; send again")
            sink.write(padding(f.size))
            if progress and f.size <= SMALL_FILE:
                progress(done, total)
        post = []
        # The set's own link list (its names under the spare being built), kept far side to rebuild the spare.
        links = bytearray()
        for f in files:
            if f.mode & 0o111:
                # Executable inputs get their own copy: the cache object is shared and read-only.
                # post.sh makes them under the tree it is given ($1: the job's work tree, or a spare).
                root = '"$1"'
                parent = posixpath.dirname(f.relpath)
                folder = f"{root}/{quote(parent)}" if parent else root
                dst = f"{root}/{quote(f.relpath)}"
                post.append(
                    f"mkdir -p -- {folder} && rm -f -- {dst} && "
                    f"cp -- cache/{f.sha256} {dst} && chmod {f.mode & 0o7777:o} -- {dst}"
                )
                continue
            target = f"{incoming}/objects/{f.sha256}" if f.sha256 in by_digest else f"cache/{f.sha256}"
            sink.write(tar_header(f"{job_rel}/{WORK_DIR}/{f.relpath}", linkname=target))
            links += tar_header(f"{kept}/new/{f.relpath}", linkname=f"cache/{f.sha256}")
        links += END_OF_ARCHIVE
        sink.write(tar_header(f"{incoming}/links.tar", size=len(links), mode=0o600))
        sink.write(bytes(links) + padding(len(links)))
        if post:
            script = ("set -e\n" + "\n".join(post) + "\n").encode()
            sink.write(tar_header(f"{incoming}/post.sh", size=len(script), mode=0o600))
            sink.write(script + padding(len(script)))
        sink.write(tar_header(f"{incoming}/complete", size=0, mode=0o600))
        sink.write(END_OF_ARCHIVE)
        sink.flush()

    def start(self, job: RemoteJob, launch: LaunchSpec) -> RemoteJob:
        d = self._dir(job)
        payload = launch_input(launch.env, launch.secret_env)  # secrets: stdin only
        script = command_script(launch.command)
        if len(script) > 64 << 10:
            # Too long for one command line: write it first, in its own call.
            res = self._run(f"cat > {quote(d + '/command.sh')}", script.encode(), retry=False)
            if res.code != 0:
                raise EngineError(res.error(f"{self.name}: writing the command of {job.job_id}"))
            write = ":"
        else:
            write = f"printf '%s' {quote(script)} > command.sh"
        body = f"""cd -- {quote(d)} || exit 97
if [ -f pid ]; then read -r p < pid; echo "already $p"; exit 0; fi
{write}
exec sh launch.sh {quote(d)}
"""
        res = self._run(body, payload, timeout=60, retry=False)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: starting job {job.job_id}"))
        words = res.text().split()
        if not words or not words[-1].isdigit():
            raise EngineError(f"{self.name}: the launcher did not report a process id ({res.text()[-200:]!r})")
        return dataclasses.replace(job, handle={**job.handle, "pid": int(words[-1])})

    def poll(self, jobs: Sequence[RemoteJob]) -> dict[str, RemoteStatus]:
        return self.poll_watched(jobs, {})[0]

    def poll_watched(
        self, jobs: Sequence[RemoteJob], watched: Mapping[str, MetricOffsets]
    ) -> tuple[dict[str, RemoteStatus], dict[str, MetricBytes]]:
        if not jobs:
            return {}, {}
        words = farside.status_words([quote(self._dir(job)) for job in jobs], bool(watched))
        stdin = farside.watch_input(jobs, watched) if watched else b""
        res = self._run(farside.command_line("status", *words), stdin, timeout=60)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: poll"))
        text, blob = farside.split_metrics(res.out)
        return farside.parse_status(text, jobs, self.name), farside.parse_metrics(blob, jobs)

    def read_log(self, job: RemoteJob, offset: int, limit: int) -> bytes:
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        if limit == 0:
            return b""
        d = self._dir(job)
        body = f"""[ -d {quote(d)} ] || {{ echo "job directory is missing" >&2; exit 3; }}
[ -f {quote(d + "/log")} ] || exit 0
tail -c +{offset + 1} -- {quote(d + "/log")} | head -c {limit}
"""
        res = self._run(body, timeout=120)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: reading the log of {job.job_id}"))
        return res.out

    def cancel(self, job: RemoteJob, grace: float) -> None:
        body = farside.command_line("cancel", quote(self._dir(job)), farside.cancel_ticks(grace))
        res = self._run(body, timeout=grace + 30, retry=True)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: cancelling job {job.job_id}"))

    def fetch(
        self,
        job: RemoteJob,
        outputs: Sequence[str],
        dest: Path,
        progress: ProgressCallback | None = None,
    ) -> FetchResult:
        d = self._dir(job)
        for out in outputs:
            check_relpath(out, "output")
        manifest = f".fetch-{uuid.uuid4().hex}"
        body = farside.command_line("manifest", quote(d), quote(manifest), *(quote(o) for o in outputs))
        try:
            with self._channel(sh_script(body), CALL_TIMEOUT) as ch:
                ch.shutdown_write()
                err = bytearray()

                def read(n: int) -> bytes:
                    data = ch.recv(n)
                    self._drain_stderr(ch, err)
                    return data

                try:
                    result = farside.receive_outputs(read, outputs, dest, manifest, self.name, progress)
                except UnsafeArchive:
                    if not ch.get_transport().is_active():
                        # Cut short by a dropped connection, not a bad archive: fetch again.
                        raise Dropped("the connection closed while fetching outputs") from None
                    raise
                except (farside.NoManifest, farside.ArchiveCut) as e:
                    # Nothing came, or the stream stopped before its digests: the far side's words say why,
                    # unless it was the connection that went away.
                    code = self._finish(ch, err, CALL_TIMEOUT)
                    if dropped_under(ch, code):
                        raise Dropped("the connection closed while fetching outputs") from None
                    if code in (0, -1) and isinstance(e, farside.ArchiveCut):
                        raise
                    raise EngineError(Result(code, b"", bytes(err)).error(f"{self.name}: fetching outputs")) from None
                code = self._finish(ch, err, CALL_TIMEOUT)
        except Dropped as e:
            raise self._lost(e) from None
        if code != 0:
            raise EngineError(Result(code, b"", bytes(err)).error(f"{self.name}: fetching outputs"))
        return result

    def _extract_command(self, command: str, dest: Path, allowed: Callable[[str], bool]) -> list[str]:
        """Extract the tar stream a far-side command prints, with the same checks as ``fetch`` (for tests)."""
        extractor = SafeExtractor(Path(dest), allowed, self.name)
        try:
            with self._channel(sh_script(command), CALL_TIMEOUT) as ch:
                ch.shutdown_write()
                reader = TarReader(ch.recv)
                for info in reader.members():
                    extractor.extract(reader, info)
                self._finish(ch, bytearray(), CALL_TIMEOUT)
        except Dropped as e:
            raise self._lost(e) from None
        return sorted(extractor.files)

    def cleanup(self, job: RemoteJob) -> None:
        # Only the directory this job's prepare made (its job.json names the job) is removed.
        res = self._run(farside.command_line("cleanup", quote(self._dir(job)), quote(job.job_id)), timeout=300)
        if res.code != 0:
            raise EngineError(res.error(f"{self.name}: removing job {job.job_id}"))


def input_set_digest(files: Sequence[InputFile]) -> str:
    """One digest of a whole input set (every name, content and mode): the far side's key for its spare tree."""
    # NUL-separated fields: a name holds no NUL (check_relpaths), so the text is unambiguous; half the
    # cost of a JSON list, which a 10,000-file re-send paid on its critical path.
    entries = sorted(files, key=attrgetter("relpath"))
    text = "\0".join(["\0".join((f.relpath, f.sha256, str(f.size), oct(f.mode & 0o7777))) for f in entries])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


class _Changed(Exception):
    pass


class _ReadAhead:
    """Read a file in ``CHUNK`` pieces from a thread, hashing each piece before handing it over.

    Iterating yields memoryviews of a few reused buffers; each is valid until the next one is taken,
    so at most ``READ_AHEAD + 1`` chunks are in memory. ``grew`` says the file was longer than ``size``.
    """

    def __init__(self, src: Any, size: int, h: Any) -> None:
        self._src = src
        self._size = size
        self._h = h
        self._free: queue.Queue[bytearray] = queue.Queue()
        self._full: queue.Queue[memoryview | BaseException | None] = queue.Queue()
        for _ in range(READ_AHEAD + 1):
            self._free.put(bytearray(CHUNK))
        self._stop = False
        self.grew = False
        self._thread = threading.Thread(target=self._run, name="jrc-ssh-read", daemon=True)

    def _run(self) -> None:
        try:
            left = self._size
            while left > 0:
                buf = self._free.get()
                if self._stop:
                    return
                n = self._src.readinto(memoryview(buf)[: min(CHUNK, left)])
                if not n:
                    break
                view = memoryview(buf)[:n]
                self._h.update(view)
                self._full.put(view)
                left -= n
            self.grew = left == 0 and bool(self._src.read(1))
            self._full.put(None)
        except BaseException as e:  # handed to the sending thread
            self._full.put(e)

    def __enter__(self) -> _ReadAhead:
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[memoryview]:
        while True:
            item = self._full.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            self._free.put(item.obj)  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._free.put(bytearray(0))  # wakes the reader if it waits for a buffer
        self._thread.join()


class _Sink:
    """Gather small writes (headers, small files) into big channel sends."""

    def __init__(self, ch: paramiko.Channel) -> None:
        self.ch = ch
        self.buf = bytearray()

    def write(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            buf, self.buf = self.buf, bytearray()
            send_view(self.ch, memoryview(buf))


__all__ = [
    "BLOCK",
    "AuthenticationFailed",
    "HostKeyChanged",
    "HostKeyUnknown",
    "SSHEngine",
]
