"""Rolling upgrades: the schema says which feedproc may run on it.

* `feedproc_schema`: one row; `compatible_since` is the oldest revision whose code runs correctly on
  this schema (each revision declares its own: `compatible_since` below). `migrate` writes the
  head's. A feedproc older than the database runs on it when its own revision is at or after that
  one (`store/upgrades.py`), so watchers of the previous release keep working while they are
  replaced.

Expand only: a new table.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None
#: The oldest revision whose code runs on this schema: 0017's ignores the new table.
compatible_since = "0017"


def upgrade() -> None:
    op.create_table(
        "feedproc_schema",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("compatible_since", sa.String(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("feedproc_schema")
