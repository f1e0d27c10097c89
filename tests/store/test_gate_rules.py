"""The gate rules against the real store: a hypothesis state machine drives a Store on SQLite through
random producer operations and watcher answers and checks the rules after every step."""

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select

from feedproc.core.errors import Refused
from feedproc.core.gates import initial_gate
from feedproc.core.models import NewItem
from feedproc.core.records import Kind, ReadyItem
from feedproc.store import Store
from feedproc.store.schema import items, partitions

from ..support import answer

# ---------------------------------------------------------------- the rules against the real Store (SQLite)

WATCHER = "w-model"
KEYS = ("p0", "p1")
TERMINAL = ("complete", "cancelled")


def item_rows(store: Store, key: str) -> list[tuple[Any, ...]]:
    """Every item of partition `key` as (id, gate, status, attempts, version), by id."""
    with store.read() as conn:
        rows = conn.execute(
            select(items.c.id, items.c.gate, items.c.status, items.c.attempts, items.c.version)
            .join(partitions, partitions.c.id == items.c.partition_id)
            .where(partitions.c.key == key)
            .order_by(items.c.id)
        ).all()
    return [tuple(r) for r in rows]


def snapshot(store: Store) -> dict[str, tuple[dict[str, Any], list[tuple[Any, ...]]]]:
    return {key: (store.status(key), item_rows(store, key)) for key in KEYS}


