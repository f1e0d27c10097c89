"""Alembic environment for feedproc.

feedproc runs migrations programmatically (`feedproc migrate` / `Feed.migrate()`), handing the
open connection in `config.attributes["connection"]`; the `alembic` command line works too when
`sqlalchemy.url` is set.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from feedproc.store.schema import metadata

config = context.config
# Tables under another prefix (`feedproc --table-prefix`) keep their own version table; the
# statements themselves are qualified by the engine (feedproc/store/names.py). Alembic asks whether
# the version table exists by a bound name, which that rewrite does not see, so it is named here.
VERSION_TABLE = (config.get_main_option("feedproc_table_prefix") or "feedproc_") + "version"


def _configure_and_run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        _configure_and_run(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
