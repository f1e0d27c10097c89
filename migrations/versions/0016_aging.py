"""Aging: a queue's `aging`, the seconds after which a waiting partition's priority counts one
higher (Scylla's device against starvation by a stream of higher priority work).

`feedproc_queues.aging` (seconds, NULL: none). Expand only: a nullable column, so code of the
previous revision keeps working on this schema (it ignores aging).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Float64

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedproc_queues", sa.Column("aging", Float64, nullable=True))


def downgrade() -> None:
    op.drop_column("feedproc_queues", "aging")
