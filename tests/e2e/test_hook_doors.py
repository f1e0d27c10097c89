"""Completion hooks' deliveries at the doors (issue 33), on every database: `Feed.hooks|hook|retry_hooks`
(typed `HookView`s), `feedproc hooks [show|retry]` and `queue set --on-*`, the API's `/hooks` routes
and `PUT /queues/NAME {"hooks"}`, /metrics' `feedproc_hooks` and the dashboard's hooks page.

A failed hook is made through the store's own paths, no watcher: the queue's `on_cancel` hook is
set, a partition cancelled (its hook's row written in that transaction), then the row claimed and
recorded failed for good, as a watcher out of attempts does."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import feedproc
from feedproc import Feed, HookView, NotFound
from feedproc.core.hooks import sign

from ..api_support import AUTH, ApiServer
from ..support import run_cli

DOWN = "http://127.0.0.1:9/hooks"  # nothing listens there: no watcher runs in these tests anyway


def cancelled_with_a_hook(feed: Feed, key: str, *, queue: str = "q") -> None:
    """Partition `key` of `queue` added and cancelled: its on_cancel hook's row is written, pending."""
    feed.set_queue(queue, hooks={"on_cancel": DOWN})
    feed.add_partition(key, [(0, b"1")], queue=queue)
    feed.cancel(key)


def failed_hook(feed: Feed, key: str = "p", *, queue: str = "q") -> int:
    """The id of partition `key`'s on_cancel hook, failed for good after one attempt answered 503."""
    cancelled_with_a_hook(feed, key, queue=queue)
    (call,) = [c for c in feed.store.claim_hooks("w", queue) if c.key == key]
    assert feed.store.hook_failed(call, "answered HTTP 503", retry_in=None, response_status=503)
    return call.id


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


# ---------------------------------------------------------------- Feed


def test_feed_lists_hooks_as_typed_views_whose_json_is_the_stores(feed: Feed) -> None:
    failed = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")

    hooks = feed.hooks()

    assert all(isinstance(h, HookView) for h in hooks)
    assert [(h.key, h.status, h.attempts) for h in hooks] == [("p2", "pending", 0), ("p1", "failed", 1)]
    assert [h.to_json() for h in hooks] == feed.store.hooks()
    assert hooks[1].id == failed and hooks[1].last_error == "answered HTTP 503" and hooks[1].response_status == 503
    assert hooks[1].payload is None and "payload" not in hooks[1].to_json()


def test_feed_filters_hooks_by_status_queue_and_key_and_pages_by_id(feed: Feed) -> None:
    failed = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")
    cancelled_with_a_hook(feed, "p3", queue="other")

    assert [h.id for h in feed.hooks(status="failed")] == [failed]
    assert [h.key for h in feed.hooks(queue="other")] == ["p3"]
    assert [h.key for h in feed.hooks(key="p2")] == ["p2"]
    first = feed.hooks(limit=2)
    assert [h.key for h in first] == ["p3", "p2"]
    assert [h.key for h in feed.hooks(limit=2, before=first[-1].id)] == ["p1"]


def test_feed_reads_one_hook_with_the_summary_it_sends(feed: Feed) -> None:
    hook_id = failed_hook(feed, "p")

    hook = feed.hook(hook_id)

    assert hook.to_json() == feed.store.hook(hook_id)
    assert hook.payload is not None
    assert (hook.payload["key"], hook.payload["queue"], hook.payload["status"]) == ("p", "q", "cancelled")
    with pytest.raises(NotFound, match="no hook 999"):
        feed.hook(999)


def test_feed_retries_a_failed_hook_and_leaves_a_pending_one_alone(feed: Feed) -> None:
    failed = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")
    (pending,) = [h.id for h in feed.hooks(status="pending")]

    assert feed.retry_hooks([failed, pending]) == 1

    again = feed.hook(failed)
    assert (again.status, again.attempts, again.next_attempt_at is not None) == ("pending", 0, True)
    assert feed.retry_hooks(failed=True) == 0


