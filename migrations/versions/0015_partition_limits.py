"""Partition limits: how many items of one partition may be in flight at once.

* `feedproc_partitions.partition_limit`: the partition's own (NULL: none).
* `feedproc_queues.partition_limit`: every partition of the queue's (NULL: none).

A pipeline gate's `partition_limit` lives in its stored pipeline document. The smallest of those
that apply holds; the watcher that leases the partition enforces it (it alone delivers its items).

Expand only: nullable columns, so code of the previous revision keeps working on this schema (it
ignores the limits: run no older watcher beside one).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedproc_partitions", sa.Column("partition_limit", sa.Integer, nullable=True))
    op.add_column("feedproc_queues", sa.Column("partition_limit", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("feedproc_queues", "partition_limit")
    op.drop_column("feedproc_partitions", "partition_limit")
