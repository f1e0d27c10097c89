"""PostgreSQL behind a transaction pooler (store/pooling.py): the URL says so, the driver never
sees the option, and notifications come over a direct connection or not at all."""

from __future__ import annotations

import pytest
from sqlalchemy import make_url

from feedproc.core.errors import InvalidInput
from feedproc.store.foundations import normalize_url
from feedproc.store.pooling import listen_dsn, split_pooler

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
    assert listen_dsn(url, pooler, direct) == "postgresql://app:secret@primary:5432/jobs"


def test_a_direct_url_listens_on_itself() -> None:
    assert listen_dsn(make_url("postgresql+psycopg://db/jobs"), None, None) == "postgresql://db/jobs"


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