def test_feed_retries_every_failed_hook_of_one_queue(feed: Feed) -> None:
    mine = failed_hook(feed, "p1")
    theirs = failed_hook(feed, "p2", queue="other")

    assert feed.retry_hooks(failed=True, queue="q") == 1

    assert (feed.hook(mine).status, feed.hook(theirs).status) == ("pending", "failed")


def test_feedproc_exports_a_signature_check_receivers_can_use() -> None:
    body = b'{"id":1}'

    assert feedproc.verify_signature("s3cret", sign("s3cret", 1_000_000, body), body, now=1_000_010)
    assert not feedproc.verify_signature("other", sign("s3cret", 1_000_000, body), body, now=1_000_010)


# ---------------------------------------------------------------- CLI


def test_the_cli_lists_hooks_a_line_each(db_url: str, feed: Feed) -> None:
    hook_id = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")

    result = run_cli(db_url, "hooks")

    assert result.returncode == 0, result.stderr
    header, _rule, *rows = result.stdout.splitlines()
    assert header.split() == [
        "id",
        "queue",
        "key",
        "hook",
        "status",
        "attempts",
        "last",
        "error",
        "/",
        "response",
        "target",
    ]
    assert rows[1].split() == [str(hook_id), "q", "p1", "on_cancel", "failed", "1", "answered", "HTTP", "503", DOWN]
    (pending,) = feed.hooks(key="p2")
    assert rows[0].split()[:6] == [str(pending.id), "q", "p2", "on_cancel", "pending", "0"]


def test_the_cli_lists_only_failed_hooks_as_json_lines(db_url: str, feed: Feed) -> None:
    hook_id = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")

    result = run_cli(db_url, "hooks", "--failed", "--json")

    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [feed.hooks(key="p1")[0].to_json()]
    assert json.loads(result.stdout)["id"] == hook_id


def test_the_cli_shows_one_hook_with_its_payload(db_url: str, feed: Feed) -> None:
    hook_id = failed_hook(feed, "p1")

    shown = run_cli(db_url, "hooks", "show", str(hook_id))
    as_json = run_cli(db_url, "hooks", "show", str(hook_id), "--json")

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"hook {hook_id}  on_cancel  queue q  partition p1  status failed  attempts 1\n")
    assert "last error: answered HTTP 503" in shown.stdout and '"status": "cancelled"' in shown.stdout
    assert json.loads(as_json.stdout) == feed.hook(hook_id).to_json()


def test_the_cli_retries_failed_hooks_by_id_or_all(db_url: str, feed: Feed) -> None:
    first = failed_hook(feed, "p1")
    second = failed_hook(feed, "p2")

    by_id = run_cli(db_url, "hooks", "retry", str(first))
    every = run_cli(db_url, "hooks", "retry", "--failed", "--queue", "q")

    assert (by_id.returncode, by_id.stdout) == (0, "1 hook(s) pending again\n"), by_id.stderr
    assert (every.returncode, every.stdout) == (0, "1 hook(s) pending again\n"), every.stderr
    assert [feed.hook(i).status for i in (first, second)] == ["pending", "pending"]


