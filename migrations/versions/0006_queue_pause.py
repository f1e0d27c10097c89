"""Queues can be paused: nothing new is dispatched or claimed from a paused queue, fleet-wide, until
it is resumed; in-flight items finish. `paused_at`/`paused_by` record when and by whom.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedproc_queues", sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("feedproc_queues", sa.Column("paused_at", UTCDateTime(), nullable=True))
    op.add_column("feedproc_queues", sa.Column("paused_by", sa.String(120), nullable=True))


def downgrade() -> None:
    for column in ("paused_by", "paused_at", "paused"):
        op.drop_column("feedproc_queues", column)
