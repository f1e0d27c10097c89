"""Bounded HTTP serving, shared by `feedproc serve` and the watchers' monitor: uvicorn's HTTP/1.1
protocol (h11) with limits that no client, slow or silent, can outlast.

Per connection (`Limits`):

- a header deadline: the request line and headers must be complete within `header_timeout` seconds
  of the connection opening, or of the first byte after an idle pause; bytes trickling in do not
  reset it (uvicorn's keep-alive timer, which data does reset, let a header line every 2 s hold a
  connection forever);
- an idle timeout between requests (uvicorn's keep-alive, `idle_timeout`);
- a minimum body rate: each `header_timeout` window of a request body in which the server did not
  itself pause reading must bring `min_body_rate` bytes a second, else the connection is closed.

Per server: at most `max_connections` connections. A newcomer at the cap closes the oldest
connection not in a request that has sent part of one (a slow client), else the oldest one that has
sent nothing for `ROOM_DELAY` (idle, or silent); never a connection whose request may just not have
been read yet (asyncio accepts connections in batches before reading any, and a probe early in a
batch must not be evicted by the rest of it). A connection closed so before it ever sent a whole
request is answered 503 first. Newcomers beyond the cap that found nothing to close are let in up
to `BACKLOG` more (room is made for them once they have been read), then answered 503 at once.
API requests (any path but `PROBE_PATHS`) are at most `max_connections` at once; more are answered
503 with `Connection: close`. Probe requests are never refused while fewer than `probe_reserve` run
beyond the cap. So open sockets stay bounded, a slowloris client is evicted by newcomers, and probes
always get through.

uvicorn internals relied on (a change breaks `tests/unit/test_serving.py`): `H11Protocol`'s
constructor, `connection_made`, `data_received`, `handle_events` (which starts a request by
setting `self.cycle`), `on_response_complete`, `connection_lost`, and the attributes `app` (the
ASGI app a request runs), `cycle` (its `response_complete`), `conn` (the h11 connection), `flow`
(a `FlowControl` whose `pause_reading` uvicorn calls when the app does not read the body yet),
`transport` and `loop`. pyproject.toml pins the uvicorn versions these were checked against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("feedproc.serving")

#: Paths never refused for concurrency: liveness and readiness probes must answer while the API is busy.
PROBE_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
#: Descriptors a server process needs besides its HTTP connections: database connections (a pool of
#: 5 + 5 overflow, SQLite's -wal and -shm files each), listening socket, logs, stdio, imports.
DESCRIPTOR_MARGIN = 64
#: The listen backlog, which is also how many connections asyncio accepts at once before any of them
#: can be counted (and so how far the open sockets may overshoot the cap for a moment).
BACKLOG = 32
#: Seconds a connection that has sent nothing is safe from eviction (and the delay before room is
#: made for newcomers beyond the cap): time for its request to be read, even on a loaded machine.
ROOM_DELAY = 0.5

BUSY_BODY = b'{"error": "server busy: too many connections; retry"}'
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(BUSY_BODY), BUSY_BODY)
)


@dataclass(frozen=True)
class Limits:
    """How much one server lets its clients hold."""

    max_connections: int
    header_timeout: float  # seconds to send a request's line and headers, however slowly bytes come
    idle_timeout: float  # seconds a connection may stay idle between two requests
    min_body_rate: float = 8192.0  # bytes a second a request body must arrive at (64 kbit/s)
    probe_reserve: int = 4  # probe requests served beyond max_connections (kubelets probe 2 or 3 at once)


class _Registry:
    """The connections of one server (one event loop: no locking). `waiting` holds those not in a
    request, oldest first: the ones a newcomer at the cap evicts."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: dict[BoundedH11Protocol, None] = {}
        self.waiting: dict[BoundedH11Protocol, None] = {}
        self.api_requests = self.probe_requests = 0
        self._room: asyncio.TimerHandle | None = None

    def forget(self, connection: BoundedH11Protocol) -> None:
        self.open.pop(connection, None)
        self.waiting.pop(connection, None)

    def evictable(self, now: float) -> BoundedH11Protocol | None:
        """The connection to close for a newcomer: the oldest one not in a request that has sent
        part of one (a slow client), else the oldest one idle for ROOM_DELAY. Never one whose request
        may simply not have been read yet: asyncio accepts connections in batches, and a probe early
        in a batch must not be evicted by the rest of it."""
        for connection in self.waiting:
            if connection.heard:
                return connection
        for connection in self.waiting:
            if now - connection.since >= ROOM_DELAY:
                return connection
        return None

    def make_room(self, now: float) -> bool:
        """Close the oldest evictable connection; False when there is none."""
        connection = self.evictable(now)
        if connection is not None:
            connection._close(evicted=True)
        return connection is not None

    def make_room_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._room is None:
            self._room = loop.call_later(ROOM_DELAY, self._make_room, loop)

    def _make_room(self, loop: asyncio.AbstractEventLoop) -> None:
        self._room = None
        while len(self.open) > self.limits.max_connections and self.make_room(loop.time()):
            pass
        if len(self.open) > self.limits.max_connections and self.waiting:  # newcomers too fresh yet
            self.make_room_soon(loop)


