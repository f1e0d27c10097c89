"""What every part of `Feed` shares: its store and retry policy, `retried` (a call run again after a
database conflict) and the gate names of a queue's pipeline, by which items and answers may name gates."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, TypeVar, cast

import tenacity

from ..core.errors import DatabaseConflict, DatabaseRefusesWrites
from ..core.gate_names import naming
from ..core.models import NewItem, check_key
from ..core.policy import RetryPolicy
from ..store import Store

ItemLike = NewItem | tuple[int, bytes] | dict[str, Any]
F = TypeVar("F", bound=Callable[..., Any])
#: Times a call is run again after the database aborted it in a conflict (DatabaseConflict).
CONFLICT_RETRIES = 4


def retried(call: F) -> F:
    """Run `call` again when that can succeed: up to CONFLICT_RETRIES times, after a short random
    wait, when the database aborted its transaction in a conflict (a serialization failure or a
    deadlock rolled everything back, and running it again is what the database asks for); once, at
    once, when a write was refused as read-only: the store has closed its connections then, and a
    session opened while the database was read-only stays so after it takes writes again
    (PostgreSQL's default_transaction_read_only, SQLite's read-only storage). Never when the call
    runs in the caller's transaction (a `connection=` keyword): the error is the caller's to handle.
    Tenacity takes over only after a failure: its decorator costs 11 us a call, on the worker API's
    claims too."""
    again = tenacity.retry(
        retry=tenacity.retry_if_exception_type(DatabaseConflict),
        stop=tenacity.stop_after_attempt(CONFLICT_RETRIES),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
        reraise=True,
    )(call)

    @functools.wraps(call)
    def run(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("connection") is not None:
            # In the caller's transaction: a conflict may have rolled all of it back (MariaDB does,
            # on a deadlock), so running feedproc's part again alone would be wrong; the caller
            # runs its transaction again.
            return call(*args, **kwargs)
        try:
            return call(*args, **kwargs)
        except DatabaseRefusesWrites:
            return call(*args, **kwargs)
        except DatabaseConflict:
            return again(*args, **kwargs)

    return cast(F, run)


class FeedBase:
    """A handle's store and its pull workers' retry policy; the gate names its parts read."""

    store: Store
    policy: RetryPolicy

    def gate_naming(
        self, *, queue: str | None = None, key: str | None = None, item: int | None = None
    ) -> AbstractContextManager[None]:
        """A block within which gate names (`{"gate": "ocr"}`, `check_gate("ocr")`) are those of
        `queue`'s pipeline, or of the queue of partition `key`, or of item `item`'s: for a front door
        that checks items or answers before it hands them over. The pipeline is read only if a name
        is met."""
        if queue is not None:
            return naming(lambda: self.store.gate_numbers(queue), f"queue {queue!r}")
        if item is not None:
            return naming(lambda: self._names_of_item(item), f"the queue of item {item}")
        assert key is not None, "gate_naming needs a queue, a key or an item"
        return naming(lambda: self._names_of_partition(key), f"the queue of partition {key!r}")

    def _names_of_item(self, item_id: int) -> dict[str, int]:
        queue = self.store.queue_of_item(item_id)
        return self.store.gate_numbers(queue) if queue is not None else {}

    def _names_of_partition(self, key: str) -> dict[str, int]:
        queue = self.store.queue_of(key)
        return self.store.gate_numbers(queue) if queue is not None else {}

    def queue_of(self, key: str) -> str | None:
        """The queue of partition `key` (None when there is no such partition)."""
        return self.store.queue_of(check_key(key))

    def queues_of_items(self, item_ids: Iterable[int]) -> dict[int, str]:
        """The queue of each of `item_ids` that exists (one query): for a front door that lets a
        token work on some queues only."""
        return self.store.queues_of_items(item_ids)
