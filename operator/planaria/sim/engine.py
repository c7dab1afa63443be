"""One policy over one trace: the clock, the events, and where every second goes.

Between events the job trains at the running plan's step time: progress is committed every
`steps_per_commit` steps, each commit followed by a `commit_s` checkpoint write (Varuna,
Bamboo; 1 and 0 for the others: every finished step counts). A failure in the plan loses the
uncommitted progress (the step in flight; for checkpointing policies everything since the last
checkpoint: Oobleck §7.4.2 "fallback") and pauses for the recovery's transition (Odyssey eq. 2
t_{S_i -> S_i+1}); a failure during a pause starts a new pause from the new plan. The ideal
bound is fluid: samples accrue continuously and nothing is lost.

Time buckets (they sum to the horizon): training (steps that committed, or are in flight at
the end), checkpoint (writes), recovering (pauses), lost (uncommitted progress a failure
discarded), idle (no plan can run). `Run.timeline` holds (time, samples/s, live nodes) at each
change, with samples/s 0 while paused or idle.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

from planaria.contract import plan
from planaria.sim import policies, traces


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    """Seconds per bucket (module docstring); they sum to the horizon."""

    training_s: float
    checkpoint_s: float
    recovering_s: float
    lost_s: float
    idle_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """`duration_s` of training on a plan of `rate` samples/s with the nodes `live` alive."""

    duration_s: float
    rate: float
    live: frozenset[int]

    @property
    def num_live(self) -> int:
        return len(self.live)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One policy's simulated run: samples trained, time buckets, timeline and restarts."""

    policy: str
    horizon_s: float
    samples: float
    breakdown: Breakdown
    timeline: tuple[tuple[float, float, int], ...]
    intervals: tuple[Interval, ...]
    restarts: int
    recoveries: int
    note: str

    @property
    def throughput(self) -> float:
        """Average samples per second over the horizon."""
        return self.samples / self.horizon_s


@dataclass(slots=True)
class _State:
    running: policies.Running
    live: set[int]
    now: float = 0.0
    resume_at: float = 0.0
    position_s: float = 0.0  # time into the current commit cycle
    samples: float = 0.0
    buckets: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[float, float, int]] = field(default_factory=list)
    intervals: list[Interval] = field(default_factory=list)
    restarts: int = 0
    recoveries: int = 0


def simulate(
    trace: traces.Trace, policy: policies.Policy, global_batch: int, gpus_per_node: int = 1
) -> Run:
    """Run `policy` through `trace` (module docstring)."""
    simulation = Simulation(trace, policy, global_batch, gpus_per_node)
    for event in trace.events:
        simulation.step(event)
    return simulation.finish()


class Simulation:
    """`simulate` an event at a time: `policy` starts on every node of `trace`, `step` applies
    the trace's events in order, `finish` runs to the horizon. A study steps every policy
    through each event in turn: policies that decide alike then ask the planner the same
    question one after another, while its memo of re-plans (bounded in size) still holds
    the answer (a whole run of one policy first outgrew it at 1,024 nodes of 8 GPUs)."""

    def __init__(
        self,
        trace: traces.Trace,
        policy: policies.Policy,
        global_batch: int,
        gpus_per_node: int = 1,
    ) -> None:
        self._trace = trace
        self._policy = policy
        self._global_batch = global_batch
        self._gpus_per_node = gpus_per_node
        live = set(range(trace.num_nodes))
        self._state = _State(running=policy.start(workers(live, gpus_per_node)), live=live)
        _mark(self._state, global_batch)

    def step(self, event: traces.Event) -> None:
        """Train until `event` (the next of the trace's, in order), then apply it."""
        _advance(self._state, event.time_s, self._global_batch)
        _apply(self._state, self._policy, event, self._global_batch, self._gpus_per_node)

    def finish(self) -> Run:
        """Train until the horizon and settle the cycle in flight: the run."""
        state = self._state
        _advance(state, self._trace.horizon_s, self._global_batch)
        _settle(state, self._global_batch)
        return Run(
            policy=self._policy.name,
            horizon_s=self._trace.horizon_s,
            samples=state.samples,
            breakdown=Breakdown(**{f"{k}_s": state.buckets.get(k, 0.0) for k in BUCKETS}),
            timeline=tuple(state.timeline),
            intervals=tuple(state.intervals),
            restarts=state.restarts,
            recoveries=state.recoveries,
            note=state.running.note,
        )


