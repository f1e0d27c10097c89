"""Fan-in that joins: results kept apart from inputs, the gate an item collects, the failures a
partition tolerates, queues' accumulate operations and partitions' accumulators.

Expand only: new nullable columns and a new table, so code of the previous revision keeps working
on this schema.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Blob, Float64, LongText, table_options

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

#: SQLite only auto-increments INTEGER PRIMARY KEY (as schema.BigId).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("feedproc_items", sa.Column("result", Blob, nullable=True))
    op.add_column("feedproc_items", sa.Column("collect", sa.Integer, nullable=True))
    op.add_column("feedproc_partitions", sa.Column("tolerate", sa.String(16), nullable=True))
    op.add_column("feedproc_queues", sa.Column("accumulate", LongText, nullable=True))
    op.create_table(
        "feedproc_accumulators",
        sa.Column(
            "partition_id",
            BigId,
            sa.ForeignKey("feedproc_partitions.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", Float64, nullable=False),
        **table_options(op.get_bind()),
    )


def downgrade() -> None:
    op.drop_table("feedproc_accumulators")
    op.drop_column("feedproc_queues", "accumulate")
    op.drop_column("feedproc_partitions", "tolerate")
    op.drop_column("feedproc_items", "collect")
    op.drop_column("feedproc_items", "result")
