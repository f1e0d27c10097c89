"""Completion hooks' pure rules: which hooks a queue may name and where they may go, the signature
receivers verify (Stripe's and GitHub's scheme), the backoff between attempts, the body sent."""

from __future__ import annotations

import json

import pytest

from feedproc import verify_signature
from feedproc.core.errors import InvalidInput
from feedproc.core.hooks import HookCall, backoff, check_hooks, sign, verify
from feedproc.core.pipelines import parse_toml

BODY = b'{"id":7,"hook":"on_complete","key":"k"}'


def test_the_three_hooks_take_an_http_url_or_python_and_an_empty_value_is_dropped() -> None:
    assert check_hooks({"on_complete": "https://app.example/h", "on_fail": "python", "on_cancel": ""}) == {
        "on_complete": "https://app.example/h",
        "on_fail": "python",
    }


@pytest.mark.parametrize(
    ("hooks", "problem"),
    [
        ({"on_finish": "http://h/"}, "unknown hook 'on_finish'"),
        ({"on_complete": "file:///etc/passwd"}, "must be an http:// or https:// URL"),
        ({"on_complete": "http:///nohost"}, "must be an http:// or https:// URL"),
        ({"on_complete": "https://user:secret@h/"}, r"no credentials in a hook URL \(https://\*\*\*@h/\)"),
        ({"on_complete": ["http://h/"]}, "must be a URL or 'python'"),
        ("http://h/", "must be a table"),
    ],
)
def test_a_bad_hook_is_named(hooks: object, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        check_hooks(hooks)  # type: ignore[arg-type]


def test_a_signature_verifies_its_body_with_its_secret_only() -> None:
    header = sign("s3cret", 1_800_000_000, BODY)

    assert header.startswith("t=1800000000,v1=")
    assert verify("s3cret", header, BODY, now=1_800_000_000)
    assert verify_signature("s3cret", header, BODY, now=1_800_000_100)
    assert not verify("other", header, BODY, now=1_800_000_000)
    assert not verify("s3cret", header, BODY.replace(b"k", b"j"), now=1_800_000_000)


def test_an_old_signature_is_refused_as_a_replay() -> None:
    header = sign("s3cret", 1_800_000_000, BODY)

    assert not verify("s3cret", header, BODY, now=1_800_000_301)
    assert verify("s3cret", header, BODY, now=1_800_000_301, tolerance=600)


def test_any_v1_may_match_while_a_secret_is_rotated() -> None:
    new = sign("new", 1_800_000_000, BODY).partition(",")[2]
    header = f"{sign('old', 1_800_000_000, BODY)},{new}"

    assert verify("new", header, BODY, now=1_800_000_000)
    assert verify("old", header, BODY, now=1_800_000_000)


@pytest.mark.parametrize("header", ["", "t=abc,v1=00", "v1=00", "t=1800000000"])
def test_a_malformed_signature_header_does_not_verify(header: str) -> None:
    assert not verify("s3cret", header, BODY, now=1_800_000_000)


def test_backoff_doubles_up_to_its_cap_within_its_jitter() -> None:
    for attempt, nominal in ((1, 1.0), (2, 2.0), (4, 8.0), (7, 60.0), (30, 60.0)):
        for _ in range(50):
            assert 0.8 * nominal <= backoff(attempt) <= 1.2 * nominal


def test_the_body_sent_is_the_summary_with_the_hooks_id_and_name_first() -> None:
    call = HookCall(7, "q", "k", "on_fail", "http://h/", '{"key":"k","status":"failed"}', 1, "c")

    assert list(json.loads(call.body())) == ["id", "hook", "key", "status"]
    assert json.loads(call.body())["id"] == 7
    assert call.status == "failed"


def test_a_pipeline_names_its_hooks_in_a_hooks_table() -> None:
    text = '[[gate]]\nname = "a"\nnumber = 0\n\n[hooks]\non_complete = "https://h/done"\non_fail = "python"\n'

    spec = parse_toml(text, source="p.toml")

    assert dict(spec.hooks) == {"on_complete": "https://h/done", "on_fail": "python"}
    assert spec.to_mapping()["hooks"] == {"on_complete": "https://h/done", "on_fail": "python"}
    with pytest.raises(InvalidInput, match=r"p.toml: \[hooks\]: unknown hook 'on_done'"):
        parse_toml(text.replace("on_fail", "on_done"), source="p.toml")
