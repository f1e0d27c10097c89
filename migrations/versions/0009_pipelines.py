"""Pipelines: a queue's named gates with their handlers and settings, its schedules' last ticks, and
the per-gate slots of watchers serving gates with a concurrency limit.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import LongText, UTCDateTime, table_options

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    options = table_options(op.get_bind())
    op.create_table(
        "feedproc_pipelines",
        sa.Column("queue", sa.String(100), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("spec", LongText, nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("updated_by", sa.String(120), nullable=True),
        **options,
    )
    op.create_table(
        "feedproc_schedules",
        sa.Column("queue", sa.String(100), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("last_tick", UTCDateTime(), nullable=False),
        sa.Column("last_key", sa.String(200), nullable=True),
        **options,
    )
    op.add_column("feedproc_watchers", sa.Column("gate_slots", LongText, nullable=True))


def downgrade() -> None:
    op.drop_column("feedproc_watchers", "gate_slots")
    op.drop_table("feedproc_schedules")
    op.drop_table("feedproc_pipelines")
