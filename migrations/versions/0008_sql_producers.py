"""Items written with plain SQL dispatch like any other: a trigger keeps the partition's readiness.

A partition is leased when its `ready_at` (the earliest due available item at its current gate) is
set, and only feedproc's own writes used to set it. After an insert into feedproc_items, the
trigger lowers `ready_at` of each partition that got an available item at its current gate, so a
producer that writes the partition and its items with SQL (README, "Producing with SQL") needs no
feedproc code. It only ever sets `ready_at` to a moment when an available item of that gate is
really due, so it cannot make a partition ready that is not; feedproc's own writes, which set
`ready_at` themselves, find nothing to change. PostgreSQL runs it once per statement over the new
rows (a transition table); SQLite and MariaDB/MySQL, which have no statement triggers, once per row.

SQLite drops a table's triggers with the table: a later revision that rebuilds feedproc_items in
batch mode must create this trigger again.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

PG_FUNCTION = """
CREATE FUNCTION feedproc_items_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE feedproc_partitions AS p SET ready_at = n.due
    FROM (SELECT partition_id, gate, min(next_attempt_at) AS due
            FROM feedproc_new_items WHERE status = 'available'
           GROUP BY partition_id, gate) AS n
    WHERE p.id = n.partition_id AND p.gate = n.gate AND p.status = 'available'
      AND (p.ready_at IS NULL OR p.ready_at > n.due);
    RETURN NULL;
END
$$
"""
PG_TRIGGER = """
CREATE TRIGGER feedproc_items_ready AFTER INSERT ON feedproc_items
REFERENCING NEW TABLE AS feedproc_new_items
FOR EACH STATEMENT EXECUTE FUNCTION feedproc_items_ready()
"""
SQLITE_TRIGGER = """
CREATE TRIGGER feedproc_items_ready AFTER INSERT ON feedproc_items
FOR EACH ROW WHEN NEW.status = 'available'
BEGIN
    UPDATE feedproc_partitions SET ready_at = NEW.next_attempt_at
    WHERE id = NEW.partition_id AND gate = NEW.gate AND status = 'available'
      AND (ready_at IS NULL OR ready_at > NEW.next_attempt_at);
END
"""

MYSQL_TRIGGER = """
CREATE TRIGGER feedproc_items_ready AFTER INSERT ON feedproc_items
FOR EACH ROW
    UPDATE feedproc_partitions SET ready_at = NEW.next_attempt_at
    WHERE NEW.status = 'available' AND id = NEW.partition_id AND gate = NEW.gate AND status = 'available'
      AND (ready_at IS NULL OR ready_at > NEW.next_attempt_at)
"""


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(PG_FUNCTION)
        op.execute(PG_TRIGGER)
    elif dialect in ("mysql", "mariadb"):
        op.execute(MYSQL_TRIGGER)
    else:
        op.execute(SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS feedproc_items_ready ON feedproc_items")
        op.execute("DROP FUNCTION IF EXISTS feedproc_items_ready()")
    else:
        op.execute("DROP TRIGGER IF EXISTS feedproc_items_ready")
