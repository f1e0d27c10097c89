"""Prometheus metrics through prometheus-client: a watcher's own metrics in a registry of its own
(served by `watch --metrics-port`), and the database's gauges per queue (served by `serve` at /metrics).

Each watcher is a process with its own registry and its own port: scrape every watcher (in
Kubernetes, a PodMonitor or a pod annotation per watcher) and sum in PromQL. prometheus-client's
multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`) is for servers that fork workers behind one port;
a watcher does not fork, so it is not used. The `*_created` series are turned off: they double the
series count and no dashboard of ours reads them.

Hot path: the processing-time histogram is observed once per delivery, on the event loop only, so
it counts in plain ints (0.17 us per observation) and a collector hands them to prometheus-client
at scrape time; its own Histogram takes two locks per observation (0.7 us; timeit, 200,000 calls),
about 3% of a watcher's CPU on the flat benchmark (py-spy). The outcome counters are
prometheus-client's, incremented once per group commit and kind, not per item.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .core.hooks import HOOK_STATES

prometheus_client.disable_created_metrics()

# The text format every Prometheus version reads (what `generate_latest` writes by default).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WatcherMetrics:
    """The metrics of one watcher process (its queue is the label every metric has)."""

    def __init__(self, queue: str, *, leases_held: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, q = self.registry, [queue]
        self._processed = Counter(
            "feedproc_items_processed",
            "Deliveries whose answer was written: done, moved, not yet, retried or failed.",
            ["queue"],
            registry=r,
        ).labels(*q)
        self._completed = Counter("feedproc_items_completed", "Items completed.", ["queue"], registry=r).labels(*q)
        self._failed = Counter(
            "feedproc_items_failed", "Items failed (permanently or out of attempts).", ["queue"], registry=r
        ).labels(*q)
        self._retried = Counter(
            "feedproc_items_retried", "Transient failures scheduled for another attempt.", ["queue"], registry=r
        ).labels(*q)
        #: Per gate (its pipeline name, else its number): `latency(gate)` makes one on first use.
        self.latencies: dict[str, LatencyHistogram] = {}
        r.register(_HistogramCollector(self.latencies, queue))
        held = Gauge("feedproc_leases_held", "Partitions leased by this watcher now.", ["queue"], registry=r)
        held.labels(*q).set_function(leases_held)
        steals = Counter(
            "feedproc_steals",
            "Rebalancing: partitions asked for (requested), received (stolen) and given away (handed_over).",
            ["queue", "event"],
            registry=r,
        )
        self.steal_requests = steals.labels(queue, "requested")  # partitions this watcher asked another one for
        self.stolen = steals.labels(queue, "stolen")  # partitions handed over to this watcher after it asked
        self.handed_over = steals.labels(queue, "handed_over")  # partitions it gave to another that asked
        self.gate_advances = Counter(
            "feedproc_gate_advances", "Gate advances caused by this watcher's answers.", ["queue"], registry=r
        ).labels(*q)
        # Late answers that never reached the database as written: refused by the fence there (the
        # partition's lease had passed to another watcher), or given up by the watcher itself when
        # it could not write them within a lease (the fence would refuse them by then).
        fenced = Counter(
            "feedproc_answers_fenced",
            "Answers discarded because this watcher had lost, or could no longer prove, the partition's lease.",
            ["queue", "by"],
            registry=r,
        )
        self.fenced = fenced.labels(queue, "database")
        self.given_up = fenced.labels(queue, "watcher")
        #: Completion hooks' calls by this watcher: sent, retried (a failed attempt) or failed (the last one).
        self.hooks = Counter(
            "feedproc_hook_calls", "Completion hooks called: sent, retried or failed.", ["queue", "outcome"], registry=r
        )
        self._backlog = _Backlog(queue)
        r.register(self._backlog)
        #: The adaptive concurrency windows this watcher knows (gate -> width), read at scrape time.
        self._windows = _Windows(queue)
        r.register(self._windows)

    def follow_windows(self, widths: Callable[[], Mapping[int, float]]) -> None:
        """Serve `feedproc_concurrency_window` per gate from `widths` (read at scrape time)."""
        self._windows.read = widths

    def latency(self, gate: str) -> LatencyHistogram:
        """The processing-time histogram of `gate` (its pipeline name, else its number as text)."""
        histogram = self.latencies.get(gate)
        if histogram is None:
            histogram = self.latencies[gate] = LatencyHistogram(LATENCY_BUCKETS)
        return histogram

    def written(self, kinds: Mapping[str, int]) -> None:
        """Count the answers of one group commit, by kind (`Kind` values: done, move, later, retry, fail)."""
        self._processed.inc(sum(kinds.values()))
        for kind, counter in (("done", self._completed), ("fail", self._failed), ("retry", self._retried)):
            if kinds.get(kind):
                counter.inc(kinds[kind])

    def render(self, *, backlog: Callable[[], int | None] | None = None) -> bytes:
        """The metrics in the Prometheus text format; `backlog` (read at scrape time, None when the
        database is away) adds `feedproc_backlog_items`."""
        self._backlog.read = backlog
        return generate_latest(self.registry)


class LatencyHistogram:
    """Seconds per delivery in fixed buckets, counted in plain ints: observed on the watcher's
    event loop only, read by the scrape (a torn read is off by one observation at most)."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # per bucket, not cumulative; the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.count += 1


