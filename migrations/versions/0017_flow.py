"""Flow control: concurrency groups, rate limits and adaptive concurrency.

* `feedproc_partitions.concurrency_group` (NULL: none) and `feedproc_claims.concurrency_group`:
  the group a partition belongs to, and a pull claim's, counted against group limits.
* `feedproc_queues.group_limit`, `.rate`, `.rate_name`, `.group_rate`: a queue's flow settings
  (NULL: none; `rate_name`: the shared rate it draws from instead of a rate of its own).
* `feedproc_watchers.group_slots`: a watcher's weight in flight per group and gate (JSON).
* `feedproc_rate_buckets`: the token buckets of rate limits, one row per limit drawn from, and
  one per shared rate (`feedproc rate set NAME 600/min`) holding its rate.
* `feedproc_gate_windows`: the adaptive concurrency window of a gate whose handler pushed back.

Expand only: nullable columns and new tables, so code of the previous revision keeps working on
this schema (it ignores the new settings: run no older watcher beside one that uses them).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Float64, LongText, UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedproc_partitions", sa.Column("concurrency_group", sa.String(200), nullable=True))
    op.add_column("feedproc_claims", sa.Column("concurrency_group", sa.String(200), nullable=True))
    op.add_column("feedproc_watchers", sa.Column("group_slots", LongText, nullable=True))
    op.add_column("feedproc_queues", sa.Column("group_limit", sa.Integer, nullable=True))
    op.add_column("feedproc_queues", sa.Column("rate", Float64, nullable=True))
    op.add_column("feedproc_queues", sa.Column("rate_name", sa.String(100), nullable=True))
    op.add_column("feedproc_queues", sa.Column("group_rate", Float64, nullable=True))
    op.create_table(
        "feedproc_rate_buckets",
        sa.Column("name", sa.String(400), primary_key=True),
        sa.Column("queue", sa.String(100), nullable=True),
        sa.Column("tokens", Float64, nullable=False),
        sa.Column("refilled_at", UTCDateTime(), nullable=False),
        sa.Column("per_second", Float64, nullable=True),
    )
    op.create_table(
        "feedproc_gate_windows",
        sa.Column("queue", sa.String(100), primary_key=True),
        sa.Column("gate", sa.Integer, primary_key=True),
        sa.Column("width", Float64, nullable=False),
        sa.Column("cut_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("feedproc_gate_windows")
    op.drop_table("feedproc_rate_buckets")
    for table, column in (
        ("feedproc_queues", "group_rate"),
        ("feedproc_queues", "rate_name"),
        ("feedproc_queues", "rate"),
        ("feedproc_queues", "group_limit"),
        ("feedproc_watchers", "group_slots"),
        ("feedproc_claims", "concurrency_group"),
        ("feedproc_partitions", "concurrency_group"),
    ):
        op.drop_column(table, column)
