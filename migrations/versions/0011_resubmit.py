"""Resubmit: an item's input as its producer added it, kept once an answer changes it.

`origin_gate` and `origin_data` are NULL until the first answer that replaces the item's data or
moves it to another gate; that answer's transaction copies the gate and data there first. A
resubmitted partition's items go back to them. Written on that path only, never at insert: a
partition whose answers only complete their items (the common case) stores no second copy.

Expand only: new nullable columns, so code of the previous revision keeps working on this schema.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Blob

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedproc_items", sa.Column("origin_gate", sa.Integer, nullable=True))
    op.add_column("feedproc_items", sa.Column("origin_data", Blob, nullable=True))


def downgrade() -> None:
    op.drop_column("feedproc_items", "origin_data")
    op.drop_column("feedproc_items", "origin_gate")
