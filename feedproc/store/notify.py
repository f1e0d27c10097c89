"""Wake-ups without polling on PostgreSQL: LISTEN/NOTIFY.

Producers (and watchers, when they hand a partition over) send `NOTIFY feedproc_ready, '<queue>'`
in the same transaction as the change, so it is delivered exactly when the change is visible. A
watcher's `Listener` holds one extra connection in LISTEN mode on a thread of its own and calls back
on each notification for its queue; polling remains the fallback, and the only mechanism on SQLite
and MariaDB/MySQL, which have no LISTEN: their dialects' `notify_*` operations send nothing, and no
listener is started (watchers, `Feed.listen_ready` and `wait` check `store.listen_dsn`, which is
also None behind a transaction pooler without a direct connection: `pooling.py`). The
notifications themselves are PostgreSQL's dialect's (`dialect/postgresql/`); the channels are here.

A watcher that asks for a steal sends `NOTIFY feedproc_wanted, '<owner watcher id>'`: the owner
hands the partition over as soon as its in-flight items are done, instead of at its next poll.

A partition that reaches a final state (complete, failed, cancelled) sends
`NOTIFY feedproc_finished, '<key>'`, in the transaction that finishes it; `FinishedListener` is
what `Feed.wait` / `feedproc wait` block on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from .prefixes import qualify

log = logging.getLogger("feedproc.store.notify")
CHANNEL = "feedproc_ready"
WANTED_CHANNEL = "feedproc_wanted"
FINISHED_CHANNEL = "feedproc_finished"


class FinishedListener:
    """A LISTEN connection on `feedproc_finished` for one waiter (PostgreSQL). Listen first, then read
    the partition's status, then `wait_for(key, seconds)`: no notification can fall in between."""

    def __init__(self, dsn: str, prefix: str) -> None:
        import psycopg

        self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        self._conn.execute(f"LISTEN {qualify(FINISHED_CHANNEL, prefix)}")

    def wait_for(self, key: str, seconds: float) -> bool:
        """Block up to `seconds` for a notification about `key`; True if one came. Raises on a lost
        connection (the caller falls back to polling)."""
        if seconds <= 0:
            return False
        return any(note.payload == key for note in self._conn.notifies(timeout=seconds))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()


class Listener:
    """Listens for notifications on PostgreSQL: calls `on_ready()` when `queue` (None: any queue)
    has new work and `on_wanted()` when another watcher wants partitions of `watcher_id`."""

    def __init__(
        self,
        dsn: str,
        prefix: str,
        queue: str | None,
        on_ready: Callable[[], Any],
        *,
        watcher_id: str | None = None,
        on_wanted: Callable[[], Any] | None = None,
    ) -> None:
        self.dsn = dsn
        # The channels of these tables (a feed under another table prefix has its own).
        self.channel, self.wanted_channel = qualify(CHANNEL, prefix), qualify(WANTED_CHANNEL, prefix)
        self.queue = queue
        self.on_ready = on_ready
        self.watcher_id = watcher_id
        self.on_wanted = on_wanted
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
                    if self.on_wanted is not None:
                        conn.execute(f"LISTEN {self.wanted_channel}")
                    conn.execute(f"LISTEN {self.channel}")  # last: the statement pg_stat_activity shows (bench)
                    if delay > 0.5:
                        log.warning("listening for notifications again")
                    delay = 0.5
                    self.on_ready()  # anything sent while we were not listening
                    wanted = (self.wanted_channel, self.watcher_id)
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            if note.channel == self.channel and self.queue in (None, note.payload):
                                self.on_ready()
                            elif self.on_wanted and (note.channel, note.payload) == wanted:
                                self.on_wanted()
            except Exception as error:  # the server restarted or is unreachable: poll meanwhile
                if self._stop.is_set():
                    return
                if delay == 0.5:
                    log.warning("notifications unavailable (%s); polling until they are back", error)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
