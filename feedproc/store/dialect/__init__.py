"""One `Dialect` per database: every statement, and every decision, that differs between SQLite,
PostgreSQL and MariaDB/MySQL, as named operations.

The store's concern modules (`answers.py`, `dispatch.py`, `leasing.py`, ...) write dialect-neutral
SQLAlchemy Core where they can and call `self.dialect.<operation>(conn, ...)` where the databases
need different statements; they never ask which database they run on
(tests/unit/test_store_has_no_dialect_branches.py keeps it so). Each database is one class:

* `sqlite.SQLiteDialect`: standard SQL, in-process (its write transaction holds the database's lock);
* `postgresql.PostgreSQLDialect`: arrays, LATERAL, data-modifying CTEs, the hot path on the driver's
  cursor (`DriverStatement`), LISTEN/NOTIFY;
* `mysql.MySQLDialect` (MariaDB and MySQL): no RETURNING, no arrays, InnoDB's locking reads.

Each is a package: the class in its `__init__.py`, the statements it runs in `statements.py`.

Where one database runs another's statement, its class says so where the operation is defined (a
delegation with the reason beside it); nothing falls back silently. Below the statements, what the
databases share (column types, the database clock, engine creation) is in `foundations.py`. A fourth
database is a fourth class that passes tests/store (docs/guides/adding-a-database.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Engine, Insert, Row, Select, Table, Update
from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from ...core.records import Outcome, ProgressReport, ReadyItem

#: An accumulator's row to merge: (partition id, name, combination (add, min, max), value).
AccumulatorRow = tuple[int, str, str, float]


class Dialect(Protocol):
    """Everything the store does differently on one database. Each operation runs in the caller's
    connection (and transaction) and commits nothing itself."""

    #: The database family: "sqlite", "postgresql" or "mysql" (MariaDB and MySQL).
    name: str
    #: Whether the store sends notifications (`notify_*`) a `notify.Listener` can wait for; without
    #: them watchers, `Feed.listen_ready` and `wait` poll.
    notifies: bool
    #: Whether `StoreBase.single()` runs its one statement in autocommit mode (one round trip instead
    #: of three) rather than in a write transaction.
    autocommits_single_statements: bool
    #: Whether the group commit writes the common answer, "done" without new data, with
    #: `complete_items` rather than with the general `update_items`.
    writes_done_narrowly: bool
    #: Whether `refresh_ready_at`'s rows also carry what `GateWriter._settle` reads of a partition
    #: (`gating.SETTLE_COLUMNS` and its gate facts), so that it reads nothing more.
    ready_at_rows_carry_settle_facts: bool

    # ------------------------------------------------------------ rows every concern writes

    def insert_stamped(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], now: tuple[str, ...]
    ) -> None:
        """Insert `rows` (all with the same keys) into `table`, the `now` columns set to the
        database's clock."""
        ...

    def add_to_stats(self, conn: Connection, queue: str, source: str, values: Mapping[str, int]) -> None:
        """Add `values` (counter -> number) to `source`'s `feedproc_stats` row of `queue` for the
        database clock's current minute, creating it."""
        ...

    def insert_partition(self, conn: Connection, statement: Insert) -> int:
        """Run `statement`, an INSERT of one partition; its new id."""
        ...

    def notify_ready(self, conn: Connection, queue: str) -> None:
        """Tell listening watchers that `queue` has new work (at commit), if the database can."""
        ...

    def notify_wanted(self, conn: Connection, owner: str) -> None:
        """Tell watcher `owner` that partitions of its are wanted by another (at commit), if it can."""
        ...

    def limit_lock_waits(self, conn: Connection, seconds: float) -> None:
        """Make a statement of this transaction that waits longer than `seconds` for a lock fail
        (`migrate`: a schema change queued behind a long transaction would hold up every watcher
        queued behind it); nothing where the database has no such setting."""
        ...

    def notify_finished(self, conn: Connection, key: str) -> None:
        """Tell waiters that partition `key` reached a final state (at commit), if the database can."""
        ...

    # ------------------------------------------------------------ the group commit (answers.py)

    def lock_held_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        """Lock partitions `pids` still leased to `watcher_id` and available, in id order: id -> epoch."""
        ...

    def lock_live_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        """`lock_held_leases`, of the leases that have not expired either, on the database's clock
        at this statement (not the transaction's start: a transactional processor's is long)."""
        ...

    def complete_items(
        self, conn: Connection, completed: list[Outcome], watcher_id: str, accumulate: list[AccumulatorRow]
    ) -> int:
        """Complete the items of `completed` ("done" answers without data or result), version-guarded,
        merging `accumulate` into the accumulators first; how many matched. Only where
        `writes_done_narrowly`."""
        ...

    def update_items(self, conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
        """Write answers to their available items, version-guarded: `rows` of `answers._OUTCOME_COLUMNS`
        (and "result" in every row when any carries one); how many matched."""
        ...

    def bump_version(self, conn: Connection, statement: Update, matched_version: int) -> int | None:
        """Run `statement`, an UPDATE of one item that matches `matched_version` and bumps it by one;
        the version it set, None when it matched nothing."""
        ...

    def refresh_ready_at(self, conn: Connection, pids: list[int], idle_after: float) -> Sequence[Row[Any]]:
        """Set each partition's ready_at from its earliest available item at its gate; rows of id,
        ready_at, idle (nothing due within `idle_after` seconds), gate, queue, tolerate (and, where
        `ready_at_rows_carry_settle_facts`, what `_settle` reads)."""
        ...

    def renew_written_leases(self, conn: Connection, pids: list[int], watcher_id: str, seconds: float) -> None:
        """Renew the leases of partitions `pids` (locked by this transaction) held by `watcher_id`
        for `seconds`, on the clock of the statement (not of the transaction's start)."""
        ...

    def merge_accumulators(self, conn: Connection, rows: list[AccumulatorRow]) -> None:
        """Merge `rows` (no (partition, name) twice) into the accumulators."""
        ...

    # ------------------------------------------------------------ dispatch (dispatch.py)

    def find_ready(
        self,
        conn: Connection,
        watcher_id: str,
        limit: int,
        excluded: list[int],
        closed: list[int],
        after: int = 0,
        aging: float | None = None,
    ) -> list[ReadyItem]:
        """Up to `limit` due items at the current gate of `watcher_id`'s partitions (not wanted, not
        in `closed`), skipping `excluded`: partitions by priority, then from the one after `after`
        (the last partition the previous fetch served) by id, wrapping around; items in due order.
        Each item carries its partition's priority, aged by `aging` (`aged_priority`) when given."""
        ...

    def mark_inflight(
        self, conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
    ) -> set[int]:
        """Record `entries` (encoded) in flight in each partition's record, unless a newer lease wrote
        it; the partitions whose record is now this lease's."""
        ...

    def mark_isolated(self, conn: Connection, params: dict[str, Any]) -> None:
        """Write one partition's in-flight record whole (`pid`, `watcher`, `epoch`, `entries`) unless a
        newer lease wrote it."""
        ...

    # ------------------------------------------------------------ items entering (gating.py)

    def insert_new_items(
        self, conn: Connection, pid: int, gates: list[int], data: list[bytes], collects: list[int | None] | None
    ) -> None:
        """Insert a producer's items of partition `pid` (gates, data, and what each collects when
        `collects` is given), in order."""
        ...

    def insert_item_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert children's item rows (`gating._ITEM_COLUMNS`, and `collect` in every row or none)."""
        ...

    # ------------------------------------------------------------ leases (leasing.py)

    def acquire_leases(
        self,
        conn: Connection,
        watcher_id: str,
        queue: str,
        limit: int,
        lease_seconds: float,
        aging: float | None = None,
    ) -> Sequence[Row[Any]]:
        """Lease up to `limit` ready partitions of `queue` (not in pull mode) to `watcher_id`, highest
        priority then oldest first, logging each ("leased" or "expired"); rows of id, key, lease_epoch,
        the lease's schedule, remaining, pending_watcher, pending_entries. `conn` is `single()`'s."""
        ...

    def renew_leases(self, conn: Connection, watcher_id: str, seconds: float) -> None:
        """Renew every lease `watcher_id` holds for `seconds` (the heartbeat)."""
        ...

    def forget_dead_watchers(self, conn: Connection, lease_seconds: float) -> None:
        """Delete the watchers dead for ten lease lengths."""
        ...

    def pick_partitions_to_steal(self, conn: Connection, victim: str, take: int) -> list[int]:
        """Up to `take` partitions of `victim` to mark as wanted, locked (others' locks skipped)."""
        ...

    def lock_leases(self, conn: Connection, watcher_id: str, pairs: list[tuple[int, int]]) -> list[int]:
        """Lock the partitions of `pairs` (id, epoch) still leased to `watcher_id` under that epoch;
        their ids."""
        ...

    def charge_lost(self, conn: Connection, updates: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
        """Charge lost deliveries (`updates`: b_id, b_version, b_status, b_attempts, b_error;
        version-guarded) and insert their delivery `records`, ended now."""
        ...

    def store_progress(self, conn: Connection, reports: Sequence[ProgressReport]) -> None:
        """Write progress reports (fraction, start) of items still available at their gate."""
        ...

    # ------------------------------------------------------------ pull workers (pulling.py)

    def find_claimable(
        self, conn: Connection, queue: str, max_items: int, blocked: Sequence[int], priorities: tuple[int, int]
    ) -> list[Any]:
        """Up to `max_items` claimable items of `queue` in claim order, at gates not in `blocked`, of
        partitions with a priority in `priorities` (lowest, highest; both included), locked for this
        transaction (`claimable.py`)."""
        ...

    def claim_items(self, conn: Connection, claiming: Update, ids: list[int]) -> Sequence[Any]:
        """Run `claiming` (an UPDATE of items `ids`, locked); rows of id, version, claimed_until."""
        ...

    def claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        """The claims of `tokens` (`pulling._CLAIM_COLUMNS`)."""
        ...

    def items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        """Items `ids` with their partition's key, queue and status (`pulling._item_rows`)."""
        ...

    def end_claims(self, conn: Connection, tokens: list[str], state: str) -> None:
        """End the claims of `tokens` in `state`."""
        ...

    # ------------------------------------------------------------ reading and cleaning up

    def read_collected(self, conn: Connection, params: dict[str, Any]) -> Sequence[Row[Any]]:
        """One window of a collected page (`collecting.Collecting._page`'s parameters)."""
        ...

    def deletable(self, chunk: Select[Any]) -> Select[Any]:
        """`chunk` (ids of a table, LIMITed) as a subquery a DELETE of that table may read."""
        ...


def dialect_for(engine: Engine | Connection) -> Dialect:
    """The dialect of `engine`'s database."""
    name = engine.dialect.name
    if name == "postgresql":
        from .postgresql import PostgreSQLDialect

        return PostgreSQLDialect()
    if name in ("mysql", "mariadb"):  # SQLAlchemy names a MariaDB reached by `mysql://` "mysql"
        from .mysql import MySQLDialect

        return MySQLDialect()
    if name == "sqlite":
        from .sqlite import SQLiteDialect

        return SQLiteDialect()
    raise ValueError(f"feedproc has no dialect for {name!r}")
