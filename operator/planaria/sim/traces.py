"""Failure traces: when nodes fail and when they (or new ones) join.

A `Trace` is a time-ordered tuple of `Event`s over `num_nodes` initial nodes (ids 0..N-1; joins
may bring new ids) and a horizon in seconds: the run ends there, whatever the events. An empty
trace is a fault-free run of its horizon. Generators, all seeded (`random.Random(seed)`):

- `per_device`: each node fails after an exponential time of rate `rate_per_hour` (Odyssey
  §V-B: 32 NPUs, 10% per NPU per hour, 9 hours); no re-joins, so each node fails at most once.
- `per_cluster`: one failure at a time, exponential gaps of mean `mtbf_s`, a uniformly chosen
  live node each (Oobleck §7.2: once every 6 h / 1 h / 10 min, from 30 nodes until 15 remain;
  the horizon is the time the last of those failures happens, unless one is given: then the
  failures stop at it too).
- `spot`: preemptions with exponential gaps of mean `preempt_mtbf_s` (Oobleck §7.3: 7.7 min on
  EC2 P3, 10.3 min on GCP a2) and additions at the same mean rate while below the initial size,
  each preemption a random live node, each addition the lowest-numbered absent node.

`read_csv` reads a user's trace: a header `time,event,node`, seconds >= 0 in order and within
the horizon, event `fail` or `join`, and a node of the cluster (0..N-1) whose event changes it: a
`fail` of a live node, a `join` of an absent one. Nothing is dropped silently: every other line
is an `errors.SimInputError` naming the line and the fix.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from planaria.sim import errors


class Kind(StrEnum):
    FAIL = "fail"
    JOIN = "join"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Node `node` fails or joins at `time_s` seconds after the start."""

    time_s: float
    kind: Kind
    node: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """Events in time order over `num_nodes` initial nodes, simulated until `horizon_s`."""

    num_nodes: int
    horizon_s: float
    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise errors.SimInputError(f"num_nodes is {self.num_nodes}; give 1 or more")
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise errors.SimInputError(f"horizon_s is {self.horizon_s}; give seconds > 0")
        times = [e.time_s for e in self.events]
        if times != sorted(times) or any(t < 0 or t > self.horizon_s for t in times):
            raise errors.SimInputError("events must be in time order within [0, horizon_s]")

    def live_after(self) -> list[frozenset[int]]:
        """Live nodes after each event (failing an absent node or joining a live one: no-op)."""
        live, out = set(range(self.num_nodes)), []
        for event in self.events:
            if event.kind is Kind.FAIL:
                live.discard(event.node)
            else:
                live.add(event.node)
            out.append(frozenset(live))
        return out


def per_device(num_nodes: int, rate_per_hour: float, horizon_s: float, seed: int) -> Trace:
    """Each node fails once after an Exp(rate) time; those before the horizon are events."""
    _positive("rate_per_hour", rate_per_hour)
    rng = random.Random(seed)
    times = [(rng.expovariate(rate_per_hour / 3600.0), node) for node in range(num_nodes)]
    events = _ordered(Event(time_s=t, kind=Kind.FAIL, node=n) for t, n in times if t <= horizon_s)
    return Trace(num_nodes=num_nodes, horizon_s=horizon_s, events=events)


def per_cluster(
    num_nodes: int, mtbf_s: float, min_nodes: int, seed: int, horizon_s: float = math.inf
) -> Trace:
    """Failures with Exp gaps of mean `mtbf_s` on random live nodes until `min_nodes` remain;
    the horizon is the last failure's time (Oobleck §7.2 measures until then), or `horizon_s`
    when finite: failures stop there, and a run outlasting them goes on with `min_nodes`."""
    _positive("mtbf_s", mtbf_s)
    if not 1 <= min_nodes < num_nodes:
        raise errors.SimInputError(f"min_nodes is {min_nodes}; give 1..{num_nodes - 1}")
    rng, live, now, events = random.Random(seed), list(range(num_nodes)), 0.0, []
    while len(live) > min_nodes:
        now += rng.expovariate(1.0 / mtbf_s)
        if now > horizon_s:
            break
        events.append(Event(time_s=now, kind=Kind.FAIL, node=live.pop(rng.randrange(len(live)))))
    end = horizon_s if math.isfinite(horizon_s) else now
    return Trace(num_nodes=num_nodes, horizon_s=end, events=tuple(events))


