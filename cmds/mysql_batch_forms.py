"""How to write a batch of answers to MariaDB/MySQL in one go: the forms the group commit could take,
timed against each other on one throwaway database (`python cmds/mysql_batch_forms.py [URL]`).

MariaDB has no arrays and no UPDATE ... RETURNING, and PyMySQL's executemany batches only INSERTs, so
each form below updates `BATCH` items (version-guarded, as the group commit does) in one transaction:

* `per-row`: one UPDATE per item (executemany): a round trip per answer;
* `union-all`: one multi-table UPDATE joined to a derived table of one SELECT per outcome (what
  `MySQLDialect.update_items` does, in `feedproc/store/dialect/mysql.py`);
* `json-table`: the same UPDATE joined to JSON_TABLE over one JSON document of the outcomes
  (MariaDB >= 10.6, MySQL >= 8.0; the data travels as base64);
* `upsert`: INSERT ... ON DUPLICATE KEY UPDATE on the items' primary key, the guard in IF()s.

Each form's every round is checked: all `BATCH` rows matched their version.
"""

from __future__ import annotations

import base64
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, NullPool, create_engine, make_url, text

from feedproc import Feed

BATCH = 200
ROUNDS = 30
ITEMS = 20_000

SET_COLUMNS = """
    i.status = v.status, i.data = COALESCE(v.data, i.data), i.attempts = v.attempts,
    i.next_attempt_at = UTC_TIMESTAMP(6), i.deliveries = i.deliveries + 1,
    i.delivered_by = 'w', i.version = i.version + 1, i.updated_at = UTC_TIMESTAMP(6)"""


Rows = Sequence[dict[str, Any]]  # id, version, status, data, attempts


def per_row(conn: Connection, rows: Rows) -> int:
    cursor = conn.connection.cursor()  # the pool's proxy of the driver's connection
    n = 0
    for r in rows:
        n += cursor.execute(
            "UPDATE feedproc_items AS i SET i.status = %s, i.data = COALESCE(%s, i.data), i.attempts = %s,"
            " i.next_attempt_at = UTC_TIMESTAMP(6), i.deliveries = i.deliveries + 1, i.delivered_by = 'w',"
            " i.version = i.version + 1, i.updated_at = UTC_TIMESTAMP(6) WHERE i.id = %s AND i.version = %s",
            (r["status"], r["data"], r["attempts"], r["id"], r["version"]),
        )
    return n


def union_all(conn: Connection, rows: Rows) -> int:
    one = "SELECT %s AS id, %s AS version, %s AS status, %s AS data, %s AS attempts"
    sql = f"UPDATE feedproc_items AS i JOIN ({' UNION ALL '.join([one] * len(rows))}) AS v"
    sql += f" ON i.id = v.id AND i.version = v.version SET {SET_COLUMNS}"
    params = [r[c] for r in rows for c in ("id", "version", "status", "data", "attempts")]
    return conn.exec_driver_sql(sql, tuple(params)).rowcount


def json_table(conn: Connection, rows: Rows) -> int:
    doc = json.dumps(
        [
            [
                r["id"],
                r["version"],
                r["status"],
                None if r["data"] is None else base64.b64encode(r["data"]).decode(),
                r["attempts"],
            ]
            for r in rows
        ]
    )
    sql = (
        "UPDATE feedproc_items AS i JOIN (SELECT j.id, j.version, j.status, FROM_BASE64(j.data) AS data, j.attempts"
        " FROM JSON_TABLE(%s, '$[*]' COLUMNS (id BIGINT PATH '$[0]', version BIGINT PATH '$[1]',"
        " status VARCHAR(16) PATH '$[2]', data LONGTEXT PATH '$[3]', attempts INT PATH '$[4]')) AS j) AS v"
        f" ON i.id = v.id AND i.version = v.version SET {SET_COLUMNS}"
    )
    return conn.exec_driver_sql(sql, (doc,)).rowcount


def upsert(conn: Connection, rows: Rows) -> int:
    # Every NOT NULL column must be given for the INSERT half, which must never happen: the ids exist.
    values = ",".join(
        ["(%s, %s, 0, 0, %s, COALESCE(%s, ''), %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"] * len(rows)
    )
    ok = "feedproc_items.version = VALUES(version)"
    sql = (
        "INSERT INTO feedproc_items (id, version, partition_id, gate, status, data, attempts, next_attempt_at,"
        f" created_at, updated_at) VALUES {values} ON DUPLICATE KEY UPDATE"
        f" status = IF({ok}, VALUES(status), status), data = IF({ok} AND VALUES(data) <> '', VALUES(data), data),"
        f" attempts = IF({ok}, VALUES(attempts), attempts), deliveries = IF({ok}, deliveries + 1, deliveries),"
        f" next_attempt_at = IF({ok}, UTC_TIMESTAMP(6), next_attempt_at),"
        f" updated_at = IF({ok}, UTC_TIMESTAMP(6), updated_at),"
        f" version = IF({ok}, version + 1, version)"
    )
    params = [v for r in rows for v in (r["id"], r["version"], r["status"], r["data"], r["attempts"])]
    conn.exec_driver_sql(sql, tuple(params))
    return len(rows)  # its row count mixes inserted, changed and unchanged rows: no guard count


FORMS = {"per-row": per_row, "union-all": union_all, "json-table": json_table, "upsert": upsert}


def main(admin_url: str) -> None:
    name = f"fp_forms_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        feed = Feed(url)
        feed.migrate()
        feed.add_partition("forms", [(0, b'{"n": %d}' % n) for n in range(ITEMS)])
        engine = feed.store.engine
        with engine.connect() as conn:
            ids = list(conn.execute(text("SELECT id FROM feedproc_items ORDER BY id")).scalars())
        versions = dict.fromkeys(ids, 0)
        timings: dict[str, list[float]] = {form: [] for form in FORMS}
        for round_ in range(ROUNDS):
            for form, write in FORMS.items():  # interleaved: the machine's drift falls on every form
                batch = ids[(round_ * BATCH) % ITEMS :][:BATCH]
                rows = [
                    {
                        "id": i,
                        "version": versions[i],
                        "status": "available",
                        "data": b'{"r": %d}' % round_ if i % 2 else None,
                        "attempts": round_,
                    }
                    for i in batch
                ]
                with engine.connect() as conn, conn.begin():
                    started = time.perf_counter()
                    matched = write(conn, rows)
                timings[form].append(time.perf_counter() - started)
                assert matched == len(rows), (form, matched)
                for i in batch:
                    versions[i] += 1
        with engine.connect() as conn:
            server = conn.execute(text("SELECT VERSION()")).scalar()
        feed.close()
        print(f"{server}: {BATCH} answers per transaction, median of {ROUNDS} interleaved rounds")
        print("| form | ms per batch | µs per answer |\n| --- | ---: | ---: |")
        for form, seconds in timings.items():
            median = statistics.median(seconds)
            print(f"| {form} | {median * 1e3:.2f} | {median / BATCH * 1e6:.0f} |")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mysql+pymysql://root@127.0.0.1:3306/test")