def test_the_cli_says_which_hooks_it_left_as_they_were(db_url: str, feed: Feed) -> None:
    failed = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")

    (pending,) = feed.hooks(key="p2")

    result = run_cli(db_url, "hooks", "retry", str(failed), str(pending.id))

    assert result.stdout == "1 hook(s) pending again (1 not failed: left as they are)\n", result.stderr


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["hooks", "show", "999"], 1, "no hook 999"),
        (["hooks", "retry", "999"], 1, "no hook 999"),
        (["hooks", "retry"], 2, "retry: name the hooks (IDs) or --failed"),
        (["hooks", "retry", "1", "--failed"], 2, "retry: name the hooks (IDs) or --failed, not both"),
        (["hooks", "show", "x"], 2, "'x' is not a hook id (a positive integer)"),
        (["hooks", "--status", "lost"], 2, "--status 'lost': use one of pending, sent, failed"),
        (["hooks", "frob"], 2, "usage: feedproc hooks"),
        (["queue", "set", "q", "--on-fail", "ftp://x"], 2, "--on-fail must be an http:// or https:// URL"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_the_cli_refuses_in_one_line(db_url: str, feed: Feed, args: list[str], code: int, says: str) -> None:
    result = run_cli(db_url, *args)

    assert result.returncode == code
    assert says in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_the_cli_sets_removes_and_shows_a_queues_hooks_credentials_hidden(db_url: str, feed: Feed) -> None:
    set_ = run_cli(
        db_url, "queue", "set", "q", "--on-complete", "https://app.example/done?token=s3cret", "--on-fail", "python"
    )
    removed = run_cli(db_url, "queue", "set", "q", "--on-fail", "")
    shown = run_cli(db_url, "queue", "show", "q")

    assert set_.returncode == 0, set_.stderr
    assert set_.stdout.endswith(", hooks on_complete https://app.example/done?token=***, on_fail python\n")
    assert removed.stdout.endswith(", hooks on_complete https://app.example/done?token=***\n"), removed.stderr
    assert shown.stdout == "q: push, no limit, no windows, hooks on_complete https://app.example/done?token=***\n"
    assert "s3cret" not in set_.stdout + removed.stdout + shown.stdout
    assert dict(feed.store.queue_settings("q").hooks) == {"on_complete": "https://app.example/done?token=s3cret"}


# ---------------------------------------------------------------- API


def test_the_api_lists_hooks_and_pages_them(api: ApiServer, feed: Feed) -> None:
    failed = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")

    everything = api.get("/api/v1/hooks").json()
    page = api.get("/api/v1/hooks", params={"limit": 1}).json()
    rest = api.get("/api/v1/hooks", params={"limit": 1, "before": page["next"]}).json()
    only_failed = api.get("/api/v1/hooks", params={"status": "failed", "queue": "q"}).json()

    assert everything == {"hooks": [h.to_json() for h in feed.hooks()], "next": None}
    assert [h["key"] for h in page["hooks"]] == ["p2"] and [h["key"] for h in rest["hooks"]] == ["p1"]
    assert [h["id"] for h in only_failed["hooks"]] == [failed]
    assert [h["key"] for h in api.get("/api/v1/hooks", params={"key": "p2"}).json()["hooks"]] == ["p2"]


def test_the_api_reads_one_hook_with_its_payload_and_404s_an_unknown_one(api: ApiServer, feed: Feed) -> None:
    hook_id = failed_hook(feed, "p1")

    one = api.get(f"/api/v1/hooks/{hook_id}")
    missing = api.get("/api/v1/hooks/999")

    assert one.status_code == 200 and one.json() == feed.hook(hook_id).to_json()
    assert one.json()["payload"]["key"] == "p1"
    assert missing.status_code == 404 and missing.json() == {"error": "no hook 999"}


def test_the_api_refuses_a_malformed_listing_with_a_json_422(api: ApiServer) -> None:
    for params in ({"status": "lost"}, {"limit": 0}, {"limit": 1001}, {"queue": "bad queue!"}, {"before": 0}):
        response = api.get("/api/v1/hooks", params=params)
        assert response.status_code == 422 and "error" in response.json(), params


def test_the_api_retries_a_failed_hook(api: ApiServer, feed: Feed) -> None:
    hook_id = failed_hook(feed, "p1")

    response = api.post(f"/api/v1/hooks/{hook_id}/retry")

    assert response.status_code == 200, response.text
    assert response.json()["retried"] == 1 and response.json()["hook"]["status"] == "pending"
    assert feed.hook(hook_id).status == "pending"


def test_the_api_answers_409_for_a_hook_that_is_not_failed_and_404_for_none(api: ApiServer, feed: Feed) -> None:
    cancelled_with_a_hook(feed, "p1")
    (pending,) = feed.hooks()

    refused = api.post(f"/api/v1/hooks/{pending.id}/retry")
    missing = api.post("/api/v1/hooks/999/retry")

    assert refused.status_code == 409
    assert refused.json() == {"error": f"hook {pending.id} is pending, not failed: only a failed hook is retried"}
    assert missing.status_code == 404 and missing.json() == {"error": "no hook 999"}


def test_the_api_retries_failed_hooks_in_bulk(api: ApiServer, feed: Feed) -> None:
    mine = failed_hook(feed, "p1")
    theirs = failed_hook(feed, "p2", queue="other")

    of_queue = api.post("/api/v1/hooks/retry", {"failed": True, "queue": "q"})
    by_id = api.post("/api/v1/hooks/retry", {"ids": [mine, theirs]})

    assert of_queue.status_code == 200 and of_queue.json() == {"retried": 1}
    assert by_id.status_code == 200 and by_id.json() == {"retried": 1}  # mine was pending already
    assert (feed.hook(mine).status, feed.hook(theirs).status) == ("pending", "pending")


@pytest.mark.parametrize(
    ("body", "status"),
    [({}, 400), ({"ids": [1], "failed": True}, 400), ({"failed": "yes"}, 422), ({"ids": []}, 422), ({"x": 1}, 422)],
)
def test_the_api_refuses_a_bulk_retry_it_cannot_read(api: ApiServer, feed: Feed, body: object, status: int) -> None:
    hook_id = failed_hook(feed, "p1")

    response = api.post("/api/v1/hooks/retry", body)

    assert response.status_code == status and "error" in response.json(), response.text
    assert feed.hook(hook_id).status == "failed"


def test_the_api_needs_an_operate_token_to_retry_a_hook(api: ApiServer, feed: Feed) -> None:
    hook_id = failed_hook(feed, "p1")

    assert api.post(f"/api/v1/hooks/{hook_id}/retry", auth=False).status_code == 401
    assert api.post("/api/v1/hooks/retry", {"failed": True}, auth=False).status_code == 401
    assert feed.hook(hook_id).status == "failed"


def test_the_api_sets_a_queues_hooks_and_shows_them_redacted(api: ApiServer, feed: Feed) -> None:
    target = "https://app.example/done?token=s3cret"

    response = api.client.put("/api/v1/queues/q", json={"hooks": {"on_complete": target}}, headers=AUTH)
    removed = api.client.put("/api/v1/queues/q", json={"hooks": {"on_complete": ""}}, headers=AUTH)
    bad = api.client.put("/api/v1/queues/q", json={"hooks": {"on_finish": target}}, headers=AUTH)

    assert response.status_code == 200, response.text
    assert response.json()["hooks"] == {"on_complete": "https://app.example/done?token=***"}
    assert removed.json()["hooks"] == {}
    assert bad.status_code == 400 and "unknown hook 'on_finish'" in bad.json()["error"]


# ---------------------------------------------------------------- metrics and the dashboard


def test_metrics_count_hooks_by_queue_and_status(api: ApiServer, feed: Feed) -> None:
    failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")

    text = api.get("/metrics").text

    assert 'feedproc_hooks{queue="q",status="failed"} 1.0' in text
    assert 'feedproc_hooks{queue="q",status="pending"} 1.0' in text
    assert 'feedproc_hooks{queue="q",status="sent"} 0.0' in text


def test_the_hooks_page_lists_failed_and_pending_hooks_with_retry_on_failed_ones(api: ApiServer, feed: Feed) -> None:
    failed = failed_hook(feed, "p1")
    cancelled_with_a_hook(feed, "p2")
    (pending,) = feed.hooks(key="p2")

    page = api.get("/hooks")

    assert page.status_code == 200
    assert f'<tr data-hook="{failed}" data-status="failed">' in page.text
    assert f'<tr data-hook="{pending.id}" data-status="pending">' in page.text
    assert f'data-hook-action="retry" data-hook="{failed}"' in page.text
    assert f'data-hook="{pending.id}">retry' not in page.text
    assert "answered HTTP 503" in page.text


def test_a_queues_page_shows_its_hooks_credentials_hidden(api: ApiServer, feed: Feed) -> None:
    feed.set_queue("q", hooks={"on_fail": "https://app.example/failed?token=s3cret"})

    page = api.get("/queues/q").text

    assert '<span class="mono" data-hook-name="on_fail">on_fail https://app.example/failed?token=***</span>' in page
    assert "s3cret" not in page
