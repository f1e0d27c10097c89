"""Completion hooks: each queue's hooks, and the outbox their deliveries are kept in.

`feedproc_queues.hooks` holds a queue's on_complete / on_fail / on_cancel targets (JSON);
`feedproc_hooks` one row per hook a finished partition calls, written in the transaction that
finished it and delivered at least once by the queue's watchers.

Expand only: a new nullable column and a new table, so code of the previous revision keeps working
on this schema (it writes no hooks).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import LongText, UTCDateTime, table_options

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("feedproc_queues", sa.Column("hooks", LongText, nullable=True))
    op.create_table(
        "feedproc_hooks",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("partition_key", sa.String(200), nullable=False),
        sa.Column("hook", sa.String(16), nullable=False),
        sa.Column("target", LongText, nullable=False),
        sa.Column("payload", LongText, nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("claim", sa.String(32), nullable=True),
        sa.Column("claimed_by", sa.String(120), nullable=True),
        sa.Column("claimed_until", UTCDateTime(), nullable=True),
        sa.Column("last_error", LongText, nullable=True),
        sa.Column("response_status", sa.Integer, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        **table_options(op.get_bind()),
    )
    op.create_index("feedproc_hooks_due", "feedproc_hooks", ["status", "next_attempt_at"])
    op.create_index("feedproc_hooks_queue", "feedproc_hooks", ["queue", "id"])
    op.create_index("feedproc_hooks_partition", "feedproc_hooks", ["partition_key"])


def downgrade() -> None:
    op.drop_index("feedproc_hooks_partition", "feedproc_hooks")
    op.drop_index("feedproc_hooks_queue", "feedproc_hooks")
    op.drop_index("feedproc_hooks_due", "feedproc_hooks")
    op.drop_table("feedproc_hooks")
    op.drop_column("feedproc_queues", "hooks")