BUCKETS = ("training", "checkpoint", "recovering", "lost", "idle")


def workers(nodes: Collection[int], gpus_per_node: int) -> frozenset[plan.WorkerId]:
    """The workers of `nodes` (WorkerId = node * gpus_per_node + gpu)."""
    return frozenset(
        plan.WorkerId(n * gpus_per_node + g) for n in nodes for g in range(gpus_per_node)
    )


def _add(state: _State, bucket: str, seconds: float) -> None:
    state.buckets[bucket] = state.buckets.get(bucket, 0.0) + seconds


def _rate(running: policies.Running, global_batch: int) -> float:
    return 0.0 if running.plan is None else global_batch / running.step_s


def _mark(state: _State, global_batch: int) -> None:
    paused = state.now < state.resume_at
    rate = 0.0 if paused else _rate(state.running, global_batch)
    state.timeline.append((state.now, rate, len(state.live)))


def _advance(state: _State, until: float, global_batch: int) -> None:
    """Move the clock to `until`: pause, then train (committing cycles) or idle."""
    if state.running.plan is None:
        _add(state, "idle", until - state.now)
        state.now = until
        return
    if state.now < state.resume_at:
        stop = min(state.resume_at, until)
        _add(state, "recovering", stop - state.now)
        state.now = stop
        if stop == state.resume_at:
            _mark(state, global_batch)
    if until > state.now:
        _train(state, until - state.now, global_batch)
        state.now = until


def _train(state: _State, seconds: float, global_batch: int) -> None:
    running = state.running
    rate = _rate(running, global_batch)
    state.intervals.append(Interval(duration_s=seconds, rate=rate, live=frozenset(state.live)))
    if running.fluid:
        state.samples += rate * seconds
        _add(state, "training", seconds)
        return
    work_s = running.steps_per_commit * running.step_s
    cycle_s = work_s + running.commit_s
    total = state.position_s + seconds
    cycles = math.floor(total / cycle_s)
    state.samples += cycles * running.steps_per_commit * global_batch
    state.position_s = total - cycles * cycle_s
    # only whole cycles commit; the cycle in flight stays pending until a failure loses it
    # or the horizon ends the run (`_settle`)
    _add(state, "training", cycles * work_s)
    _add(state, "checkpoint", cycles * running.commit_s)
    _add(state, "pending", seconds - cycles * cycle_s)


def _apply(
    state: _State,
    policy: policies.Policy,
    event: traces.Event,
    global_batch: int,
    gpus_per_node: int,
) -> None:
    if event.kind is traces.Kind.FAIL:
        if event.node not in state.live:
            return
        state.live.discard(event.node)
        failed = frozenset(workers({event.node}, gpus_per_node))
        recovery = policy.on_failure(state.running, failed, workers(state.live, gpus_per_node))
    else:
        if event.node in state.live:
            return
        state.live.add(event.node)
        recovery = policy.on_join(state.running, workers(state.live, gpus_per_node))
    if recovery is not None:
        _recover(state, recovery)
    _mark(state, global_batch)


def _recover(state: _State, recovery: policies.Recovery) -> None:
    """Discard the uncommitted cycle (moved from pending to lost) and start the pause."""
    _add(state, "pending", -state.position_s)
    _add(state, "lost", state.position_s)
    state.position_s = 0.0
    state.running = recovery.running
    state.resume_at = state.now + recovery.pause_s
    state.restarts += recovery.restart
    state.recoveries += 1


def _settle(state: _State, global_batch: int) -> None:
    """At the horizon the run ends, it is not lost: the cycle in flight is training time (and
    its checkpoint write), and its finished steps count."""
    pending = state.buckets.pop("pending", 0.0)
    running = state.running
    if running.plan is None or running.fluid:
        _add(state, "training", pending)
        return
    work_s = running.steps_per_commit * running.step_s
    training = min(pending, work_s)
    # a whole cycle's steps all finished (dividing work_s by step_s could round below k)
    steps = running.steps_per_commit if pending >= work_s else math.floor(pending / running.step_s)
    state.samples += steps * global_batch
    _add(state, "training", training)
    _add(state, "checkpoint", pending - training)