class _WatchedFlow(FlowControl):
    """uvicorn's flow control, remembering that reading was paused: a body that arrives slowly
    because the app has not read it yet is not the client's fault."""

    was_paused = False

    def pause_reading(self) -> None:
        self.was_paused = True
        super().pause_reading()


class BoundedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the limits of this module; `bounded_protocol` makes the
    class for one server (its limits and connection registry)."""

    registry: ClassVar[_Registry]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = self.registry.limits
        self._inner_app = self.app
        self.app = self._admit
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_bytes = 0
        self.since, self.heard = 0.0, False  # waiting for a request since; anything received since

    # ---------------------------------------------------------------- connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = self._flow = _WatchedFlow(transport)
        registry, limits = self.registry, self.limits
        if len(registry.open) >= limits.max_connections:
            registry.make_room(self.loop.time())
        if len(registry.open) >= limits.max_connections + BACKLOG:  # every one in a request, or too fresh
            log.warning("%d connections open, none to close: answering a newcomer 503", len(registry.open))
            transport.write(_BUSY_RESPONSE)
            transport.close()
            return
        registry.open[self] = None
        self._wait_for_request()
        self._header_timer = self.loop.call_later(limits.header_timeout, self._header_expired)
        if len(registry.open) > limits.max_connections:
            registry.make_room_soon(self.loop)

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.forget(self)
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self in self.registry.waiting:
            self.heard = True
            if self._header_timer is None:  # the first byte after an idle pause: the header deadline starts
                self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_expired)
        else:
            self._body_bytes += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and not self.transport.is_closing():
            self._request_started()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle.response_complete:  # no pipelined request started
            self._wait_for_request()

    # ---------------------------------------------------------------- states and timers

    def _wait_for_request(self) -> None:
        self.registry.waiting.pop(self, None)
        self.registry.waiting[self] = None  # the newest waiting connection: evicted last
        self.since, self.heard = self.loop.time(), False

    def _request_started(self) -> None:
        self.registry.waiting.pop(self, None)
        self._cancel_timers()
        if self.conn.their_state is h11.SEND_BODY:
            self._watch_body()

    def _watch_body(self) -> None:
        self._body_bytes = 0
        self._flow.was_paused = self._flow.read_paused
        self._body_timer = self.loop.call_later(self.limits.header_timeout, self._body_check)

    def _body_check(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        if not self._flow.was_paused and self._body_bytes < self.limits.min_body_rate * self.limits.header_timeout:
            log.info("closing a connection whose request body came slower than %g bytes/s", self.limits.min_body_rate)
            self._close()
            return
        self._watch_body()

    def _header_expired(self) -> None:
        self._header_timer = None
        if self in self.registry.waiting:
            self._close()

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    def _close(self, *, evicted: bool = False) -> None:
        self.registry.forget(self)
        self._cancel_timers()
        if evicted and self.cycle is None and not self.transport.is_closing():
            self.transport.write(_BUSY_RESPONSE)  # it never sent a whole request: say why it is closed
        if not self.transport.is_closing():
            with contextlib.suppress(h11.LocalProtocolError):  # in the middle of a request: just close
                self.conn.send(h11.ConnectionClosed())
            self.transport.close()

    # ---------------------------------------------------------------- requests

    async def _admit(self, scope: Any, receive: Any, send: Any) -> None:
        """Run the app; 503 for an API request beyond `max_connections` at once, or for a probe
        beyond `probe_reserve` at once while the server holds more connections than its cap."""
        registry, limits = self.registry, self.limits
        probe = scope["type"] == "http" and scope["path"] in PROBE_PATHS
        if probe:
            admitted = len(registry.open) <= limits.max_connections or registry.probe_requests < limits.probe_reserve
        else:
            admitted = registry.api_requests < limits.max_connections
        if not admitted:
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(BUSY_BODY)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": BUSY_BODY})
            return
        if probe:
            registry.probe_requests += 1
        else:
            registry.api_requests += 1
        try:
            await self._inner_app(scope, receive, send)
        finally:
            if probe:
                registry.probe_requests -= 1
            else:
                registry.api_requests -= 1


def bounded_protocol(limits: Limits) -> type[BoundedH11Protocol]:
    """The protocol class for one uvicorn server (`uvicorn.Config(http=...)`): its connections share
    one registry, so make one per server."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"registry": _Registry(limits)})


