"""Rolling upgrades: which feedproc runs on which schema.

A fleet is upgraded without stopping it: `feedproc migrate` first, then the watchers, `serve` and
producers are replaced one at a time. That works because revisions expand the schema (new tables,
nullable columns, indexes) and contract it only a release after the code stopped using what goes.
Each revision declares `compatible_since`, the oldest revision whose code runs correctly on the
schema it leaves: its down revision's when it only adds, itself when it takes away what older code
reads or writes. `migrate` records the head's in `feedproc_schema`; a feedproc older than the
database runs on it when that revision is one it knows, and says so in its log.

`migrate` itself waits at most `LOCK_WAIT` seconds for each lock (PostgreSQL's `lock_timeout`,
MariaDB's `lock_wait_timeout`), then tries again, up to `LOCK_ATTEMPTS` times: a schema change
queued behind a long transaction would otherwise hold up every statement queued behind it.
"""

from __future__ import annotations

from collections.abc import Collection

from ..core.errors import SchemaAhead, SchemaMissing

#: Seconds one attempt of `migrate` waits for a lock; attempts before it gives up.
LOCK_WAIT = 3.0
LOCK_ATTEMPTS = 20


def schema_fit(
    head: str | None, known: Collection[str], current: str | None, compatible_since: str | None
) -> str | None:
    """Whether code whose newest revision is `head` (knowing the revisions `known`) runs on a
    database at `current` whose schema declares `compatible_since`: None when it is this code's own
    schema; a line to log when it is a newer one this code is declared compatible with; else
    SchemaMissing (older: run `feedproc migrate`) or SchemaAhead (newer, and not compatible)."""
    if current == head:
        return None
    if current is None:
        raise SchemaMissing("the database has no feedproc schema: run `feedproc migrate`")
    if current in known:
        raise SchemaMissing(f"the database is at schema {current}, not {head}: run `feedproc migrate`")
    if compatible_since is not None and compatible_since in known:
        return (
            f"the database is at schema {current}, newer than this feedproc's {head}; it declares feedproc from "
            f"schema {compatible_since} on compatible: running (replace this process with the new release)"
        )
    runs = f"; it runs feedproc from schema {compatible_since} on" if compatible_since else ""
    raise SchemaAhead(f"the database is at schema {current}, newer than this feedproc ({head}){runs}: upgrade feedproc")


def declared_compatible_since(module: object, revision: str) -> str:
    """A revision module's `compatible_since` (a revision that declares none is compatible with
    no code older than itself)."""
    since = getattr(module, "compatible_since", revision)
    return since if isinstance(since, str) else revision
