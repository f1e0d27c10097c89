"""Throughput by minute for the dashboard's charts: each source (watcher, producer, worker API)
adds its counts to its own row per minute of the database clock.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import UTCDateTime, table_options

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "feedproc_stats",
        sa.Column("bucket", UTCDateTime(), primary_key=True),
        sa.Column("queue", sa.String(100), primary_key=True),
        sa.Column("source", sa.String(120), primary_key=True),
        *(
            sa.Column(name, sa.BigInteger, nullable=False, server_default=sa.text("0"))
            for name in ("added", "processed", "completed", "failed")
        ),
        **table_options(op.get_bind()),
    )


def downgrade() -> None:
    op.drop_table("feedproc_stats")
