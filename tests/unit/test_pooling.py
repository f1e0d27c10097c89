"""PostgreSQL behind a transaction pooler (store/pooling.py): the URL says so, the driver never
sees the option, and notifications come over a direct connection or not at all."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import make_url

from feedproc.core.errors import InvalidInput
from feedproc.store.foundations import normalize_url
from feedproc.store.pooling import listen_dsn, split_pooler


def libpq(dsn: str | None) -> dict[str, object]:
    """A listen connection string's fields."""
    assert dsn is not None
    return dict(conninfo_to_dict(dsn))


POOLED = "postgresql+psycopg://app:secret@bouncer:6432/jobs?feedproc_pooler=transaction&sslmode=require"


def test_the_option_names_the_pooler_and_is_taken_off_the_url() -> None:
    url, pooler = split_pooler(make_url(POOLED))
    assert pooler == "transaction"
    assert dict(url.query) == {"sslmode": "require"} and url.host == "bouncer"


def test_a_url_without_the_option_reaches_the_database_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEEDPROC_POOLER", raising=False)
    assert split_pooler(make_url("postgresql+psycopg://db/jobs"))[1] is None


def test_the_environment_names_the_pooler_for_every_postgresql_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDPROC_POOLER", "transaction")
    assert split_pooler(make_url("postgresql+psycopg://db/jobs"))[1] == "transaction"
    assert split_pooler(make_url("sqlite:///feedproc.db"))[1] is None  # it means nothing there


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://db/jobs?feedproc_pooler=statement", "the pooler's mode must be transaction"),
        ("mysql://db/jobs?feedproc_pooler=transaction", "is for PostgreSQL behind PgBouncer, not mysql"),
    ],
)
def test_a_pooler_feedproc_does_not_know_is_refused_in_one_line(url: str, said: str) -> None:
    with pytest.raises(InvalidInput, match=said):
        normalize_url(url)


def test_an_unknown_pooler_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDPROC_POOLER", "session")
    with pytest.raises(InvalidInput, match="FEEDPROC_POOLER='session'"):
        normalize_url("postgresql://db/jobs")


def test_behind_the_pooler_without_a_listen_url_nothing_listens() -> None:
    url, pooler = split_pooler(make_url(POOLED))
    assert listen_dsn(url, pooler, None) is None


def test_a_listen_url_is_where_notifications_come_from() -> None:
    url, pooler = split_pooler(make_url(POOLED))
    direct = make_url("postgresql+psycopg://app:secret@primary:5432/jobs")
    dsn = libpq(listen_dsn(url, pooler, direct))
    assert (dsn["host"], dsn["port"], dsn["user"], dsn["password"], dsn["dbname"]) == (
        "primary",
        "5432",
        "app",
        "secret",
        "jobs",
    )


def test_a_direct_url_listens_on_itself() -> None:
    dsn = libpq(listen_dsn(make_url("postgresql+psycopg://db/jobs"), None, None))
    assert (dsn["host"], dsn["dbname"]) == ("db", "jobs")


@pytest.mark.parametrize(
    ("listen", "said"),
    [
        ("mysql+pymysql://db/jobs", "give a postgresql:// URL"),
        ("postgresql+psycopg://bouncer:6432/jobs?feedproc_pooler=transaction", "must be a direct connection"),
    ],
)
def test_a_listen_url_that_cannot_listen_is_refused(listen: str, said: str) -> None:
    url, pooler = split_pooler(make_url(POOLED))
    with pytest.raises(InvalidInput, match=said):
        listen_dsn(url, pooler, make_url(listen))


def test_a_multi_host_url_listens_on_the_same_hosts_in_libpq_s_spelling() -> None:
    url = make_url("postgresql+psycopg://app@/jobs?host=pg1:5432&host=pg2:5433&target_session_attrs=read-write")
    dsn = libpq(listen_dsn(url, None, None))
    assert dsn["host"] == "pg1,pg2" and dsn["port"] == "5432,5433"
    assert dsn["target_session_attrs"] == "read-write" and dsn["dbname"] == "jobs" and dsn["user"] == "app"


def test_connections_give_up_on_a_silent_server_unless_the_url_says_otherwise() -> None:
    defaults = libpq(listen_dsn(make_url("postgresql://db/jobs"), None, None))
    assert defaults["keepalives"] == "1" and defaults["tcp_user_timeout"] == "20000"
    own = libpq(listen_dsn(make_url("postgresql://db/jobs?tcp_user_timeout=5000"), None, None))
    assert own["tcp_user_timeout"] == "5000" and own["host"] == "db"
