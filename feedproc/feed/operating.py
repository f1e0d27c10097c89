"""`Feed`, operating: retry, cancel, skip and checkpoint partitions and items, resubmit or remove a
finished partition, clean finished ones up, set a queue's limit, windows, mode, pause, accumulate rules
and completion hooks, and retry hooks that failed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from ..core.records import QueueSettings
from ..core.views import RateView
from .base import retried
from .reading import Reading


class Operating(Reading):
    """Acting on partitions, items and queues (retries, cancels, cleanup, queue settings)."""

    @retried
    def retry(self, key: str) -> int:
        """Put a failed partition and its failed items (attempts reset) back to work."""
        return self.store.retry(key)

    def retry_failed(
        self, *, queue: str | None = None, prefix: str | None = None, error: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Retry failed partitions in bulk: up to `limit` (at most 500) of them, filtered as in
        `partitions`, each in its own transaction. Returns `{"key", "retried": items}` per partition;
        one that stopped being failed meanwhile is left out."""
        from ..core.errors import Refused

        limit = max(1, min(limit, 500))
        done = []
        for partition in self.partitions(status="failed", queue=queue, prefix=prefix, error=error, limit=limit):
            try:
                done.append({"key": partition.key, "retried": self.retry(partition.key)})
            except Refused:
                continue
        return done

    @retried
    def cancel(self, key: str, *, connection: Connection | None = None) -> None:
        """Cancel `key` and its available items; refused for a complete partition. `connection`:
        in the caller's transaction, as `add_partition`'s."""
        self.store.cancel(key, connection=connection)

    @retried
    def resubmit(self, key: str, *, by: str = "python") -> int:
        """Run finished partition `key` (complete, failed or cancelled) again from its first gate
        with the items its producer added: children its answers added are deleted, attempts, errors,
        results and accumulators reset; its history is kept, with a `resubmitted` event naming
        `by`. Refused while it is available (cancel it first to stop it). Returns the items it runs."""
        return self.store.resubmit(key, by=by)

    @retried
    def remove(self, key: str) -> dict[str, int]:
        """Delete finished partition `key` now, with its items, history, delivery records, claims
        and accumulators (one transaction); refused while it is available: cancel it first.
        Returns the rows removed per kind."""
        return self.store.remove(key)

    @retried
    def retry_hooks(self, ids: Sequence[int] = (), *, failed: bool = False, queue: str | None = None) -> int:
        """Make failed completion hooks pending again, due now with fresh attempts: those of `ids`,
        or with `failed=True` every failed one (of `queue`). A hook of `ids` that is pending or sent
        is left alone (not counted); NotFound for an id that does not exist, InvalidInput when given
        neither. Returns how many are pending again."""
        return self.store.retry_hooks(ids, failed=failed, queue=queue)

    @retried
    def act_on_items(
        self,
        action: str,
        *,
        ids: Sequence[int] | None = None,
        key: str | None = None,
        gate: int | None = None,
        by: str = "python",
    ) -> dict[str, Any]:
        """Retry (due now, attempts reset), skip (complete without processing) or cancel items:
        those named by `ids`, or every failed or available item of partition `key` (at `gate`).
        Recorded in each item's deliveries and the partition's history with `by`; a call in
        progress for a skipped or cancelled item is cancelled. Refused (nothing changes) when a
        named item is not failed or available, or its partition is finished."""
        return self.store.act_on_items(action, ids=ids, key=key, gate=gate, by=by)

    @retried
    def set_priority(self, key: str, priority: int, *, by: str = "python") -> int:
        """Change partition `key`'s priority (a signed 64-bit integer; higher is leased and claimed
        first): the next lease and claim order follow it, a lease held now is kept. Recorded in its
        history with `by` unless unchanged. Returns the priority it had; NotFound for an unknown
        key, InvalidInput out of range (nothing changes)."""
        return self.store.set_priority(key, priority, by=by)

    @retried
    def checkpoint(self, key: str) -> int:
        """Advance a manual-checkpoint partition whose gate has drained; returns its new gate."""
        return self.store.checkpoint(key)

    @retried
    def cleanup(self, older_than: float, *, include_failed: bool = False, dry_run: bool = False) -> dict[str, int]:
        """Delete complete and cancelled (and, if asked, failed) partitions last changed more than
        `older_than` seconds ago, with their items and history, in bounded batches; with
        `dry_run`, count what would go and delete nothing."""
        statuses = ("complete", "cancelled", "failed") if include_failed else ("complete", "cancelled")
        return self.store.cleanup(older_than, statuses=statuses, dry_run=dry_run)

    @retried
    def set_rate(self, name: str, rate: str | float) -> RateView:
        """Declare (or change) shared rate `name`: "600/min", "10/s", "100/hour" or items per second.
        Any queue's or pipeline gate's `rate` may name it: all of them draw from its one bucket,
        fleet-wide (an API that allows 600 calls a minute, called from several queues)."""
        return RateView.from_json(self.store.set_rate(name, rate))

    @retried
    def remove_rate(self, name: str) -> None:
        """Remove shared rate `name`: Refused while a queue's rate names it, NotFound without it."""
        self.store.remove_rate(name)

    @retried
    def set_queue(
        self,
        name: str,
        *,
        limit: int | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        clear_windows: bool = False,
        mode: str | None = None,
        paused: bool | None = None,
        accumulate: Mapping[str, str] | None = None,
        hooks: Mapping[str, str | None] | None = None,
        priority: int | None = None,
        weight: int | None = None,
        clear_defaults: bool = False,
        partition_limit: int | None = None,
        aging: float | None = None,
        group_limit: int | None = None,
        rate: str | float | None = None,
        group_rate: str | float | None = None,
        by: str = "python",
    ) -> QueueSettings:
        """Store a queue's global concurrency limit (sum of weights in flight across all watchers
        and workers; < 1 means none), its windows of the day and/or its mode ("push": watchers
        deliver its items; "pull": workers claim them) and/or whether it is `paused` (nothing new is
        dispatched or claimed, fleet-wide; in-flight items finish) and/or how answers' `accumulate`
        numbers merge in its partitions ({"pages": "sum"}: sum, min, max or count; a pipeline gate's
        own declaration wins for its answers; {} removes it) and/or its completion `hooks`
        ({"on_complete": URL or "python", "on_fail": ..., "on_cancel": ...}; an empty value removes
        one, hooks not named keep theirs) and/or the `priority` and `weight` a partition added to it
        without its own gets (`clear_defaults` removes both: 0 and 1 again) and/or its
        `partition_limit` (items of any one of its partitions in flight at once, fleet-wide; < 1:
        none) and/or its `aging` (seconds after which a waiting partition's priority counts one
        higher, for leasing and dispatch; 0: none) and/or its flow controls: `group_limit` (items
        of any one concurrency group in flight at once, fleet-wide; < 1: none), `rate` and
        `group_rate` (items started at most, the queue's and each group's: "600/min", "10/s",
        "100/hour" or a number per second; 0: none); arguments left None keep their value. `by` is
        recorded with a pause. InvalidInput naming a bad value: nothing changes."""
        return self.store.set_queue(
            name,
            limit=limit,
            windows=windows,
            window_tz=window_tz,
            clear_windows=clear_windows,
            mode=mode,
            paused=paused,
            accumulate=accumulate,
            hooks=hooks,
            priority=priority,
            weight=weight,
            clear_defaults=clear_defaults,
            partition_limit=partition_limit,
            aging=aging,
            group_limit=group_limit,
            rate=rate,
            group_rate=group_rate,
            by=by,
        )
