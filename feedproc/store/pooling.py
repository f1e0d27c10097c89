"""PostgreSQL behind a connection pooler, and where notifications are listened for.

A transaction-mode pooler (PgBouncer's `pool_mode = transaction`) lends each transaction whichever
server connection is free. What lives in a session does not survive that: psycopg's automatic
prepared statements (prepared on one server connection, then executed on another: `prepared
statement "_pg3_0" does not exist`) and LISTEN (the server connection that listens is lent to the
next client, which never reads the notifications). feedproc keeps no other session state: its
per-statement settings are `set_config(..., true)`, local to the transaction.

`?feedproc_pooler=transaction` on a PostgreSQL URL (or `FEEDPROC_POOLER=transaction` in the
environment, for a URL other programs read too) says a pooler is in between: statements are not
prepared, and notifications are listened for on a direct connection when one is given (`listen_url`,
`feedproc watch --listen-db URL`), else not at all: watchers then find new work by polling, every
`--poll-interval` (1 s by default) at most. A pooler in session mode needs no option.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import URL

from ..core.errors import InvalidInput

#: The URL query parameter naming the pooler in front of PostgreSQL.
POOLER_OPTION = "feedproc_pooler"
#: The same, for every PostgreSQL URL of the process.
POOLER_VARIABLE = "FEEDPROC_POOLER"
#: The pooler modes feedproc knows (a session-mode pooler needs no option).
POOLERS = ("transaction",)


def split_pooler(url: URL) -> tuple[URL, str | None]:
    """`url` without its `feedproc_pooler` parameter (the driver would refuse it), and the pooler it
    or $FEEDPROC_POOLER names (None: the URL reaches the database directly). InvalidInput, in one
    line, for a pooler feedproc does not know or one named on a database other than PostgreSQL."""
    value = url.query.get(POOLER_OPTION)
    if value is None:
        variable = os.environ.get(POOLER_VARIABLE, "")
        if variable not in ("", *POOLERS):
            raise InvalidInput(f"{POOLER_VARIABLE}={variable!r}: the pooler's mode must be transaction")
        return url, variable if variable and url.get_backend_name() == "postgresql" else None
    if not isinstance(value, str) or value not in POOLERS:
        raise InvalidInput(f"{POOLER_OPTION}={value!r} in the database URL: the pooler's mode must be transaction")
    if url.get_backend_name() != "postgresql":
        raise InvalidInput(
            f"{POOLER_OPTION} in the database URL is for PostgreSQL behind PgBouncer, not {url.get_backend_name()}"
        )
    return url.difference_update_query([POOLER_OPTION]), value


def listen_dsn(url: URL, pooler: str | None, listen_url: URL | None) -> str | None:
    """The libpq connection string notifications are listened for on: `listen_url` when given
    (a direct connection beside a pooler), else the database's own URL unless a transaction pooler
    is in between (None: poll)."""
    if listen_url is not None:
        if listen_url.get_backend_name() != "postgresql":
            raise InvalidInput(
                "the listen database is where PostgreSQL's notifications come from: give a postgresql:// URL"
            )
        if POOLER_OPTION in listen_url.query:
            raise InvalidInput("the listen database must be a direct connection, not through a transaction pooler")
        return _libpq(listen_url)
    return None if pooler == "transaction" else _libpq(url)


def _libpq(url: URL) -> str:
    """`url` as a libpq connection string, a multi-host URL's hosts included
    (`?host=a:5432&host=b:5432&target_session_attrs=read-write`, as SQLAlchemy spells them, is
    libpq's `host=a,b port=5432,5432`), with the connection defaults feedproc's engine has."""
    from psycopg.conninfo import make_conninfo

    options: dict[str, str | int | None] = {k: str(v) for k, v in url.query.items() if k != "host"}
    hosts = url.query.get("host", ())
    named = [hosts] if isinstance(hosts, str) else list(hosts)
    if named and url.host is None:  # SQLAlchemy's multi-host spelling: each `host:port` in the query
        pairs = [h.rpartition(":") if ":" in h else (h, "", "") for h in named]
        options["host"] = ",".join(host for host, _, _ in pairs)
        options["port"] = ",".join(port or str(url.port or 5432) for _, _, port in pairs)
    else:
        options |= {"host": url.host or (named[0] if named else None), "port": url.port}
    options |= {"user": url.username, "password": url.password, "dbname": url.database}
    given = {k: v for k, v in options.items() if v is not None}
    return make_conninfo("", **(connection_defaults(url) | given))


#: What every PostgreSQL connection of feedproc asks of libpq unless its URL says otherwise. TCP
#: keepalives and a TCP user timeout: a server whose host is cut off (a failed-over leader, a network
#: partition) answers nothing and closes nothing, and a call on such a connection would otherwise
#: wait for the kernel's retransmissions to give up (about 15 minutes); with these it fails within
#: 20 s and the pool connects again, to the new leader with `target_session_attrs=read-write`.
CONNECTION_DEFAULTS: dict[str, str | int | None] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 2,
    "tcp_user_timeout": 20000,
}


def connection_defaults(url: URL) -> dict[str, str | int | None]:
    """CONNECTION_DEFAULTS, less what `url`'s query sets itself."""
    return {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in url.query}
