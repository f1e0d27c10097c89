"""A multi-host PostgreSQL URL (`?host=a:5432&host=b:5432&target_session_attrs=read-write`), as a
cluster with failover is reached: a host that refuses is passed over for the next, for the store's
connections and for the one notifications are listened on."""

from __future__ import annotations

import socket
import threading

import pytest
from sqlalchemy import make_url

from feedproc import Feed

pytestmark = pytest.mark.postgres_only


def refusing_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def multi_host(db_url: str) -> str:
    url = make_url(db_url)
    hosts = (f"127.0.0.1:{refusing_port()}", f"{url.host}:{url.port or 5432}")
    spelled = url.set(host=None, port=None, query={"host": hosts, "target_session_attrs": "read-write"})
    return spelled.render_as_string(hide_password=False)


def test_the_store_and_its_listener_connect_to_the_host_that_answers(db_url: str) -> None:
    woken = threading.Event()
    with Feed(multi_host(db_url)) as feed:
        stop = feed.listen_ready(woken.set)
        assert stop is not None
        try:
            assert woken.wait(10), "the listener did not connect"  # it wakes once when it starts to listen
            woken.clear()
            feed.add_partition("p", [(0, b"{}")])
            assert woken.wait(10), "no notification came over the multi-host listen connection"
        finally:
            stop()
        assert feed.status("p").items["available"] == 1