class GateMachine(RuleBasedStateMachine):
    """Two partitions in one SQLite file, driven by producer operations and one watcher's answers."""

    def __init__(self, template: Path, workdir: Path) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(dir=workdir))
        shutil.copy(template, self.dir / "feedproc.db")
        self.store = Store(f"sqlite:///{self.dir / 'feedproc.db'}")
        self.store.register_watcher(
            WATCHER, host="test", pid=1, queue="default", concurrency=4, capacity=8, lease_seconds=600
        )
        self.gate: dict[str, int] = {}  # highest gate seen per partition: a gate never goes down
        self.completed: set[int] = set()  # ids of items seen complete: they stay complete
        self.final: dict[str, str] = {}  # status of partitions seen complete or cancelled: terminal
        self.delivered: list[ReadyItem] = []  # every ReadyItem fetched so far, for late answers
        self.checkpointed: set[str] = set()  # partitions an operator's checkpoint moved in the last step

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ set-up

    @initialize(
        gates0=st.lists(st.integers(0, 4), max_size=4),
        gates1=st.lists(st.integers(0, 4), max_size=4),
        sealed=st.tuples(st.booleans(), st.booleans()),
        manual=st.tuples(st.booleans(), st.booleans()),
    )
    def create(
        self, gates0: list[int], gates1: list[int], sealed: tuple[bool, bool], manual: tuple[bool, bool]
    ) -> None:
        for key, gates_, s, m in zip(KEYS, (gates0, gates1), sealed, manual, strict=True):
            self.store.add_partition(key, [(g, b"{}") for g in gates_], sealed=s, manual_checkpoint=m)
            status = self.store.status(key)
            assert status["gate"] == initial_gate(gates_), "rule 1: the lowest gate among the items"
            self.gate[key] = status["gate"]

    # ------------------------------------------------------------ producers

    def _refusable(self, operation: Callable[[], Any]) -> Any:
        """Run a producer operation; a refusal must leave everything as it was."""
        before = snapshot(self.store)
        try:
            return operation()
        except Refused:
            assert snapshot(self.store) == before, "a refused operation wrote something"
            return None

    @rule(key=st.sampled_from(KEYS), offsets=st.lists(st.integers(-1, 3), min_size=1, max_size=3))
    def add_items(self, key: str, offsets: list[int]) -> None:
        status = self.store.status(key)
        gates_ = [max(status["gate"] + o, 0) for o in offsets]
        before = len(item_rows(self.store, key))
        added = self._refusable(lambda: self.store.add_items(key, [(g, b"{}") for g in gates_]))
        if added is None:
            assert status["sealed"] or status["status"] != "available" or min(gates_) < status["gate"]
        else:
            assert status["status"] == "available" and not status["sealed"]
            assert min(gates_) >= status["gate"], "rule 4: an item below the partition's gate was accepted"
            assert len(item_rows(self.store, key)) == before + len(gates_)

    @rule(key=st.sampled_from(KEYS))
    def seal(self, key: str) -> None:
        before = self.store.status(key)
        self._refusable(lambda: self.store.seal(key))
        after = self.store.status(key)
        if before["status"] != "cancelled":
            assert after["sealed"]
        if before["status"] == "available" and before["items"]["available"] == 0:
            assert after["status"] == "complete", "sealing a drained partition completes it"

    @rule(key=st.sampled_from(KEYS))
    def checkpoint(self, key: str) -> None:
        before = self.store.status(key)
        gate = before["gate"]
        above = sorted(int(g) for g, c in before["gates"].items() if int(g) > gate and c["available"])
        here = before["gates"].get(str(gate), {"available": 0, "failed": 0})
        new_gate = self._refusable(lambda: self.store.checkpoint(key))
        allowed = before["manual_checkpoint"] and before["status"] == "available" and not here["available"] and above
        if new_gate is None:
            assert not allowed, f"checkpoint refused although allowed: {before}"
        else:
            assert allowed
            assert new_gate == above[0], "checkpoint moves to the next gate that holds work"
            event("checkpoint advanced")
            assert self.store.status(key)["gate"] == new_gate
            self.checkpointed.add(key)

    @rule(key=st.sampled_from(KEYS))
    def retry(self, key: str) -> None:
        before = self.store.status(key)
        count = self._refusable(lambda: self.store.retry(key))
        if count is None:
            assert before["status"] != "failed"
            return
        assert before["status"] == "failed"
        assert count == before["items"]["failed"]
        after = self.store.status(key)
        assert after["status"] == "available" and after["items"]["failed"] == 0
        retried = {f["id"] for f in before["failed_items"]}
        assert all(attempts == 0 for id_, _, _, attempts, _ in item_rows(self.store, key) if id_ in retried)

    @rule(key=st.sampled_from(KEYS), now=st.sampled_from([True, False, False, False, False]))
    def cancel(self, key: str, now: bool) -> None:
        if not now:  # cancelling is terminal: keep it rare so the other rules get to run
            return
        before = self.store.status(key)
        self._refusable(lambda: self.store.cancel(key))
        after = self.store.status(key)
        if before["status"] == "complete":
            assert after == before
            return
        assert after["status"] == "cancelled"
        assert after["items"]["available"] == 0
        assert after["items"]["failed"] == before["items"]["failed"], "failed items stay failed on cancel"
        if before["status"] == "cancelled":
            assert after == before, "cancelling a cancelled partition is a no-op"

    # ------------------------------------------------------------ the watcher

    def _fetch(self) -> list[ReadyItem]:
        """Lease what has work and fetch every ready item, checking rule 2 and liveness on the way."""
        self.store.acquire(WATCHER, "default", 10, 600)
        ready = self.store.fetch_ready(WATCHER, 500)
        for key in KEYS:
            status = self.store.status(key)
            mine = [r for r in ready if r.partition == key]
            here = status["gates"].get(str(status["gate"]), {}).get("available", 0)
            assert all(r.gate == status["gate"] for r in mine), "rule 2: dispatched off the current gate"
            if status["status"] == "available" and here:
                assert mine, f"{key} has due work at its gate but nothing was dispatched: {status}"
            else:
                assert not mine
        assert not {r.id for r in ready} & self.completed, "a completed item was dispatched again"
        self.delivered += ready
        return ready

    def _answer(self, ready: ReadyItem, kind: Kind, step: int, children: list[int]) -> None:
        outcome = answer(
            ready,
            kind,
            new_gate=ready.gate + step if kind == Kind.MOVE else None,
            children=tuple(NewItem(ready.gate + c, b"{}") for c in children) if kind in (Kind.DONE, Kind.MOVE) else (),
            attempts=1 if kind in (Kind.FAIL, Kind.RETRY) else 0,
            error="boom" if kind in (Kind.FAIL, Kind.RETRY) else None,
        )
        before = snapshot(self.store)
        applied = self.store.apply(WATCHER, [outcome])
        event(f"answer {kind}")
        assert applied.written == [ready.id]
        rows = {r[0]: r for r in item_rows(self.store, ready.partition)}
        expected = {Kind.DONE: "complete", Kind.FAIL: "failed"}.get(kind, "available")
        assert rows[ready.id][2] == expected
        assert rows[ready.id][1] == (outcome.new_gate if kind == Kind.MOVE else ready.gate)
        new = len(rows) - len(before[ready.partition][1])
        assert new == len(outcome.children), "children are inserted with the answer, once"

    answers = st.sampled_from([Kind.DONE, Kind.DONE, Kind.MOVE, Kind.MOVE, Kind.FAIL, Kind.RETRY, Kind.LATER])

    @rule(
        pick=st.integers(0, 20), kind=answers, step=st.integers(1, 3), children=st.lists(st.integers(0, 3), max_size=2)
    )
    def work(self, pick: int, kind: Kind, step: int, children: list[int]) -> None:
        ready = self._fetch()
        event(f"work: {len(ready)} ready")
        if ready:
            self._answer(ready[pick % len(ready)], kind, step, children)

    @rule(pick=st.integers(0, 1000), kind=answers, step=st.integers(1, 3))
    def answer_an_old_delivery(self, pick: int, kind: Kind, step: int) -> None:
        """A late or repeated answer: written only if the delivery is still current, else nothing changes."""
        if not self.delivered:
            return
        old = self.delivered[pick % len(self.delivered)]
        current = {r.id: r for r in self._fetch()}.get(old.id)
        if current is not None and (current.version, current.epoch) == (old.version, old.epoch):
            self._answer(old, kind, step, [])
            return
        before = snapshot(self.store)
        outcome = answer(
            old,
            kind,
            new_gate=old.gate + step if kind == Kind.MOVE else None,
            attempts=1 if kind in (Kind.FAIL, Kind.RETRY) else 0,
            error="boom",
        )
        applied = self.store.apply(WATCHER, [outcome])
        assert applied.written == [], f"a stale answer was written: {outcome}"
        if applied.superseded:
            event("stale answer: version")
            assert applied.superseded == [old.id]
        else:
            event("stale answer: fenced")
            assert applied.lost == {old.partition_id}
        assert snapshot(self.store) == before, "a stale answer changed something"

    # ------------------------------------------------------------ invariants

    @invariant()
    def gate_rules_hold(self) -> None:
        if not self.gate:
            return
        for key in KEYS:
            status = self.store.status(key)
            rows = item_rows(self.store, key)
            gate, state = status["gate"], status["status"]
            assert gate >= self.gate[key], f"{key}: the gate went down from {self.gate[key]} to {gate}"
            if status["manual_checkpoint"] and key not in self.checkpointed:
                assert gate == self.gate[key], f"{key}: a manual-checkpoint gate moved without a checkpoint"
            self.gate[key] = gate
            if key in self.final:
                assert state == self.final[key], f"{key} left terminal status {self.final[key]} for {state}"
            if state in TERMINAL:
                self.final[key] = state
            event(f"status {state}")
            by_status = Counter(s for _, _, s, _, _ in rows)
            here = Counter(s for _, g, s, _, _ in rows if g == gate)
            above = [g for _, g, s, _, _ in rows if g > gate and s == "available"]
            # rule 4 and the barrier: nothing unfinished is ever left behind the gate
            assert not [r for r in rows if r[1] < gate and r[2] in ("available", "failed")], (key, gate, rows)
            if state == "available":
                # a failed item may wait beside available ones at the gate; once they drain, rule 3 fails it
                assert by_status["failed"] == here["failed"], f"{key}: a failed item off the current gate"
                if not here["available"]:  # drained: rule 3 must have left it waiting
                    assert not here["failed"], f"{key}: drained gate with a failed item but not failed"
                    if above:
                        assert status["manual_checkpoint"], f"{key} did not advance to gate {min(above)}"
                    else:
                        assert not status["sealed"], f"{key}: sealed and drained but not complete"
            elif state == "failed":
                assert here["failed"] and not here["available"], (key, rows)
                assert all(g == gate for _, g, s, _, _ in rows if s == "failed")
            elif state == "complete":
                assert status["sealed"]
                assert set(by_status) <= {"complete"}, f"{key}: complete with unfinished items {by_status}"
            elif state == "cancelled":
                assert by_status["available"] == 0
            else:
                pytest.fail(f"unknown status {state!r}")
            for id_, _, s, _, _ in rows:
                if id_ in self.completed:
                    assert s == "complete", f"item {id_} left complete for {s}"
                if s == "complete":
                    self.completed.add(id_)
            assert status["items"]["total"] == len(rows)
        self.checkpointed.clear()


def test_store_follows_the_gate_rules_under_random_operations(tmp_path: Path) -> None:
    template = tmp_path / "template.db"
    migrated = Store(f"sqlite:///{template}")
    migrated.migrate()
    migrated.close()
    run_state_machine_as_test(
        lambda: GateMachine(template, tmp_path),  # type: ignore[arg-type]  # a factory: typed as the class
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
