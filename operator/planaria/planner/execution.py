"""The execution model on paper: replay a schedule the way the executor runs it.

Semantics (the contract the executor implements; docs/schedule.md):
- a worker runs its instructions in order; compute takes `Costs.compute_s`;
- a send is posted and the worker goes on at once (buffered, non-blocking); its message arrives
  `Costs.transfer_s` after posting;
- a receive blocks until the message with its (source, destination, tag) has arrived;
- a collective blocks until every member of its group has reached its next collective on that
  group; then all members run it together for `Costs.collective_s`. Members must therefore meet
  the collectives of a group in the same order, or the replay gets stuck;
- the commit barrier: a worker's first OptimizerStep of the step waits until every worker with
  an OptimizerStep has reached its first one, then `Costs.barrier_s` more (the executor's
  all-reduce of the loss shares over the epoch's world, docs/executor.md), then computes. Its
  event is ready at the worker's arrival and starts when the barrier is passed.

`replay` is the one implementation of these rules: the checker (`deadlock`) replays with zero
costs to prove a schedule finishes, the time estimator (`estimator`) with profiled costs to time
it (Odyssey eq. 11, generalised from one pipeline to every worker, message and collective).
Each event remembers what it waited for, so the critical path can be traced back.

Not here: structural checks (`deadlock`), the cost model (`estimator`).
"""

from __future__ import annotations

import enum
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Protocol

from planaria.contract import errors, instructions, plan, schedule


class Costs(Protocol):
    """Durations in seconds of what a stream does."""

    def compute_s(
        self,
        stream: schedule.WorkerStream,
        instruction: instructions.Compute | instructions.OptimizerStep | instructions.Snapshot,
    ) -> float: ...

    def transfer_s(self, stream: schedule.WorkerStream, instruction: instructions.Send) -> float:
        """From posting a send on `stream`'s worker to the message's arrival."""
        ...

    def collective_s(self, instruction: instructions.AllReduce) -> float: ...

    def barrier_s(self, workers: tuple[plan.WorkerId, ...]) -> float:
        """The commit barrier among `workers`, from the last one's arrival until all pass."""
        ...


class ZeroCosts:
    """Every instruction takes no time: replaying answers only "does it finish?"."""

    def compute_s(
        self,
        stream: schedule.WorkerStream,
        instruction: instructions.Compute | instructions.OptimizerStep | instructions.Snapshot,
    ) -> float:
        return 0.0

    def transfer_s(self, stream: schedule.WorkerStream, instruction: instructions.Send) -> float:
        return 0.0

    def collective_s(self, instruction: instructions.AllReduce) -> float:
        return 0.0

    def barrier_s(self, workers: tuple[plan.WorkerId, ...]) -> float:
        return 0.0


