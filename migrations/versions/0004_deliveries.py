"""Deliveries: what a watcher has in flight, and every delivery's record.

* `feedproc_inflight`: per partition, the items its lease holder has taken for delivery and not
  yet answered (`id/version,...`), written by the fetch that takes them. A watcher that takes the
  partition over charges each one still unanswered as a lost delivery, so an item whose
  processing kills its watcher cannot be redelivered forever.
* `feedproc_items.deliveries` (all deliveries of the item, every gate) numbers its records;
  `lost` counts deliveries in a row that ended with their watcher gone; `started_at`, `duration`
  and `delivered_by` describe the delivery that completed the item (the common case writes no
  record row of its own).
* `feedproc_attempts`: one row per delivery that did not complete its item (moved, not yet,
  retried, failed, lost), with its error and a bounded traceback; the first and last few of each
  item are kept.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Float64, LongText, UTCDateTime, table_options

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "feedproc_inflight",
        # No foreign key: its check would take a key-share lock on the partition in every fetch,
        # which waits behind a group commit's lock (retention deletes these rows with their partition).
        sa.Column("partition_id", BigId, primary_key=True),
        sa.Column("watcher", sa.String(120), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("entries", LongText, nullable=False),
        **table_options(op.get_bind()),
    )
    op.add_column("feedproc_items", sa.Column("deliveries", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("feedproc_items", sa.Column("lost", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("feedproc_items", sa.Column("started_at", UTCDateTime(), nullable=True))
    op.add_column("feedproc_items", sa.Column("duration", Float64, nullable=True))
    op.add_column("feedproc_items", sa.Column("delivered_by", sa.String(120), nullable=True))
    op.create_table(
        "feedproc_attempts",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("partition_id", BigId, sa.ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("item_id", BigId, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("watcher", sa.String(120), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("duration", Float64, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", LongText, nullable=True),
        **table_options(op.get_bind()),
    )
    op.create_index("feedproc_attempts_item", "feedproc_attempts", ["item_id", "n"])
    op.create_index("feedproc_attempts_partition", "feedproc_attempts", ["partition_id", "id"])


def downgrade() -> None:
    # The table with its indexes (MariaDB/MySQL refuse to drop the index its foreign key uses).
    op.drop_table("feedproc_attempts")
    for column in ("delivered_by", "duration", "started_at", "lost", "deliveries"):
        op.drop_column("feedproc_items", column)
    op.drop_table("feedproc_inflight")
