"""The whole schema: partitions, items, watchers and the event history.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Blob, LongText, UTCDateTime, table_options

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _partial(condition: str) -> dict:
    return {"postgresql_where": sa.text(condition), "sqlite_where": sa.text(condition)}


def upgrade() -> None:
    op.create_table(
        "feedproc_partitions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(200), nullable=False, unique=True),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("sealed", sa.Boolean, nullable=False),
        sa.Column("manual_checkpoint", sa.Boolean, nullable=False),
        sa.Column("not_before", UTCDateTime(), nullable=True),
        sa.Column("ready_at", UTCDateTime(), nullable=True),
        sa.Column("lease_owner", sa.String(120), nullable=True),
        sa.Column("lease_epoch", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
        sa.Column("wanted_by", sa.String(120), nullable=True),
        sa.Column("version", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        **table_options(op.get_bind()),
    )
    op.create_index(
        "feedproc_partitions_leasable",
        "feedproc_partitions",
        ["queue", sa.text("priority DESC"), "created_at", "id"],
        **_partial("status = 'available' AND ready_at IS NOT NULL"),
    )
    op.create_index(
        "feedproc_partitions_owner", "feedproc_partitions", ["lease_owner"], **_partial("lease_owner IS NOT NULL")
    )
    op.create_index("feedproc_partitions_status", "feedproc_partitions", ["status", "updated_at"])

    op.create_table(
        "feedproc_items",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("partition_id", BigId, sa.ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("data", Blob, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", LongText, nullable=True),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("parent_id", BigId, nullable=True),
        sa.Column("parent_gate", sa.Integer, nullable=True),
        sa.Column("seq", sa.Integer, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        **table_options(op.get_bind()),
    )
    op.create_index(
        "feedproc_items_ready",
        "feedproc_items",
        ["partition_id", "gate", "next_attempt_at", "id"],
        **_partial("status = 'available'"),
    )
    op.create_index(
        "feedproc_items_failed", "feedproc_items", ["partition_id", "gate"], **_partial("status = 'failed'")
    )
    op.create_index("feedproc_items_partition_gate_status", "feedproc_items", ["partition_id", "gate", "status"])
    op.create_index(
        "feedproc_items_child",
        "feedproc_items",
        ["parent_id", "parent_gate", "seq"],
        unique=True,
        **_partial("parent_id IS NOT NULL"),
    )

    op.create_table(
        "feedproc_watchers",
        sa.Column("id", sa.String(120), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("capacity", sa.Integer, nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        **table_options(op.get_bind()),
    )
    op.create_index("feedproc_watchers_queue", "feedproc_watchers", ["queue", "expires_at"])

    op.create_table(
        "feedproc_events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("partition_id", BigId, sa.ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("item_id", BigId, nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("watcher", sa.String(120), nullable=True),
        sa.Column("detail", LongText, nullable=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        **table_options(op.get_bind()),
    )
    op.create_index("feedproc_events_partition", "feedproc_events", ["partition_id", "id"])


def downgrade() -> None:
    op.drop_table("feedproc_events")
    op.drop_table("feedproc_watchers")
    op.drop_table("feedproc_items")
    op.drop_table("feedproc_partitions")