# Where an event's start came from, when not from the previous instruction of its own worker:
# a receive waits for the send (worker, index), a collective for its last member's arrival.
Cause = tuple[plan.WorkerId, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One instruction as replayed: reached at `ready_s`, started at `start_s` (a receive
    "starts" when its message arrives, a collective when its last member arrives), ended at
    `end_s`."""

    ready_s: float
    start_s: float
    end_s: float
    cause: Cause | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """Events of every worker, in stream order (shorter than the stream where it got stuck), and
    the (worker, index) of each instruction a stuck worker waits at."""

    events: dict[plan.WorkerId, tuple[Event, ...]]
    stuck: tuple[tuple[plan.WorkerId, int], ...]

    @property
    def step_s(self) -> float:
        """When the last instruction of any worker ends."""
        return max((e[-1].end_s for e in self.events.values() if e), default=0.0)


def replay(sched: schedule.Schedule, costs: Costs) -> Replay:
    """Run every stream under the rules above until all end or nothing can move."""
    run = _Run(sched, costs)
    while run.ready:
        run.advance(run.ready.popleft())
    stuck = tuple(
        (s.worker, len(run.events[s.worker]))
        for s in sched.streams
        if len(run.events[s.worker]) < len(s.instructions)
    )
    return Replay(events={w: tuple(e) for w, e in run.events.items()}, stuck=stuck)


def raise_if_stuck(sched: schedule.Schedule, result: Replay) -> None:
    """DeadlockError naming every stuck worker and the instruction it waits at."""
    if result.stuck:
        waits = "; ".join(
            f"worker {w} waits at #{i} {sched.stream(w).instructions[i]}" for w, i in result.stuck
        )
        raise errors.DeadlockError(f"the schedule deadlocks: {waits}")


class _Kind(enum.Enum):
    """How the replay treats an instruction (the rules in the module docstring)."""

    RECEIVE = enum.auto()
    SEND = enum.auto()
    COLLECTIVE = enum.auto()
    COMMIT = enum.auto()  # an OptimizerStep: the first of a step waits for the commit barrier
    COMPUTE = enum.auto()  # Forward, Backward, Snapshot (and a later OptimizerStep)


def _kind_of(instruction: instructions.Instruction) -> _Kind:
    match instruction:
        case instructions.RecvActivation() | instructions.RecvGrad():
            return _Kind.RECEIVE
        case instructions.SendActivation() | instructions.SendGrad():
            return _Kind.SEND
        case instructions.AllReduce():
            return _Kind.COLLECTIVE
        case instructions.OptimizerStep():
            return _Kind.COMMIT
        case _:
            return _Kind.COMPUTE


# The instruction classes looked up by exact type (`_kind_of` answers for any other, e.g. a
# subclass): the replay's hot loop dispatches on a dict look-up, not a chain of isinstance.
_KINDS: dict[type, _Kind] = {
    instructions.RecvActivation: _Kind.RECEIVE,
    instructions.RecvGrad: _Kind.RECEIVE,
    instructions.SendActivation: _Kind.SEND,
    instructions.SendGrad: _Kind.SEND,
    instructions.AllReduce: _Kind.COLLECTIVE,
    instructions.OptimizerStep: _Kind.COMMIT,
    instructions.Forward: _Kind.COMPUTE,
    instructions.Backward: _Kind.COMPUTE,
    instructions.Snapshot: _Kind.COMPUTE,
}

# Event's frozen-dataclass __init__ sets each field through object.__setattr__ (about twice
# the cost of the rest of an instruction's replay): the hot loop sets the slots directly. The
# object is the same as Event(ready_s=..., start_s=..., end_s=..., cause=...) builds (no
# __post_init__; tests/planner/test_execution.py compares replays with the old loop's).
_new_event = object.__new__
_set_ready, _set_start, _set_end, _set_cause = (
    vars(Event)[name].__set__ for name in ("ready_s", "start_s", "end_s", "cause")
)


def _event(ready_s: float, start_s: float, end_s: float, cause: Cause | None) -> Event:
    event: Event = _new_event(Event)
    _set_ready(event, ready_s)
    _set_start(event, start_s)
    _set_end(event, end_s)
    _set_cause(event, cause)
    return event


_Message = tuple[plan.WorkerId, plan.WorkerId, int]  # source, destination, tag
_Collective = tuple[tuple[plan.WorkerId, ...], int]  # group, how many earlier ones on it


class _Run:
    """Mutable replay state; `advance` runs one worker until it blocks or ends."""

    def __init__(self, sched: schedule.Schedule, costs: Costs) -> None:
        self.streams = {s.worker: s for s in sched.streams}
        self.costs = costs
        self.events: dict[plan.WorkerId, list[Event]] = {w: [] for w in self.streams}
        self.clock: dict[plan.WorkerId, float] = dict.fromkeys(self.streams, 0.0)
        self.ready = deque(self.streams)
        self.arrivals: dict[_Message, tuple[float, Cause]] = {}
        self.waiting: dict[_Message, plan.WorkerId] = {}
        self.seen: dict[plan.WorkerId, dict[tuple[plan.WorkerId, ...], int]] = defaultdict(
            lambda: defaultdict(int)
        )
        self.members: dict[_Collective, dict[plan.WorkerId, float]] = defaultdict(dict)
        # the commit barrier: who takes part, who has arrived (when), who has passed it
        self.committing = tuple(
            s.worker
            for s in sched.streams
            if any(isinstance(op, instructions.OptimizerStep) for op in s.instructions)
        )
        self.at_barrier: dict[plan.WorkerId, float] = {}
        self.passed: dict[plan.WorkerId, tuple[float, Cause | None]] = {}  # (arrival, cause)
        self.committed: set[plan.WorkerId] = set()

    def advance(self, worker: plan.WorkerId) -> None:
        # the hot loop of every estimate (a 1,024-worker plan replays ~75,000 instructions):
        # one dispatch on the instruction's class, sends and receives inline
        stream = self.streams[worker]
        ops = stream.instructions
        events = self.events[worker]
        clock, costs, arrivals, waiting = self.clock, self.costs, self.arrivals, self.waiting
        while (index := len(events)) < len(ops):
            # Any: `kind` says which class it is, which mypy cannot follow through the dict
            instruction: Any = ops[index]
            kind = _KINDS.get(type(instruction)) or _kind_of(instruction)
            now = clock[worker]
            if kind is _Kind.RECEIVE:
                key = (instruction.source, worker, instruction.tag)
                found = arrivals.get(key)
                if found is None:
                    waiting[key] = worker
                    return
                arrival, sender = found
                start = max(now, arrival)
                event = _event(now, start, start, sender if arrival > now else None)
            elif kind is _Kind.SEND:
                key = (worker, instruction.destination, instruction.tag)
                if key in arrivals:
                    raise errors.ScheduleError(
                        f"worker {worker} sends tag {key[2]} twice to {key[1]}"
                    )
                arrivals[key] = (now + costs.transfer_s(stream, instruction), (worker, index))
                if key in waiting:
                    self.ready.append(waiting.pop(key))
                event = _event(now, now, now, None)
            elif kind is _Kind.COLLECTIVE:
                if not self._collective(worker, instruction):
                    return
                continue
            elif kind is _Kind.COMMIT and worker not in self.committed:
                if worker not in self.passed and not self._barrier(worker):
                    return
                ready, cause = self.passed.pop(worker)
                self.committed.add(worker)
                now = clock[worker]
                event = _event(ready, now, now + costs.compute_s(stream, instruction), cause)
            else:
                event = _event(now, now, now + costs.compute_s(stream, instruction), None)
            clock[worker] = event.end_s
            events.append(event)

    def _barrier(self, worker: plan.WorkerId) -> bool:
        """Register `worker`'s arrival at the commit barrier; when it is the last, everyone
        passes: `passed` holds each member's arrival and what it waited for, its clock is the
        moment all pass (True: `worker` may compute its optimizer step)."""
        self.at_barrier[worker] = self.clock[worker]
        if len(self.at_barrier) < len(self.committing):
            return False
        arrived, self.at_barrier = self.at_barrier, {}
        last = max(arrived, key=lambda m: (arrived[m], m))
        passed = arrived[last] + self.costs.barrier_s(self.committing)
        for member, ready in arrived.items():
            cause = None if member == last else (last, len(self.events[last]))
            self.passed[member] = (ready, cause)
            self.clock[member] = passed
            if member != worker:
                self.ready.append(member)
        return True

    def _collective(self, worker: plan.WorkerId, instruction: instructions.AllReduce) -> bool:
        """Register `worker`'s arrival; when it is the last member, run the collective for all
        (True: `worker` moved on)."""
        group = instruction.group
        if worker not in group:
            raise errors.ScheduleError(f"worker {worker} issues {instruction} outside its group")
        key = (group, self.seen[worker][group])
        self.members[key][worker] = self.clock[worker]
        if len(self.members[key]) < len(group):
            return False
        arrived = self.members.pop(key)
        start = max(arrived.values())
        last = max(arrived, key=lambda m: (arrived[m], m))
        end = start + self.costs.collective_s(instruction)
        last_index = len(self.events[last])
        for member, ready in arrived.items():
            cause = None if member == last else (last, last_index)
            self.events[member].append(Event(ready_s=ready, start_s=start, end_s=end, cause=cause))
            self.clock[member] = end
            self.seen[member][group] += 1
            if member != worker:
                self.ready.append(member)
        return True