def spot(num_nodes: int, preempt_mtbf_s: float, horizon_s: float, seed: int) -> Trace:
    """Preemptions and additions, each a Poisson stream of mean gap `preempt_mtbf_s`; additions
    only while fewer than `num_nodes` are live, preemptions only while some are."""
    _positive("preempt_mtbf_s", preempt_mtbf_s)
    rng, live, events = random.Random(seed), set(range(num_nodes)), []
    next_fail = rng.expovariate(1.0 / preempt_mtbf_s)
    next_join = rng.expovariate(1.0 / preempt_mtbf_s)
    while min(next_fail, next_join) <= horizon_s:
        if next_fail <= next_join:
            if len(live) > 1:
                node = rng.choice(sorted(live))
                live.discard(node)
                events.append(Event(time_s=next_fail, kind=Kind.FAIL, node=node))
            next_fail += rng.expovariate(1.0 / preempt_mtbf_s)
        else:
            if len(live) < num_nodes:
                node = min(set(range(num_nodes)) - live)
                live.add(node)
                events.append(Event(time_s=next_join, kind=Kind.JOIN, node=node))
            next_join += rng.expovariate(1.0 / preempt_mtbf_s)
    return Trace(num_nodes=num_nodes, horizon_s=horizon_s, events=tuple(events))


def read_csv(path: Path, num_nodes: int, horizon_s: float = math.inf) -> Trace:
    """A trace from a CSV file `time,event,node` over nodes 0..num_nodes-1, simulated until
    `horizon_s` (infinite: until the last event). Raises SimInputError naming the line for
    anything malformed, an event after the horizon, a node outside the cluster or an event that
    would change nothing; and for an open-ended horizon with no event to end it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise errors.SimInputError(f"cannot read trace {path}: {exc.strerror}") from exc
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip() for c in rows[0]] != ["time", "event", "node"]:
        raise errors.SimInputError(f"{path}: line 1 must be the header time,event,node")
    events = tuple(_event(path, number, row) for number, row in enumerate(rows[1:], start=2))
    for number, (a, b) in enumerate(zip(events, events[1:], strict=False), start=3):
        if b.time_s < a.time_s:
            raise errors.SimInputError(f"{path}: line {number}: times must not decrease")
    _check_events(path, events, num_nodes, horizon_s)
    if math.isfinite(horizon_s):
        return Trace(num_nodes=num_nodes, horizon_s=horizon_s, events=events)
    if not events or events[-1].time_s <= 0:
        raise errors.SimInputError(
            f"{path}: no event after time 0 ends the run; give a horizon in hours (--hours)"
        )
    return Trace(num_nodes=num_nodes, horizon_s=events[-1].time_s, events=events)


def _event(path: Path, number: int, row: list[str]) -> Event:
    where = f"{path}: line {number}"
    if len(row) != 3:
        raise errors.SimInputError(f"{where}: give three fields time,event,node")
    try:
        time_s, node = float(row[0]), int(row[2])
    except ValueError as exc:
        raise errors.SimInputError(f"{where}: time must be seconds, node an integer") from exc
    if not (math.isfinite(time_s) and time_s >= 0) or node < 0:
        raise errors.SimInputError(f"{where}: time must be finite seconds >= 0, node >= 0")
    if row[1].strip() not in ("fail", "join"):
        raise errors.SimInputError(f"{where}: event is {row[1]!r}; give fail or join")
    return Event(time_s=time_s, kind=Kind(row[1].strip()), node=node)


def _check_events(path: Path, events: Sequence[Event], num_nodes: int, horizon_s: float) -> None:
    """Each event (line 2 onwards) is within the horizon, names a node of the cluster and
    changes it: the engine ignores a failure of an absent node, which would hide a typo."""
    live, last_line = set(range(num_nodes)), dict.fromkeys(range(num_nodes), 0)
    for number, event in enumerate(events, start=2):
        where, node = f"{path}: line {number}", event.node
        if event.time_s > horizon_s:
            raise errors.SimInputError(
                f"{where}: time {event.time_s:g} s is after the horizon "
                f"({horizon_s:g} s = {horizon_s / 3600:g} h); give more --hours or drop the line"
            )
        if node >= num_nodes:
            raise errors.SimInputError(
                f"{where}: node {node} is not in the cluster (nodes 0..{num_nodes - 1}); give "
                "one of those, or a scenario with more nodes (--scenario)"
            )
        if event.kind is Kind.FAIL and node not in live:
            raise errors.SimInputError(
                f"{where}: node {node} already failed at line {last_line[node]}; a node fails "
                "again only after a join line brings it back"
            )
        if event.kind is Kind.JOIN and node in live:
            since = f"since line {last_line[node]}" if last_line[node] else "from the start"
            raise errors.SimInputError(
                f"{where}: node {node} cannot join, it is live {since}; a node joins only "
                "after it failed"
            )
        live.symmetric_difference_update({node})
        last_line[node] = number


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise errors.SimInputError(f"{name} is {value}; give a finite number > 0")


def _ordered(events: Iterable[Event]) -> tuple[Event, ...]:
    return tuple(sorted(events, key=lambda e: (e.time_s, e.node)))
