"""Wake-ups without polling on PostgreSQL: LISTEN/NOTIFY.

Producers (and watchers, when they hand a partition over) send `NOTIFY feedproc_ready, '<queue>'`
in the same transaction as the change, so it is delivered exactly when the change is visible. A
watcher's `Listener` holds one extra connection in LISTEN mode on a thread of its own and calls back
on each notification for its queue; polling remains the fallback (and the only mechanism on SQLite).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection

log = logging.getLogger("feedproc.notify")
CHANNEL = "feedproc_ready"
_NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', :queue)")


def notify_ready(conn: Connection, queue: str) -> None:
    """Tell listening watchers that `queue` has new work (delivered at commit; PostgreSQL only)."""
    if conn.dialect.name == "postgresql":
        conn.execute(_NOTIFY, {"queue": queue})


class Listener:
    """Listens for work notifications on PostgreSQL and calls `on_ready()` for `queue`."""

    def __init__(self, engine: Engine, queue: str, on_ready: Callable[[], Any]) -> None:
        self.dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.queue = queue
        self.on_ready = on_ready
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feedproc-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg

        delay = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if delay > 0.5:
                        log.warning("listening for notifications again")
                    delay = 0.5
                    self.on_ready()  # anything sent while we were not listening
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            if note.payload == self.queue:
                                self.on_ready()
            except Exception as error:  # the server restarted or is unreachable: poll meanwhile
                if self._stop.is_set():
                    return
                if delay == 0.5:
                    log.warning("notifications unavailable (%s); polling until they are back", error)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
