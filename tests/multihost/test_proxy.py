"""The fault proxy, over real sockets on 127.0.0.1, in front of an echo server."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from ..support import wait_until
from .proxy import FaultProxy

TIMEOUT = 5.0


class EchoServer(socketserver.ThreadingTCPServer):
    """Echoes every byte back; records how each connection ended ("eof" or "reset")."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.accepted = 0
        self.outcomes: list[str] = []
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Echo(socketserver.BaseRequestHandler):
    server: EchoServer

    def handle(self) -> None:
        with self.server.lock:
            self.server.accepted += 1
        outcome = "eof"
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except ConnectionResetError:
            outcome = "reset"
        except OSError:
            outcome = "error"
        with self.server.lock:
            self.server.outcomes.append(outcome)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(TIMEOUT)


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", 0, "127.0.0.1", echo.port) as p:
        yield p


def connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=TIMEOUT)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(65536, n - got))
        if not chunk:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def round_trip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return recv_exactly(sock, len(data))


def assert_reset_on_arrival(proxy: FaultProxy) -> None:
    """A new connection is reset: connecting (on loopback the RST can beat connect()'s return),
    writing or reading fails with a reset, never with data or an EOF."""
    with pytest.raises((ConnectionResetError, BrokenPipeError)), connect(proxy) as sock:
        sock.sendall(b"anyone there?")
        sock.recv(1)


def assert_silent(sock: socket.socket, for_s: float = 0.5) -> None:
    sock.settimeout(for_s)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(TIMEOUT)


# ---------------------------------------------------------------------- forwarding


