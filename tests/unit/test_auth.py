"""Who may do what on `feedproc serve` (no database, no HTTP): tokens read from the environment and a
file, their scopes and queues, the Host names answered, and when `serve` refuses to start."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedproc.auth import (
    ADMIN,
    OPERATE,
    READ,
    WORKER,
    Tokens,
    host_allowed,
    load_tokens,
    serve_access,
)
from feedproc.core.errors import InvalidInput, Refused

A = "a" * 16 + "-read"
B = "b" * 16 + "-operate"
C = "c" * 16 + "-admin"
W = "w" * 16 + "-worker"
W2 = "x" * 16 + "+/=~._"


def scopes(tokens: Tokens, token: str) -> set[str]:
    grant = tokens.grant(token)
    assert grant is not None, "token not accepted"
    return set(grant.scopes)


def test_scopes_nest_admin_operate_read_and_worker_stands_apart() -> None:
    tokens = load_tokens(
        {
            "FEEDPROC_READ_TOKENS": A,
            "FEEDPROC_OPERATE_TOKENS": B,
            "FEEDPROC_ADMIN_TOKENS": C,
            "FEEDPROC_WORKER_TOKENS": W,
        }
    )
    assert scopes(tokens, A) == {READ}
    assert scopes(tokens, B) == {READ, OPERATE}
    assert scopes(tokens, C) == {READ, OPERATE, ADMIN}
    assert scopes(tokens, W) == {WORKER}
    assert tokens.grant("z" * 20) is None and tokens.grant("") is None


def test_the_tokens_of_earlier_versions_keep_their_meaning() -> None:
    tokens = load_tokens({"FEEDPROC_API_TOKEN": "old-api-token!@#$", "FEEDPROC_WORKER_TOKEN": "old-worker-token?"})
    assert scopes(tokens, "old-api-token!@#$") == {READ, OPERATE, ADMIN, WORKER}
    assert scopes(tokens, "old-worker-token?") == {WORKER}


def test_a_list_holds_two_tokens_at_once_while_rotating() -> None:
    tokens = load_tokens({"FEEDPROC_OPERATE_TOKENS": f"{B}, {C}"})
    assert scopes(tokens, B) == scopes(tokens, C) == {READ, OPERATE}


def test_a_worker_token_may_be_limited_to_queues_whose_names_hold_colons() -> None:
    tokens = load_tokens({"FEEDPROC_WORKER_TOKENS": f"ocr+gpu:a/b:{W},{W2}"})
    limited = tokens.grant(W)
    assert limited is not None and limited.queues == frozenset({"ocr", "gpu:a/b"})
    assert limited.may_work_on("gpu:a/b") and not limited.may_work_on("hr")
    anywhere = tokens.grant(W2)
    assert anywhere is not None and anywhere.queues is None and anywhere.may_work_on("hr")


def test_a_token_listed_for_all_queues_and_for_some_works_on_all() -> None:
    tokens = load_tokens({"FEEDPROC_WORKER_TOKENS": f"ocr:{W}", "FEEDPROC_WORKER_TOKEN": W})
    grant = tokens.grant(W)
    assert grant is not None and grant.may_work_on("hr")


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"FEEDPROC_READ_TOKENS": "short"}, "FEEDPROC_READ_TOKENS entry 1: a token must be at least 16"),
        ({"FEEDPROC_OPERATE_TOKENS": f"{B},"}, "FEEDPROC_OPERATE_TOKENS entry 2"),
        ({"FEEDPROC_ADMIN_TOKENS": "   "}, "FEEDPROC_ADMIN_TOKENS is set but holds no token"),
        ({"FEEDPROC_WORKER_TOKENS": "has space in it 0123456789"}, "FEEDPROC_WORKER_TOKENS entry 1"),
        ({"FEEDPROC_WORKER_TOKENS": "0123456789abcdef!"}, "FEEDPROC_WORKER_TOKENS entry 1"),
        ({"FEEDPROC_WORKER_TOKENS": f"bad queue:{W}"}, "queue names joined by '+'"),
        ({"FEEDPROC_READ_TOKENS": f"ocr:{A}"}, "only worker tokens may be limited to queues"),
        ({"FEEDPROC_API_TOKEN": "short"}, "FEEDPROC_API_TOKEN must be at least 16"),
    ],
)
def test_an_unusable_token_is_refused_naming_its_variable_never_its_value(environ: dict[str, str], says: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        load_tokens(environ)
    assert says in str(refused.value)
    for value in environ.values():
        if value.strip():
            assert value.split(":")[-1].strip(",") not in str(refused.value)


def test_a_tokens_file_gives_scoped_tokens_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# who may do what\nread {A}\n\nworker gpu:{W}   # the GPU boxes\nadmin {C}\n")
    tokens = load_tokens({}, path)
    assert scopes(tokens, A) == {READ} and scopes(tokens, C) == {READ, OPERATE, ADMIN}
    grant = tokens.grant(W)
    assert grant is not None and grant.queues == frozenset({"gpu"})


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"read {A}\nreader {B}\n", "line 2: expected 'SCOPE [QUEUES:]TOKEN'"),
        (f"{A}\n", "line 1: expected"),
        ("operate tooshort\n", "line 1: a token must be"),
        ("# nothing\n", "holds no token"),
    ],
)
def test_a_bad_tokens_file_is_refused_naming_the_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(InvalidInput) as refused:
        load_tokens({}, path)
    assert says in str(refused.value) and A not in str(refused.value) and B not in str(refused.value)


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:8000", "LOCALHOST.", "app.localhost:80", "127.0.0.1", "127.0.0.1:8000", "10.1.2.3:9",
     "[::1]:8000", "[::1]", "[fe80::1%25eth0]:1"],
)  # fmt: skip
def test_loopback_names_and_ip_addresses_are_always_answered(host: str) -> None:
    assert host_allowed(host)


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io", "[not-v6]:80", "[::1"]
)
def test_other_names_are_refused_unless_allowed(host: str) -> None:
    assert not host_allowed(host)


def test_allowed_hosts_name_a_host_its_subdomains_or_any() -> None:
    assert host_allowed("feedproc.internal:8000", ["feedproc.internal"])
    assert not host_allowed("x.feedproc.internal", ["feedproc.internal"])
    assert host_allowed("a.b.svc.cluster.local", ["*.svc.cluster.local"])
    assert not host_allowed("svc.cluster.local", ["*.svc.cluster.local"])
    assert host_allowed("anything.example", ["*"])


def test_on_loopback_reads_are_open_until_read_tokens_are_set() -> None:
    assert serve_access("127.0.0.1", load_tokens({"FEEDPROC_API_TOKEN": C})).open_reads
    assert not serve_access("localhost", load_tokens({"FEEDPROC_READ_TOKENS": A})).open_reads


def test_beyond_loopback_reads_need_a_token_and_serve_refuses_without_one() -> None:
    assert not serve_access("0.0.0.0", load_tokens({"FEEDPROC_API_TOKEN": C})).open_reads
    assert not serve_access("10.0.0.5", load_tokens({"FEEDPROC_READ_TOKENS": A})).open_reads
    for environ in ({}, {"FEEDPROC_WORKER_TOKEN": W}, {"FEEDPROC_WORKER_TOKENS": W}):
        with pytest.raises(Refused, match="--public-read"):
            serve_access("0.0.0.0", load_tokens(environ))
    assert serve_access("0.0.0.0", load_tokens({"FEEDPROC_WORKER_TOKEN": W}), public_read=True).open_reads


def test_a_malformed_allowed_host_is_refused() -> None:
    for name in ("a b", "host:8000", "", "*evil"):
        with pytest.raises(InvalidInput, match="--allowed-host"):
            serve_access("127.0.0.1", Tokens(), allowed_hosts=[name])
