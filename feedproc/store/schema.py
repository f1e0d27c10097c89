"""The database schema as SQLAlchemy Core tables.

The alembic revisions in `migrations/` create exactly this (a test compares the two). Indexes are
partial where that keeps finished work out of the watcher's paths: the item index a watcher reads
covers only `available` items, the partition index it leases from covers only partitions that have
work ready, so their cost does not grow with the history kept in the tables.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    false,
    text,
)

from .foundations import Blob, Float64, LongText, UTCDateTime

metadata = MetaData()

#: A signed 64-bit integer: BIGINT, and on SQLite INTEGER (64-bit already; and SQLite only
#: auto-increments an INTEGER PRIMARY KEY).
Int64 = BigInteger().with_variant(Integer(), "sqlite")
#: An auto-incrementing 64-bit key.
BigId = Int64

partitions = Table(
    "feedproc_partitions",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("key", String(200), nullable=False, unique=True),
    Column("queue", String(100), nullable=False),
    Column("status", String(16), nullable=False),  # available | complete | failed | cancelled
    Column("gate", Integer, nullable=False),
    Column("priority", Int64, nullable=False, server_default=text("0")),  # higher first; 64-bit (0013)
    Column("sealed", Boolean, nullable=False),
    Column("manual_checkpoint", Boolean, nullable=False),
    Column("not_before", UTCDateTime(), nullable=True),
    # Earliest next_attempt_at of the available items at the current gate; NULL when that gate
    # has no available item (the partition is waiting, finished, or about to move on).
    Column("ready_at", UTCDateTime(), nullable=True),
    Column("lease_owner", String(120), nullable=True),
    Column("lease_epoch", BigInteger, nullable=False, server_default=text("0")),  # fencing token
    Column("lease_expires_at", UTCDateTime(), nullable=True),
    Column("wanted_by", String(120), nullable=True),  # a watcher asking for the lease (steal)
    Column("version", BigInteger, nullable=False, server_default=text("0")),  # optimistic concurrency
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    # Scheduling controls (revision 0002): share of the queue's concurrency limit each item in
    # flight takes, per-item time limit (seconds), and windows of the day for dispatch.
    Column("weight", Integer, nullable=False, server_default=text("1")),
    Column("item_timeout", Float64, nullable=True),
    Column("windows", LongText, nullable=True),  # e.g. "22:00-06:00,12:00-13:00"
    Column("window_tz", String(64), nullable=True),  # IANA zone of the windows; NULL is UTC
    # Failed items its gates tolerate (0010): "5%" or a count; NULL: its pipeline gate's, else none.
    Column("tolerate", String(16), nullable=True),
    # When it fails with "deadline exceeded" unless finished (0014); NULL: never. The watchers' sweep
    # reads the partial index: partitions without a deadline are not in it.
    Column("deadline", UTCDateTime(), nullable=True),
    # Since when it is at its gate (0014): its pipeline gate's `max_time` counts from there.
    Column("gate_since", UTCDateTime(), nullable=True),
    # Items of it in flight at once at most (0015); NULL: none of its own.
    Column("partition_limit", Integer, nullable=True),
    # Its concurrency group (0017): a tenant, a customer; the queue's group limit and group rate
    # hold per group. NULL: none (group limits do not apply to it).
    Column("concurrency_group", String(200), nullable=True),
    Index(
        "feedproc_partitions_leasable",
        "queue",
        text("priority DESC"),
        "created_at",
        "id",
        postgresql_where=text("status = 'available' AND ready_at IS NOT NULL"),
        sqlite_where=text("status = 'available' AND ready_at IS NOT NULL"),
    ),
    Index(
        "feedproc_partitions_owner",
        "lease_owner",
        postgresql_where=text("lease_owner IS NOT NULL"),
        sqlite_where=text("lease_owner IS NOT NULL"),
    ),
    Index("feedproc_partitions_status", "status", "updated_at"),
    Index(
        "feedproc_partitions_deadline",
        "deadline",
        postgresql_where=text("deadline IS NOT NULL AND status = 'available'"),
        sqlite_where=text("deadline IS NOT NULL AND status = 'available'"),
    ),
)

items = Table(
    "feedproc_items",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition_id", BigId, ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
    Column("gate", Integer, nullable=False),
    Column("status", String(16), nullable=False),  # available | complete | failed | cancelled
    Column("data", Blob, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_error", LongText, nullable=True),
    Column("next_attempt_at", UTCDateTime(), nullable=False),
    Column("version", BigInteger, nullable=False, server_default=text("0")),
    # Fan-out identity: a child is (parent, the parent's gate when it answered, position).
    Column("parent_id", BigId, nullable=True),
    Column("parent_gate", Integer, nullable=True),
    Column("seq", Integer, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("progress", Float64, nullable=True),  # 0..1 reported by the processor while in flight (0002)
    # Deliveries (0004): all of this item's (every gate), the last ones in a row whose watcher
    # died or stalled, and the delivery that completed it (when, how long, by which watcher).
    Column("deliveries", Integer, nullable=False, server_default=text("0")),
    Column("lost", Integer, nullable=False, server_default=text("0")),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("duration", Float64, nullable=True),
    Column("delivered_by", String(120), nullable=True),
    Column("claimed_until", UTCDateTime(), nullable=True),  # a pull worker's claim on it ends then (0005)
    # Fan-in (0010): what its answers produced, kept apart from its input `data`; and, for a queue
    # without a pipeline, the gate whose items' results it collects when delivered.
    Column("result", Blob, nullable=True),
    Column("collect", Integer, nullable=True),
    # Resubmit (0011): the gate and data its producer added it with, copied by the first answer that
    # moves it or replaces its data (NULL until then: no second copy at insert).
    Column("origin_gate", Integer, nullable=True),
    Column("origin_data", Blob, nullable=True),
    # "Not yet" answers at its current gate (0014), bounded by the gate's max_not_yet; 0 again
    # when it moves on, as its attempts are.
    Column("not_yet", Integer, nullable=False, server_default=text("0")),
    Index(
        "feedproc_items_failed",
        "partition_id",
        "gate",
        postgresql_where=text("status = 'failed'"),
        sqlite_where=text("status = 'failed'"),
    ),
    # Items by partition, gate and status, each gate's available ones in the order they became due
    # (0003): the fetch walks it in order and stops at its limit, whatever a partition's backlog and
    # whether the table has statistics yet; finished items sit in other key ranges, out of the way.
    Index("feedproc_items_by_gate", "partition_id", "gate", "status", "next_attempt_at", "id"),
    Index(
        "feedproc_items_child",
        "parent_id",
        "parent_gate",
        "seq",
        unique=True,
        postgresql_where=text("parent_id IS NOT NULL"),
        sqlite_where=text("parent_id IS NOT NULL"),
    ),
)

watchers = Table(
    "feedproc_watchers",
    metadata,
    Column("id", String(120), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queue", String(100), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("capacity", Integer, nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("heartbeat_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),  # heartbeat + lease length: alive until then
    # Weight of the items this watcher has in flight, counted against its queue's concurrency limit
    # while the watcher is alive (0002): a dead watcher's slots come back when it expires.
    Column("slots", Integer, nullable=False, server_default=text("0")),
    # The same per gate of a pipeline with gate limits (0009): JSON {"gate": weight, ...}.
    Column("gate_slots", LongText, nullable=True),
    # The same per concurrency group and gate, when group limits apply (0017): JSON [[group, gate, weight]].
    Column("group_slots", LongText, nullable=True),
    # The newest schema revision the watcher's feedproc knows (0019): its release, during a rolling upgrade.
    Column("revision", String(32), nullable=True),
    Index("feedproc_watchers_queue", "queue", "expires_at"),
)

# Per-queue scheduling settings (0002); a queue without a row has no limit and no windows.
queues = Table(
    "feedproc_queues",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("concurrency_limit", Integer, nullable=False, server_default=text("0")),  # < 1: no limit
    Column("windows", LongText, nullable=True),
    Column("window_tz", String(64), nullable=True),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("mode", String(8), nullable=False, server_default=text("'push'")),  # push | pull (0005)
    # Paused: nothing new dispatched or claimed, fleet-wide, until resumed (0006).
    Column("paused", Boolean, nullable=False, server_default=false()),
    Column("paused_at", UTCDateTime(), nullable=True),
    Column("paused_by", String(120), nullable=True),
    # How answers' `accumulate` numbers merge in its partitions (0010): JSON {"name": "sum"}; a
    # pipeline gate's own declaration wins for the answers at that gate.
    Column("accumulate", LongText, nullable=True),
    # Its completion hooks (0012): JSON {"on_complete": URL | "python", ...}, set by `queue set` or
    # by applying its pipeline's [hooks]; read in the transaction that finishes a partition.
    Column("hooks", LongText, nullable=True),
    # What a partition added to it without a priority or a weight of its own gets (0013); NULL: 0 and 1.
    Column("default_priority", Int64, nullable=True),
    Column("default_weight", Integer, nullable=True),
    # Items of any one of its partitions in flight at once at most (0015); NULL: none.
    Column("partition_limit", Integer, nullable=True),
    # Seconds after which a waiting partition's priority counts one higher (0016); NULL: no aging.
    Column("aging", Float64, nullable=True),
    # Flow control (0017): items of one concurrency group in flight at most (NULL: none), and rates
    # in items per second (NULL: none) for the whole queue and for each group; or instead of its
    # own rate, the name of a shared rate (`rate_name`) it draws from with every queue naming it.
    Column("group_limit", Integer, nullable=True),
    Column("rate", Float64, nullable=True),
    Column("rate_name", String(100), nullable=True),
    Column("group_rate", Float64, nullable=True),
)

# Token buckets of rate limits (0017), one row per queue, pipeline gate or group that has a rate
# and has been drawn from: the tokens it held at `refilled_at` (database clock), locked by the fetch
# or claim that spends them; a missing row is a full bucket. A shared rate's row (`feedproc rate
# set`) is there from its declaration and holds its rate (`per_second`; NULL for the others, whose
# rate is their queue's or gate's setting); `queue` is NULL for it.
rate_buckets = Table(
    "feedproc_rate_buckets",
    metadata,
    Column("name", String(400), primary_key=True),
    Column("queue", String(100), nullable=True),
    Column("tokens", Float64, nullable=False),
    Column("refilled_at", UTCDateTime(), nullable=False),
    Column("per_second", Float64, nullable=True),
)

# Which feedproc may run on this schema (0018): one row, the oldest revision whose code does
# (`upgrades.py`), written by `migrate`.
schema_info = Table(
    "feedproc_schema",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("compatible_since", String(32), nullable=False),
)

# Adaptive concurrency (0017): per queue and gate whose handler pushed back (429, 503, a timeout),
# the fleet's concurrency window there; it shrinks on push-back, grows as answers succeed, and the
# row goes once it has grown past every bound.
gate_windows = Table(
    "feedproc_gate_windows",
    metadata,
    Column("queue", String(100), primary_key=True),
    Column("gate", Integer, primary_key=True),
    Column("width", Float64, nullable=False),
    Column("cut_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

# Each partition's accumulator (0010): per name, what its answers' `accumulate` numbers came to,
# merged in each answer's own fenced transaction (a group commit merges its batch first: one row
# write per partition and name per batch).
accumulators = Table(
    "feedproc_accumulators",
    metadata,
    Column("partition_id", BigId, ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("value", Float64, nullable=False),
)

# What each partition's lease holder has taken for delivery and not yet answered (0004), one row per
# partition, rewritten by every fetch that takes its items: "id/version,..." (an entry ending "/i"
# was delivered alone, isolated). A watcher that takes the partition over charges the entries still
# unanswered (same version) as lost deliveries. A table of its own, not a partition column, so the
# fetch that writes it never waits for the row locks of a group commit.
inflight = Table(
    "feedproc_inflight",
    metadata,
    # No foreign key: its check would take a key-share lock on the partition in every fetch, which
    # waits behind a group commit's lock; retention deletes these rows with their partition.
    Column("partition_id", BigId, primary_key=True),
    Column("watcher", String(120), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("entries", LongText, nullable=False),
)

# One row per delivery that did not complete its item (0004): moved, not yet, retried, failed or
# lost, with its error (and a bounded traceback). `n` is the item's delivery number; the completing
# delivery lives on the item row. Per item the first and the last few rows are kept.
attempts = Table(
    "feedproc_attempts",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition_id", BigId, ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
    Column("item_id", BigId, nullable=False),
    Column("n", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("gate", Integer, nullable=False),
    Column("watcher", String(120), nullable=True),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("ended_at", UTCDateTime(), nullable=True),
    Column("duration", Float64, nullable=True),
    Column("outcome", String(16), nullable=False),
    Column("error", LongText, nullable=True),
    Index("feedproc_attempts_item", "item_id", "n"),
    Index("feedproc_attempts_partition", "partition_id", "id"),
)

# Pull workers' claims on items (0005): one row per claim, kept when it ends so that an old token
# is refused with its reason. `version` is the item's version while the claim holds it; `state`:
# active | answered | expired | cancelled | superseded. `callback`: a push handler's 202 (its
# answer comes later, as a worker's would).
claims = Table(
    "feedproc_claims",
    metadata,
    Column("token", String(64), primary_key=True),
    Column("item_id", BigId, nullable=False),
    Column("partition_id", BigId, ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
    Column("queue", String(100), nullable=False),
    Column("worker", String(120), nullable=False),
    Column("gate", Integer, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("weight", Integer, nullable=False),
    Column("lease_seconds", Float64, nullable=False),
    Column("state", String(12), nullable=False),
    Column("callback", Boolean, nullable=False, server_default=false()),
    Column("claimed_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Column("ended_at", UTCDateTime(), nullable=True),
    Column("concurrency_group", String(200), nullable=True),  # its partition's, counted against group limits (0017)
    Index("feedproc_claims_active", "queue", "state", "expires_at"),
    Index("feedproc_claims_item", "item_id"),
)

events = Table(
    "feedproc_events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition_id", BigId, ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
    Column("item_id", BigId, nullable=True),
    Column("kind", String(32), nullable=False),
    Column("watcher", String(120), nullable=True),
    Column("detail", LongText, nullable=True),
    Column("at", UTCDateTime(), nullable=False),
    Index("feedproc_events_partition", "partition_id", "id"),
)

# Throughput by minute (0007): what each source (a watcher, a producer process, the worker API of a
# `serve` process) added, processed, completed and failed in that minute of the database clock. Each
# source adds to its own row (a watcher once per heartbeat, from counters it keeps in memory), so
# the hot path writes nothing here and no two sources wait on one row; the dashboard's charts sum a
# few thousand rows whatever the size of the items table.
stats = Table(
    "feedproc_stats",
    metadata,
    Column("bucket", UTCDateTime(), primary_key=True),
    Column("queue", String(100), primary_key=True),
    Column("source", String(120), primary_key=True),
    Column("added", BigInteger, nullable=False, server_default=text("0")),
    Column("processed", BigInteger, nullable=False, server_default=text("0")),
    Column("completed", BigInteger, nullable=False, server_default=text("0")),
    Column("failed", BigInteger, nullable=False, server_default=text("0")),
)

# Pipelines (0009): one per queue, the JSON of `core.pipelines.PipelineSpec.to_mapping`, with a
# version every applied change raises; watchers read it once per poll interval and follow it.
pipelines = Table(
    "feedproc_pipelines",
    metadata,
    Column("queue", String(100), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("spec", LongText, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("updated_by", String(120), nullable=True),
)

# The last tick each schedule of a pipeline started a partition for (0009): the row is locked while
# a tick is fired, so any number of watchers start each tick's partition once.
schedules = Table(
    "feedproc_schedules",
    metadata,
    Column("queue", String(100), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("last_tick", UTCDateTime(), nullable=False),
    Column("last_key", String(200), nullable=True),
)

# Completion hooks' outbox (0012): one row per hook a finished partition calls, written in the
# transaction that finished it, delivered at least once by the queue's watchers (`hooks.py`). A
# watcher claims a row with a token of its own until `claimed_until`; its outcome is written only
# while that token is the row's (a claim that expired and was taken again writes nothing). No
# foreign key: removing the partition leaves its hooks to be delivered and kept on record.
hooks = Table(
    "feedproc_hooks",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("queue", String(100), nullable=False),
    Column("partition_key", String(200), nullable=False),
    Column("hook", String(16), nullable=False),  # on_complete | on_fail | on_cancel
    Column("target", LongText, nullable=False),  # an http(s) URL, or "python"
    Column("payload", LongText, nullable=False),  # the partition's summary, JSON
    Column("status", String(12), nullable=False),  # pending | sent | failed
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", UTCDateTime(), nullable=False),
    Column("claim", String(32), nullable=True),
    Column("claimed_by", String(120), nullable=True),
    Column("claimed_until", UTCDateTime(), nullable=True),
    Column("last_error", LongText, nullable=True),
    Column("response_status", Integer, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("sent_at", UTCDateTime(), nullable=True),
    Index("feedproc_hooks_due", "status", "next_attempt_at"),
    Index("feedproc_hooks_queue", "queue", "id"),
    Index("feedproc_hooks_partition", "partition_key"),
)
