"""Which feedproc runs on which schema (store/upgrades.py): its own, or a newer one that declares
it compatible; an older one needs `feedproc migrate`."""

from __future__ import annotations

import pytest

from feedproc.core.errors import SchemaAhead, SchemaMissing
from feedproc.store.upgrades import declared_compatible_since, schema_fit

KNOWN = {"0016", "0017", "0018"}


def test_its_own_schema_runs_without_a_word() -> None:
    assert schema_fit("0018", KNOWN, "0018", "0017") is None


def test_an_older_schema_needs_migrate() -> None:
    with pytest.raises(SchemaMissing, match=r"at schema 0017, not 0018: run `feedproc migrate`"):
        schema_fit("0018", KNOWN, "0017", None)


def test_no_schema_needs_migrate() -> None:
    with pytest.raises(SchemaMissing, match="has no feedproc schema"):
        schema_fit("0018", KNOWN, None, None)


def test_a_newer_schema_compatible_since_a_known_revision_runs_and_says_so() -> None:
    note = schema_fit("0018", KNOWN, "0019", "0017")
    assert note is not None and "newer than this feedproc's 0018" in note and "from schema 0017 on" in note


def test_a_newer_schema_compatible_only_with_newer_code_is_refused() -> None:
    with pytest.raises(SchemaAhead, match="it runs feedproc from schema 0019 on: upgrade feedproc"):
        schema_fit("0018", KNOWN, "0020", "0019")


def test_a_newer_schema_without_a_record_is_refused() -> None:
    with pytest.raises(SchemaAhead, match=r"newer than this feedproc \(0018\): upgrade feedproc"):
        schema_fit("0018", KNOWN, "0019", None)


def test_a_revision_that_declares_nothing_is_compatible_only_with_itself() -> None:
    class Declares:
        compatible_since = "0017"

    assert declared_compatible_since(Declares, "0018") == "0017"
    assert declared_compatible_since(object(), "0018") == "0018"