def test_bytes_round_trip_unchanged(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert round_trip(sock, b"SELECT 1;\x00\xff") == b"SELECT 1;\x00\xff"


def test_a_mebibyte_round_trips_unchanged(proxy: FaultProxy) -> None:
    data = os.urandom(1024 * 1024)
    with connect(proxy) as sock:
        # Send from a thread: echoing 1 MiB back while we are still sending could fill every buffer.
        sender = threading.Thread(target=sock.sendall, args=(data,))
        sender.start()
        received = recv_exactly(sock, len(data))
        sender.join(TIMEOUT)
    assert received == data


def test_counts_connections_and_bytes_each_way(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        round_trip(sock, b"x" * 1000)
        wait_until(lambda: proxy.connections_open == 1, TIMEOUT, 0.01, "the connection to be counted")
    wait_until(lambda: proxy.connections_open == 0, TIMEOUT, 0.01, "the connection to close")
    assert (proxy.connections_total, proxy.bytes_up, proxy.bytes_down) == (1, 1000, 1000)


def test_each_client_connection_gets_one_connection_to_the_target(proxy: FaultProxy, echo: EchoServer) -> None:
    for _ in range(3):
        with connect(proxy) as sock:
            round_trip(sock, b"ping")
    assert echo.accepted == 3


# ---------------------------------------------------------------------- latency


def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    proxy.set_latency(50)
    with connect(proxy) as sock:
        started = time.monotonic()
        assert round_trip(sock, b"ping") == b"ping"
        elapsed = time.monotonic() - started
    assert 0.095 <= elapsed < 2.0


def test_latency_zero_removes_the_delay(proxy: FaultProxy) -> None:
    proxy.set_latency(300)
    proxy.set_latency(0)
    with connect(proxy) as sock:
        started = time.monotonic()
        round_trip(sock, b"ping")
        elapsed = time.monotonic() - started
    assert elapsed < 0.3  # 600 ms with the latency


def test_a_large_transfer_with_latency_arrives_unchanged(proxy: FaultProxy) -> None:
    proxy.set_latency(1)  # every chunk goes through the delay queue and its flow control
    data = os.urandom(8 * 1024 * 1024)
    with connect(proxy) as sock:
        sender = threading.Thread(target=sock.sendall, args=(data,))
        sender.start()
        received = recv_exactly(sock, len(data))
        sender.join(TIMEOUT)
    assert received == data


def test_jitter_never_reorders_a_stream(proxy: FaultProxy) -> None:
    proxy.set_latency(2, jitter_ms=20)  # delays of 0 to 22 ms: much reordering if it were allowed
    messages = [b"%06d\n" % i for i in range(1000)]
    with connect(proxy) as sock:
        for message in messages:
            sock.sendall(message)
        received = recv_exactly(sock, sum(map(len, messages)))
    assert received == b"".join(messages)


# ---------------------------------------------------------------------- blackhole


def test_blackhole_holds_bytes_until_it_ends(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        round_trip(sock, b"warm")
        proxy.blackhole(True)
        sock.sendall(b"ping")
        assert_silent(sock)
        proxy.blackhole(False)
        assert recv_exactly(sock, 4) == b"ping"


def test_a_connection_made_during_a_blackhole_works_after_it(proxy: FaultProxy) -> None:
    proxy.blackhole(True)
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        assert_silent(sock)
        proxy.blackhole(False)
        assert recv_exactly(sock, 5) == b"hello"
        assert round_trip(sock, b"again") == b"again"


def test_the_target_sees_no_new_connection_during_a_blackhole(proxy: FaultProxy, echo: EchoServer) -> None:
    proxy.blackhole(True)
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        wait_until(lambda: proxy.connections_total == 1, TIMEOUT, 0.01, "the proxy to accept")
        assert_silent(sock, 0.2)
        assert echo.accepted == 0
        proxy.blackhole(False)
        wait_until(lambda: echo.accepted == 1, TIMEOUT, 0.01, "the target to be dialled")


def test_holding_more_than_the_limit_resets_the_connection(echo: EchoServer) -> None:
    with FaultProxy("127.0.0.1", 0, "127.0.0.1", echo.port, hold_limit_bytes=64 * 1024) as proxy:
        with connect(proxy) as sock:
            round_trip(sock, b"warm")
            proxy.blackhole(True)
            sock.sendall(b"x" * (256 * 1024))
            with pytest.raises(ConnectionResetError):
                sock.recv(1)
        assert proxy.resets == 1


def test_blackhole_drop_mode_loses_bytes_and_the_stream_goes_on(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        round_trip(sock, b"warm")
        proxy.blackhole(True, mode="drop")
        sock.sendall(b"lost")
        wait_until(lambda: proxy.bytes_dropped == 4, TIMEOUT, 0.01, "the bytes to be dropped")
        proxy.blackhole(False)
        assert_silent(sock, 0.2)
        assert round_trip(sock, b"after") == b"after"


# ---------------------------------------------------------------------- resets


def test_reset_all_resets_every_client_and_counts(proxy: FaultProxy) -> None:
    with connect(proxy) as one, connect(proxy) as two:
        round_trip(one, b"1")
        round_trip(two, b"2")
        assert proxy.reset_all() == 2
        for sock in (one, two):
            with pytest.raises(ConnectionResetError):
                sock.recv(1)
    assert proxy.resets == 2


def test_reset_all_resets_the_target_side_too(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        round_trip(sock, b"1")
        proxy.reset_all()
    wait_until(lambda: echo.outcomes, TIMEOUT, 0.01, "the target to see the connection end")
    assert echo.outcomes == ["reset"]


def test_a_reset_storm_resets_open_connections(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        round_trip(sock, b"1")
        proxy.reset_storm(duration_s=1.0, every_s=0.1)
        with pytest.raises(ConnectionResetError):
            sock.recv(1)


def test_a_reset_storm_resets_new_connections_with_the_given_probability(proxy: FaultProxy) -> None:
    # every_s longer than the storm: after the first (immediate) round, only arrivals are reset.
    proxy.reset_storm(duration_s=30.0, every_s=60.0, new_connection_reset_p=1.0)
    assert_reset_on_arrival(proxy)
    proxy.reset_storm(duration_s=30.0, every_s=60.0, new_connection_reset_p=0.0)
    with connect(proxy) as sock:
        assert round_trip(sock, b"spared") == b"spared"


def test_a_new_connection_works_after_a_reset_storm(proxy: FaultProxy) -> None:
    proxy.reset_storm(duration_s=0.3, every_s=0.05, new_connection_reset_p=1.0)
    wait_until(lambda: not proxy.storming, TIMEOUT, 0.01, "the storm to end")
    with connect(proxy) as sock:
        assert round_trip(sock, b"calm") == b"calm"


# ---------------------------------------------------------------------- stop


def test_stop_leaves_no_thread_and_closes_the_port(echo: EchoServer) -> None:
    before = set(threading.enumerate())
    proxy = FaultProxy("127.0.0.1", 0, "127.0.0.1", echo.port).start()
    with connect(proxy) as sock:
        round_trip(sock, b"1")
        proxy.stop()
        assert sock.recv(1) == b""  # the open connection was closed
    # The echo server's thread for that connection ends once the proxy closed its side.
    wait_until(lambda: set(threading.enumerate()) <= before, TIMEOUT, 0.01, "the proxy's threads to end")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=TIMEOUT).close()
    proxy.stop()  # idempotent
