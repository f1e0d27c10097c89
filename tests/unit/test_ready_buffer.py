"""The buffer that serves partitions in turn (`watcher.flight.ReadyBuffer`): no database."""

from __future__ import annotations

import asyncio

import pytest

from feedproc.core.records import ReadyItem
from feedproc.watcher.flight import TURN, InFlight, ReadyBuffer


def ready(item_id: int, partition_id: int, priority: int = 0) -> ReadyItem:
    return ReadyItem(item_id, 1, partition_id, f"p{partition_id}", "default", 1, 0, 0, b"{}", priority=priority)


def buffer_of(*items: ReadyItem) -> ReadyBuffer:
    flight = InFlight()
    buffer = ReadyBuffer(flight)
    for item in items:
        flight.add(item)
        buffer.put(item)
    return buffer


def drain(buffer: ReadyBuffer) -> list[int]:
    taken: list[int] = []
    while True:
        try:
            item = buffer.get_nowait()
        except asyncio.QueueEmpty:
            return taken
        assert item is not None
        taken.append(item.id)


def test_the_buffer_serves_partitions_in_turns_of_turn_items_each_in_its_own_order() -> None:
    big = [ready(n, partition_id=1) for n in range(1, 2 * TURN + 5)]
    small = [ready(n, partition_id=2) for n in (1001, 1002)]
    taken = drain(buffer_of(*big, *small))
    assert taken == [*range(1, TURN + 1), 1001, 1002, *range(TURN + 1, 2 * TURN + 5)]


def test_each_partition_gets_a_turn_in_rotation() -> None:
    items = [ready(100 * p + n, partition_id=p) for p in (1, 2, 3) for n in range(TURN + 1)]
    taken = drain(buffer_of(*items))
    turns = [taken[i] // 100 for i in range(0, 3 * TURN, TURN)] + [taken[-3] // 100]
    assert turns == [1, 2, 3, 1]


def test_the_buffer_serves_the_highest_priority_first() -> None:
    items = [ready(1, 1), ready(2, 1), ready(11, 2, priority=5), ready(3, 1), ready(12, 2, priority=5)]
    assert drain(buffer_of(*items)) == [11, 12, 1, 2, 3]


def test_a_batch_takes_its_own_partitions_next_item_first() -> None:
    buffer = buffer_of(ready(1, 1), ready(11, 2), ready(2, 1))
    first = buffer.get_nowait()
    assert first is not None
    assert [buffer.get_nowait(like=first).id for _ in range(2)] == [2, 11]  # type: ignore[union-attr]


def test_a_stop_signal_is_served_before_any_item() -> None:
    buffer = buffer_of(ready(1, 1))
    buffer.put(None)
    assert buffer.get_nowait() is None
    assert drain(buffer) == [1]


def test_dropping_takes_items_out_of_the_buffer_and_out_of_flight() -> None:
    flight = InFlight()
    buffer = ReadyBuffer(flight)
    for item in (ready(1, 1), ready(11, 2), ready(2, 1)):
        flight.add(item)
        buffer.put(item)
    buffer.drop_partition(1)
    assert buffer.size() == 1
    assert set(flight.items) == {11}
    assert drain(buffer) == [11]


def test_a_waiting_worker_gets_an_item_put_later() -> None:
    async def scenario() -> int | None:
        buffer = ReadyBuffer(InFlight())
        waiting = asyncio.ensure_future(buffer.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        buffer.put(ready(5, 1))
        item = await asyncio.wait_for(waiting, timeout=5)
        return None if item is None else item.id

    assert asyncio.run(scenario()) == 5


@pytest.mark.parametrize("workers", [1, 3])
def test_every_item_put_is_taken_once_by_waiting_workers(workers: int) -> None:
    async def scenario() -> list[int]:
        buffer = ReadyBuffer(InFlight())
        taken: list[int] = []

        async def worker() -> None:
            while (item := await buffer.get()) is not None:
                taken.append(item.id)
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
        for n in range(30):
            buffer.put(ready(n, n % 4))
            if n % 5 == 0:
                await asyncio.sleep(0)
        while buffer.size():  # (stop signals are served before items)
            await asyncio.sleep(0)
        for _ in tasks:
            buffer.put(None)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)
        return taken

    assert sorted(asyncio.run(scenario())) == list(range(30))
