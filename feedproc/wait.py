"""Waiting for a partition to finish (complete, failed or cancelled): `Feed.wait`, `feedproc wait`.

On PostgreSQL the waiter LISTENs on `feedproc_finished` (sent in the transaction that finishes a
partition) and reads the status when notified, polling only as a slow fallback; if notifications are
unavailable it polls. On SQLite and MariaDB/MySQL (no LISTEN) it polls with exponential backoff.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from .core.models import Status
from .store import Store

log = logging.getLogger("feedproc.wait")
FINAL = (Status.COMPLETE, Status.FAILED, Status.CANCELLED)
FIRST_POLL = 0.05  # seconds; doubles up to the poll interval


def wait_final(store: Store, key: str, timeout: float | None = None, *, poll_interval: float = 1.0) -> dict[str, Any]:
    """Block until partition `key` is complete, failed or cancelled; return its status dict.

    Raises NotFound for an unknown key and TimeoutError (carrying the last status as `.status`)
    when `timeout` seconds pass first. `poll_interval` is the longest pause between reads when
    polling; with notifications (PostgreSQL) it is only the fallback's period, at least 5 s.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    listener = _listen(store)
    try:
        delay = FIRST_POLL
        while True:
            status = store.status(key)
            if status["status"] in FINAL:
                return status
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                error = TimeoutError(f"partition {key!r} is still {status['status']} after {timeout:g}s")
                error.status = status  # type: ignore[attr-defined]
                raise error
            if listener is not None:
                pause = max(poll_interval, 5.0) if remaining is None else min(max(poll_interval, 5.0), remaining)
                try:
                    listener.wait_for(key, pause)
                except Exception as error:  # the server went away: poll from now on
                    log.warning("notifications unavailable (%s); polling", error)
                    listener.close()
                    listener = None
                continue
            pause = delay if remaining is None else min(delay, remaining)
            time.sleep(pause)
            delay = min(delay * 2, poll_interval)
    finally:
        if listener is not None:
            listener.close()


def _listen(store: Store) -> Any:
    """A FinishedListener on PostgreSQL, or None (SQLite, MariaDB/MySQL, a transaction pooler with no
    direct listen URL, or notifications unavailable)."""
    if store.listen_dsn is None:
        return None
    from .store.notify import FinishedListener

    with contextlib.suppress(Exception):
        return FinishedListener(store.listen_dsn, store.table_prefix)
    log.warning("could not LISTEN for notifications; polling")
    return None
