"""Fault injection: a fan-out/fan-in workflow, a fleet of watcher processes that can be faulted, and
the invariant checks, in plain Python (no pytest), so that `cmds/soak.py` checks a soak run with
exactly the code `tests/e2e/test_faults.py` uses.

The workflow (one partition):

* `roots` items at gate 0, `{"kind": "root", "n": r, "fanout": F}`: each answers done and adds F
  children at gate 1, `{"kind": "child", "parent": <token>, "n": i}`;
* the children sleep `child_sleep` seconds in the handler, then answer done;
* one item at gate 2, `{"kind": "final"}`, answers done.

Every delivery gets a *token* (a number unique within the handler) and every answer stores
`{"token": <token>, "input": <the data it was delivered with>}` as the item's data, so the
database says which delivery's answer was committed, and which root answer a child came from.
The handler's log of deliveries (with the `X-Watcher` header each watcher sends) plus the database
is all the checks read.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from feedproc import HTTPProcessor, Item, Response
from feedproc.store.schema import events, items, partitions

WATCHER_HEADER = "X-Watcher"
DISPATCHED_HEADER = "X-Dispatched-At"

# ---------------------------------------------------------------- the workflow


def fan_out_items(roots: int, fanout: int) -> list[tuple[int, bytes]]:
    """The items of one workflow partition: `roots` roots at gate 0 and the final item at gate 2."""
    rows = [(0, {"kind": "root", "n": r, "fanout": fanout}) for r in range(roots)] + [(2, {"kind": "final"})]
    return [(gate, json.dumps(data).encode()) for gate, data in rows]


def expected_items(roots: int, fanout: int) -> int:
    return roots + roots * fanout + 1


class FanOut:
    """The handler's behaviour for the workflow (a `HandlerService.behavior`).

    `extra(body, earlier)` may add seconds to a delivery (`earlier`: how many deliveries of the
    same item came before it). Items of kind `hold` are answered "not yet" (they keep their
    partition busy). Each request body is annotated with its delivery's `token`.
    """

    def __init__(
        self,
        *,
        child_sleep: tuple[float, float] = (0.05, 0.15),
        extra: Callable[[dict[str, Any], int], float] | None = None,
        seed: int | None = None,
    ) -> None:
        self.child_sleep = child_sleep
        self.extra = extra
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._rng = random.Random(seed)
        self._seen: Counter[int] = Counter()
        self.started: list[tuple[float, dict[str, Any]]] = []  # (time.time(), body) as each delivery began

    def __call__(self, body: dict[str, Any]) -> tuple[Any, ...]:
        now = time.time()
        with self._lock:
            token = next(self._tokens)
            earlier = self._seen[body["id"]]
            self._seen[body["id"]] += 1
            pause = self._rng.uniform(*self.child_sleep)
            self.started.append((now, body))
        body["token"] = token
        data = body["data"]
        kind = data["kind"]
        if kind == "hold":
            return 200, {"gate": body["gate"], "retry_after": 0.1}
        answer: dict[str, Any] = {"done": True, "data": {"token": token, "input": data}}
        if kind == "root":
            answer["items"] = [
                {"gate": 1, "data": {"kind": "child", "parent": token, "n": n}} for n in range(data["fanout"])
            ]
        sleep = pause if kind == "child" else 0.0
        if self.extra is not None:
            sleep += self.extra(body, earlier)
        return 200, answer, {}, sleep

    def starts(self, **where: Any) -> list[dict[str, Any]]:
        """Bodies of the deliveries that began so far, filtered by body fields (`partition=...`)."""
        with self._lock:
            bodies = [body for _, body in self.started]
        return [b for b in bodies if all(b.get(k) == v for k, v in where.items())]


# ---------------------------------------------------------------- a processor that says when it dispatched

_dispatched: ContextVar[float] = ContextVar("feedproc_faults_dispatched", default=0.0)


class StampedHTTP(HTTPProcessor):
    """feedproc's HTTP processor with two more headers: `X-Watcher` ($FEEDPROC_FAULTS_WATCHER) and
    `X-Dispatched-At`, the time the watcher called the processor, right after it decided to deliver.

    A request a watcher sent just before it was stopped may reach the handler only after it is
    continued; from the handler's clock alone that looks like a delivery decided after the stall.
    `feedproc watch --processor tests.faults_support:StampedHTTP` (with $FEEDPROC_FAULTS_HANDLER,
    the handler's URL) lets the checks tell the two apart.
    """

    def __init__(self) -> None:
        watcher = {WATCHER_HEADER: os.environ.get("FEEDPROC_FAULTS_WATCHER", "?")}
        super().__init__(os.environ["FEEDPROC_FAULTS_HANDLER"], headers=watcher, max_connections=10)

    def request_headers(self) -> Mapping[str, str]:
        return {**super().request_headers(), DISPATCHED_HEADER: f"{_dispatched.get():.6f}"}

    async def process(self, item: Item) -> Response:
        _dispatched.set(time.time())  # each worker is its own task: its own context
        return await super().process(item)


# ---------------------------------------------------------------- deliveries and faults


@dataclass(frozen=True, slots=True)
class Call:
    """One delivery as the handler saw it (wall-clock times)."""

    token: int
    item: int
    partition: str
    gate: int
    attempt: int
    watcher: str
    start: float  # the handler began reading the request
    end: float  # the handler had its answer
    sent: float  # the watcher decided to deliver it (its X-Dispatched-At header; else `start`)


def calls_from(deliveries: Iterable[Any]) -> list[Call]:
    """`Call`s from recorded deliveries (objects with `body`, `headers`, `start`, `end`)."""
    return [
        Call(
            d.body.get("token", 0),
            d.body["id"],
            d.body["partition"],
            d.body["gate"],
            d.body["attempt"],
            d.headers.get(WATCHER_HEADER.lower(), "?"),
            d.start,
            d.end,
            float(d.headers.get(DISPATCHED_HEADER.lower(), d.start)),
        )
        for d in deliveries
    ]


@dataclass(frozen=True, slots=True)
class Fault:
    """A signal sent to a watcher: `kill` (SIGKILL), `stop` (SIGSTOP), `cont`, `term` (SIGTERM)."""

    kind: str
    watcher: str
    at: float  # time.time() right after the signal was sent


# ---------------------------------------------------------------- a fleet of watcher processes

Starter = Callable[[str, Sequence[str]], tuple["subprocess.Popen[bytes]", Path]]  # (name, arguments)


@dataclass
class Member:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def count(self, fragment: str) -> int:
        return sum(fragment in line for line in self.text().splitlines())

    @property
    def id(self) -> str | None:
        """The watcher id it logged on start (`host:pid:uuid`), once it has."""
        found = re.search(r"watcher (\S+) on queue", self.text())
        return found.group(1) if found else None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class Fleet:
    """Named watcher processes (the starter makes each send `X-Watcher: <name>`); faults are recorded."""

    def __init__(self, start: Starter) -> None:
        self._start = start
        self.members: dict[str, Member] = {}
        self.faults: list[Fault] = []

    def start(self, name: str, *args: str) -> Member:
        assert name not in self.members, f"watcher name {name} used twice"
        process, log = self._start(name, list(args))
        member = self.members[name] = Member(name, process, log)
        return member

    def __getitem__(self, name: str) -> Member:
        return self.members[name]

    def by_id(self, watcher_id: str | None) -> Member | None:
        return next((m for m in self.members.values() if watcher_id and m.id == watcher_id), None)

    def _signal(self, name: str, signum: int, kind: str) -> Fault:
        member = self.members[name]
        os.kill(member.process.pid, signum)
        fault = Fault(kind, name, time.time())
        self.faults.append(fault)
        return fault

    def kill(self, name: str) -> Fault:
        fault = self._signal(name, signal.SIGKILL, "kill")
        self.members[name].process.wait(timeout=10)
        return fault

    def stop(self, name: str) -> Fault:
        self.members[name].stopped = True
        return self._signal(name, signal.SIGSTOP, "stop")

    def cont(self, name: str) -> Fault:
        self.members[name].stopped = False
        return self._signal(name, signal.SIGCONT, "cont")

    def term(self, name: str) -> Fault:
        return self._signal(name, signal.SIGTERM, "term")

    def resume_all(self) -> None:
        """SIGCONT every stopped member (so that it can be stopped cleanly)."""
        for member in self.members.values():
            if member.stopped and member.alive:
                os.kill(member.process.pid, signal.SIGCONT)
                member.stopped = False

    def stop_all(self, timeout: float = 20.0) -> None:
        self.resume_all()
        for member in self.members.values():
            if member.alive:
                member.process.send_signal(signal.SIGTERM)
        for member in self.members.values():
            try:
                member.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait(timeout=10)


# ---------------------------------------------------------------- the database


@dataclass(frozen=True, slots=True)
class StoredItem:
    id: int
    partition: str
    gate: int
    status: str
    attempts: int
    data: Any

    @property
    def token(self) -> int | None:
        """The token of the delivery whose answer is stored (None: no answer stored yet)."""
        return self.data.get("token") if isinstance(self.data, dict) and "input" in self.data else None

    @property
    def input(self) -> Any:
        """The data the item was created with."""
        return self.data["input"] if self.token is not None else self.data

    @property
    def kind(self) -> str | None:
        return self.input.get("kind") if isinstance(self.input, dict) else None


def stored_items(engine: Engine, keys: Iterable[str] | None = None) -> list[StoredItem]:
    query = select(items.c.id, partitions.c.key, items.c.gate, items.c.status, items.c.attempts, items.c.data).join(
        partitions, items.c.partition_id == partitions.c.id
    )
    if keys is not None:
        query = query.where(partitions.c.key.in_(list(keys)))
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(items.c.id)).all()
    return [StoredItem(r.id, r.key, r.gate, r.status, r.attempts, json.loads(r.data)) for r in rows]


def stored_partitions(engine: Engine, keys: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    query = select(
        partitions.c.key,
        partitions.c.status,
        partitions.c.gate,
        partitions.c.lease_owner,
        partitions.c.lease_epoch,
        partitions.c.lease_expires_at,
        partitions.c.sealed,
    )
    if keys is not None:
        query = query.where(partitions.c.key.in_(list(keys)))
    with engine.connect() as conn:
        return {r.key: dict(r._mapping) for r in conn.execute(query)}


def history(engine: Engine, keys: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every event of the partitions (`key`, `kind`, `item`, `watcher`, `detail`, `at`), oldest first."""
    query = select(
        partitions.c.key, events.c.kind, events.c.item_id, events.c.watcher, events.c.detail, events.c.at
    ).join(partitions, events.c.partition_id == partitions.c.id)
    if keys is not None:
        query = query.where(partitions.c.key.in_(list(keys)))
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(events.c.id)).all()
    return [
        {
            "key": r.key,
            "kind": r.kind,
            "item": r.item_id,
            "watcher": r.watcher,
            "detail": json.loads(r.detail) if r.detail else None,
            "at": r.at.timestamp(),
        }
        for r in rows
    ]


