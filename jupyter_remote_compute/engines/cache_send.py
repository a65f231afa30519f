"""Sending a job's inputs: one tar stream through the machine's content-addressed input cache.

Any transport with a channel can carry it (ssh, a local shell, a ``kubectl exec``). One call does it
all: the far side first takes an unchanged input set's spare work tree (one rename), else answers
which digests its cache holds (farside/cache.sh), then unpacks a stream with only the missing
objects and a hard link per work-tree name. So a re-sent file costs a name, not its bytes. File
names travel inside tar headers, never through a shell; every digest is checked as it is sent.
"""

from __future__ import annotations

import hashlib
import posixpath
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any

from . import farside
from .base import WORK_DIR, EngineError, InputFile, ProgressCallback, SendStats
from .ssh_transfer import (
    CHUNK,
    END_OF_ARCHIVE,
    check_digests,
    check_relpaths,
    padding,
    tar_header,
)
from .transport import (
    CALL_TIMEOUT,
    Channel,
    Dropped,
    Result,
    Transport,
    dropped_under,
    feed,
    quote,
    send_view,
    sh_script,
)

READ_AHEAD = 3  # chunks read and hashed ahead of the one being sent
SMALL_FILE = 256 << 10  # inputs up to this size are read whole and batched with their neighbours


def send_inputs(
    transport: Transport,
    d: str,
    files: Sequence[InputFile],
    options: Mapping[str, Any],
    progress: ProgressCallback | None = None,
) -> SendStats:
    """Send a job's inputs into its work tree ``d`` on the far side, through the machine's input cache."""
    name = transport.name
    stats = SendStats()
    if not files:
        return stats
    check_relpaths([f.relpath for f in files], "input")
    check_digests([f.sha256 for f in files])
    base = posixpath.dirname(posixpath.dirname(d))
    job_rel = posixpath.relpath(d, base)
    days, max_bytes = farside.cache_limits(options)
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
        with transport.channel(sh_script(body), CALL_TIMEOUT) as ch:
            err = bytearray()

            def answer_until(marks: tuple[bytes, ...], answer: bytearray) -> bytearray:
                # a mark counts as a whole line of its own
                while not any(answer.startswith(m) or b"\n" + m in answer for m in marks):
                    data = ch.recv(CHUNK)
                    if not data:
                        code = transport.finish(ch, err, CALL_TIMEOUT)
                        raise EngineError(Result(code, b"", bytes(err)).error(f"{name}: sending inputs"))
                    answer += data
                    transport.drain_stderr(ch, err)
                return answer

            first = answer_until((b"JRC-HAVE-ALL\n", b"JRC-LIST\n"), bytearray())
            if first.startswith(b"JRC-HAVE-ALL\n") or b"\nJRC-HAVE-ALL\n" in first:
                ch.shutdown_write()
                while ch.recv(CHUNK):
                    transport.drain_stderr(ch, err)
                code = transport.finish(ch, err, CALL_TIMEOUT)
                if code != 0:
                    raise EngineError(Result(code, b"", bytes(err)).error(f"{name}: sending inputs"))
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
                _stream_inputs(
                    transport, ch, err, files, by_digest, incoming, job_rel, kept, progress, stats.bytes_sent
                )
                ch.shutdown_write()
            except _Changed as e:
                # End the stream short and wait: the far side discards everything before we report.
                ch.shutdown_write()
                while ch.recv(CHUNK):
                    pass
                transport.finish(ch, err, CALL_TIMEOUT)
                raise EngineError(str(e)) from None
            except OSError:
                # The far side may have stopped reading (disk full, tar error): report its words.
                if not (ch.exit_status_ready() or ch.closed):
                    raise
            while ch.recv(CHUNK):
                transport.drain_stderr(ch, err)
            code = transport.finish(ch, err, CALL_TIMEOUT)
            if dropped_under(ch, code):
                # "No exit status": the connection dropped under the stream, the far side did not fail.
                raise Dropped("the connection closed while sending inputs")
    except Dropped as e:
        raise transport.lost(e) from None
    if code != 0:
        raise EngineError(Result(code, b"", bytes(err)).error(f"{name}: sending inputs"))
    return stats


def _stream_inputs(
    transport: Transport,
    ch: Channel,
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
                        transport.drain_stderr(ch, err)
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

    def __init__(self, ch: Channel) -> None:
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
