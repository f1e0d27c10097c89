"""Deadlines and bounded waiting: an item's "not yet" answers at its gate, a partition's deadline
and since when it is at its gate.

* `feedproc_items.not_yet`: "not yet" answers of the item at its current gate (0 again when it moves
  on), written with each answer, fenced by its lease: a gate's `max_not_yet` bounds them.
* `feedproc_partitions.deadline`: when an unfinished partition fails with `deadline exceeded`
  (NULL: never), indexed for the watchers' sweep, partially where the database can, so that
  partitions without one cost nothing.
* `feedproc_partitions.gate_since`: since when it is at its current gate (set as it gets there), for
  its pipeline gate's `max_time` (NULL: written by an older feedproc, which no `max_time` judges).

Expand only: a column with a default and nullable columns, so code of the previous revision keeps
working on this schema (its answers leave `not_yet` as it is; it sets no deadline, and leaves
`gate_since` as it was when it moves a partition on: run no older watcher beside a `max_time`).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedproc_items", sa.Column("not_yet", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("feedproc_partitions", sa.Column("deadline", UTCDateTime(), nullable=True))
    op.add_column("feedproc_partitions", sa.Column("gate_since", UTCDateTime(), nullable=True))
    op.create_index(
        "feedproc_partitions_deadline",
        "feedproc_partitions",
        ["deadline"],
        postgresql_where=sa.text("deadline IS NOT NULL AND status = 'available'"),
        sqlite_where=sa.text("deadline IS NOT NULL AND status = 'available'"),
    )


def downgrade() -> None:
    op.drop_index("feedproc_partitions_deadline", "feedproc_partitions")
    op.drop_column("feedproc_partitions", "gate_since")
    op.drop_column("feedproc_partitions", "deadline")
    op.drop_column("feedproc_items", "not_yet")