# ---------------------------------------------------------------- invariant checks


@dataclass
class Check:
    name: str
    summary: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"[{'PASS' if self.ok else 'FAIL'}] {self.name}: {self.summary}"
        shown = self.problems[:20]
        more = [f"... and {len(self.problems) - len(shown)} more"] if len(self.problems) > len(shown) else []
        return "\n".join([head, *(f"    - {p}" for p in [*shown, *more])])


def _at(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def check_all_complete(parts: dict[str, dict[str, Any]], stored: list[StoredItem], keys: Iterable[str]) -> Check:
    keys = list(keys)
    problems = [f"partition {k} is missing" for k in keys if k not in parts]
    problems += [
        f"partition {k} is {parts[k]['status']} at gate {parts[k]['gate']}"
        for k in keys
        if k in parts and parts[k]["status"] != "complete"
    ]
    problems += [
        f"item {i.id} of {i.partition} is {i.status} at gate {i.gate}" for i in stored if i.status != "complete"
    ]
    return Check("all complete", f"{len(keys)} partitions, {len(stored)} items", problems)


def _keepers(stored: Sequence[StoredItem], calls: Sequence[Call]) -> dict[tuple[int, int], Call]:
    """For each (item, gate) delivered, the delivery that counted: at the item's stored gate the
    one whose answer is stored, at a gate it moved on from the last one."""
    committed = {i.id: (i.gate, i.token) for i in stored}
    by_token = {c.token: c for c in calls}
    keepers: dict[tuple[int, int], Call] = {}
    for call in sorted(calls, key=lambda c: c.start):
        keepers[(call.item, call.gate)] = call
    for item, (gate, token) in committed.items():
        answer = by_token.get(token) if token is not None else None
        if answer is not None and answer.item == item and answer.gate == gate:
            keepers[(item, gate)] = answer
    return keepers


def check_barrier(calls: Sequence[Call], stored: Sequence[StoredItem] | None = None) -> Check:
    """No item at gate h of a partition is dispatched before the deliveries that counted at every
    lower gate have ended. (Given `stored`, a repeated delivery whose answer was not the one stored
    — a stale one — does not count; without it every delivery does.)"""
    counted = set(map(id, _keepers(stored, calls).values())) if stored is not None else set(map(id, calls))
    by_partition: dict[str, list[Call]] = defaultdict(list)
    for call in calls:
        by_partition[call.partition].append(call)
    problems: list[str] = []
    crossings = 0
    closest = float("inf")
    for key, mine in sorted(by_partition.items()):
        gates = sorted({c.gate for c in mine})
        for lower, higher in itertools.pairwise(gates):
            below = [c for c in mine if c.gate <= lower and id(c) in counted]
            if not below:
                continue
            crossings += 1
            last_below = max(below, key=lambda c: c.end)
            first_above = min((c for c in mine if c.gate == higher), key=lambda c: c.sent)
            closest = min(closest, first_above.sent - last_below.end)
            if first_above.sent < last_below.end:
                problems.append(
                    f"{key}: item {first_above.item} at gate {higher} dispatched {_at(first_above.sent)} "
                    f"({first_above.watcher}) before item {last_below.item} at gate {last_below.gate} "
                    f"ended {_at(last_below.end)} ({last_below.watcher})"
                )
    margin = f"; smallest margin {closest * 1000:.0f} ms" if crossings else ""
    summary = f"{len(by_partition)} partitions, {crossings} gate crossings{margin}"
    return Check("barrier never crossed", summary, problems)


def _committed(stored: Sequence[StoredItem], calls: Sequence[Call]) -> dict[int, Call | None]:
    """For each stored item with an answer, the delivery whose answer was committed."""
    by_token = {c.token: c for c in calls}
    return {i.id: by_token.get(i.token) for i in stored if i.token is not None}


def check_completed_never_redelivered(stored: Sequence[StoredItem], calls: Sequence[Call]) -> Check:
    """Each complete item's stored answer came from one of its deliveries, and no delivery of the
    item was dispatched after that delivery ended."""
    by_item: dict[int, list[Call]] = defaultdict(list)
    for call in calls:
        by_item[call.item].append(call)
    committed = _committed(stored, calls)
    problems: list[str] = []
    complete = [i for i in stored if i.status == "complete"]
    for item in complete:
        if item.token is None:
            continue  # completed without an answer of ours (not a workflow item)
        keeper = committed.get(item.id)
        if keeper is None or keeper.item != item.id:
            problems.append(f"item {item.id} of {item.partition}: stored answer token {item.token} is not its delivery")
            continue
        later = [c for c in by_item[item.id] if c.sent > keeper.end]
        problems += [
            f"item {item.id} of {item.partition} completed by {keeper.watcher} (delivery ended {_at(keeper.end)}) "
            f"was delivered again at {_at(c.sent)} by {c.watcher} (gate {c.gate}, attempt {c.attempt})"
            for c in later
        ]
    return Check("completed items never delivered again", f"{len(complete)} complete items", problems)


def check_children_once(stored: Sequence[StoredItem]) -> Check:
    """Every root's children come from its committed answer only, exactly once each."""
    problems: list[str] = []
    roots = {i.token: i for i in stored if i.kind == "root" and i.token is not None}
    children: dict[int, list[int]] = defaultdict(list)
    for item in stored:
        if item.kind == "child":
            children[item.input["parent"]].append(item.input["n"])
    for parent, numbers in children.items():
        if parent not in roots:
            problems.append(f"{len(numbers)} children come from delivery {parent}, whose answer is not stored")
    for token, root in roots.items():
        expected = list(range(root.input["fanout"]))
        got = sorted(children.get(token, []))
        if got != expected:
            problems.append(f"root {root.id} of {root.partition}: children {got}, expected {expected}")
    unanswered = [i.id for i in stored if i.kind == "root" and i.token is None]
    if unanswered:
        problems.append(f"roots without an answer: {unanswered}")
    total = sum(len(v) for v in children.values())
    return Check("children exactly once", f"{len(roots)} roots, {total} children", problems)


def check_redeliveries(stored: Sequence[StoredItem], calls: Sequence[Call], faults: Sequence[Fault]) -> Check:
    """A delivery is repeated only when the watcher that made it was killed, or stopped, while it
    was in flight: the delivery that counted began after that fault, and (for a stop) the repeated
    one was dispatched before the watcher was continued. (The handler may begin a request a moment
    after a kill or stop: the watcher sent it before.)"""
    keepers = _keepers(stored, calls)
    groups: dict[tuple[int, int], list[Call]] = defaultdict(list)
    for call in calls:
        groups[(call.item, call.gate)].append(call)
    windows: list[tuple[Fault, float]] = []  # (kill or stop, when the watcher could dispatch again)
    for n, fault in enumerate(faults):
        if fault.kind == "kill":
            windows.append((fault, float("inf")))
        elif fault.kind == "stop":
            cont = next((f.at for f in faults[n + 1 :] if f.kind == "cont" and f.watcher == fault.watcher), None)
            windows.append((fault, float("inf") if cont is None else cont))
    problems: list[str] = []
    repeated = 0
    excused: Counter[str] = Counter()
    for (item, gate), group in sorted(groups.items()):
        if len(group) < 2:
            continue
        keeper = keepers[(item, gate)]
        for call in sorted(group, key=lambda c: c.start):
            if call is keeper:
                continue
            repeated += 1
            reason = next(
                (
                    f
                    for f, resumed in windows
                    if f.watcher == call.watcher and call.sent < resumed and f.at < keeper.start
                ),
                None,
            )
            if reason is None:
                problems.append(
                    f"item {item} (gate {gate}) delivered by {call.watcher} at {_at(call.sent)} "
                    f"and by {keeper.watcher} at {_at(keeper.start)} (the delivery that counted), with no kill "
                    f"or stop of {call.watcher} while it was in flight"
                )
            else:
                excused[reason.kind] += 1
    detail = ", ".join(f"{n} at a {kind}" for kind, n in sorted(excused.items())) or "none excused"
    summary = f"{len(calls)} deliveries, {repeated} repeated ({detail}); {len(faults)} signals"
    return Check("redeliveries only of items in flight at a kill or stop", summary, problems)


def workflow_checks(
    engine: Engine, keys: Sequence[str], calls: Sequence[Call], faults: Sequence[Fault] = ()
) -> list[Check]:
    """All the workflow's invariants for partitions `keys`."""
    parts = stored_partitions(engine, keys)
    stored = stored_items(engine, keys)
    mine = [c for c in calls if c.partition in set(keys)]
    return [
        check_all_complete(parts, stored, keys),
        check_barrier(mine, stored),
        check_completed_never_redelivered(stored, mine),
        check_children_once(stored),
        check_redeliveries(stored, mine, faults),
    ]


def report(checks: Sequence[Check]) -> str:
    return "\n".join(str(c) for c in checks)
