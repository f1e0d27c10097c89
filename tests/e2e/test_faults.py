"""Fault injection (issue 4): nothing lost, nothing done twice after completion, with real watcher
processes, real signals, a real HTTP handler and real databases.

Every test runs `feedproc watch` subprocesses (each sends `X-Watcher: <name>` to the handler),
injects a fault (kill -9, SIGSTOP past the lease, SIGTERM, a database outage, a handler outage),
lets the run finish, and checks the invariants of `faults_support` from the handler's log of
deliveries plus the database: every partition completes, the gate barrier is never crossed, a
completed item is never delivered again, each answer's children are written exactly once, and the
only repeated deliveries are of items that were in flight at a kill or a stop.

Run them alone with `pytest -m faults`.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, make_url, text
from sqlalchemy.exc import OperationalError

from feedproc import Feed
from feedproc.core.errors import DatabaseRefusesWrites

from ..faults_support import (
    WATCHER_HEADER,
    Call,
    FanOut,
    Fault,
    Fleet,
    Member,
    calls_from,
    check_barrier,
    check_children_once,
    check_completed_never_redelivered,
    expected_items,
    fan_out_items,
    history,
    report,
    stored_items,
    stored_partitions,
    workflow_checks,
)
from ..outages import mariadb_read_only, mariadb_user
from ..pgbouncer_support import PgBouncer
from ..support import HandlerService, WatcherProcesses, run_cli, spawn, wait_until
from ..watcher.test_database_outages import waits_out_read_only

pytestmark = [pytest.mark.faults, pytest.mark.slow]

UNAVAILABLE, REACHABLE = "database unavailable", "database reachable again"


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def fleet(watchers: WatcherProcesses) -> Iterator[Fleet]:
    """Named watcher processes from the `watchers` fixture (which stops them after the test)."""

    def start(name: str, args: Any) -> tuple[subprocess.Popen[bytes], Path]:
        log = watchers.log_dir / f"watch-{len(watchers.processes)}.log"
        return watchers.start(*args, "--header", f"{WATCHER_HEADER}: {name}"), log

    group = Fleet(start)
    yield group
    group.resume_all()  # a stopped watcher could not act on the fixture's SIGTERM


def waiting(predicate: Callable[[], Any], *, timeout: float, what: str, fleet: Fleet, feed: Feed | None = None) -> Any:
    """`wait_until`, failing with the partitions' state and the watchers' logs at the deadline."""
    try:
        return wait_until(predicate, timeout=timeout, what=what)
    except pytest.fail.Exception as failure:
        state = ""
        if feed is not None:
            with contextlib.suppress(Exception):
                state = "\n".join(f"{k}: {v}" for k, v in stored_partitions(engine_of(feed)).items())
        pytest.fail(f"{failure}\n\npartitions:\n{state}\n\n{logs_of(fleet)}")


def engine_of(feed: Feed) -> Engine:
    return feed.store.engine


def calls(handler: HandlerService) -> list[Call]:
    with handler.lock:
        return calls_from(list(handler.deliveries))


def assert_checks(feed: Feed, keys: list[str], handler: HandlerService, faults: list[Fault], fleet: Fleet) -> None:
    checks = workflow_checks(engine_of(feed), keys, calls(handler), faults)
    print(report(checks))  # shown with -rP or on failure
    assert all(c.ok for c in checks), report(checks) + "\n\n" + logs_of(fleet)


def logs_of(fleet: Fleet) -> str:
    return "\n".join(f"--- {m.name} ({m.id})\n{m.text()[-4000:]}" for m in fleet.members.values())


def all_complete(feed: Feed, keys: list[str]) -> bool:
    """Whether every partition is complete (False while the database is unreachable)."""
    try:
        parts = stored_partitions(engine_of(feed), keys)
    except OperationalError:  # an outage test may poll through the outage
        return False
    return len(parts) == len(keys) and all(p["status"] == "complete" for p in parts.values())


def hold_until(moment: float) -> None:
    """Let a fault last until `moment` (time.monotonic()): the fault's length, not a synchronisation."""
    time.sleep(max(0.0, moment - time.monotonic()))


