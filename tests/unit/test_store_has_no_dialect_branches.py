"""The store's concern modules never ask which database they run on: what differs between SQLite,
PostgreSQL and MariaDB/MySQL is a named operation of their `Dialect` (`feedproc/store/dialect/`).

The modules' syntax trees are read (comments and docstrings may name any database): no flag like
`self.postgres` or `self.mysql`, no `_twin`, no dialect name in code (`dialect.name == ...`, a hint for
`"mysql"`, a `postgres=` argument), no statement named after a database (`_PG_...`, `_xxx_mysql`), no
import of one database's SQLAlchemy dialect. Below the statements, `foundations.py` (column types that
render per database, the database clock, engine creation) and `schema.py` (per-database index options)
are dialect-aware by design, as are `notify.py` (PostgreSQL's LISTEN connections, started only where
`dialect.notifies`) and `pooling.py` (PostgreSQL behind PgBouncer: engine creation's concern, below
the dialect); the `dialect` package is where the differences live.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

STORE = Path(__file__).resolve().parents[2] / "feedproc" / "store"
#: Dialect-aware by design (see the module docstring).
EXEMPT = {"foundations.py", "schema.py", "notify.py", "pooling.py"}
CONCERN_MODULES = sorted(path for path in STORE.glob("*.py") if path.name not in EXEMPT)

DATABASE_WORDS = {"postgres", "postgresql", "pg", "mysql", "mariadb", "sqlite"}
#: An identifier that names a database as one of its words: `_PG_FETCH`, `_find_ready_mysql`, `is_postgres`.
NAMED_AFTER_A_DATABASE = re.compile(r"(?:^|_)(?:" + "|".join(sorted(DATABASE_WORDS)) + r")(?:_|$)", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def branches_on_the_database(source: str) -> list[str]:
    """Where `source` (a module) asks which database it runs on: one line per finding."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found: list[str] = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in DATABASE_WORDS or node.attr == "_twin":
                say(node, f".{node.attr}")
            elif node.attr == "name" and isinstance(node.value, ast.Attribute) and node.value.attr == "dialect":
                say(node, ".dialect.name")
            elif NAMED_AFTER_A_DATABASE.search(node.attr):
                say(node, f".{node.attr}")
        elif isinstance(node, ast.Name) and (node.id == "_twin" or NAMED_AFTER_A_DATABASE.search(node.id)):
            say(node, node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and (
            NAMED_AFTER_A_DATABASE.search(node.name) or node.name == "_twin"
        ):
            say(node, f"def {node.name}")
        elif isinstance(node, ast.keyword) and node.arg is not None:
            if node.arg in DATABASE_WORDS or node.arg == "dialect_name":
                say(node, f"{node.arg}=")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.lower() in DATABASE_WORDS:
                say(node, repr(node.value))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sqlalchemy.dialects"):
            say(node, f"from {node.module} import ...")
        elif isinstance(node, ast.alias) and NAMED_AFTER_A_DATABASE.search(node.asname or node.name.split(".")[-1]):
            say(node, f"import {node.name}")
    return found


@pytest.mark.parametrize("module", CONCERN_MODULES, ids=lambda path: path.name)
def test_a_concern_module_does_not_branch_on_the_database(module: Path) -> None:
    found = branches_on_the_database(module.read_text())
    assert not found, f"{module.name} asks which database it runs on (use a Dialect operation): {found}"


@pytest.mark.parametrize(
    "line",
    [
        "if self.postgres:\n    pass",
        "x = self.mysql",
        "f = self._twin(a, b)",
        "if conn.dialect.name == 'postgresql':\n    pass",
        "s = s.with_hint('FORCE INDEX (PRIMARY)', dialect_name='mysql')",
        "rows = claimable(conn, q, postgres=True)",
        "conn.execute(_PG_FETCH_READY)",
        "def _find_ready_sqlite(conn):\n    pass",
        "from sqlalchemy.dialects.postgresql import insert",
        "from .foundations import is_mysql",
    ],
)
def test_the_check_finds_each_kind_of_branch(line: str) -> None:
    assert branches_on_the_database(line)


def test_the_check_lets_a_dialect_operation_and_a_docstring_naming_a_database_pass() -> None:
    source = '"""On PostgreSQL this is one statement; on SQLite, one per partition."""\n'
    source += "found = self.dialect.find_ready(conn, watcher_id, limit, excluded, closed)\n"
    source += "if self.dialect.writes_done_narrowly:\n    pass\n"
    assert branches_on_the_database(source) == []


def test_every_concern_module_is_scanned() -> None:
    names = {path.name for path in CONCERN_MODULES}
    assert {"answers.py", "base.py", "dispatch.py", "leasing.py", "lost.py", "pulling.py", "producing.py"} <= names
