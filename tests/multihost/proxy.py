"""A TCP proxy that injects latency, partitions and resets between watchers and their database.

There is no `tc netem` and no iptables on the harness machines, so faults are made in user space:
every connection to the proxy gets its own connection to the one configured target, and bytes are
copied both ways by an asyncio loop on a thread of the proxy's own.

What the faults simulate, and what they do not:

* Latency (`set_latency`) delays every chunk the proxy reads, per direction, keeping byte order.
  It adds delay only: no bandwidth limit, no loss. Chunk boundaries are wherever the kernel split the
  stream, so one delay covers one read (up to 64 KiB), not one packet.
* A blackhole (`blackhole(True)`) is a partition as the application sees it: nothing gets through,
  nothing is answered, and connections are neither closed nor reset. New connections are still
  accepted (a real partition would leave the SYN unanswered) but the target is not dialled until
  the blackhole ends, so the server sees nothing of them meanwhile.
  In "hold" mode (the default) bytes, end-of-stream and resets are kept and delivered when the
  blackhole ends, like TCP retransmitting after a partition heals; a connection holding more than
  `hold_limit_bytes` in one direction is reset. In "drop" mode bytes read during the blackhole
  (and those delayed by latency but not yet sent) are lost for good, which TCP never does: the
  stream then resumes with a gap, so expect a confused peer. End-of-stream and resets are held in
  both modes.
  What it cannot simulate: each side's kernel is talking to the proxy's kernel, which keeps
  acknowledging data and answering keepalive probes. So TCP keepalives and TCP_USER_TIMEOUT never
  detect a blackhole, and a sender's writes keep succeeding (up to the hold limit, or forever in
  "drop" mode) instead of filling its send buffer. Only application-level timeouts notice it;
  follow a blackhole with `reset_all()` to model "the connection was found dead".
* `reset_all` and `reset_storm` abort both legs with a real RST (SO_LINGER 0), as a crashed
  middlebox or a rebooted peer would; the client sees ECONNRESET on its next read or write. Both
  are immediate, regardless of latency or blackhole. A reset by either peer is passed on to the
  other as a RST, in its place in the stream (after the bytes before it, delayed and held like them).
* If the target cannot be dialled, the client's connection is reset.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from enum import Enum
from types import TracebackType
from typing import Any, Literal, TypeAlias, TypeVar

BlackholeMode = Literal["hold", "drop"]

READ_SIZE = 64 * 1024
# Past this many bytes waiting in one direction (latency, or target not yet dialled) the proxy stops
# reading that side, so a slow reader slows its writer instead of growing the proxy's memory.
HIGH_WATER = 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
START_TIMEOUT_S = 10.0

_T = TypeVar("_T")


class _Signal(Enum):
    """End-of-stream and reset travel in the byte queue so that they keep their place in the stream."""

    EOF = "eof"
    RST = "rst"


_Item: TypeAlias = bytes | _Signal


def _abort(writer: asyncio.StreamWriter, rst: bool) -> None:
    """Close a leg at once; with `rst` the kernel sends a RST instead of a FIN."""
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _nodelay(writer: asyncio.StreamWriter) -> None:
    # asyncio already sets TCP_NODELAY on TCP transports; set it anyway so that it never depends
    # on that: PostgreSQL's small messages must not wait for Nagle.
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Pipe:
    """One direction of a connection: what is read from `src` is written to `dst`."""

    def __init__(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter | None, up: bool) -> None:
        self.src = src
        self.dst = dst  # None until the target is dialled (client to target only)
        self.up = up
        self.queue: asyncio.Queue[tuple[float, _Item]] = asyncio.Queue()
        self.pending = 0  # items queued and not yet written or dropped; 0 allows the fast path
        self.queued_bytes = 0
        self.last_due = 0.0  # send time of the last queued item: later items never go before it
        self.room = asyncio.Event()


class _Conn:
    """A client connection, its leg to the target, and the tasks copying between them."""

    def __init__(self, client: asyncio.StreamWriter, up: _Pipe) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.up = up
        self.down: _Pipe | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.done = asyncio.Event()
        self.closed = False
        self.eofs = 0

    def pipes(self) -> list[_Pipe]:
        return [self.up] if self.down is None else [self.up, self.down]

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def abort(self, rst: bool) -> None:
        """End the connection now: stop its tasks and close both legs (with RST if `rst`)."""
        if self.closed:
            return
        self.closed = True
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        for writer in (self.client, self.upstream):
            if writer is not None:
                _abort(writer, rst)
        self.done.set()

    def eof_sent(self) -> None:
        """Both directions have ended: close both legs gracefully."""
        self.eofs += 1
        if self.eofs == 2 and not self.closed:
            self.closed = True
            for writer in (self.client, self.upstream):
                if writer is not None:
                    writer.close()
            self.done.set()


class FaultProxy:
    """A TCP proxy to one target with injectable latency, blackholes and resets.

    `start()` runs it on a daemon thread; every control is callable from any thread while it runs.
    Counters are plain ints written only by the proxy's loop, so reading them needs no lock.
    `bytes_up` (client to target) and `bytes_down` count bytes delivered, not bytes read.
    """

    def __init__(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        *,
        blackhole_mode: BlackholeMode = "hold",
        hold_limit_bytes: int = 16 * 1024 * 1024,
        seed: int | None = None,
    ) -> None:
        self.listen_host = listen_host
        self.target_host = target_host
        self.target_port = target_port
        self._listen_port = listen_port
        self._mode: BlackholeMode = blackhole_mode
        self._hold_limit = hold_limit_bytes
        self._rng = random.Random(seed)
        self._latency = (0.0, 0.0)  # one-way delay and jitter in seconds, swapped as one tuple
        self._blackholed = False
        self._storm_until = 0.0  # time.monotonic() deadline of the reset storm
        self._storm_reset_p = 0.0
        self._lifecycle = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._stopping: asyncio.Event | None = None
        self._clear: asyncio.Event | None = None  # set while there is no blackhole
        self._storm: asyncio.Task[None] | None = None
        self._conns: set[_Conn] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._port: int | None = None
        self.connections_total = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.bytes_dropped = 0
        self.resets = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FaultProxy:
        """Listen and serve on a daemon thread; return once the port accepts connections."""
        with self._lifecycle:
            if self._thread is not None:
                raise RuntimeError("FaultProxy already started")
            if self._stopped:
                raise RuntimeError("FaultProxy cannot be restarted")
            loop = asyncio.new_event_loop()
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            name = f"FaultProxy->{self.target_host}:{self.target_port}"
            thread = threading.Thread(target=self._run, args=(loop, ready), name=name, daemon=True)
            self._loop, self._thread = loop, thread
            thread.start()
            try:
                ready.result(START_TIMEOUT_S)
            except BaseException:
                if self._stopping is not None and thread.is_alive():  # started, but too late
                    loop.call_soon_threadsafe(self._stopping.set)
                thread.join(START_TIMEOUT_S)
                self._stopped = True
                raise
            return self

    def stop(self) -> None:
        """Close the listener and every connection, and join the thread. Idempotent."""
        with self._lifecycle:
            if self._stopped:
                return
            self._stopped = True
            loop, thread, stopping = self._loop, self._thread, self._stopping
            if loop is None or thread is None:
                return
            if stopping is not None and thread.is_alive():
                loop.call_soon_threadsafe(stopping.set)
            thread.join()

    def __enter__(self) -> FaultProxy:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port listened on (the ephemeral one when constructed with 0)."""
        if self._port is None:
            raise RuntimeError("FaultProxy not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self.listen_host, self.port)

    @property
    def connections_open(self) -> int:
        return len(self._conns)

    @property
    def storming(self) -> bool:
        """Whether a reset storm is under way."""
        return time.monotonic() < self._storm_until

    # ------------------------------------------------------------------ controls

    def set_latency(self, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every chunk, each direction, by `delay_ms` ± uniform `jitter_ms` (never below 0).

        A chunk is never sent before the one read before it, so jitter cannot reorder a stream.
        `set_latency(0)` returns to direct forwarding once what is queued has gone.
        """
        if delay_ms < 0 or jitter_ms < 0:
            raise ValueError("delay and jitter must not be negative")
        # One tuple assignment: the loop never sees a new delay with an old jitter.
        self._latency = (delay_ms / 1000.0, jitter_ms / 1000.0)

    def blackhole(self, on: bool, mode: BlackholeMode | None = None) -> None:
        """Start or end a partition (see the module docstring); `mode` overrides the default.

        Returns once it is in effect: no byte read after it returns gets through while it is on.
        """
        if mode is not None and mode not in ("hold", "drop"):
            raise ValueError(f"unknown blackhole mode {mode!r}")
        self._call(lambda: self._set_blackhole(on, mode))

    def reset_all(self) -> int:
        """Abort every open connection with a RST to both sides; return how many there were.

        Returns after the sockets are closed, so a client's next read sees the reset.
        """
        return self._call(self._reset_all)

    def reset_storm(self, duration_s: float, every_s: float, new_connection_reset_p: float = 0.5) -> None:
        """For `duration_s`, reset all connections every `every_s` (the first at once), and reset a
        new connection on arrival with probability `new_connection_reset_p`. Returns at once; a new
        storm replaces one under way."""
        if duration_s < 0 or every_s <= 0 or not 0.0 <= new_connection_reset_p <= 1.0:
            raise ValueError("need duration_s >= 0, every_s > 0 and 0 <= new_connection_reset_p <= 1")
        if self._loop is None or self._stopped:
            raise RuntimeError("FaultProxy not running")
        self._call(lambda: self._start_storm(duration_s, every_s, new_connection_reset_p))

    # ------------------------------------------------------------------ loop side

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` on the loop and wait for it (directly when not running, or on the loop thread)."""
        if threading.current_thread() is self._thread:
            return fn()

        async def run() -> _T:
            result = fn()
            # Let the transports' close callbacks, scheduled by fn, run before the caller resumes.
            await asyncio.sleep(0)
            return result

        # Under the lifecycle lock, so that the loop cannot finish between the check and the call
        # (the caller would then wait forever).
        with self._lifecycle:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._stopped or not thread.is_alive():
                return fn()
            return asyncio.run_coroutine_threadsafe(run(), loop).result()

    def _run(self, loop: asyncio.AbstractEventLoop, ready: concurrent.futures.Future[None]) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main(ready))
        except BaseException as exc:
            if ready.done():
                raise  # a crash after start: let the thread's excepthook report it
            ready.set_exception(exc)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        self._stopping = asyncio.Event()
        self._clear = asyncio.Event()
        if not self._blackholed:
            self._clear.set()
        server = self._server = await asyncio.start_server(self._on_client, self.listen_host, self._listen_port)
        self._port = int(server.sockets[0].getsockname()[1])
        ready.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            server.close()
            if self._storm is not None:
                self._storm.cancel()
                await asyncio.wait([self._storm])
            await self._close_connections()
            await server.wait_closed()

    async def _close_connections(self) -> None:
        """Abort every connection, including any accepted just before the listener closed."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for conn in list(self._conns):
                conn.abort(rst=False)
            if self._handlers:
                await asyncio.wait(list(self._handlers))  # they end on their own once aborted
            # A connection accepted just before close() reaches _on_client a few loop iterations
            # later, and an aborted socket is closed one iteration after abort(). The server counts
            # its live transports (private, but there since 3.7; 3.12's wait_closed() waits for it).
            if getattr(self._server, "_active_count", 0) == 0 or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.001)

    def _set_blackhole(self, on: bool, mode: BlackholeMode | None) -> None:
        if mode is not None:
            self._mode = mode
        self._blackholed = on
        if self._clear is not None:
            if on:
                self._clear.clear()
            else:
                self._clear.set()
        for conn in self._conns:
            for pipe in conn.pipes():
                pipe.room.set()  # a reader waiting for room must start reading (to hold or drop)

    def _reset_all(self) -> int:
        conns = list(self._conns)
        for conn in conns:
            conn.abort(rst=True)
        self.resets += len(conns)
        return len(conns)

    def _start_storm(self, duration_s: float, every_s: float, p: float) -> None:
        if self._storm is not None:
            self._storm.cancel()
        self._storm_reset_p = p
        self._storm_until = time.monotonic() + duration_s
        self._storm = asyncio.get_running_loop().create_task(self._run_storm(every_s))

    async def _run_storm(self, every_s: float) -> None:
        while True:
            self._reset_all()
            remaining = self._storm_until - time.monotonic()
            if remaining <= 0:
                return
            await asyncio.sleep(min(every_s, remaining))

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        conn = _Conn(writer, _Pipe(reader, None, up=True))
        self._conns.add(conn)
        self.connections_total += 1
        try:
            await self._serve(conn)
        finally:
            conn.abort(rst=False)  # no-op unless something failed before the connection ended
            self._conns.discard(conn)
            self._handlers.discard(task)

    async def _serve(self, conn: _Conn) -> None:
        assert self._clear is not None
        if self.storming and self._rng.random() < self._storm_reset_p:
            conn.abort(rst=True)
            self.resets += 1
            return
        _nodelay(conn.client)
        # Read the client at once, even before the target answers, so that a blackhole holds or
        # drops the client's first bytes like any other.
        conn.spawn(self._pump(conn, conn.up))
        if not self._clear.is_set() and not await self._unless_ended(conn, self._clear.wait()):
            return
        connect = asyncio.ensure_future(
            asyncio.wait_for(asyncio.open_connection(self.target_host, self.target_port), CONNECT_TIMEOUT_S)
        )
        alive = await self._unless_ended(conn, connect)
        if not connect.cancelled() and connect.exception() is None:
            upstream_reader, upstream = connect.result()
            if not alive:
                _abort(upstream, rst=True)  # reset while dialling: the target must not keep it
                return
        else:
            conn.abort(rst=True)  # target unreachable: the client sees its connection reset
            return
        _nodelay(upstream)
        conn.upstream = conn.up.dst = upstream
        conn.down = _Pipe(upstream_reader, conn.client, up=False)
        conn.spawn(self._send(conn, conn.up))
        conn.spawn(self._pump(conn, conn.down))
        conn.spawn(self._send(conn, conn.down))
        await conn.done.wait()

    async def _unless_ended(self, conn: _Conn, awaitable: Awaitable[object]) -> bool:
        """Wait for `awaitable` unless the connection ends first; False if it ended."""
        work = asyncio.ensure_future(awaitable)
        ended = asyncio.ensure_future(conn.done.wait())
        await asyncio.wait([work, ended], return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait([work])
        return not conn.closed

    async def _pump(self, conn: _Conn, pipe: _Pipe) -> None:
        """Read one side; forward directly when no fault applies, else queue for `_send`."""
        read = pipe.src.read
        try:
            while True:
                data = await read(READ_SIZE)
                if not data:
                    self._enqueue(pipe, _Signal.EOF)
                    return
                dst = pipe.dst
                if dst is not None and pipe.pending == 0 and not self._blackholed and self._latency == (0.0, 0.0):
                    # The fast path: nothing queued ahead, so writing now keeps the order.
                    dst.write(data)
                    if pipe.up:
                        self.bytes_up += len(data)
                    else:
                        self.bytes_down += len(data)
                    await dst.drain()
                    continue
                if self._blackholed and self._mode == "drop":
                    self.bytes_dropped += len(data)
                    continue
                self._enqueue(pipe, data)
                if self._blackholed and pipe.queued_bytes > self._hold_limit:
                    conn.abort(rst=True)
                    self.resets += 1
                    return
                while pipe.queued_bytes > HIGH_WATER and not self._blackholed:
                    pipe.room.clear()
                    await pipe.room.wait()
        except OSError:
            # This side was reset (or our write to the other side failed): pass the reset on, in
            # its place in the stream.
            self._enqueue(pipe, _Signal.RST)

    def _enqueue(self, pipe: _Pipe, item: _Item) -> None:
        delay, jitter = self._latency
        if jitter:
            delay += self._rng.uniform(-jitter, jitter)
        due = asyncio.get_running_loop().time() + max(0.0, delay)
        pipe.last_due = due = max(pipe.last_due, due)
        pipe.queue.put_nowait((due, item))
        pipe.pending += 1
        if isinstance(item, bytes):
            pipe.queued_bytes += len(item)

    async def _send(self, conn: _Conn, pipe: _Pipe) -> None:
        """Write queued items to `dst` at their send time, holding or dropping them in a blackhole."""
        assert self._clear is not None and pipe.dst is not None
        loop = asyncio.get_running_loop()
        dst = pipe.dst
        try:
            while True:
                due, item = await pipe.queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                dropped = False
                while self._blackholed:
                    if self._mode == "drop" and isinstance(item, bytes):
                        dropped = True
                        break
                    await self._clear.wait()
                pipe.pending -= 1
                if isinstance(item, bytes):
                    pipe.queued_bytes -= len(item)
                    if pipe.queued_bytes <= HIGH_WATER:
                        pipe.room.set()
                    if dropped:
                        self.bytes_dropped += len(item)
                        continue
                    dst.write(item)
                    if pipe.up:
                        self.bytes_up += len(item)
                    else:
                        self.bytes_down += len(item)
                    await dst.drain()
                elif item is _Signal.EOF:
                    if dst.can_write_eof():
                        dst.write_eof()
                    conn.eof_sent()
                    return
                else:
                    conn.abort(rst=True)
                    return
        except OSError:
            conn.abort(rst=True)
