"""Which release each watcher runs: `feedproc_watchers.revision`, the newest schema revision its
feedproc knows (NULL: a watcher from before 0019). During a rolling upgrade `feedproc status`
shows which watchers still run the previous release.

Expand only: a nullable column; watchers of 0018 register without it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None
#: The oldest revision whose code runs on this schema: 0018's ignores the new column (and 0017's
#: would too, but it refuses any schema newer than its own).
compatible_since = "0017"


def upgrade() -> None:
    op.add_column("feedproc_watchers", sa.Column("revision", sa.String(32), nullable=True))


def downgrade() -> None:
    op.drop_column("feedproc_watchers", "revision")