def stays(read: Callable[[], Any], expected: Any, seconds: float, what: str) -> None:
    """Watch `read()` for `seconds`: it must equal `expected` the whole time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = read()
        assert now == expected, f"{what} changed:\nbefore: {expected!r}\nafter:  {now!r}"
        time.sleep(0.1)


def state_lines(member: Member) -> list[str]:
    """The watcher's database-health log lines, in order: 'down' or 'up'."""
    return [
        "down" if UNAVAILABLE in line else "up"
        for line in member.text().splitlines()
        if UNAVAILABLE in line or REACHABLE in line
    ]


WORKFLOW = ("--poll-interval", "0.2", "--concurrency", "4", "--retry-delay", "0.1")


# ---------------------------------------------------------------- 1. crash takeover


def test_kill_9_mid_run_loses_nothing_and_repeats_only_in_flight_items(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet
) -> None:
    handler.behavior = FanOut(seed=1)
    keys = [f"crash-{n}" for n in range(8)]
    args = ("--handler", handler.url, "--lease-seconds", "2", *WORKFLOW, "--max-partitions", "3")
    for name in ("w1", "w2", "w3"):
        fleet.start(name, *args)
    waiting(lambda: all(m.id for m in fleet.members.values()), timeout=30, what="three watchers to start", fleet=fleet)
    for key in keys:
        feed.add_partition(key, fan_out_items(roots=2, fanout=6))
    total = len(keys) * expected_items(2, 6)
    waiting(lambda: len(handler.deliveries) >= total // 4, timeout=30, what="a quarter of the deliveries", fleet=fleet)

    # Kill the two watchers holding the most partitions right now, then see what they left behind.
    owners = Counter(p["lease_owner"] for p in stored_partitions(engine_of(feed), keys).values() if p["lease_owner"])
    ranked = sorted(fleet.members.values(), key=lambda m: owners[m.id], reverse=True)
    victims = ranked[:2]
    for victim in victims:
        fleet.kill(victim.name)
    victim_ids = {v.id for v in victims}
    orphaned = {
        key: p
        for key, p in stored_partitions(engine_of(feed), keys).items()
        if p["status"] == "available" and p["lease_owner"] in victim_ids
    }
    assert orphaned, f"the killed watchers held no unfinished partition (owners {owners})"
    fleet.start("w4", *args)

    waiting(lambda: all_complete(feed, keys), timeout=90, what="every partition to complete", fleet=fleet, feed=feed)
    assert_checks(feed, keys, handler, fleet.faults, fleet)
    events = history(engine_of(feed), keys)
    for key, lease in orphaned.items():
        expired = [
            e
            for e in events
            if e["key"] == key and e["kind"] == "expired" and e["detail"]["previous"] == lease["lease_owner"]
        ]
        assert len(expired) == 1, f"{key} was not taken over from {lease['lease_owner']} once: {expired}"
        assert expired[0]["at"] >= lease["lease_expires_at"].timestamp(), "taken over before the lease ran out"
    assert "Traceback" not in logs_of(fleet)


# ---------------------------------------------------------------- 2. stale owner (SIGSTOP past the lease)


def stale_owner_run(feed: Feed, handler: HandlerService, fleet: Fleet) -> dict[str, Any]:
    """Watcher `a` leases a workflow partition and a partition it keeps busy ("not yet" answers),
    is stopped with four slow root deliveries in flight (and more items buffered), `b` takes both
    over and completes the workflow; `a` is continued after 5 s and watched for 3 s."""
    slow_first_root = FanOut(extra=lambda body, earlier: 1.0 if body["data"]["kind"] == "root" and not earlier else 0)
    handler.behavior = slow_first_root
    feed.add_partition("stale-work", fan_out_items(roots=6, fanout=3))
    feed.add_partition("stale-held", [(0, b'{"kind": "hold"}'), (0, b'{"kind": "hold"}')])
    args = ("--handler", handler.url, "--lease-seconds", "2", *WORKFLOW)
    a = fleet.start("a", *args)
    waiting(
        lambda: len(slow_first_root.starts(partition="stale-work")) >= 4,
        timeout=30,
        what="four root deliveries in flight",
        fleet=fleet,
    )
    stopped = fleet.stop("a")
    b = fleet.start("b", *args)
    engine = engine_of(feed)

    def taken_over() -> bool:
        parts = stored_partitions(engine)
        return parts["stale-work"]["status"] == "complete" and parts["stale-held"]["lease_owner"] == b.id

    waiting(taken_over, timeout=30, what="b to take over and complete the workflow", fleet=fleet, feed=feed)

    def snapshot() -> tuple[Any, ...]:
        parts = stored_partitions(engine)
        held = parts["stale-held"]
        return parts["stale-work"], stored_items(engine, ["stale-work"]), (held["lease_owner"], held["lease_epoch"])

    before = snapshot()
    hold_until(time.monotonic() + max(0.0, stopped.at + 5 - time.time()))
    resumed = fleet.cont("a")
    waiting(lambda: "lost the lease" in a.text(), timeout=15, what="a to notice it lost its leases", fleet=fleet)
    stays(snapshot, before, 3.0, "the database after a's late answers")
    return {"a": a, "b": b, "stopped": stopped, "resumed": resumed, "keys": ["stale-work"]}


def test_stale_owner_late_answers_change_nothing_and_it_lets_go(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet
) -> None:
    run = stale_owner_run(feed, handler, fleet)
    a, b, stopped, resumed = run["a"], run["b"], run["stopped"], run["resumed"]
    # a really had answers in flight: root deliveries it made began before the stop, ended after it.
    late = [c for c in calls(handler) if c.watcher == "a" and c.start < stopped.at < c.end]
    assert len(late) >= 4, late
    assert a.alive, "the resumed watcher exited"
    owners = {k: p["lease_owner"] for k, p in stored_partitions(engine_of(feed)).items()}
    assert a.id not in owners.values(), f"the resumed watcher holds leases again: {owners}"
    assert owners["stale-held"] == b.id
    written_by_a = [e for e in history(engine_of(feed)) if e["watcher"] == a.id and e["at"] > resumed.at]
    assert written_by_a == [], f"the resumed watcher wrote history: {written_by_a}"
    # The database, unchanged by a's answers (stale_owner_run watched it): the workflow completed
    # at its last gate, every item complete, each root's children exactly once.
    work = stored_partitions(engine_of(feed))["stale-work"]
    assert (work["status"], work["gate"]) == ("complete", 2)
    stored = stored_items(engine_of(feed), run["keys"])
    assert len(stored) == expected_items(6, 3) and all(i.status == "complete" for i in stored)
    children = check_children_once(stored)
    assert children.ok, str(children)
    assert "Traceback" not in logs_of(fleet)


def test_stale_owner_dispatches_nothing_after_resuming(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet
) -> None:
    run = stale_owner_run(feed, handler, fleet)
    resumed = run["resumed"]
    after = [
        f"item {c.item} of {c.partition} (gate {c.gate}) at +{c.start - resumed.at:.3f}s"
        for c in calls(handler)
        if c.watcher == "a" and c.start > resumed.at
    ]
    stored = stored_items(engine_of(feed), run["keys"])
    mine = [c for c in calls(handler) if c.partition in run["keys"]]
    checks = [check_barrier(mine), check_completed_never_redelivered(stored, mine)]
    assert after == [], (
        "the watcher resumed after losing its leases dispatched items of partitions it no longer holds: "
        + "; ".join(after)
        + "\n\n"
        + report(checks)
        + "\n\n"
        + logs_of(fleet)
    )
    assert all(c.ok for c in checks), report(checks)


# ---------------------------------------------------------------- 3. graceful yield


def test_sigterm_commits_in_flight_answers_and_yields_to_a_running_watcher_within_a_poll(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet
) -> None:
    every_item_slow = FanOut(extra=lambda body, earlier: 1.0)
    handler.behavior = every_item_slow
    key = "yield-1"
    feed.add_partition(key, fan_out_items(roots=12, fanout=0))
    poll, grace = 0.5, 5.0
    args = ("--handler", handler.url, "--lease-seconds", "30", "--poll-interval", str(poll), "--concurrency", "4")
    a = fleet.start("a", *args, "--shutdown-grace", str(grace))
    waiting(lambda: len(every_item_slow.starts()) >= 4, timeout=30, what="four deliveries in flight", fleet=fleet)
    b = fleet.start("b", *args)
    waiting(
        lambda: any(w.id == b.id and w.alive for w in feed.watchers()),
        timeout=30,
        what="b to be running",
        fleet=fleet,
    )

    term = fleet.term("a")
    assert a.process.wait(timeout=grace + 10) == 0, logs_of(fleet)
    took = time.time() - term.at
    assert took < grace + 2.0, f"the watcher took {took:.1f}s to stop (grace {grace}s)"
    waiting(lambda: all_complete(feed, [key]), timeout=30, what="b to finish the partition", fleet=fleet, feed=feed)

    events = history(engine_of(feed), [key])
    yielded = [e for e in events if e["kind"] == "yielded"]
    assert len(yielded) == 1 and yielded[0]["watcher"] == a.id, events
    leased_after = [e for e in events if e["kind"] == "leased" and e["at"] >= yielded[0]["at"]]
    assert leased_after and leased_after[0]["watcher"] == b.id, events
    gap = leased_after[0]["at"] - yielded[0]["at"]
    print(f"a stopped {took:.2f}s after SIGTERM; b leased the partition {gap * 1000:.0f} ms after a yielded it")
    limit = 0.25 if feed.store.dialect.notifies else poll + 0.35  # PostgreSQL: NOTIFY, not the next poll
    assert gap <= limit, f"b leased the partition {gap:.3f}s after a yielded it (at most {limit}s)"

    in_flight = [c for c in calls(handler) if c.watcher == "a" and c.start < term.at]
    assert len(in_flight) >= 4
    by_token = {i.token: i for i in stored_items(engine_of(feed), [key])}
    for call in in_flight:
        assert call.token in by_token, f"a's answer for item {call.item}, in flight at SIGTERM, was not committed"
    redelivered = [c for c in calls(handler) if c.watcher == "b" and c.item in {i.item for i in in_flight}]
    assert redelivered == [], redelivered
    assert_checks(feed, [key], handler, [], fleet)  # no fault excuses a repeated delivery here
    assert "abandoned" not in a.text()


# ---------------------------------------------------------------- 4. and 5. database outages


def outage_run(feed: Feed, handler: HandlerService, fleet: Fleet, outage: Any) -> list[str]:
    """Two watchers work through six workflow partitions; `outage()` (a context manager) hits the
    database once a fifth of the deliveries happened. Returns the keys."""
    handler.behavior = FanOut(seed=4, child_sleep=(0.1, 0.3))
    keys = [f"outage-{n}" for n in range(6)]
    for key in keys:
        feed.add_partition(key, fan_out_items(roots=2, fanout=8))
    args = ("--handler", handler.url, "--lease-seconds", "30", *WORKFLOW)
    for name in ("w1", "w2"):
        fleet.start(name, *args)
    total = len(keys) * expected_items(2, 8)
    waiting(lambda: len(handler.deliveries) >= total // 5, timeout=60, what="a fifth of the deliveries", fleet=fleet)
    with outage():
        waiting(
            lambda: all(UNAVAILABLE in m.text() for m in fleet.members.values()),
            timeout=30,
            what="every watcher to notice the outage",
            fleet=fleet,
        )
    waiting(lambda: all_complete(feed, keys), timeout=90, what="completion after the outage", fleet=fleet, feed=feed)
    waiting(
        lambda: all(state_lines(m)[-1:] == ["up"] for m in fleet.members.values()),
        timeout=30,
        what="every watcher to log that the database is reachable again",
        fleet=fleet,
    )
    return keys


def assert_outage_logged_once_per_change(fleet: Fleet, most: int) -> None:
    for member in fleet.members.values():
        lines = state_lines(member)
        print(f"{member.name}: database state changes logged: {lines}")
        assert member.alive, f"{member.name} exited\n{member.text()[-3000:]}"
        assert lines and lines[0] == "down" and lines[-1] == "up", lines
        assert all(x != y for x, y in itertools.pairwise(lines)), f"{member.name} repeated a state: {lines}"
        assert lines.count("down") <= most, f"{member.name} logged the outage {lines.count('down')} times"
        assert "Traceback" not in member.text(), member.text()[-3000:]


def local_pg_cluster(db_url: str) -> tuple[str, str]:
    """(version, name) of the pg_ctlcluster-managed cluster serving `db_url`; skips if there is none."""
    url = make_url(db_url)
    if os.environ.get("FEEDPROC_TEST_PG") == "embedded" or url.host not in ("127.0.0.1", "localhost", "::1"):
        pytest.skip(f"the test database ({url.host}:{url.port}) is not a local pg_ctlcluster cluster")
    if not shutil.which("pg_lsclusters") or not shutil.which("pg_ctlcluster"):
        pytest.skip("pg_lsclusters/pg_ctlcluster are not installed: cannot restart the server")
    with Feed(db_url) as feed, feed.store.engine.connect() as conn:
        data_directory = conn.execute(text("SHOW data_directory")).scalar()
    listed = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[2] == str(url.port or 5432) and fields[5] == data_directory:
            if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != fields[4]:
                pytest.skip(f"only root or {fields[4]} may stop cluster {fields[0]}/{fields[1]}")
            return fields[0], fields[1]
    pytest.skip(f"no local cluster serves {url.host}:{url.port} from {data_directory} (embedded server?)")


def pg_ctlcluster(version: str, name: str, action: str) -> None:
    extra = ["-m", "fast"] if action == "stop" else []
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action, *extra],
        check=True,
        capture_output=True,
        timeout=120,
    )


