"""One deterministic partition of every kind of state the reads show (gates, a failure tolerated,
history, a lease, a schedule, a watcher, a claim in flight), and every read of it as JSON with its
times normalised: tests/unit/test_views.py compares today's reads with the golden copy recorded
before the reads were typed (tests/unit/data/views_golden.json)."""

from __future__ import annotations

import re
from typing import Any

from feedproc import Feed
from feedproc.core.pipelines import from_mapping

_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_TIMED = {"elapsed", "duration", "time_at_gate", "per_second", "eta_seconds", "p50", "p95"}


def build(feed: Feed) -> dict[str, Any]:
    """Fill an empty, migrated database; returns the ids the reads need."""
    feed.apply_pipeline(
        from_mapping(
            {
                "queue": "ocr",
                "gate": [{"name": "scan", "number": 0}, {"name": "read", "number": 1, "tolerate": 1}],
                "schedule": [{"name": "nightly", "cron": "0 3 * * *", "key": "night-{date:%Y%m%d}"}],
            }
        )
    )
    feed.set_queue("ocr", mode="pull", limit=4)
    feed.add_partition(
        "p1", [(0, b'{"n": 1}'), (0, b'{"n": 2}'), (1, b'{"n": 3}'), (1, b"raw"), (1, b"{}")], queue="ocr", priority=3
    )
    feed.add_partition("p2", [(0, b"{}")], queue="other", sealed=False)
    first, second = feed.claim("ocr", "w1", max_items=4)  # gate 0's items
    feed.answer(first["id"], first["token"], {"gate": 1, "data": {"n": 1}})
    feed.answer(second["id"], second["token"], {"done": True})
    by_data = {c["data"]: c for c in feed.claim("ocr", "w1", max_items=4)}  # gate 1's, after the advance
    failed = by_data[b'{"n": 3}']
    feed.answer(failed["id"], failed["token"], {"error": {"message": "broken page", "no_retry": True}})
    done = by_data[b"raw"]
    feed.answer(done["id"], done["token"], {"done": True, "result": {"ok": True}})
    feed.add_partition("p3", [(0, b"{}")], queue="ocr")  # fails: gate 0 tolerates nothing
    (doomed,) = feed.claim("ocr", "w1")
    feed.answer(doomed["id"], doomed["token"], {"error": {"message": "no pages", "no_retry": True}})
    feed.store.register_watcher("watch-1", host="h", pid=1, queue="other", concurrency=2, capacity=2, lease_seconds=60)
    feed.store.acquire("watch-1", "other", 1, 60)
    return {"item": failed["id"], "done": done["id"]}


def reads(feed: Feed, ids: dict[str, Any], json: Any) -> dict[str, Any]:
    """Every read, each as `json(result)` (the plain object), times normalised."""
    out = {
        "status": json(feed.status("p1", history=20)),
        "status_plain": json(feed.status("p2")),
        "partitions": [json(p) for p in feed.partitions()],
        "items": [json(i) for i in feed.items("p1")],
        "item": json(feed.item(ids["item"])),
        "item_done": json(feed.item(ids["done"])),
        "history": [json(h) for h in feed.history("p1")],
        "summary": json(feed.summary(recent=5)),
        "summary_plain": json(feed.summary()),
        "queue": json(feed.queue("ocr")),
        "queues": [json(q) for q in feed.queues()],
        "running": [json(r) for r in feed.running()],
        "leases": [json(lease) for lease in feed.leases()],
        "recent_failures": [json(f) for f in feed.recent_failures()],
        "watchers": [json(w) for w in feed.watchers()],
        "timings": json(feed.timings("p1")),
        "timings_plain": json(feed.timings("p2")),
        "throughput": json(feed.throughput(seconds=600, step=300)),
        "schedules": [json(s) for s in feed.schedules()],
    }
    # The buckets' counts depend on where the minute boundaries fell during the run: their keys stay.
    out["throughput"]["buckets"] = [list(b) for b in out["throughput"]["buckets"][-1:]]
    return normalised(out)


def normalised(value: Any) -> Any:
    """Times replaced by a placeholder, bytes by their text: the shape, keys, order and values stay."""
    if isinstance(value, dict):
        return {k: "<seconds>" if k in _TIMED and v is not None else normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, bytes):
        return {"bytes": value.decode("latin-1")}
    if isinstance(value, str) and _ISO.match(value):
        return "<time>"
    if isinstance(value, str) and value.startswith("night-"):
        return "night-<date>"
    return value
