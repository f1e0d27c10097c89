"""A queue's pending work as a test sees it: which partitions are unfinished, when its next work is
due on the database's clock, how many deliveries were made; and a fake clock's move, every due
time of the queue brought forward at once (`bring_forward`), so that retries, backoff and
`not_before` come due without a test sleeping through them."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import and_, bindparam, case, func, select, update

from ..core.errors import InvalidInput, NotFound
from .base import IS_AVAILABLE, I, P, StoreBase
from .foundations import UTCDateTime, seconds_until
from .schema import items, partitions

#: When an available partition's current gate has work due: its earliest item's time, or its
#: `not_before` when that is later (a partition is leased only once both have passed).
_DUE_AT = case((and_(P.not_before.is_not(None), P.not_before > P.ready_at), P.not_before), else_=P.ready_at)


class Pending(StoreBase):
    """Unfinished partitions, the next due time, deliveries made, and moving the clock."""

    def partition_id(self, key: str) -> int:
        """Partition `key`'s id; NotFound if unknown."""
        with self.read() as conn:
            pid = conn.execute(select(P.id).where(P.key == key)).scalar()
        if pid is None:
            raise NotFound(f"no partition {key!r}")
        return int(pid)

    def unfinished(self, queue: str) -> list[str]:
        """The keys of `queue`'s partitions that are neither complete, failed nor cancelled, in key order."""
        with self.read() as conn:
            return list(
                conn.execute(select(P.key).where(P.queue == queue, P.status == IS_AVAILABLE).order_by(P.key)).scalars()
            )

    def next_due(self, queue: str) -> float | None:
        """Seconds from the database's now until work of `queue` is due next: 0 or less when some is
        due now (an item in flight is due until its answer is written), None when no unfinished
        partition waits for time (everything finished, or waiting for items, a seal or a checkpoint)."""
        statement = select(func.min(seconds_until(_DUE_AT))).where(
            P.queue == queue, P.status == IS_AVAILABLE, P.ready_at.is_not(None)
        )
        with self.read() as conn:
            seconds = conn.execute(statement).scalar()
        return None if seconds is None else float(seconds)

    def deliveries_made(self, queue: str) -> int:
        """Deliveries of `queue`'s items so far, answered and written (every gate, every outcome)."""
        statement = select(func.coalesce(func.sum(I.deliveries), 0)).select_from(
            items.join(partitions, I.partition_id == P.id)
        )
        with self.read() as conn:
            return int(conn.execute(statement.where(P.queue == queue)).scalar() or 0)

    def bring_forward(self, queue: str, seconds: float) -> int:
        """Move `queue`'s clock `seconds` forward: every due time of its unfinished partitions (their
        `ready_at` and `not_before`) and of their available items (retries, "not yet" answers,
        children waiting for their gate) comes `seconds` sooner. For a test, while no watcher holds
        the queue's partitions: item versions do not change, and history keeps its real times.
        Returns the number of partitions moved."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < 10 * 365 * 86400:
            raise InvalidInput(f"seconds must be a number from 0 to ten years, got {seconds!r}")
        shift = timedelta(seconds=seconds)
        with self.write() as conn:
            moved = conn.execute(
                select(P.id, P.ready_at, P.not_before).where(P.queue == queue, P.status == IS_AVAILABLE)
            ).all()
            if not moved:
                return 0
            conn.execute(
                update(partitions)
                .where(P.id == bindparam("p_id"))
                .values(
                    ready_at=bindparam("p_ready", type_=UTCDateTime()),
                    not_before=bindparam("p_not_before", type_=UTCDateTime()),
                ),
                [
                    {
                        "p_id": row.id,
                        "p_ready": None if row.ready_at is None else row.ready_at - shift,
                        "p_not_before": None if row.not_before is None else row.not_before - shift,
                    }
                    for row in moved
                ],
            )
            waiting = conn.execute(
                select(I.id, I.next_attempt_at).where(
                    I.partition_id.in_([row.id for row in moved]), I.status == IS_AVAILABLE
                )
            ).all()
            if waiting:
                conn.execute(
                    update(items)
                    .where(I.id == bindparam("i_id"))
                    .values(next_attempt_at=bindparam("i_next", type_=UTCDateTime())),
                    [{"i_id": row.id, "i_next": row.next_attempt_at - shift} for row in waiting],
                )
            return len(moved)