def uvicorn_settings(limits: Limits) -> dict[str, Any]:
    """The `uvicorn.Config` arguments that apply `limits` (merge with the server's own)."""
    return {
        "http": bounded_protocol(limits),
        "ws": "none",
        "backlog": BACKLOG,
        "timeout_keep_alive": limits.idle_timeout,
        "limit_concurrency": None,  # ours: uvicorn's counts idle connections and cannot tell probes apart
    }


def fit_descriptors(max_connections: int, reserve: int = 4) -> int:
    """The connections this process has file descriptors for: raises the soft RLIMIT_NOFILE towards the
    hard one as needed, and returns `max_connections`, or fewer (logged) when even that is not enough."""
    overhead = reserve + DESCRIPTOR_MARGIN + 3 * BACKLOG  # newcomers not yet counted, and not yet read
    wanted = max_connections + overhead
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fitted = max(1, soft - overhead)
    log.warning(
        "only %d file descriptors (ulimit -n): serving at most %d connections instead of %d",
        soft,
        fitted,
        max_connections,
    )
    return fitted


class Budget:
    """An allowance shared by a server's requests (one event loop): bytes of request bodies being
    read and handled, or turns of expensive reads. FIFO: a large request waiting is not overtaken
    forever by small ones. Unlike `asyncio.wait_for(semaphore.acquire())` on Python 3.11, a grant
    that coincides with the timeout is never lost."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, size: int, timeout: float) -> bool:
        """Reserve `size` bytes (at most the whole budget), waiting up to `timeout` seconds; False
        when they could not be had."""
        size = min(size, self.total)
        if not self._waiters and self.used + size <= self.total:
            self.used += size
            return True
        waiter: tuple[int, asyncio.Future[None]] = (size, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter[1]), timeout)
            return True
        except TimeoutError:
            return self._withdraw(waiter)
        except asyncio.CancelledError:
            if self._withdraw(waiter):
                self.release(size)
            raise

    def _withdraw(self, waiter: tuple[int, asyncio.Future[None]]) -> bool:
        """Stop waiting; True when the bytes were granted meanwhile (the caller holds them)."""
        if waiter[1].done():
            return True
        self._waiters.remove(waiter)
        waiter[1].cancel()
        self._grant()  # a smaller request behind this one may fit now
        return False

    def release(self, size: int) -> None:
        self.used -= min(size, self.total)
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.total:
            size, future = self._waiters.popleft()
            self.used += size
            future.set_result(None)
