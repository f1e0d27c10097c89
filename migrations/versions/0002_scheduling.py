"""Scheduling controls: queue settings (concurrency limit, windows), partition weight / item timeout /
windows, item progress, and the slots each watcher holds against its queue's limit.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Float64, LongText, UTCDateTime, table_options

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "feedproc_queues",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("concurrency_limit", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("windows", LongText, nullable=True),
        sa.Column("window_tz", sa.String(64), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        **table_options(op.get_bind()),
    )
    # Plain ADD / DROP COLUMN (SQLite >= 3.35 has both): a batch rebuild of the table would recreate its
    # indexes from reflection, which loses `priority DESC` on SQLite.
    op.add_column("feedproc_partitions", sa.Column("weight", sa.Integer, nullable=False, server_default=sa.text("1")))
    op.add_column("feedproc_partitions", sa.Column("item_timeout", Float64, nullable=True))
    op.add_column("feedproc_partitions", sa.Column("windows", LongText, nullable=True))
    op.add_column("feedproc_partitions", sa.Column("window_tz", sa.String(64), nullable=True))
    op.add_column("feedproc_items", sa.Column("progress", Float64, nullable=True))
    op.add_column("feedproc_watchers", sa.Column("slots", sa.Integer, nullable=False, server_default=sa.text("0")))


def downgrade() -> None:
    op.drop_column("feedproc_watchers", "slots")
    op.drop_column("feedproc_items", "progress")
    for column in ("window_tz", "windows", "item_timeout", "weight"):
        op.drop_column("feedproc_partitions", column)
    op.drop_table("feedproc_queues")
