"""Go Feed's own tests, ported: what a Go Feed handler service gets from feedproc when the watcher
sends raw requests (`HTTPProcessor(request="raw")`, as `feedproc watch --request raw` does).

Go Feed (github.com/steeling/gofeed) POSTs each item's data bytes and reads an answer
`{"gate": N, "complete": bool, "response": {...}, "error": {"message", "no_retry"}}`. Each test
here is one case of its `internal/processors/httprocessor/processor_test.go` TestProcess, or one
behaviour its `internal/state/watcher_test.go` TestWatcher and `repo_test.go` check, run against
a real in-process watcher, a real handler on loopback and every database; it names the Go Feed
case it ports and asserts the item's resulting state in feedproc. Where feedproc differs on
purpose, the test asserts feedproc's behaviour and its docstring says so.

The handler is the `handler` fixture (tests/support.py): it parses each request body as JSON and
hands it to `behavior`, which is exactly what a Go Feed handler does with its raw body.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy import update

from feedproc import Feed, HTTPProcessor
from feedproc.core.records import Kind
from feedproc.core.views import ItemRow
from feedproc.store import Store
from feedproc.store.schema import partitions

from ..support import Answer, Delivery, HandlerService, answer, history_of, json_of, wait_status, wait_until, watching

# ---------------------------------------------------------------- helpers


def raw(handler: HandlerService) -> HTTPProcessor:
    return HTTPProcessor(handler.url, request="raw")


def requests_to(handler: HandlerService, key: str) -> list[Delivery]:
    """The requests the handler got for partition `key` (their `body` is the item's data, parsed)."""
    with handler.lock:
        return [d for d in handler.deliveries if d.headers.get("feedproc-partition") == key]


def data(item: ItemRow) -> Any:
    return json_of(item.data)


def set_status(store: Store, key: str, status: str) -> None:
    """Write a partition's status directly, as Go Feed's tests save their rows (the API never makes
    a finished partition with available items)."""
    with store.write() as conn:
        conn.execute(update(partitions).where(partitions.c.key == key).values(status=status))


# ---------------------------------------------------------------- processor_test.go: TestProcess
#
# Go Feed's mock client answers every request with the case's status and body; here the handler
# does, and the watcher delivers one item (data `{}`: Go Feed's test posts an empty body, which its
# mock never reads). Transient failures are retried up to max_attempts=2, then the item fails with
# its last error; a permanent one fails it at the first delivery.

CASE = {"max_attempts": 2}


def run_case(db_url: str, feed: Feed, handler: HandlerService, status: int, body: str, final: str) -> ItemRow:
    """Deliver one item to a handler answering `status`, `body` until its partition is `final`; the item."""
    handler.behavior = lambda item: (status, body)
    feed.add_partition("case", items=[(0, b"{}")])
    with watching(db_url, raw(handler), **CASE):
        wait_status(feed, "case", final)
    [item] = feed.items("case")
    return item


def test_good_request_moves_the_item_to_gate_1_with_the_response_as_its_data(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestProcess "good request": `{"gate": 1, "complete": false, "response": {...}}` moves the item
    to gate 1 with the response as its data, which the next request carries as its body. (Go Feed
    stores `{"data":1,"more":"json"}` plus a newline; feedproc stores the compact JSON.) At gate 1
    the same answer names the item's own gate: "not yet", asked again, not a failure."""
    handler.behavior = lambda data: (200, '{"gate": 1, "complete": false, "response": {"data": 1, "more":"json"}}')
    feed.add_partition("case", items=[(0, b"{}")])
    with watching(db_url, raw(handler)):
        wait_until(lambda: len(requests_to(handler, "case")) >= 3, what="the item to be asked again at gate 1")
        [item] = feed.items("case")

    assert (item.status, item.gate, item.attempts) == ("available", 1, 0)
    assert item.data == b'{"data":1,"more":"json"}'
    first, second = requests_to(handler, "case")[:2]
    assert (first.headers["feedproc-gate"], first.body) == ("0", {})
    assert (second.headers["feedproc-gate"], second.body) == ("1", {"data": 1, "more": "json"})
    assert feed.status("case").gate == 1


def test_completed_request_completes_the_item_with_the_response_as_its_data(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestProcess "completed request": `{"gate": 1, "complete": true, "response": {...}}` completes
    the item with the response as its data. Differs on purpose: Go Feed also moves the item to gate
    1; in feedproc a complete item keeps the gate it completed at (complete wins over gate)."""
    item = run_case(
        db_url, feed, handler, 200, '{"gate": 1, "complete": true, "response": {"data": 1, "more":"json"}}', "complete"
    )
    assert (item.status, item.gate, item.data) == ("complete", 0, b'{"data":1,"more":"json"}')
    assert len(requests_to(handler, "case")) == 1


def test_process_with_no_gate_completes_the_item_with_the_response_as_its_data(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestProcess "process with no gate": `{"complete": true, "response": {...}}` completes the item."""
    item = run_case(
        db_url, feed, handler, 200, '{"complete": true, "response": {"data": 1, "more":"json"}}', "complete"
    )
    assert (item.status, item.gate, item.data) == ("complete", 0, b'{"data":1,"more":"json"}')


def test_marshaling_error_is_a_transient_failure(db_url: str, feed: Feed, handler: HandlerService) -> None:
    """TestProcess "marshaling error": a 200 whose body `{"":` is not JSON is a retryable error,
    in Go Feed ("marshal error: unexpected EOF") and in feedproc (an invalid answer)."""
    item = run_case(db_url, feed, handler, 200, '{"":', "failed")
    assert (item.status, item.attempts) == ("failed", 2)
    assert item.last_error == "invalid answer: expected a JSON object, got '{\"\":'"
    assert [d.headers["feedproc-attempt"] for d in requests_to(handler, "case")] == ["1", "2"]


def test_empty_string_is_a_transient_failure(db_url: str, feed: Feed, handler: HandlerService) -> None:
    """TestProcess "empty string": a 200 with an empty body is a retryable error ("marshal error: EOF")."""
    item = run_case(db_url, feed, handler, 200, "", "failed")
    assert (item.status, item.attempts) == ("failed", 2)
    assert item.last_error == "invalid answer: expected a JSON object, got ''"


def test_400_fails_the_item_at_once(db_url: str, feed: Feed, handler: HandlerService) -> None:
    """TestProcess "400". Differs on purpose: Go Feed retries a 400 ("HTTP 400", a retryable error);
    in feedproc a 4xx other than 408/429 is permanent (CONTRACT.md section 3): the item fails at its
    first delivery."""
    item = run_case(db_url, feed, handler, 400, "{}", "failed")
    assert (item.status, item.attempts) == ("failed", 1)
    assert item.last_error == f"HTTP 400 from {handler.url}: {{}}"
    assert len(requests_to(handler, "case")) == 1


def test_500_is_a_transient_failure(db_url: str, feed: Feed, handler: HandlerService) -> None:
    """TestProcess "500": retryable ("HTTP 500")."""
    item = run_case(db_url, feed, handler, 500, "{}", "failed")
    assert (item.status, item.attempts) == ("failed", 2)
    assert item.last_error == f"HTTP 500 from {handler.url}: {{}}"


def test_300_is_a_transient_failure(db_url: str, feed: Feed, handler: HandlerService) -> None:
    """TestProcess "300": retryable ("HTTP 300"); feedproc follows no redirect."""
    item = run_case(db_url, feed, handler, 300, "{}", "failed")
    assert (item.status, item.attempts) == ("failed", 2)
    assert item.last_error == f"HTTP 300 from {handler.url}: {{}}"


def test_500_with_error_message_is_a_transient_failure_keeping_the_message(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestProcess "500 with error message": retryable; Go Feed's error reads "Status HTTP 500;
    message: additional error context", feedproc's last_error names the status and keeps the body."""
    body = '{"error": {"message": "additional error context"}}'
    item = run_case(db_url, feed, handler, 500, body, "failed")
    assert (item.status, item.attempts) == ("failed", 2)
    assert item.last_error == f"HTTP 500 from {handler.url}: {body}"


def test_non_retryable_500_with_error_message_fails_the_item_at_once(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestProcess "NonRetryable 500 with error message": `"no_retry": true` makes it permanent."""
    body = '{"error": {"message": "additional error context", "no_retry":true}}'
    item = run_case(db_url, feed, handler, 500, body, "failed")
    assert (item.status, item.attempts) == ("failed", 1)
    assert item.last_error == f"HTTP 500 from {handler.url}: {body}"
    assert len(requests_to(handler, "case")) == 1


def test_non_retryable_200_fails_the_item_at_once_with_its_message(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestProcess "NonRetryable 200": an `error` with `"no_retry": true` in a 200 is a permanent failure."""
    item = run_case(
        db_url, feed, handler, 200, '{"error": {"message": "additional error context", "no_retry":true}}', "failed"
    )
    assert (item.status, item.attempts, item.last_error) == ("failed", 1, "additional error context")
    assert len(requests_to(handler, "case")) == 1


# ---------------------------------------------------------------- watcher_test.go: TestWatcher
#
# TestWatcher's items carry `{"times": N, "fail": bool, "processed": n, "gate": G}` and its
# testProcessor answers with the data's own gate, complete once `processed` reaches `times`:
# in feedproc an answer naming the item's own gate is "not yet, ask again", so each item is asked
# `times` times at its gate. Its Go error becomes the HTTP answer a Go Feed handler gives for one.


def go_test_processor(item: dict[str, Any]) -> Answer:
    """Go Feed's testProcessor.Process as an HTTP handler: it reads the raw body as its own data."""
    if item.get("fail"):
        return 500, {"error": {"message": "moving to failed item"}}
    processed = item.get("processed", 0) + 1
    response = {**item, "processed": processed}
    return 200, {"gate": item.get("gate", 0), "complete": processed >= item["times"], "response": response}


TIMES_3 = b'{"times": 3}'


def test_an_item_is_asked_again_at_its_gate_until_processed_reaches_times(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestWatcher s1_ready (also s4, s5, s7, s11): `{"times": 3}` ends complete with
    `{"times":3,"processed":3}` after three requests at gate 0, each carrying the data the last
    answer stored; the "not yet" answers are not failures (attempt 1 each time)."""
    handler.behavior = go_test_processor
    feed.add_partition("p1_unowned", items=[(0, TIMES_3)])
    with watching(db_url, raw(handler)):
        wait_status(feed, "p1_unowned", "complete")

    [s1_ready] = feed.items("p1_unowned")
    assert (s1_ready.status, data(s1_ready)) == ("complete", {"times": 3, "processed": 3})
    requests = requests_to(handler, "p1_unowned")
    assert [d.body for d in requests] == [{"times": 3}, {"times": 3, "processed": 1}, {"times": 3, "processed": 2}]
    assert {(d.headers["feedproc-gate"], d.headers["feedproc-attempt"]) for d in requests} == {("0", "1")}


def test_a_failing_item_fails_its_partition_after_its_retries_and_its_sibling_completes(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestWatcher p2_owned: s6_owned_should_fail is retried (MaxRetries = 3 there, max_attempts=3
    here) and fails with its error, its data unchanged; s4_owned completes; the partition fails."""
    handler.behavior = go_test_processor
    feed.add_partition("p2_owned", items=[(0, TIMES_3), (0, b'{"times": 3, "fail": true}')])
    with watching(db_url, raw(handler), max_attempts=3):
        wait_status(feed, "p2_owned", "failed")

    s4_owned, s6_owned_should_fail = feed.items("p2_owned")
    assert (s4_owned.status, data(s4_owned)) == ("complete", {"times": 3, "processed": 3})
    assert s6_owned_should_fail.status == "failed"
    assert s6_owned_should_fail.attempts == 3
    assert s6_owned_should_fail.last_error == (
        f'HTTP 500 from {handler.url}: {{"error": {{"message": "moving to failed item"}}}}'
    )
    assert data(s6_owned_should_fail) == {"times": 3, "fail": True}


def test_a_complete_item_is_never_processed_again(db_url: str, feed: Feed, handler: HandlerService) -> None:
    """TestWatcher p1_owned: s3_done, saved complete, is never sent and keeps its data; its siblings
    s5_owned and s7_owned complete, and so does the partition. (The item is made complete without
    processing by an operator's skip, the way feedproc has to complete an item by hand.)"""
    handler.behavior = go_test_processor
    feed.add_partition("p1_owned", items=[(0, TIMES_3), (0, TIMES_3), (0, TIMES_3)])
    s3_id = feed.items("p1_owned")[0].id
    feed.act_on_items("skip", ids=[s3_id])
    with watching(db_url, raw(handler)):
        wait_status(feed, "p1_owned", "complete")

    s3_done, s5_owned, s7_owned = feed.items("p1_owned")
    assert (s3_done.status, data(s3_done)) == ("complete", {"times": 3})
    assert data(s5_owned) == data(s7_owned) == {"times": 3, "processed": 3}
    assert str(s3_id) not in {d.headers["feedproc-item-id"] for d in requests_to(handler, "p1_owned")}


def test_a_complete_partition_is_not_processed(db_url: str, feed: Feed, store: Store, handler: HandlerService) -> None:
    """TestWatcher p1_disabled: the available item s8_disabled of a partition saved complete is
    never sent and stays available with its data, while the watcher serves another partition."""
    handler.behavior = go_test_processor
    feed.add_partition("p1_disabled", items=[(0, TIMES_3)])
    set_status(store, "p1_disabled", "complete")
    feed.add_partition("p1_owned", items=[(0, TIMES_3)])
    with watching(db_url, raw(handler)):
        wait_status(feed, "p1_owned", "complete")

    [s8_disabled] = feed.items("p1_disabled")
    assert (s8_disabled.status, data(s8_disabled)) == ("available", {"times": 3})
    assert requests_to(handler, "p1_disabled") == []


def test_a_failed_partition_is_processed_only_once_retried(
    db_url: str, feed: Feed, store: Store, handler: HandlerService
) -> None:
    """TestWatcher p1_unowned, saved Failed with the available item s1_ready. Differs on purpose:
    Go Feed leases a failed partition again and completes s1_ready; in feedproc `failed` holds until
    `feedproc retry` (CONTRACT.md section 2), after which s1_ready completes."""
    handler.behavior = go_test_processor
    feed.add_partition("p1_unowned", items=[(0, TIMES_3)])
    set_status(store, "p1_unowned", "failed")
    feed.add_partition("p1_owned", items=[(0, TIMES_3)])
    with watching(db_url, raw(handler)):
        wait_status(feed, "p1_owned", "complete")
        assert requests_to(handler, "p1_unowned") == []
        feed.retry("p1_unowned")
        wait_status(feed, "p1_unowned", "complete")

    [s1_ready] = feed.items("p1_unowned")
    assert data(s1_ready) == {"times": 3, "processed": 3}


def test_partitions_whose_watchers_went_away_are_taken_over(
    db_url: str, feed: Feed, store: Store, handler: HandlerService
) -> None:
    """TestWatcher p1_swap and p2_swap ("These 2 should swap owners"): each saved leased by the
    other's watcher, whose lease runs out; the running watchers take both over: s9_ready and
    s11_ready complete, s10_ready_should_fail fails, and so p1_swap completes and p2_swap fails."""
    handler.behavior = go_test_processor
    feed.add_partition("p1_swap", items=[(0, TIMES_3)])
    feed.add_partition("p2_swap", items=[(0, b'{"times": 3, "fail": true}'), (0, TIMES_3)])
    assert [lease.key for lease in store.acquire("p2", "default", 1, 1.0)] == ["p1_swap"]  # the oldest first
    assert [lease.key for lease in store.acquire("p1", "default", 1, 1.0)] == ["p2_swap"]
    with contextlib.ExitStack() as running:
        w1 = running.enter_context(watching(db_url, raw(handler), max_attempts=3))
        w2 = running.enter_context(watching(db_url, raw(handler), max_attempts=3))
        wait_status(feed, "p1_swap", "complete")
        wait_status(feed, "p2_swap", "failed")

    [s9_ready] = feed.items("p1_swap")
    s10_ready_should_fail, s11_ready = feed.items("p2_swap")
    assert data(s9_ready) == data(s11_ready) == {"times": 3, "processed": 3}
    assert (s10_ready_should_fail.status, s10_ready_should_fail.attempts) == ("failed", 3)
    for key, previous in (("p1_swap", "p2"), ("p2_swap", "p1")):
        [takeover] = history_of(feed, key, "expired")
        assert takeover.detail == {"previous": previous}
        assert takeover.watcher in (w1.id, w2.id)


def test_a_partition_moves_to_its_next_gate_only_when_every_item_of_its_gate_is_done(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """Go Feed's checkpointing (docs/guides/gofeed.md, checkpoints; Partition.Gate in partition.go; TestWatcher's
    p1_gate): the item at gate 1 is sent only after both items at gate 0 are complete, the one
    asked three times included."""
    handler.behavior = lambda item: (*go_test_processor(item), {}, 0.05)
    feed.add_partition("p1_gate", items=[(0, TIMES_3), (0, b'{"times": 1}'), (1, b'{"times": 1, "gate": 1}')])
    with watching(db_url, raw(handler)):
        final = wait_status(feed, "p1_gate", "complete", history=100)

    requests = requests_to(handler, "p1_gate")
    gate_0 = [d for d in requests if d.headers["feedproc-gate"] == "0"]
    [gate_1] = [d for d in requests if d.headers["feedproc-gate"] == "1"]
    assert len(gate_0) == 4
    assert gate_1.start >= max(d.end for d in gate_0)
    assert final.gate == 1
    assert [e.detail for e in final.history or () if e.kind == "gate_advanced"] == [{"from": 0, "to": 1}]


def test_a_partition_whose_items_all_wait_at_gate_1_is_served_at_gate_1(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    """TestWatcher p1_gate: s14_gate and s15_gate (`"gate": 1`) complete with `processed` 3 at gate
    1, and so does their partition. Go Feed saves the partition at gate 0 and increments it past the
    empty gate; a feedproc partition starts at its lowest item's gate (CONTRACT.md rule 1)."""
    handler.behavior = go_test_processor
    feed.add_partition("p1_gate", items=[(1, b'{"times": 3, "gate": 1}')] * 2)
    assert feed.status("p1_gate").gate == 1
    with watching(db_url, raw(handler)):
        wait_status(feed, "p1_gate", "complete")

    for item in feed.items("p1_gate"):
        assert (item.status, item.gate, data(item)) == ("complete", 1, {"times": 3, "gate": 1, "processed": 3})
    assert {d.headers["feedproc-gate"] for d in requests_to(handler, "p1_gate")} == {"1"}


def test_a_failed_item_keeps_its_partition_from_the_next_gate(db_url: str, feed: Feed, handler: HandlerService) -> None:
    """TestWatcher p2_gate: s13_gate_fail fails, and with it the partition, at gate 1; the item at
    gate 2 is never sent. Differs on purpose: Go Feed expects s12_gate still available after one
    request (its watcher stops after 3 s); feedproc finishes the gate's other items before failing
    the partition, so s12_gate completes."""
    handler.behavior = go_test_processor
    feed.add_partition(
        "p2_gate",
        items=[(1, b'{"times": 3, "gate": 1}'), (1, b'{"times": 3, "gate": 1, "fail": true}'), (2, b'{"times": 1}')],
    )
    with watching(db_url, raw(handler), max_attempts=3):
        final = wait_status(feed, "p2_gate", "failed")

    s12_gate, s13_gate_fail, later = feed.items("p2_gate")
    assert (s12_gate.status, data(s12_gate)) == ("complete", {"times": 3, "gate": 1, "processed": 3})
    assert (s13_gate_fail.status, data(s13_gate_fail)) == ("failed", {"times": 3, "gate": 1, "fail": True})
    assert (later.status, final.gate) == ("available", 1)
    assert {d.headers["feedproc-gate"] for d in requests_to(handler, "p2_gate")} == {"1"}


# ---------------------------------------------------------------- repo_test.go: TestSave (optimistic concurrency)
#
# Go Feed saves every item and partition with `WHERE version = <the version read>`, so a write made
# from a stale read changes nothing. feedproc fences each answer by the item's version and by the
# partition's lease epoch.


def test_an_answer_for_an_item_changed_since_it_was_sent_changes_nothing(store: Store, feed: Feed) -> None:
    """TestSave: the item's version moved on (an operator skipped it while it was in flight); the
    late answer is dropped and the item keeps what the operator wrote."""
    feed.add_partition("occ", items=[(0, TIMES_3), (0, TIMES_3)])
    store.acquire("w1", "default", 10, 30.0)
    sent, _ = store.fetch_ready("w1", 10)
    feed.act_on_items("skip", ids=[sent.id])

    applied = store.apply("w1", [answer(sent, Kind.DONE, data=b'{"times":3,"processed":1}')])
    assert (applied.written, applied.superseded) == ([], [sent.id])
    skipped = next(item for item in feed.items("occ") if item.id == sent.id)
    assert (skipped.status, data(skipped)) == ("complete", {"times": 3})


def test_an_answer_from_a_watcher_whose_lease_was_taken_over_changes_nothing(store: Store, feed: Feed) -> None:
    """TestSave, for partitions (and TestWatcher's swaps): a watcher whose lease ran out and was
    taken over writes nothing more; the new owner's answer is written."""
    feed.add_partition("occ", items=[(0, TIMES_3)])
    [old] = store.acquire("w1", "default", 10, 2.0)
    [sent] = store.fetch_ready("w1", 10)
    [new] = wait_until(lambda: store.acquire("w2", "default", 10, 30.0), what="w1's lease to run out")
    assert new.epoch > old.epoch

    late = store.apply("w1", [answer(sent, Kind.DONE)])
    assert (late.written, late.lost) == ([], {sent.partition_id})
    assert feed.items("occ")[0].status == "available"
    [again] = store.fetch_ready("w2", 10)
    assert store.apply("w2", [answer(again, Kind.DONE)]).written == [sent.id]
    assert feed.status("occ").status == "complete"
