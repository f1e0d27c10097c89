"""Priorities: 64-bit, and defaults per queue.

`feedproc_partitions.priority` becomes a BIGINT on PostgreSQL and MariaDB/MySQL (SQLite's INTEGER is
64-bit already and is left alone: rebuilding the table would drop its trigger); the leasable index
over it is kept (the databases rebuild it with the column). `feedproc_queues` gets
`default_priority` and `default_weight`: what a partition added to the queue without its own gets
(NULL: none, as before).

Expand only: a wider column holds every value a 32-bit one did, and the new columns are nullable,
so code of the previous revision keeps working on this schema. Widening the column rewrites
feedproc_partitions on PostgreSQL (under an exclusive lock) and on MariaDB/MySQL (a table copy):
writers wait for it, for as long as a pass over the table takes.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column(
            "feedproc_partitions",
            "priority",
            type_=sa.BigInteger(),
            existing_type=sa.Integer(),
            existing_nullable=False,
            existing_server_default=sa.text("0"),
        )
    op.add_column(
        "feedproc_queues",
        sa.Column("default_priority", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
    )
    op.add_column("feedproc_queues", sa.Column("default_weight", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("feedproc_queues", "default_weight")
    op.drop_column("feedproc_queues", "default_priority")
    if op.get_bind().dialect.name != "sqlite":  # refused by the database while a priority is beyond 32 bits
        op.alter_column(
            "feedproc_partitions",
            "priority",
            type_=sa.Integer(),
            existing_type=sa.BigInteger(),
            existing_nullable=False,
            existing_server_default=sa.text("0"),
        )
