"""How an engine reaches its machine: run a far-side sh script with a stdin, stream bytes both ways.

A ``Transport`` is the one thing a kind must give to reuse the whole far side
(``farside/``: prepare, the input cache, the launcher, status, logs, cancel,
the verified fetch, cleanup), written once in ``shell.ShellEngine``. It knows
nothing of what it carries and nothing of host keys or routes: those stay in
the transport that has them (ssh's ``Connection``).

- ``channel(command, timeout)``: one far-side command line, as a context
  manager yielding a ``Channel`` (its stdin, stdout, stderr and exit status);
  raises ``Dropped`` when the way to the machine went away under it.
- ``run(body, stdin)``: a whole POSIX sh script on top of ``channel``, with a
  retry on a fresh connection for calls that change nothing.
- ``round_trip``, ``active``, ``close``.

Transports here: ``LocalTransport`` (this computer, a process per call) and
``ProcessChannel``, the channel of any transport whose calls are local
processes (OpenSSH's mux clients are). ssh's two are in ``ssh_connection.py``
(paramiko) and ``ssh_openssh.py``; the Jupyter kind moves bytes through a kernel
instead (``jupyter.py``). A ``kubectl exec`` or ``docker exec`` transport is a
``Transport`` whose ``channel`` starts that client as a ``ProcessChannel``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import fcntl
import os
import select
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Protocol

from .base import EngineError
from .ssh_transfer import CHUNK

#: Seconds without progress on one channel before a call gives up.
CALL_TIMEOUT = 120.0
#: How long a channel that ended without an exit status waits for its connection to be seen gone: a
#: connection that drops ends its channels first and is marked inactive (or its process exits) after.
GONE_WAIT = 5.0
#: A stdin longer than this is fed from a thread: the far side may answer while it reads (half of
#: paramiko's default window, the smallest any transport here has).
FEED_IN_THREAD = 1 << 20
#: Bigger pipes than Linux's 64 KiB default: fewer wake-ups between this process and its child.
PIPE_SIZE = 1 << 20


class Dropped(Exception):
    """The connection went away under a call; the call may be retried on a new one."""


@dataclasses.dataclass
class Result:
    code: int
    out: bytes
    err: bytes

    def text(self) -> str:
        return self.out.decode("utf-8", "replace")

    def error(self, what: str) -> str:
        detail = (self.err or self.out).decode("utf-8", "replace").strip()
        return f"{what} failed (exit code {self.code}): {detail[-1500:] or 'no message'}"


class Link(Protocol):
    """What a channel's ``get_transport()`` returns: whether the way to the machine is still up."""

    def is_active(self) -> bool: ...


class Channel(Protocol):
    """The part of paramiko's ``Channel`` the far side's code uses; every transport's channel has it.

    ``recv_exit_status`` is -1 when the connection went away before the command ended.
    """

    status_event: Any
    closed: bool

    def recv(self, n: int) -> bytes: ...
    def send(self, data: bytes | memoryview) -> int: ...
    def shutdown_write(self) -> None: ...
    def recv_stderr_ready(self) -> bool: ...
    def recv_stderr(self, n: int) -> bytes: ...
    def exit_status_ready(self) -> bool: ...
    def recv_exit_status(self) -> int: ...
    def get_transport(self) -> Link: ...


def quote(value: str) -> str:
    return shlex.quote(value)


def sh_script(body: str) -> str:
    """Run ``body`` under /bin/sh whatever the login shell is, so its syntax is POSIX sh's."""
    return "sh -c " + quote(body)


def dropped_under(ch: Channel, code: int) -> bool:
    """Whether a channel that ended with ``code`` lost its connection: no exit status, and the
    connection is gone or goes within ``GONE_WAIT``. The far side did not fail; the call may be retried."""
    if code != -1:
        return False
    link = ch.get_transport()
    deadline = time.monotonic() + GONE_WAIT
    while link.is_active():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def send_view(ch: Channel, view: memoryview) -> None:
    # Channel.sendall re-slices a bytes object after every packet (a copy each time); a memoryview does not.
    while view:
        n = ch.send(view)
        if n <= 0:
            raise OSError("channel closed while sending")
        view = view[n:]


def feed(ch: Channel, data: bytes, close: bool = True) -> None:
    """Send ``data`` (from a thread); a failure is left to the reading side, which sees the channel end."""
    with contextlib.suppress(Exception):
        send_view(ch, memoryview(data))
        if close:
            ch.shutdown_write()