def forget_dead_connections() -> None:
    """The restart killed every pooled server connection of this process too, the fixtures'
    (which do not pre-ping) included: drop them, so the next checkout connects afresh."""
    for engine in [obj for obj in gc.get_objects() if isinstance(obj, Engine)]:
        if engine.dialect.name != "sqlite":
            engine.dispose()


def postgres_restarted(version: str, name: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """An outage: the PostgreSQL cluster stopped for at least six seconds, then started again."""

    @contextlib.contextmanager
    def server_down() -> Iterator[None]:
        down_until = time.monotonic() + 6.0
        pg_ctlcluster(version, name, "stop")
        try:
            yield
            hold_until(down_until)  # the outage lasts at least six seconds
        finally:
            pg_ctlcluster(version, name, "start")
            forget_dead_connections()

    return server_down


@pytest.mark.postgres_only
def test_postgres_down_mid_run_is_survived_and_logged_once_per_state_change(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet
) -> None:
    keys = outage_run(feed, handler, fleet, postgres_restarted(*local_pg_cluster(db_url)))
    assert_checks(feed, keys, handler, [], fleet)  # no fault excuses a repeated delivery here
    assert_outage_logged_once_per_change(fleet, most=2)


@pytest.mark.postgres_only
def test_postgres_down_mid_run_behind_pgbouncer_is_survived_and_logged_once_per_state_change(
    db_url: str, pgbouncer: PgBouncer, handler: HandlerService, tmp_path: Path
) -> None:
    """The same restart with the watchers and the producer behind PgBouncer in transaction mode:
    PgBouncer stays up and answers for the server while it is down."""
    cluster = local_pg_cluster(db_url)
    pooled = pgbouncer.url(db_url)
    watchers = WatcherProcesses(pooled, tmp_path)

    def start(name: str, args: Any) -> tuple[subprocess.Popen[bytes], Path]:
        log = watchers.log_dir / f"watch-{len(watchers.processes)}.log"
        return watchers.start(*args, "--header", f"{WATCHER_HEADER}: {name}"), log

    fleet = Fleet(start)
    try:
        with Feed(pooled) as feed:
            keys = outage_run(feed, handler, fleet, postgres_restarted(*cluster))
            assert_checks(feed, keys, handler, [], fleet)
        assert_outage_logged_once_per_change(fleet, most=2)
    finally:
        fleet.resume_all()
        watchers.stop_all()


def local_mariadb(db_url: str) -> tuple[list[str], int]:
    """The command line and user id of the local MariaDB server serving `db_url`, to start it again
    as it was; skips unless it is local and this process may restart it."""
    url = make_url(db_url)
    if url.host not in ("127.0.0.1", "localhost") or os.geteuid() != 0:
        pytest.skip(f"the test database ({url.host}:{url.port}) is not a local server root may restart")
    with Feed(db_url) as feed, feed.store.engine.connect() as conn:
        pid = int(Path(conn.execute(text("SELECT @@pid_file")).scalar_one()).read_text())
    command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    return [part.decode() for part in command], Path(f"/proc/{pid}").stat().st_uid


@pytest.mark.mariadb_only
def test_mariadb_down_mid_run_is_survived_and_logged_once_per_state_change(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet
) -> None:
    command, uid = local_mariadb(db_url)
    port = make_url(db_url).port or 3306

    def answers() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        return False

    @contextlib.contextmanager
    def server_down() -> Iterator[None]:
        down_until = time.monotonic() + 6.0
        subprocess.run(["mariadb-admin", "-h127.0.0.1", f"-P{port}", "-uroot", "shutdown"], check=True, timeout=120)
        try:
            yield
            hold_until(down_until)  # the outage lasts at least six seconds
        finally:
            subprocess.Popen(
                command, user=uid, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            wait_until(answers, timeout=60, what="MariaDB to accept connections again")
            forget_dead_connections()

    keys = outage_run(feed, handler, fleet, server_down)
    assert_checks(feed, keys, handler, [], fleet)  # no fault excuses a repeated delivery here
    assert_outage_logged_once_per_change(fleet, most=2)


@pytest.mark.mariadb_only
def test_mariadb_read_only_mid_run_is_waited_out_unready_but_live(db_url: str, feed: Feed) -> None:
    """`SET GLOBAL read_only` (errors 1290, 1792 in a read-only transaction) binds users without
    READ ONLY ADMIN: the watcher and a producer run as one. Global to the server: a fault test."""
    with mariadb_user(db_url) as user_url:
        waits_out_read_only(user_url, feed, lambda: mariadb_read_only(db_url))
        with Feed(user_url) as producer, mariadb_read_only(db_url):
            with pytest.raises(DatabaseRefusesWrites) as refused:
                producer.add_partition("later", [(0, b"{}")])
            assert str(refused.value) == "the database is read-only"
            assert producer.status("p").status == "complete"  # reading works throughout


LOCKER = """
import sqlite3, sys, pathlib
conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
pathlib.Path(sys.argv[2]).touch()
sys.stdin.read()  # hold the lock until the test closes our standard input
conn.execute("ROLLBACK")
"""


@pytest.mark.sqlite_only
def test_sqlite_locked_by_another_process_mid_run_is_survived(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet, tmp_path: Path
) -> None:
    database = make_url(db_url).database
    assert database

    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        marker = tmp_path / "locked"
        locker = spawn([sys.executable, "-c", LOCKER, database, str(marker)], stdin=subprocess.PIPE)
        try:
            wait_until(marker.exists, timeout=30, what="the other process to lock the database")
            until = time.monotonic() + 12.0  # longer than the 10 s busy timeout
            yield
            hold_until(until)
        finally:
            assert locker.stdin is not None
            locker.stdin.close()
            assert locker.wait(timeout=30) == 0

    keys = outage_run(feed, handler, fleet, locked)
    assert_checks(feed, keys, handler, [], fleet)
    assert_outage_logged_once_per_change(fleet, most=3)


# ---------------------------------------------------------------- 6. handler outage


def test_handler_outage_fails_items_after_spread_out_attempts_and_retry_recovers_everything(
    db_url: str, feed: Feed, handler: HandlerService, fleet: Fleet
) -> None:
    workflow = FanOut(seed=6)
    up = threading.Event()
    handler.behavior = lambda body: workflow(body) if up.is_set() else (503, {"error": "service unavailable"})
    key = "handler-down"
    feed.add_partition(key, fan_out_items(roots=3, fanout=2))
    retry_delay, attempts = 0.3, 5
    fleet.start("w1", "--handler", handler.url, "--lease-seconds", "5", "--poll-interval", "0.1", "--retry-delay",
                str(retry_delay), "--max-attempts", str(attempts), "--concurrency", "4")  # fmt: skip
    waiting(
        lambda: feed.status(key).status == "failed", timeout=60, what="the partition to fail", fleet=fleet, feed=feed
    )

    status = feed.status(key)
    assert status.gate == 0 and len(status.failed_items) == 3, status
    for failed in status.failed_items:
        assert failed.attempts == attempts and "HTTP 503" in (failed.last_error or ""), failed
    failing = calls(handler)
    for item in {c.item for c in failing}:
        mine = sorted((c for c in failing if c.item == item), key=lambda c: c.start)
        assert [c.attempt for c in mine] == list(range(1, attempts + 1)), mine
        gaps = [later.start - earlier.start for earlier, later in itertools.pairwise(mine)]
        print(f"item {item}: attempts {[c.attempt for c in mine]}, gaps {[round(g, 3) for g in gaps]}")
        for n, gap in enumerate(gaps, start=1):
            base = retry_delay * 2 ** (n - 1)  # the n-th retry waits retry_delay * 2^(n-1), + up to 25 %
            assert base <= gap <= base * 1.25 + 0.5, f"item {item}: retry {n} came after {gap:.3f}s ({gaps})"
        assert mine[-1].start - mine[0].start >= retry_delay * (2 ** (attempts - 1) - 1)  # not "5 in 3 s"
    retried = [e for e in history(engine_of(feed), [key]) if e["kind"] == "item_retried"]
    assert len(retried) == 3 * (attempts - 1)
    for event in retried:
        base = retry_delay * 2 ** (event["detail"]["attempts"] - 1)
        assert base <= event["detail"]["retry_in"] <= base * 1.25 + 0.001, event

    up.set()
    assert run_cli(db_url, "retry", key).returncode == 0
    waiting(lambda: all_complete(feed, [key]), timeout=60, what="the retried partition", fleet=fleet, feed=feed)
    recovered = [c for c in calls(handler) if c.start > failing[-1].end]
    assert sorted(c.attempt for c in recovered if c.gate == 0) == [1, 1, 1]  # attempts start again at 1
    stored = stored_items(engine_of(feed), [key])
    assert len(stored) == expected_items(3, 2) and all(i.status == "complete" for i in stored)
    checks = [
        check_children_once(stored),
        check_barrier(recovered),
        check_completed_never_redelivered(stored, recovered),
    ]
    assert all(c.ok for c in checks), report(checks)
    kinds = [e["kind"] for e in history(engine_of(feed), [key])]
    assert kinds.count("item_failed") == 3 and kinds.count("retried") == 1 and kinds[-1] == "completed", kinds
