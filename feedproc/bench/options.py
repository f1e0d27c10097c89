"""The options of `feedproc bench`, validated, and the constants the benchmark's pieces share."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import FeedprocError, InvalidInput

WORKLOADS = (
    "flat",
    "fan",
    "http",
    "http-batch",
    "pull",
    "http-fan",
    "pipeline",
    "collect",
    "collect-http",
    "flat-accumulate",
)
DEFAULT_WORKLOADS = ("flat", "fan", "http", "http-batch", "pull")
#: Through the bench handler, with these options. `http-fan` is `fan`'s partitions through one
#: `--handler`; `pipeline` the same through a stored pipeline, each gate to a handler of its own.
HTTP_WORKLOADS = {"http": [], "http-batch": ["--batch", "100"], "http-fan": [], "pipeline": []}
FAN_WORKLOADS = {"fan", "http-fan", "pipeline"}  # the fan workload's partitions
#: flat, with every answer carrying accumulate numbers merged by these operations (the queue's).
ACCUMULATE_WORKLOADS = {"flat-accumulate": {"pages": "sum", "max_score": "max"}}
PULL_WORKLOADS = {"pull"}  # a pull-mode queue: `feedproc work` processes claim through one `feedproc serve`
PULL_CLAIM = 100  # a pull worker's concurrency, so its claims ask for up to this many items
#: N items fanning in to one collecting item, a run per size: read by a Python processor, or by an
#: HTTP handler (inline, or page by page from `feedproc serve`).
COLLECT_WORKLOADS = ("collect", "collect-http")
#: The collect workloads' sizes (`--sizes`).
COLLECT_SIZES = (1_000, 100_000, 1_000_000)
QUICK_COLLECT_SIZES = (10,)
PEERS = ("pgqueuer", "procrastinate")
DIR_ENV = "FEEDPROC_BENCH_DIR"  # where a bench watcher writes its call log and statement counts
STATS_ENV = "FEEDPROC_BENCH_STATS"  # set: watch_main counts SQLAlchemy statements
PACED_TICK = 0.02  # seconds between two partitions of the flat paced load
FAN_GATES = 3  # the fan workload: items at gates 0..2, then one fan-in item at gate 3
PGQUEUER_CONSUMERS = 5  # PgQueuer's benchmark tool: --dequeue 5
WARMUP = "warmup-"  # key prefix of the paced phase's warm-up partitions (not in the latencies)


class BenchFailed(FeedprocError):
    """A benchmark run did not complete, or an item was not processed exactly once."""


@dataclass
class BenchOptions:
    places: list[str]
    workloads: list[str]
    watchers: list[int]
    partitions: int
    items: int
    against: list[str]
    quick: bool = False
    concurrency: int = 50
    poll_interval: float = 0.1
    latency_seconds: float = 5.0
    pgqueuer_batches: list[int] = field(default_factory=lambda: [10, 500])
    procrastinate_jobs: int = 5000
    procrastinate_concurrency: int = 10
    finished: int = 0  # finished items put in the tables before each feedproc run
    sizes: list[int] = field(default_factory=lambda: list(COLLECT_SIZES))  # the collect workload's N
    queue: dict[str, Any] = field(default_factory=dict)  # `set_queue` arguments before each run
    groups: int = 0  # concurrency groups the partitions are put in, in turn (0: none)
    timeout: float = 900.0
    keep: bool = False
    json_path: Path | None = None
    markdown_path: Path | None = None
    command: str = "feedproc bench"


def _csv(value: str, option: str) -> list[str]:
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts:
        raise InvalidInput(f"{option} {value!r}: expected a comma-separated list")
    return parts


def parse_options(
    *,
    db: Sequence[str] | None,
    fallback_db: str | None,
    workload: str | None,
    watchers: str | None,
    partitions: int | None,
    items: int | None,
    quick: bool,
    against: str | None,
    concurrency: int,
    poll_interval: float,
    latency_seconds: float | None,
    pgqueuer_batches: str,
    procrastinate_jobs: int,
    timeout: float,
    keep: bool,
    finished: int = 0,
    sizes: str | None = None,
    queue_settings: Sequence[str] = (),
    groups: int = 0,
    json_path: Path | None,
    markdown_path: Path | None,
    command: str,
) -> BenchOptions:
    """Validate the `feedproc bench` options (InvalidInput, exit 2, when malformed)."""
    places = list(db or [])
    if not places:
        places = ["sqlite"]
        if fallback_db and (is_pg(fallback_db) or is_mysql(fallback_db)):
            places.append(fallback_db)
    for place in places:
        if not (is_pg(place) or is_mysql(place) or is_sqlite(place)):
            raise InvalidInput(
                f"--db {place!r}: use sqlite, sqlite:///DIR/FILE.db, postgresql://... or mysql://... (MariaDB/MySQL)"
            )
    workloads = _csv(workload or ",".join(DEFAULT_WORKLOADS), "--workload")
    for name in workloads:
        if name not in WORKLOADS:
            raise InvalidInput(f"--workload {name!r}: choose from {', '.join(WORKLOADS)}")
    counts = [_positive_int(v, "--watchers") for v in _csv(watchers or ("1" if quick else "1,2,4"), "--watchers")]
    peers = _csv(against, "--against") if against else []
    for name in peers:
        if name not in PEERS:
            raise InvalidInput(f"--against {name!r}: choose from {', '.join(PEERS)}")
    missing = [name for name in peers if importlib.util.find_spec(name) is None]  # looked up, not imported
    if missing:
        raise InvalidInput(f"--against {','.join(missing)}: not installed; pip install 'feedproc[bench]'")
    if peers and quick:
        raise InvalidInput("--quick runs no peers: drop --against")
    if peers and not any(is_pg(place) for place in places):
        raise InvalidInput("--against needs a PostgreSQL --db (the peers run on PostgreSQL only)")
    return BenchOptions(
        places=places,
        workloads=list(dict.fromkeys(workloads)),
        watchers=list(dict.fromkeys(counts)),
        partitions=partitions or (2 if quick else 20),
        items=items or (10 if quick else 1000),
        against=list(dict.fromkeys(peers)),
        quick=quick,
        concurrency=concurrency,
        poll_interval=poll_interval,
        latency_seconds=latency_seconds if latency_seconds is not None else (0.5 if quick else 5.0),
        pgqueuer_batches=[_positive_int(v, "--pgqueuer-batches") for v in _csv(pgqueuer_batches, "--pgqueuer-batches")],
        procrastinate_jobs=procrastinate_jobs,
        finished=finished,
        sizes=[
            _positive_int(v, "--sizes")
            for v in _csv(sizes or ",".join(map(str, QUICK_COLLECT_SIZES if quick else COLLECT_SIZES)), "--sizes")
        ],
        queue=_queue_settings(queue_settings),
        groups=groups,
        timeout=timeout,
        keep=keep,
        json_path=json_path,
        markdown_path=markdown_path,
        command=command,
    )


#: The queue settings `--queue-setting` may give, and how each is read.
QUEUE_SETTINGS: dict[str, Callable[[str], Any]] = {
    "limit": int,
    "partition_limit": int,
    "group_limit": int,
    "rate": str,
    "group_rate": str,
    "aging": float,
}


def _queue_settings(given: Sequence[str]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for text in given:
        key, _, value = text.partition("=")
        if key not in QUEUE_SETTINGS or not value:
            raise InvalidInput(f"--queue-setting {text!r}: expected KEY=VALUE, KEY one of {', '.join(QUEUE_SETTINGS)}")
        try:
            settings[key] = QUEUE_SETTINGS[key](value)
        except ValueError:
            raise InvalidInput(f"--queue-setting {text!r}: {value!r} is not a {key}") from None
    return settings


def _positive_int(value: str, option: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidInput(f"{option} {value!r}: expected positive integers") from None
    if number < 1:
        raise InvalidInput(f"{option} {value!r}: expected positive integers")
    return number


def _scheme(url: str) -> str:
    """The database of a URL, without its driver: `mysql+pymysql://...` → `mysql`."""
    return url.split(":", 1)[0].split("+", 1)[0]


def is_pg(url: str) -> bool:
    return _scheme(url) in ("postgresql", "postgres")


def listens(url: str) -> bool:
    """Whether watchers of `url` LISTEN for work: PostgreSQL, unless through a transaction pooler."""
    from ..store.pooling import split_pooler
    from .places import engine_url

    return is_pg(url) and split_pooler(engine_url(url))[1] is None


def is_mysql(url: str) -> bool:
    """MariaDB or MySQL (`mysql://`, `mariadb://`, with or without a driver)."""
    return _scheme(url) in ("mysql", "mariadb")


def is_sqlite(url: str) -> bool:
    return url == "sqlite" or url.startswith("sqlite:")
