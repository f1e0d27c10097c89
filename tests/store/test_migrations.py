"""`feedproc migrate`: the alembic revisions create exactly `feedproc.store.schema.metadata`, running them
again changes nothing, and a database without the schema is named as such."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Boolean, Column, ColumnClause, Index, Inspector, UniqueConstraint, inspect, text

from feedproc.core.errors import SchemaAhead, SchemaMissing
from feedproc.store import Store, alembic_config
from feedproc.store.foundations import MYSQL
from feedproc.store.schema import metadata

from ..support import run_cli

VERSION_TABLE = "feedproc_version"


@pytest.fixture
def empty_store(unmigrated_url: str) -> Iterator[Store]:
    store = Store(unmigrated_url)
    yield store
    store.close()


def head_revision(url: str) -> str:
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None
    return head


def schema_differences(store: Store) -> list[Any]:
    """alembic's autogenerate diff between the database and `metadata`, minus the version table."""

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        return not (type_ == "table" and name == VERSION_TABLE)

    with store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={"compare_type": True, "compare_server_default": same_default, "include_name": include_name},
        )
        return compare_metadata(context, metadata)


def same_default(
    context: MigrationContext,
    inspected_column: Any,
    metadata_column: Column[Any],
    inspected_default: str | None,
    metadata_default: Any,
    rendered_default: str | None,
) -> bool | None:
    """alembic's server default comparison, except that on MariaDB/MySQL a BOOLEAN is a TINYINT(1) whose
    `false` default reads back as 0 (MySQL: '0'): the same default, not a difference."""
    if context.dialect.name in MYSQL and isinstance(metadata_column.type, Boolean) and rendered_default is not None:
        as_number = {"false": "0", "true": "1", "0": "0", "1": "1"}
        expected = as_number.get(str(rendered_default).strip("'").lower())
        return expected is None or str(inspected_default).strip("'") != expected
    return None  # alembic's own comparison


def expression_indexes() -> set[str | None]:
    """Names of indexes with an expression element (e.g. `priority DESC`), which SQLite cannot reflect
    and alembic cannot compare on MariaDB/MySQL."""
    return {
        index.name
        for table in metadata.tables.values()
        for index in table.indexes
        if any(not hasattr(element, "table") for element in index.expressions)
    }


def declared_columns(index: Index) -> list[tuple[str, bool]]:
    """An index's columns as (name, descending), its expression elements (`priority DESC`) read as text."""
    columns = []
    for element in index.expressions:
        if isinstance(element, ColumnClause):
            columns.append((element.name, False))
        else:
            name, *order = str(element).split()
            columns.append((name, [word.upper() for word in order] == ["DESC"]))
    return columns


def own_indexes(inspector: Inspector, table: str, *, mysql: bool) -> dict[str | None, Any]:
    """A table's indexes as reflected, without those that back a constraint: of a UNIQUE constraint
    (PostgreSQL marks them; MariaDB/MySQL have only the index, found here by its columns), and the
    index MariaDB/MySQL add for a foreign key that no index serves (named after the constraint or its
    column)."""
    found = {i["name"]: i for i in inspector.get_indexes(table) if not i.get("duplicates_constraint")}
    if mysql:
        uniques = [
            [column.name for column in constraint.columns]
            for constraint in metadata.tables[table].constraints
            if isinstance(constraint, UniqueConstraint)
        ]
        for name, index in list(found.items()):
            if index["unique"] and index["column_names"] in uniques:
                del found[name]
        for key in inspector.get_foreign_keys(table):
            for name in (key["name"], key["constrained_columns"][0]):
                if name in found and found[name]["column_names"] == key["constrained_columns"]:
                    del found[name]
    return found


# ---------------------------------------------------------------- a database without the schema


def test_check_schema_on_an_empty_database_raises_schema_missing_naming_feedproc_migrate(empty_store: Store) -> None:
    with pytest.raises(SchemaMissing, match="feedproc migrate"):
        empty_store.check_schema()


