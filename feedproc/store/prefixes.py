"""Table prefixes: several feeds in one database, each with tables of its own.

Every name feedproc gives the database starts with `feedproc_`: tables, indexes, triggers and their
functions, notification channels, the alembic version table. A store opened with another prefix
(`Store(url, table_prefix="billing_")`, `feedproc --table-prefix`, `FEEDPROC_TABLE_PREFIX`) sees
`billing_items`, `billing_partitions`, ... and listens on `billing_ready`, so two feeds share one
database without seeing each other's work or wake-ups.

The statements keep spelling the default names; the prefix is applied to each statement's text as
it reaches the driver (`qualify`, hooked on the engine's `before_cursor_execute` and on the hot
path's `DriverStatement`). One rewrite at the edge instead of threading a set of tables through
every module keeps each statement readable as the SQL it is, and costs nothing with the default
prefix (no hook is installed then). Names are never built from user input, and data travels as
bound parameters, so only feedproc's own identifiers carry the `feedproc_` spelling.

On PostgreSQL a schema is the other way to keep feeds apart: put it first in the search path of
the URL (`?options=-csearch_path%3Dbilling`); feedproc creates and finds everything there.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection

from ..core.models import check_table_prefix

DEFAULT_PREFIX = "feedproc_"
#: The engine's execution option holding its prefix (read by `prefix_of`).
PREFIX_OPTION = "feedproc_table_prefix"


def prefix_from(given: str | None) -> str:
    """The prefix given, else $FEEDPROC_TABLE_PREFIX, else `feedproc_`; InvalidInput unless it can
    begin a table name (`core.models.check_table_prefix`)."""
    chosen = given if given is not None else os.environ.get("FEEDPROC_TABLE_PREFIX") or DEFAULT_PREFIX
    return check_table_prefix(chosen)


def qualify(sql: str, prefix: str) -> str:
    """`sql` with feedproc's names under `prefix` (a plain replace: 1 us on a 2 KB statement)."""
    return sql if prefix == DEFAULT_PREFIX else sql.replace(DEFAULT_PREFIX, prefix)


def install(engine: Engine, prefix: str) -> None:
    """Make every statement run on `engine` use `prefix` (nothing to do for the default)."""
    if prefix == DEFAULT_PREFIX:
        return

    def _qualify(
        conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> tuple[str, Any]:
        return qualify(statement, prefix), parameters

    event.listen(engine, "before_cursor_execute", _qualify, retval=True)


def prefix_of(bind: Engine | Connection) -> str:
    """The table prefix an engine (or one of its connections) was made with."""
    prefix: str = bind.get_execution_options().get(PREFIX_OPTION, DEFAULT_PREFIX)
    return prefix
