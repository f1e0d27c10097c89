"""Schedules in the store (feedproc/store/scheduling.py), on SQLite, PostgreSQL and MariaDB: a tick's
partition is created once however many watchers fire it at the same moment, downtime is caught up
with one partition (the latest tick), a new schedule fires nothing from before it was applied, a
key that exists already is skipped with its tick counted, a schedule taken out of the pipeline
loses its row, and `schedule_list` shows what comes next.

Clocks are injected (`now=`), starting after the moment the pipeline was applied (the database's
clock), so ticks come as the test says and never from the wall clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from feedproc.core.models import NewItem
from feedproc.core.pipelines import PipelineSpec, parse_toml
from feedproc.store import Store
from feedproc.store.schema import partitions, schedules

HOUR = timedelta(hours=1)
QUEUE = "reports"


def spec(*schedule_tables: str, queue: str = QUEUE) -> PipelineSpec:
    """A pipeline of two gates (fetch, render) and these [[schedule]] tables."""
    text = f'queue = "{queue}"\n[[gate]]\nname = "fetch"\nnumber = 0\n[[gate]]\nname = "render"\nnumber = 1\n'
    return parse_toml(text + "".join(f"\n[[schedule]]\n{table}\n" for table in schedule_tables))


HOURLY = spec(
    'name = "hourly"\ncron = "0 * * * *"\nkey = "hourly-{date:%Y%m%d%H}"\npriority = 7\n'
    'items = [{gate = "fetch", data = {n = 1}}, {gate = "render", data = {n = 2}}]'
)


def key_at(tick: datetime) -> str:
    return f"hourly-{tick:%Y%m%d%H}"


def applied(store: Store, spec_: PipelineSpec = HOURLY) -> datetime:
    """Apply `spec_`; returns the first full hour after it was applied (the first tick it may fire)."""
    store.apply_pipeline(spec_)
    last_tick = store.schedule_list(spec_.queue)[0]["last_tick"]
    moment = datetime.fromisoformat(last_tick)
    return moment.replace(minute=0, second=0, microsecond=0) + HOUR


def schedule_rows(store: Store) -> list[tuple[Any, ...]]:
    with store.read() as conn:
        return [tuple(row) for row in conn.execute(select(schedules.c.queue, schedules.c.name).order_by("name"))]


def partition_keys(store: Store) -> list[str]:
    with store.read() as conn:
        return list(conn.execute(select(partitions.c.key).order_by(partitions.c.key)).scalars())


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- firing


def test_a_due_tick_creates_its_partition_with_the_schedules_items_and_priority(store: Store) -> None:
    first = applied(store)
    assert store.fire_schedules(QUEUE, now=first + timedelta(minutes=5)) == [key_at(first)]
    status = store.status(key_at(first), history=5)
    assert (status["queue"], status["priority"], status["items"]["total"]) == (QUEUE, 7, 2)
    created = [event for event in status["history"] if event["kind"] == "created"]
    assert created and created[0]["detail"]["schedule"] == "hourly"


def test_each_tick_is_created_once_when_three_watchers_fire_at_the_same_moments(db_url: str, store: Store) -> None:
    first = applied(store)
    ticks = [first + n * HOUR for n in range(6)]
    stores = [Store(db_url) for _ in range(3)]
    start = threading.Barrier(len(stores))
    created: list[list[str]] = [[] for _ in stores]
    errors: list[BaseException] = []

    def watcher(n: int) -> None:
        try:
            for tick in ticks:
                start.wait(timeout=30)  # every watcher fires the same clock at once
                created[n] += stores[n].fire_schedules(QUEUE, now=tick + timedelta(seconds=30))
        except BaseException as error:  # reported by the test
            errors.append(error)
            start.abort()

    threads = [threading.Thread(target=watcher, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for other in stores:
        other.close()
    assert not errors, errors
    everything = [key for keys in created for key in keys]
    assert sorted(everything) == [key_at(tick) for tick in ticks]  # each tick once, none twice
    assert partition_keys(store) == [key_at(tick) for tick in ticks]


def test_a_tick_fired_already_is_not_fired_again(store: Store) -> None:
    first = applied(store)
    assert store.fire_schedules(QUEUE, now=first) == [key_at(first)]
    assert store.fire_schedules(QUEUE, now=first + timedelta(minutes=59)) == []


def test_after_downtime_only_the_latest_missed_tick_is_created(store: Store) -> None:
    first = applied(store)
    back = first + 5 * HOUR + timedelta(minutes=20)  # ticks first .. first+5h were all missed
    assert store.fire_schedules(QUEUE, now=back) == [key_at(first + 5 * HOUR)]
    assert store.fire_schedules(QUEUE, now=back) == []
    assert partition_keys(store) == [key_at(first + 5 * HOUR)]


def test_a_new_schedule_does_not_fire_the_ticks_before_it_was_applied(store: Store) -> None:
    yearly = spec('name = "yearly"\ncron = "0 0 1 1 *"\nkey = "yearly-{date:%Y}"')  # last tick: January 1st
    store.apply_pipeline(yearly)
    assert store.fire_schedules(QUEUE) == []  # on the database's clock
    assert partition_keys(store) == []


def test_a_key_that_exists_already_is_skipped_and_its_tick_counted(store: Store) -> None:
    first = applied(store)
    store.add_partition(key_at(first), [NewItem(0, b'"mine"')], queue="elsewhere")
    assert store.fire_schedules(QUEUE, now=first + timedelta(minutes=1)) == []
    status = store.status(key_at(first))
    assert (status["queue"], status["items"]["total"]) == ("elsewhere", 1)  # untouched
    (row,) = store.schedule_list(QUEUE, now=first + timedelta(minutes=1))
    assert (row["last_tick"], row["last_key"]) == (iso(first), key_at(first))
    assert store.fire_schedules(QUEUE, now=first + timedelta(minutes=2)) == []


def test_a_queue_without_a_pipeline_fires_nothing(store: Store) -> None:
    assert store.fire_schedules("nothing-here", now=datetime.now(UTC)) == []


def test_changing_a_schedule_keeps_its_last_tick(store: Store) -> None:
    first = applied(store)
    store.fire_schedules(QUEUE, now=first)
    store.apply_pipeline(spec('name = "hourly"\ncron = "0 * * * *"\nkey = "h-{date:%Y%m%d%H}"'))
    assert store.fire_schedules(QUEUE, now=first + timedelta(minutes=30)) == []  # that tick is done
    assert store.fire_schedules(QUEUE, now=first + HOUR) == [f"h-{first + HOUR:%Y%m%d%H}"]


def test_a_schedule_taken_out_of_the_pipeline_loses_its_row(store: Store) -> None:
    daily = 'name = "daily"\ncron = "0 6 * * *"\nkey = "daily-{date:%Y%m%d}"'
    hourly = 'name = "hourly"\ncron = "0 * * * *"\nkey = "hourly-{date:%Y%m%d%H}"'
    store.apply_pipeline(spec(daily, hourly))
    assert schedule_rows(store) == [(QUEUE, "daily"), (QUEUE, "hourly")]
    store.apply_pipeline(spec(daily))
    assert schedule_rows(store) == [(QUEUE, "daily")]
    assert [row["name"] for row in store.schedule_list(QUEUE)] == ["daily"]


# ---------------------------------------------------------------- schedule_list


def test_schedule_list_shows_the_next_ticks_and_the_next_key(store: Store) -> None:
    first = applied(store)
    now = first + timedelta(minutes=10)
    (row,) = store.schedule_list(QUEUE, now=now, count=3)
    assert row == {
        "queue": QUEUE,
        "name": "hourly",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "key": "hourly-{date:%Y%m%d%H}",
        "priority": 7,
        "items": 2,
        "last_tick": row["last_tick"],  # when it was applied
        "last_key": None,
        "next_ticks": [iso(first + HOUR), iso(first + 2 * HOUR), iso(first + 3 * HOUR)],
        "next_key": key_at(first + HOUR),
    }
    assert datetime.fromisoformat(row["last_tick"]) < first


def test_schedule_list_counts_from_the_last_tick_when_it_is_later_than_now(store: Store) -> None:
    first = applied(store)
    store.fire_schedules(QUEUE, now=first + 2 * HOUR)
    (row,) = store.schedule_list(QUEUE, now=first, count=1)
    assert (row["last_key"], row["next_ticks"], row["next_key"]) == (
        key_at(first + 2 * HOUR),
        [iso(first + 3 * HOUR)],
        key_at(first + 3 * HOUR),
    )


def test_schedule_list_without_a_queue_shows_every_pipelines_schedules(store: Store) -> None:
    store.apply_pipeline(HOURLY)
    store.apply_pipeline(spec('name = "daily"\ncron = "0 6 * * *"\nkey = "d-{date:%Y%m%d}"', queue="archive"))
    assert [(row["queue"], row["name"]) for row in store.schedule_list()] == [("archive", "daily"), (QUEUE, "hourly")]
    assert [row["name"] for row in store.schedule_list("archive")] == ["daily"]
    assert store.schedule_list("no-pipeline") == []