class Transport(abc.ABC):
    """The way to one machine: far-side commands with their streams; made on first use, closed by ``close``."""

    #: the name ``check`` reports (facts: ``transport``)
    transport_name: ClassVar[str]

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()  # guards the counters (and a connection, where there is one)
        #: calls (channels) opened so far (tests count round trips with it)
        self.channels_opened = 0
        #: connections made so far (1 + reconnects)
        self.connections_made = 0

    @abc.abstractmethod
    def channel(self, command: str, timeout: float) -> contextlib.AbstractContextManager[Any]:
        """Run ``command`` (a shell command line) on the machine; raises ``Dropped`` if the connection died."""

    @abc.abstractmethod
    def active(self) -> bool:
        """Whether a connection is open now (no call is made)."""

    @abc.abstractmethod
    def round_trip(self) -> float:
        """Seconds for one request the far side answers (connecting first if needed)."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the connection and everything it started; the next call connects again."""

    def lost(self, error: object) -> EngineError:
        return EngineError(f"connection to {self.name} lost: {error}", transient=True)

    @staticmethod
    def drain_stderr(ch: Channel, err: bytearray) -> None:
        # stdout and stderr share the channel window: unread stderr would stall stdout.
        while ch.recv_stderr_ready():
            data = ch.recv_stderr(65536)
            if len(err) < 65536:
                err += data

    @staticmethod
    def finish(ch: Channel, err: bytearray, timeout: float) -> int:
        """Read what is left of stderr, then the exit status (-1: none came)."""
        while True:
            data = ch.recv_stderr(65536)
            if not data:
                break
            if len(err) < 65536:
                err += data
        if not ch.status_event.wait(timeout):
            raise TimeoutError("no exit status")
        return ch.recv_exit_status()

    def run(self, body: str, stdin: bytes = b"", *, timeout: float = CALL_TIMEOUT, retry: bool = True) -> Result:
        """Run a sh script; ``retry`` once on a new connection if the old one died (read-only calls)."""
        for attempt in (0, 1):
            try:
                with self.channel(sh_script(body), timeout) as ch:
                    writer = None
                    if len(stdin) > FEED_IN_THREAD:
                        # Feed a long stdin from a thread: an unread answer would fill the window and
                        # stop the far side reading.
                        writer = threading.Thread(target=feed, args=(ch, stdin), daemon=True)
                        writer.start()
                    else:
                        try:
                            if stdin:
                                send_view(ch, memoryview(stdin))
                            ch.shutdown_write()
                        except TimeoutError:
                            raise
                        except OSError:
                            # The command ended before it read all its input (an early `exit 0`, a
                            # start that finds the job started): its output and exit code say how.
                            # A connection that went away shows as no exit status, below.
                            pass
                    out = bytearray()
                    err = bytearray()
                    while True:
                        data = ch.recv(CHUNK)
                        if not data:
                            break
                        out += data
                        self.drain_stderr(ch, err)
                    code = self.finish(ch, err, timeout)
                    if writer is not None:
                        writer.join(timeout)
                    if dropped_under(ch, code):
                        raise Dropped("the connection closed before the command ended")
                    return Result(code, bytes(out), bytes(err))
            except Dropped as e:
                if retry and attempt == 0:
                    continue
                raise self.lost(e) from None
        raise AssertionError("unreachable")


# -- channels that are local processes -------------------------------------------------------


def wait_fd(fd: int, event: int, timeout: float | None) -> bool:
    """Whether ``fd`` is ready (or at its end) within ``timeout`` seconds; poll, not select: any fd number works."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(None if timeout is None else timeout * 1000))


def _widen(fd: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)


class _Exit:
    """paramiko's ``status_event``: ``wait(timeout)`` says whether the command's exit status is in."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


class ProcessLink(Link, Protocol):
    def ends_within(self, seconds: float) -> bool:
        """Whether the way to the machine has gone, or goes within ``seconds``."""
        ...


