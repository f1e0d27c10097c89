"""feedproc/serving.py: the bounded uvicorn protocol on a real socket (a request body that comes too
slowly, the uvicorn internals it relies on) and the byte budget of request bodies."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from feedproc.serving import Budget, Limits, uvicorn_settings

from ..support import wait_until


async def read_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, then answers 200."""
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server() -> Iterator[int]:
    """A bounded server: header deadline 0.5 s, bodies at least 1000 bytes/s."""
    sock = socket.create_server(("127.0.0.1", 0))
    limits = Limits(max_connections=4, header_timeout=0.5, idle_timeout=5, min_body_rate=1000)
    config = uvicorn.Config(read_body, lifespan="off", log_config=None, access_log=False, **uvicorn_settings(limits))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=10, what="the server to start")
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=10)


def test_a_body_slower_than_the_minimum_rate_is_cut_off(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as connection:
        connection.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        started = time.monotonic()
        with pytest.raises(OSError):
            while time.monotonic() - started < 10:
                connection.sendall(b"x" * 10)  # 100 bytes/s
                time.sleep(0.1)
        assert time.monotonic() - started < 3


def test_a_body_at_a_fair_rate_is_read_whole(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as connection:
        connection.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\n\r\n")
        for _ in range(15):  # 1.5 s, three header deadlines, at 20,000 bytes/s
            connection.sendall(b"x" * 2000)
            time.sleep(0.1)
        connection.settimeout(5)
        assert connection.recv(1024).startswith(b"HTTP/1.1 200 ")


def test_the_uvicorn_internals_serving_relies_on_are_there() -> None:
    """serving.py subclasses uvicorn's H11Protocol (pyproject.toml pins the versions checked): a
    uvicorn that renames these fails here first."""
    for method in ("connection_made", "connection_lost", "data_received", "handle_events", "on_response_complete"):
        assert callable(getattr(H11Protocol, method))
    assert list(inspect.signature(H11Protocol.__init__).parameters)[:4] == [
        "self",
        "config",
        "server_state",
        "app_state",
    ]
    source = inspect.getsource(H11Protocol)
    for used in ("self.app = ", "self.cycle = RequestResponseCycle(", "self.flow = FlowControl(", "self.conn = h11."):
        assert used in source, used
    assert "response_complete" in inspect.getsource(RequestResponseCycle)
    assert callable(FlowControl.pause_reading) and "read_paused" in inspect.getsource(FlowControl)


def test_the_byte_budget_grants_in_order_and_refuses_after_its_wait() -> None:
    async def scenario() -> None:
        budget = Budget(100)
        assert await budget.acquire(60, timeout=1)
        assert not await budget.acquire(50, timeout=0.05)  # 60 + 50 > 100: refused after the wait
        big = asyncio.ensure_future(budget.acquire(80, timeout=5))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(budget.acquire(10, timeout=5))  # would fit, but waits its turn
        await asyncio.sleep(0.05)
        assert not big.done() and not small.done()
        budget.release(60)
        assert await big and await small
        assert budget.used == 90
        assert await budget.acquire(500, timeout=0.05) is False  # more than the whole: at most all of it
        budget.release(80)
        budget.release(10)
        assert await budget.acquire(500, timeout=0.05) and budget.used == 100

    asyncio.run(scenario())
