"""A queue's completion hooks as stored (`feedproc_queues.hooks`): read in the transaction that
finishes a partition, written by `queue set` and by applying a pipeline with [hooks]; and the other
settings a pipeline writes on its queue's row (`write_queue_values`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from ..core.errors import InvalidInput
from ..core.hooks import check_hooks
from .base import Q
from .foundations import db_now
from .schema import queues


def stored_hooks(text: str | None) -> dict[str, str]:
    """A queue's stored hooks (JSON) as a mapping; {} when none, or when unreadable (hand-written)."""
    if not text:
        return {}
    try:
        return check_hooks(json.loads(text))
    except (ValueError, InvalidInput):
        return {}


def write_hooks(
    conn: Connection, queue: str, given: Mapping[str, str], *, removed: Collection[str] = (), replace: bool = False
) -> dict[str, str]:
    """Store queue `queue`'s hooks in this transaction (its row made if it has none): `given` added
    to those stored (all replaced with `replace`), `removed` taken away. Returns the hooks now stored."""
    current = conn.execute(select(Q.hooks).where(Q.name == queue).with_for_update()).one_or_none()
    merged = {} if replace or current is None else stored_hooks(current.hooks)
    merged = {name: t for name, t in {**merged, **given}.items() if name not in removed}
    text = json.dumps(dict(sorted(merged.items()))) if merged else None
    if current is None:
        conn.execute(insert(queues).values(name=queue, updated_at=db_now(), hooks=text))
    else:
        conn.execute(update(queues).where(Q.name == queue).values(hooks=text, updated_at=db_now()))
    return merged


def write_queue_values(conn: Connection, queue: str, values: Mapping[str, object]) -> None:
    """Set columns of queue `queue`'s settings row in this transaction (the row made if it has none)."""
    exists = conn.execute(select(Q.name).where(Q.name == queue).with_for_update()).first() is not None
    if exists:
        conn.execute(update(queues).where(Q.name == queue).values(updated_at=db_now(), **values))
    else:
        conn.execute(insert(queues).values(name=queue, updated_at=db_now(), **values))