class ProcessChannel:
    """One far-side command as a local process (``sh``, an ssh mux client, ``kubectl exec``…) with pipes
    for its three streams, shaped like a paramiko channel.

    ``link`` is the way to the machine the process goes through. A process that exits 255 (ssh's own
    failure) while its link ends counts as "no exit status", as paramiko reports a dropped connection.
    """

    def __init__(self, proc: subprocess.Popen[bytes], link: ProcessLink, timeout: float) -> None:
        self.proc = proc
        self.link = link
        self.timeout = timeout
        assert proc.stdin and proc.stdout and proc.stderr
        self._in: int | None = proc.stdin.fileno()
        self._out = proc.stdout.fileno()
        os.set_blocking(self._in, False)  # writes wait in poll, so a far side that stops reading times out
        for fd in (self._in, self._out):
            _widen(fd)
        self._err = bytearray()  # not yet taken by recv_stderr
        self._err_done = False
        self._err_ready = threading.Condition()
        self._err_thread = threading.Thread(target=self._read_stderr, name="jrc-channel-stderr", daemon=True)
        self._err_thread.start()
        self.status_event = _Exit(proc)
        self.closed = False

    def _read_stderr(self) -> None:
        # Read stderr all along: a child blocked on a full stderr pipe would stop stdout too.
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            with self._err_ready:
                if not data:
                    self._err_done = True
                    self._err_ready.notify_all()
                    return
                if len(self._err) < 1 << 20:
                    self._err += data
                self._err_ready.notify_all()

    def settimeout(self, timeout: float) -> None:
        self.timeout = timeout

    def get_transport(self) -> ProcessLink:
        return self.link

    def send(self, data: bytes | memoryview) -> int:
        if self._in is None:
            raise OSError("the channel's input is already closed")
        while True:
            if not wait_fd(self._in, select.POLLOUT, self.timeout):
                raise TimeoutError(f"the far side read nothing for {self.timeout:.0f}s")
            try:
                return os.write(self._in, data)
            except BlockingIOError:
                continue

    def shutdown_write(self) -> None:
        if self._in is not None:
            self._in = None
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def recv(self, n: int) -> bytes:
        if not wait_fd(self._out, select.POLLIN, self.timeout):
            raise TimeoutError(f"no answer for {self.timeout:.0f}s")
        return os.read(self._out, n)

    def recv_stderr_ready(self) -> bool:
        return bool(self._err)

    def recv_stderr(self, n: int) -> bytes:
        with self._err_ready:
            if not self._err and not self._err_done:
                self._err_ready.wait(self.timeout)
            data = bytes(self._err[:n])
            del self._err[:n]
            return data

    def exit_status_ready(self) -> bool:
        return self.proc.poll() is not None

    def recv_exit_status(self) -> int:
        code = self.proc.wait()
        # Only the link's end tells a dropped connection from a command that exited 255: what a session
        # prints may be the command's own words, and it can see its link go a moment before the link ends.
        if code == 255 and self.link.ends_within(GONE_WAIT):
            return -1
        return code

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.shutdown_write()
        if self.proc.poll() is None:
            # Ended early (an error on this side): ending the child ends the far side's session.
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._err_thread.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def popen(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child with its three streams as pipes, in its own session (no terminal, no signals of ours)."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if env is None else dict(env),
        start_new_session=True,
    )


class _Here:
    """The local transport's link: this computer does not go away."""

    def is_active(self) -> bool:
        return True

    def ends_within(self, seconds: float) -> bool:
        return False


class LocalTransport(Transport):
    """This computer: each call is ``/bin/sh -c`` in a child process, with this interpreter first on PATH."""

    transport_name = "local"

    def argv(self, command: str) -> list[str]:
        """The child that runs one command line; a transport through a client program (``env``,
        ``kubectl exec -i POD --``) puts that program in front."""
        return ["/bin/sh", "-c", command]

    @contextlib.contextmanager
    def channel(self, command: str, timeout: float) -> Iterator[ProcessChannel]:
        argv = self.argv(command)
        try:
            proc = popen(argv, env_with_python())
        except OSError as e:
            raise EngineError(f"{self.name}: cannot run {argv[0]}: {e}") from None
        with self._lock:
            self.channels_opened += 1
        ch = ProcessChannel(proc, _Here(), timeout)
        try:
            yield ch
        finally:
            ch.close()

    def active(self) -> bool:
        return True

    def round_trip(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


def env_with_python() -> dict[str, str]:
    """This process's environment with its interpreter's folder first on PATH, for every far-side script.

    So `python` in a job's command is the interpreter (and venv) this server runs in.
    """
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[:1] != [bindir]:
        path = bindir + os.pathsep + path
    return {**os.environ, "PATH": path}
