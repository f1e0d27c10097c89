"""Which items of a pull-mode queue a claim may take now, in claim order, locked: one statement per
dialect (`Dialect.find_claimable`). The claim itself (`pulling.py`) then keeps those that fit the
queue's and its gates' limits.

Claim order is lease order (priority, then age) over partitions no live watcher holds whose
priority is within the claim's range (`:min_priority` to `:max_priority`, the whole range unless the
worker asks for less: no statement of its own), each partition's items at its current gate in due
order. Partitions at a gate in `blocked` (full, or
outside its windows) are left out: read on, they would use up the claim's `max_items`. What the
dialects' statements share is here.
"""

from __future__ import annotations

from sqlalchemy import bindparam

from ..core.models import MAX_PRIORITY, MIN_PRIORITY
from .base import IS_AVAILABLE, P
from .foundations import db_now

MAX_CLAIM = 1000  # items per claim call (and answers per call), at most
#: The priorities a claim takes from when the worker names no range: all of them.
ALL_PRIORITIES = (MIN_PRIORITY, MAX_PRIORITY)

#: A partition of `:queue` whose items workers may claim now (not leased by a live watcher).
CLAIMABLE_PARTITION = (
    P.queue == bindparam("queue"),
    P.status == IS_AVAILABLE,
    P.ready_at.is_not(None),
    P.ready_at <= db_now(),
    (P.not_before.is_(None)) | (P.not_before <= db_now()),
    (P.lease_owner.is_(None)) | (P.lease_expires_at < db_now()),
    P.priority.between(bindparam("min_priority"), bindparam("max_priority")),
)
#: Partitions at a gate in `:blocked` (full, or outside its windows) left out: read on, they would use
#: up the claim's `:max`. A statement of its own, for claims of queues with such gates only.
NOT_BLOCKED = P.gate.not_in(bindparam("blocked", expanding=True))