class _HistogramCollector(Collector):
    """`feedproc_processing_seconds{queue, gate}` from the LatencyHistograms of each gate, as
    prometheus-client's histogram family."""

    def __init__(self, histograms: dict[str, LatencyHistogram], queue: str) -> None:
        self.histograms, self.queue = histograms, queue

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "feedproc_processing_seconds", "Time the processor (handler) took per delivery.", labels=["queue", "gate"]
        )
        for gate, h in list(self.histograms.items()):
            counts, total = list(h.counts), h.sum
            cumulative, buckets = 0, []
            for bound, n in zip((*h.buckets, float("inf")), counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric([self.queue, gate], buckets, total)
        yield family


class _Backlog(Collector):
    """`feedproc_backlog_items` of the watcher's queue, read from the database at scrape time
    (absent when the database does not answer: the process's own metrics are still served)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.read: Callable[[], int | None] | None = None

    def collect(self) -> Iterator[Metric]:
        value = self.read() if self.read is not None else None
        if value is not None:
            family = GaugeMetricFamily(
                "feedproc_backlog_items", "Available items of available partitions.", labels=["queue"]
            )
            family.add_metric([self.queue], value)
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _Windows(Collector):
    """`feedproc_concurrency_window`: per gate whose handler pushed back, the fleet's window there
    (adaptive concurrency); no sample for a gate without one (no bound but the others)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.read: Callable[[], Mapping[int, float]] = dict

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "feedproc_concurrency_window",
            "Adaptive concurrency: items the fleet may have in flight at a gate whose handler pushed back.",
            labels=["queue", "gate"],
        )
        for gate, width in sorted(self.read().items()):
            family.add_metric([self.queue, str(gate)], width)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())


_GAUGES = (
    ("feedproc_backlog_items", "backlog", "Available items of available partitions, by queue."),
    ("feedproc_failed_items", "failed_items", "Failed items, by queue."),
    ("feedproc_leases_held", "leases", "Partitions leased by a watcher now, by queue."),
    ("feedproc_watchers_alive", "watchers", "Watchers with a fresh heartbeat, by queue."),
)


class _Gauges(Collector):
    """The database's gauges per queue (`Feed.gauges()`), or `feedproc_up 0` when it is away."""

    def __init__(self, gauges: Mapping[str, Mapping[tuple[str, ...], int]] | None, down: str | None) -> None:
        self.gauges, self.down = gauges, down

    def collect(self) -> Iterator[Metric]:
        up_help = "1 when the database answered this scrape"
        if self.gauges is None:
            yield GaugeMetricFamily("feedproc_up", f"{up_help} ({(self.down or '')[:200]}).", value=0)
            return
        yield GaugeMetricFamily("feedproc_up", f"{up_help}.", value=1)
        partitions = GaugeMetricFamily(
            "feedproc_partitions", "Partitions by queue and status.", labels=["queue", "status"]
        )
        for (queue, status), n in sorted(self.gauges["partitions"].items()):
            partitions.add_metric([queue, status], n)
        yield partitions
        for name, key, doc in _GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["queue"])
            for (queue,), n in sorted(self.gauges[key].items()):
                family.add_metric([queue], n)
            yield family
        hooks = GaugeMetricFamily(
            "feedproc_hooks",
            "Completion hooks' deliveries by queue and status: pending, sent, failed.",
            labels=["queue", "status"],
        )
        counted = self.gauges.get("hooks", {})
        for queue in sorted({queue for queue, _ in counted}):
            for status in HOOK_STATES:  # each state of a queue with hooks, 0 too: `failed > 0` alerts clear
                hooks.add_metric([queue, status], counted.get((queue, status), 0))
        yield hooks


def render_gauges(gauges: Mapping[str, Mapping[tuple[str, ...], int]]) -> bytes:
    """`Feed.gauges()` in the Prometheus text format (the /metrics of `feedproc serve`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Gauges(gauges, None))
    return generate_latest(registry)


def render_down(reason: str) -> bytes:
    """/metrics of `feedproc serve` while the database does not answer: `feedproc_up 0`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Gauges(None, reason))
    return generate_latest(registry)
