"""An emulated WAN link on loopback: a TCP relay that holds every chunk for half the round trip each way.

This kernel has no ``netem`` (TESTBED), so latency comes from user space. The
relay listens on 127.0.0.1, connects each client to a target port on
127.0.0.1, and delivers every chunk it reads ``rtt / 2`` seconds later, in
order, in both directions. What sits in flight is bounded (``max_in_flight``
per direction, well above a gigabit's bandwidth-delay product at 40 ms), so
the relay behaves like a long pipe: a protocol whose own windows are smaller
than bandwidth x delay slows down, as it would over a real WAN.

Measure the relay alone first (raw ``cat | ssh`` through it) so its ceiling is
known, and compare everything through the same relay. Used by the benchmarks;
never by the product.

    with WanRelay(target_port=sshd_port, rtt=0.040) as relay:
        ... connect to 127.0.0.1:relay.port ...
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import threading
import time
from types import TracebackType

CHUNK = 256 << 10


class _Pipe:
    """One direction of one connection: chunks wait ``delay`` seconds, then go out in order."""

    def __init__(self, delay: float, max_in_flight: int) -> None:
        self.delay = delay
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.changed = asyncio.Event()
        self.closed = False

    async def pump_in(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                while self.in_flight >= self.max_in_flight:
                    self.changed.clear()
                    await self.changed.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                self.queue.append((time.monotonic() + self.delay, data))
                self.in_flight += len(data)
                self.changed.set()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            self.changed.set()

    async def pump_out(self, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                if not self.queue:
                    if self.closed:
                        break
                    self.changed.clear()
                    await self.changed.wait()
                    continue
                due, data = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)  # the emulated propagation delay itself
                self.queue.popleft()
                writer.write(data)
                await writer.drain()
                self.in_flight -= len(data)
                self.changed.set()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass


class WanRelay:
    """A delaying relay in a thread of its own; ``port`` is where clients connect."""

    def __init__(self, target_port: int, rtt: float, max_in_flight: int = 64 << 20) -> None:
        self.target_port = target_port
        self.delay = rtt / 2
        self.max_in_flight = max_in_flight
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wan-relay", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        for w in (client_w, server_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up, down = _Pipe(self.delay, self.max_in_flight), _Pipe(self.delay, self.max_in_flight)
        try:
            await asyncio.gather(
                up.pump_in(client_r), up.pump_out(server_w), down.pump_in(server_r), down.pump_out(client_w)
            )
        except asyncio.CancelledError:
            pass  # the relay is stopping: end this connection quietly (asyncio's stream callback reports a cancel)
        finally:
            for w in (client_w, server_w):
                with contextlib.suppress(Exception):
                    w.close()

    def __enter__(self) -> WanRelay:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in others:
                task.cancel()
            # wait for them to finish cancelling: a loop stopped under them prints "Task was destroyed"
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
