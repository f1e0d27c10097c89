"""All of feedproc's SQL, behind one small interface: `Store`.

Callers:

* producers (`Feed`, the CLI): add partitions and items, seal, retry, cancel, checkpoint, read status
  (`producing.py`, `reading.py`), resubmit or remove a finished partition (`lifecycle.py`);
  operators: retry, skip or cancel single items (`actions.py`);
* operators (`feedproc serve`, /metrics): bounded reads across partitions (`operators.py`), the
  dashboard's running view, charts and timings (`insight.py`), cleanup (`retention.py`);
* watchers: register and heartbeat, lease / steal / hand over / release partitions (`leasing.py`),
  charge the deliveries a watcher lost (`lost.py`), fetch ready items (`dispatch.py`), and apply a
  batch of answers (`answers.py`);
* scheduling controls: queue settings, slots, deferral, progress (`queues.py`); pipelines, their
  versions and schedules' rows (`pipelines.py`); schedules' ticks, each fired once whoever calls,
  and their next ticks (`scheduling.py`);
* pull workers (`feedproc serve`'s worker API): claim items, heartbeat and answer claims, expire
  the claims of silent workers (`pulling.py`);
* tests (`feedproc.testing`): a queue's unfinished partitions, when its next work is due, and its
  due times brought forward, a fake clock's move (`pending.py`);
* completion hooks: their rows written as partitions finish, claimed and recorded by watchers,
  listed and retried by operators (`hooks.py`).

Every write a watcher makes is **fenced**: it first locks the partition rows it writes (PostgreSQL
`FOR UPDATE`; SQLite serialises writers with `BEGIN IMMEDIATE`) and keeps only those still leased to
it under the same lease epoch, in the same transaction as the write. Producers lock the partition
row too, so an item added at the current gate can never race a gate advance. The gate rules
(`core.gates`) are applied in `gating.py`.

`Store` is one class composed of one mixin per concern over `base.StoreBase` (the engine and its
transactions): callers keep a single object and its method names, the concerns share the lock,
history and gate-rule writers without passing a connection layer around, and each module reads on
its own. SQLite, PostgreSQL and MariaDB/MySQL differ in `foundations.py` (column types, database clock,
engine set-up, the driver's cursor) and in their `Dialect` (`dialect/`, `StoreBase.dialect`): every
statement and decision that differs, as named operations the concerns call.
"""

from __future__ import annotations

from .accumulating import Accumulating
from .actions import ITEM_ACTIONS, ItemActions
from .answers import RECORDS_KEPT, Answers
from .base import StoreBase, alembic_config, migrations_path
from .claimable import MAX_CLAIM
from .collecting import Collecting
from .dispatch import Dispatch
from .gating import INSERT_CHUNK
from .hooks import MAX_HOOKS_SHOWN, Hooks
from .insight import Insight
from .leasing import Leasing
from .lifecycle import Lifecycle
from .lost import LostDeliveries
from .operators import Operators
from .pending import Pending
from .pipelines import Pipelines
from .producing import Producing, generated_key
from .pulling import ClaimAnswer, Pulling
from .queues import Queues
from .reading import FAILED_ITEMS_SHOWN, MAX_PAGE, Reading
from .retention import Retention
from .scheduling import Scheduling

__all__ = [
    "FAILED_ITEMS_SHOWN",
    "INSERT_CHUNK",
    "ITEM_ACTIONS",
    "MAX_CLAIM",
    "MAX_HOOKS_SHOWN",
    "MAX_PAGE",
    "RECORDS_KEPT",
    "ClaimAnswer",
    "Store",
    "alembic_config",
    "generated_key",
    "migrations_path",
]


class Store(
    Hooks,
    Scheduling,
    Producing,
    Lifecycle,
    ItemActions,
    Reading,
    Operators,
    Insight,
    Leasing,
    LostDeliveries,
    Dispatch,
    Pulling,
    Answers,
    Collecting,
    Accumulating,
    Queues,
    Pipelines,
    Pending,
    Retention,
    StoreBase,
):
    """feedproc's database access. Thread-safe: each call takes its own pooled connection."""