def test_reading_an_empty_database_raises_schema_missing_naming_feedproc_migrate(empty_store: Store) -> None:
    with pytest.raises(SchemaMissing, match="feedproc migrate"):
        empty_store.status("anything")


def test_schema_revision_of_an_empty_database_is_none(empty_store: Store) -> None:
    assert empty_store.schema_revision() is None


# ---------------------------------------------------------------- migrate


def test_migrate_brings_an_empty_database_to_the_head_revision(empty_store: Store, unmigrated_url: str) -> None:
    empty_store.migrate()
    empty_store.check_schema()
    assert empty_store.schema_revision() == head_revision(unmigrated_url)


def test_migrating_twice_is_idempotent_and_keeps_the_data(empty_store: Store, unmigrated_url: str) -> None:
    empty_store.migrate()
    empty_store.add_partition("kept", [(0, b"x")], sealed=False)
    before = empty_store.status("kept")
    empty_store.migrate()
    empty_store.check_schema()
    assert empty_store.schema_revision() == head_revision(unmigrated_url)
    assert empty_store.status("kept") == before


@pytest.mark.smoke  # the fast tier's database smoke
def test_feedproc_migrate_command_is_idempotent(unmigrated_url: str, tmp_path: Path) -> None:
    first = run_cli(unmigrated_url, "migrate", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = run_cli(unmigrated_url, "migrate", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    store = Store(unmigrated_url)
    try:
        store.check_schema()
    finally:
        store.close()


# ---------------------------------------------------------------- a schema newer than this feedproc


def at_a_newer_revision(store: Store, *, compatible_since: str | None = None) -> str:
    """The database as a newer feedproc would have migrated it: at the revision after this one's
    head, declaring code from `compatible_since` on compatible (by default only its own)."""
    newer = f"{int(head_revision(store.url)) + 1:04d}"
    with store.write() as conn:
        conn.execute(text("UPDATE feedproc_version SET version_num = :newer"), {"newer": newer})
        conn.execute(text("UPDATE feedproc_schema SET compatible_since = :since"), {"since": compatible_since or newer})
    return newer


def test_a_schema_newer_than_this_feedproc_is_refused_saying_to_upgrade_feedproc(store: Store) -> None:
    newer, head = at_a_newer_revision(store), head_revision(store.url)
    with pytest.raises(SchemaAhead) as refused:
        store.check_schema()
    assert str(refused.value) == (
        f"the database is at schema {newer}, newer than this feedproc ({head}); "
        f"it runs feedproc from schema {newer} on: upgrade feedproc"
    )


def test_a_newer_schema_that_declares_this_feedproc_compatible_is_run_on_saying_so(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    head = head_revision(store.url)
    newer = at_a_newer_revision(store, compatible_since=head)
    with caplog.at_level("WARNING", logger="feedproc.store"):
        note = store.check_schema()
    assert note == (
        f"the database is at schema {newer}, newer than this feedproc's {head}; it declares feedproc from schema "
        f"{head} on compatible: running (replace this process with the new release)"
    )
    assert note in caplog.text


def test_migrate_records_which_feedproc_the_schema_is_compatible_with(store: Store) -> None:
    from alembic.script import ScriptDirectory

    from feedproc.store.base import alembic_config

    script = ScriptDirectory.from_config(alembic_config(store.url))
    head = script.get_current_head()
    assert head is not None
    store.migrate()  # idempotent: the record is written again, the same
    assert store.compatible_since() == script.get_revision(head).module.compatible_since


def test_migrate_refuses_a_schema_newer_than_this_feedproc_and_changes_nothing(store: Store) -> None:
    newer = at_a_newer_revision(store)
    tables = sorted(inspect(store.engine).get_table_names())
    with pytest.raises(SchemaAhead, match="upgrade feedproc"):
        store.migrate()
    assert store.schema_revision() == newer
    assert sorted(inspect(store.engine).get_table_names()) == tables


# ---------------------------------------------------------------- the revision creates exactly `metadata`


@pytest.mark.smoke  # the fast tier's database smoke
def test_migrated_schema_matches_the_metadata(store: Store) -> None:
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
    if store.engine.dialect.name in MYSQL:
        # alembic cannot compare an index with an expression element (`priority DESC`) on MariaDB/MySQL
        # either, and reports it as removed and added again: those are compared here, column by
        # column with their order, from information_schema.
        noise = expression_indexes()
        differences = [d for d in differences if not (d[0] in ("remove_index", "add_index") and d[1].name in noise)]
        indexes: dict[str | None, Index] = {
            index.name: index for table in metadata.tables.values() for index in table.indexes
        }
        with store.engine.connect() as conn:
            for name in noise:
                rows = conn.execute(
                    text(
                        "SELECT COLUMN_NAME, COLLATION FROM information_schema.STATISTICS"
                        " WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME = :n ORDER BY SEQ_IN_INDEX"
                    ),
                    {"n": name},
                ).all()
                expected = declared_columns(indexes[name])
                assert [column for column, _ in rows] == [column for column, _ in expected], name
                if descending_indexes(store):
                    assert [order == "D" for _, order in rows] == [desc for _, desc in expected], name
    assert differences == []


def descending_indexes(store: Store) -> bool:
    """Whether the server keeps an index column's DESC (MariaDB before 10.8 parses and ignores it)."""
    dialect = store.engine.dialect
    version = dialect.server_version_info
    return not getattr(dialect, "is_mariadb", False) or (version is not None and version >= (10, 8))


def test_migrated_schema_has_the_tables_and_columns_of_the_metadata(store: Store) -> None:
    inspector = inspect(store.engine)
    assert set(inspector.get_table_names()) - {VERSION_TABLE} == set(metadata.tables)
    for name, table in metadata.tables.items():
        columns = {c["name"]: c["nullable"] for c in inspector.get_columns(name)}
        assert columns == {c.name: c.nullable for c in table.columns}, name


def test_migrated_schema_has_the_indexes_of_the_metadata_partial_where_declared(store: Store) -> None:
    inspector = inspect(store.engine)
    mysql = store.engine.dialect.name in MYSQL
    definitions: dict[str | None, str]  # index name: its SQL (on SQLite and PostgreSQL)
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            definitions = dict(conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'index'")).all())
        elif not mysql:
            definitions = dict(conn.execute(text("SELECT indexname, indexdef FROM pg_indexes")).all())
    for name, table in metadata.tables.items():
        reflected = own_indexes(inspector, name, mysql=mysql)
        assert set(reflected) == {i.name for i in table.indexes}, name
        for index in table.indexes:
            assert bool(reflected[index.name]["unique"]) == index.unique, index.name
            if mysql:
                # MariaDB and MySQL have no partial indexes: each is the full index on its columns (the
                # unique child index still binds only children, a unique index admitting any number of
                # NULL parents).
                expected = [column for column, _ in declared_columns(index)]
                assert reflected[index.name]["column_names"] == expected, index.name
                continue
            partial = index.dialect_options["postgresql"]["where"] is not None
            assert ("WHERE" in definitions[index.name].upper()) == partial, definitions[index.name]


def test_migrated_schema_has_the_unique_partition_key(store: Store) -> None:
    inspector = inspect(store.engine)
    uniques = [c["column_names"] for c in inspector.get_unique_constraints("feedproc_partitions")]
    indexes = [i["column_names"] for i in inspector.get_indexes("feedproc_partitions") if i["unique"]]
    assert ["key"] in uniques + indexes


# ---------------------------------------------------------------- 0002: scheduling controls


def test_scheduling_revision_downgrades_to_0001_and_upgrades_again_keeping_the_data(
    empty_store: Store, unmigrated_url: str
) -> None:
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
