"""Prometheus metrics in the text exposition format, written by hand (no client library, no global
registry): a watcher's own counters, served by `watch --metrics-port`, and the database's gauges per
queue, served by `serve` at /metrics.

A watcher's counters are plain attributes incremented on its event loop (an int add per item); the
monitoring thread only reads them, so no lock is needed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OUTCOMES = ("done", "move", "later", "retry", "fail")  # store.Kind values


class Histogram:
    """A cumulative histogram with fixed buckets (Prometheus `histogram`)."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1


class WatcherMetrics:
    """Counters of one watcher process (its queue is the only label)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        # Answers written, by what they did to the item (a Counter: a kind added later counts too).
        self.outcomes: Counter[str] = Counter(dict.fromkeys(OUTCOMES, 0))
        self.latency = Histogram()  # seconds a Processor took per delivery
        self.gate_advances = 0
        self.steal_requests = 0  # partitions this watcher asked another one for
        self.stolen = 0  # partitions handed over to this watcher after it asked
        self.handed_over = 0  # partitions this watcher gave to another that asked

    def render(self, *, leases_held: int, backlog: int | None = None) -> str:
        """The metrics as Prometheus text."""
        q = {"queue": self.queue}
        o = self.outcomes
        out = Exposition()
        out.metric(
            "feedproc_items_processed_total",
            "counter",
            "Deliveries whose answer was written: done, moved, not yet, retried or failed.",
            [(q, sum(o.values()))],
        )
        out.metric("feedproc_items_completed_total", "counter", "Items completed.", [(q, o["done"])])
        out.metric(
            "feedproc_items_failed_total", "counter", "Items failed (permanently or out of attempts).", [(q, o["fail"])]
        )
        out.metric(
            "feedproc_items_retried_total",
            "counter",
            "Transient failures scheduled for another attempt.",
            [(q, o["retry"])],
        )
        out.histogram("feedproc_processing_seconds", "Time the processor (handler) took per delivery.", q, self.latency)
        out.metric("feedproc_leases_held", "gauge", "Partitions leased by this watcher now.", [(q, leases_held)])
        out.metric(
            "feedproc_steals_total",
            "counter",
            "Rebalancing: partitions asked for (requested), received (stolen) and given away (handed_over).",
            [
                ({**q, "event": "requested"}, self.steal_requests),
                ({**q, "event": "stolen"}, self.stolen),
                ({**q, "event": "handed_over"}, self.handed_over),
            ],
        )
        out.metric(
            "feedproc_gate_advances_total",
            "counter",
            "Gate advances caused by this watcher's answers.",
            [(q, self.gate_advances)],
        )
        if backlog is not None:
            out.metric("feedproc_backlog_items", "gauge", "Available items of available partitions.", [(q, backlog)])
        return out.text()


def render_gauges(gauges: Mapping[str, Mapping[tuple[str, ...], int]]) -> str:
    """`Store.queue_gauges()` as Prometheus text (the /metrics of `feedproc serve`)."""
    out = Exposition()
    out.metric("feedproc_up", "gauge", "1 when the database answered this scrape.", [({}, 1)])
    out.metric(
        "feedproc_partitions",
        "gauge",
        "Partitions by queue and status.",
        [({"queue": q, "status": s}, n) for (q, s), n in sorted(gauges["partitions"].items())],
    )
    for name, key, doc in (
        ("feedproc_backlog_items", "backlog", "Available items of available partitions, by queue."),
        ("feedproc_failed_items", "failed_items", "Failed items, by queue."),
        ("feedproc_leases_held", "leases", "Partitions leased by a watcher now, by queue."),
        ("feedproc_watchers_alive", "watchers", "Watchers with a fresh heartbeat, by queue."),
    ):
        out.metric(name, "gauge", doc, [({"queue": q}, n) for (q,), n in sorted(gauges[key].items())])
    return out.text()


def render_down(reason: str) -> str:
    out = Exposition()
    out.metric("feedproc_up", "gauge", f"1 when the database answered this scrape ({reason[:200]}).", [({}, 0)])
    return out.text()


class Exposition:
    """Builds the Prometheus text format."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, doc: str, samples: Iterable[tuple[Mapping[str, str], Any]]) -> None:
        self.lines += [f"# HELP {name} {_escape_help(doc)}", f"# TYPE {name} {kind}"]
        self.lines += [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]

    def histogram(self, name: str, doc: str, labels: Mapping[str, str], hist: Histogram) -> None:
        self.lines += [f"# HELP {name} {_escape_help(doc)}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, count in zip((*hist.buckets, float("inf")), hist.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            self.lines.append(f"{name}_bucket{_labels({**labels, 'le': le})} {cumulative}")
        self.lines.append(f"{name}_sum{_labels(labels)} {_number(hist.sum)}")
        self.lines.append(f"{name}_count{_labels(labels)} {hist.count}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in labels.items()) + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
