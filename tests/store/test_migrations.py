"""`feedproc migrate`: the alembic revisions create exactly `feedproc.store.schema.metadata`, running them
again changes nothing, and a database without the schema is named as such."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from feedproc.core.errors import SchemaMissing
from feedproc.store import Store, alembic_config
from feedproc.store.schema import metadata

from ..support import run_cli

VERSION_TABLE = "feedproc_version"


@pytest.fixture
def empty_store(unmigrated_url):
    store = Store(unmigrated_url)
    yield store
    store.close()


def head_revision(url):
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def schema_differences(store):
    """alembic's autogenerate diff between the database and `metadata`, minus the version table."""

    def include_name(name, type_, parent_names):
        return not (type_ == "table" and name == VERSION_TABLE)

    with store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True, "include_name": include_name}
        )
        return compare_metadata(context, metadata)


def expression_indexes():
    """Names of indexes with an expression element (e.g. `priority DESC`), which SQLite cannot reflect."""
    return {
        index.name
        for table in metadata.tables.values()
        for index in table.indexes
        if any(not hasattr(element, "table") for element in index.expressions)
    }


# ---------------------------------------------------------------- a database without the schema


def test_check_schema_on_an_empty_database_raises_schema_missing_naming_feedproc_migrate(empty_store):
    with pytest.raises(SchemaMissing, match="feedproc migrate"):
        empty_store.check_schema()


def test_reading_an_empty_database_raises_schema_missing_naming_feedproc_migrate(empty_store):
    with pytest.raises(SchemaMissing, match="feedproc migrate"):
        empty_store.status("anything")


def test_schema_revision_of_an_empty_database_is_none(empty_store):
    assert empty_store.schema_revision() is None


# ---------------------------------------------------------------- migrate


def test_migrate_brings_an_empty_database_to_the_head_revision(empty_store, unmigrated_url):
    empty_store.migrate()
    empty_store.check_schema()
    assert empty_store.schema_revision() == head_revision(unmigrated_url)


def test_migrating_twice_is_idempotent_and_keeps_the_data(empty_store, unmigrated_url):
    empty_store.migrate()
    empty_store.add_partition("kept", [(0, b"x")], sealed=False)
    before = empty_store.status("kept")
    empty_store.migrate()
    empty_store.check_schema()
    assert empty_store.schema_revision() == head_revision(unmigrated_url)
    assert empty_store.status("kept") == before


def test_feedproc_migrate_command_is_idempotent(unmigrated_url, tmp_path):
    first = run_cli(unmigrated_url, "migrate", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_cli(unmigrated_url, "migrate", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    store = Store(unmigrated_url)
    try:
        store.check_schema()
    finally:
        store.close()


# ---------------------------------------------------------------- the revision creates exactly `metadata`


def test_migrated_schema_matches_the_metadata(store):
    differences = schema_differences(store)
    if store.engine.dialect.name == "sqlite":
        # SQLite's reflection cannot read expression index elements such as `priority DESC`, so alembic
        # reports each such index as removed and added again; those are compared by name and columns
        # in the tests below (and by their SQL text here).
        noise = expression_indexes()
        differences = [d for d in differences if not (d[0] in ("remove_index", "add_index") and d[1].name in noise)]
        with store.engine.connect() as conn:
            for name in noise:
                sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :n"), {"n": name}).scalar()
                assert sql is not None and "DESC" in sql.upper(), f"index {name}: {sql}"
    assert differences == []


def test_migrated_schema_has_the_tables_and_columns_of_the_metadata(store):
    inspector = inspect(store.engine)
    assert set(inspector.get_table_names()) - {VERSION_TABLE} == set(metadata.tables)
    for name, table in metadata.tables.items():
        columns = {c["name"]: c["nullable"] for c in inspector.get_columns(name)}
        assert columns == {c.name: c.nullable for c in table.columns}, name


def test_migrated_schema_has_the_indexes_of_the_metadata_partial_where_declared(store):
    inspector = inspect(store.engine)
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            definitions = dict(conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'index'")).all())
        else:
            definitions = dict(conn.execute(text("SELECT indexname, indexdef FROM pg_indexes")).all())
    for name, table in metadata.tables.items():
        # PostgreSQL also lists the index behind a UNIQUE constraint; that one is the constraint's
        reflected = {i["name"]: i for i in inspector.get_indexes(name) if not i.get("duplicates_constraint")}
        assert set(reflected) == {i.name for i in table.indexes}, name
        for index in table.indexes:
            assert bool(reflected[index.name]["unique"]) == index.unique, index.name
            partial = index.dialect_options["postgresql"]["where"] is not None
            assert ("WHERE" in definitions[index.name].upper()) == partial, definitions[index.name]


def test_migrated_schema_has_the_unique_partition_key(store):
    inspector = inspect(store.engine)
    uniques = [c["column_names"] for c in inspector.get_unique_constraints("feedproc_partitions")]
    indexes = [i["column_names"] for i in inspector.get_indexes("feedproc_partitions") if i["unique"]]
    assert ["key"] in uniques + indexes


# ---------------------------------------------------------------- 0002: scheduling controls


def test_scheduling_revision_downgrades_to_0001_and_upgrades_again_keeping_the_data(empty_store, unmigrated_url):
    from alembic import command

    empty_store.migrate()
    empty_store.add_partition("kept", [(0, b"x")], sealed=False)
    config = alembic_config(unmigrated_url)
    with empty_store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0001")
    assert empty_store.schema_revision() == "0001"
    assert "feedproc_queues" not in inspect(empty_store.engine).get_table_names()
    empty_store.migrate()
    empty_store.check_schema()
    assert empty_store.status("kept")["items"]["total"] == 1
