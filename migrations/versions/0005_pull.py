"""Pull workers: queues in pull mode, and the claims workers hold on items.

* `feedproc_queues.mode`: `push` (watchers deliver the queue's items) or `pull` (workers claim
  them through `feedproc serve`; watchers leave the queue alone).
* `feedproc_items.claimed_until`: set while a worker holds a claim on the item (nobody else may
  claim it), cleared by its answer or when the claim expires.
* `feedproc_claims`: one row per claim, kept after it ends so that a worker presenting an old token
  learns why it is refused (`expired`, `cancelled`, `superseded`, `answered`). A claim's `version`
  is the item's version while it is held: any other change of the item (a cancel, a retry, a
  watcher's answer) supersedes the claim.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from feedproc.store.foundations import Float64, UTCDateTime, table_options

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("feedproc_queues", sa.Column("mode", sa.String(8), nullable=False, server_default="push"))
    op.add_column("feedproc_items", sa.Column("claimed_until", UTCDateTime(), nullable=True))
    op.create_table(
        "feedproc_claims",
        sa.Column("token", sa.String(64), primary_key=True),
        sa.Column("item_id", BigId, nullable=False),
        sa.Column("partition_id", BigId, sa.ForeignKey("feedproc_partitions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("worker", sa.String(120), nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("weight", sa.Integer, nullable=False),
        sa.Column("lease_seconds", Float64, nullable=False),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("callback", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("claimed_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        **table_options(op.get_bind()),
    )
    op.create_index("feedproc_claims_active", "feedproc_claims", ["queue", "state", "expires_at"])
    op.create_index("feedproc_claims_item", "feedproc_claims", ["item_id"])


def downgrade() -> None:
    op.drop_index("feedproc_claims_item", table_name="feedproc_claims")
    op.drop_index("feedproc_claims_active", table_name="feedproc_claims")
    op.drop_table("feedproc_claims")
    op.drop_column("feedproc_items", "claimed_until")
    op.drop_column("feedproc_queues", "mode")
