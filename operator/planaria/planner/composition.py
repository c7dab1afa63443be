"""E's whole-plan estimate composed from its pipelines' replays and a replay of the gradient tail.

A worker's stream is its pipeline's receives, computes and sends (`schedule` step 3), then its
all-reduces, one optimizer step and a snapshot marker (step 4). Pipelines that take part in no
reroute exchange nothing with the others before that tail, so the replay (`execution`) times
their part exactly as it times each of them alone; a step is decided by when each worker
reaches its tail. `run_alone` keeps that arrival per stage from one replay of a pipeline alone
(identical pipelines: one replay; a pipeline of one-GPU stages, the split search's and every
fresh plan's, needs no schedule: `run_chain` walks its stages' 1F1B orders with the replay's
arithmetic, Odyssey eq. 11's DP, several times faster than compiling and replaying);
`run_rerouted` times the pipelines a reroute ties together
(those with a hole and the peers that run their micro-batches) as a plan of their own, again
without a schedule: `rerouted_timing` orders each worker's computes and places its messages as the
schedule compiler does and times them with the replay's arithmetic (~6x cheaper than
compiling and replaying the ~650 workers of a rerouted 1,024-node plan); `step_s`
replays only the tail from those arrivals: each all-reduce starts when its last member arrives
and all members end it together (the replay's rule), in the order every member runs them,
(round, first layer); then the commit barrier, then each stage's optimizer step.

The numbers are those of replaying the whole schedule, bit for bit: every time is the same sum
of the same costs along the same chain of events (`estimator`'s cost helpers), and a maximum is
exact whatever the order (checked against the replay in tests/planner/test_composition.py and
test_rerouted_timing.py). So a
candidate whose pipelines were screened costs no second replay of them, only the tail, and a
rerouted 1,024-worker plan times only the pipelines its reroutes touch.

One case is left to the whole replay: streams are ordered on a virtual timeline with one slot
count for all pipelines (`timeline`), so the rerouted pipelines replayed on their own must use
at least as many slots as the others have micro-batches (`run_rerouted` says when not).

Memory needs no composition: a worker's peak depends on its own stream's computes and messages
(`memory`), so a plan's peak is the largest of its parts'.

Not here: the memo (`screening`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from planaria.contract import instructions, plan, profile, schedule, timeline
from planaria.planner import estimator, execution, memory, rerouted_timing


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineRun:
    """One pipeline replayed alone: when each stage's (first) worker reaches its optimizer step
    (`arrival_s`, in stage order, seconds), the step alone and the largest worker peak."""

    arrival_s: tuple[float, ...]
    step_s: float
    peak_bytes: int


def run_alone(
    pipeline: plan.Pipeline, micro_batch_size: int, gpus_per_node: int, prof: profile.Profile
) -> PipelineRun:
    """`pipeline` replayed as a plan of its own: by `run_chain` when every stage has one
    worker, else compiled and replayed (`run_replayed`). Raises PlanInputError when the
    profile does not fit it, DeadlockError when it cannot finish."""
    if _chained(pipeline, prof):
        return run_chain(pipeline, gpus_per_node, prof)
    return run_replayed(pipeline, micro_batch_size, gpus_per_node, prof)


def _chained(pipeline: plan.Pipeline, prof: profile.Profile) -> bool:
    """Whether `run_chain` times `pipeline`: one worker per stage, some micro-batches, and
    the profile's layers (anything else goes to the replay, which says what is wrong)."""
    stages = pipeline.stages
    return (
        pipeline.num_micro_batches >= 1
        and all(len(stage.workers) == 1 for stage in stages)
        and stages[0].layer_start == 0
        and stages[-1].layer_stop == prof.num_layers
        and all(a.layer_stop == b.layer_start for a, b in itertools.pairwise(stages))
    )


def run_chain(pipeline: plan.Pipeline, gpus_per_node: int, prof: profile.Profile) -> PipelineRun:
    """`run_replayed`'s numbers for a pipeline of one-worker stages, bit for bit, without
    compiling its schedule: Odyssey eq. 11's DP over each stage's 1F1B order (`timeline`; with
    no reroutes micro-batch j sits in slot j, which is the schedule's order). The replay's
    arithmetic, step by step: a stage's clock waits for a message (max with the send's end
    plus the link's transfer of the boundary layer's output, as `estimator` costs it), then
    adds its compute (`estimator`'s sum of the stage's layer times); sends and receives take
    no time; every stage reaches the commit barrier at its clock, all pass it at the last
    arrival plus the barrier, then run their optimizer steps. Memory: `memory.stage_memory`
    with the 1F1B order's most micro-batches in flight. tests/planner/test_composition.py
    checks it against the replay."""
    stages, num_micro_batches = pipeline.stages, pipeline.num_micro_batches
    depth = len(stages)
    workers = [stage.workers[0] for stage in stages]
    layers = [prof.layers[stage.layer_start : stage.layer_stop] for stage in stages]
    forward = [sum(layer.forward_s[0] for layer in mine) for mine in layers]
    backward = [sum(layer.backward_s[0] for layer in mine) for mine in layers]
    # hop s -> s + 1 carries stage s's last layer's output both ways (activation, gradient)
    hop = [
        estimator.link_among(prof, gpus_per_node, (workers[s], workers[s + 1])).transfer_s(
            layers[s][-1].output_bytes
        )
        for s in range(depth - 1)
    ]
    orders = [timeline.one_f_one_b(depth, s, range(num_micro_batches)) for s in range(depth)]
    clock = _chain_clocks(orders, forward, backward, hop)
    passed = max(clock) + estimator.barrier_s(
        estimator.link_among(prof, gpus_per_node, workers), depth
    )
    ends = [passed + estimator.optimizer_s(prof, stage.layers, 1) + 0.0 for stage in stages]
    peak = max(
        memory.stage_memory(
            workers[s],
            layers[s],
            1,
            max_in_flight=_most_in_flight(orders[s]),
            sends_on=s + 1 < depth,
            receives_grads=s + 1 < depth,
        ).peak_bytes
        for s in range(depth)
    )
    return PipelineRun(arrival_s=tuple(clock), step_s=max(ends), peak_bytes=peak)


def _chain_clocks(
    orders: list[tuple[tuple[bool, int], ...]],
    forward: list[float],
    backward: list[float],
    hop: list[float],
) -> list[float]:
    """Each stage's clock after its last compute: the stages advanced in turn as far as their
    messages have come (forward j of stage s needs stage s - 1's; backward j of stage s needs
    stage s + 1's, the last stage's its own forward)."""
    depth, count = len(orders), len(orders[0]) // 2
    forward_end: list[list[float | None]] = [[None] * count for _ in range(depth)]
    backward_end: list[list[float | None]] = [[None] * count for _ in range(depth)]
    clock, position = [0.0] * depth, [0] * depth
    pending = deque(range(depth))
    while pending:
        s = pending.popleft()
        order, now = orders[s], clock[s]
        while position[s] < len(order):
            is_backward, j = order[position[s]]
            if is_backward:
                sent = backward_end[s + 1][j] if s + 1 < depth else now
                if sent is None:
                    break
                if s + 1 < depth:
                    now = max(now, sent + hop[s])
                now = now + backward[s]
                backward_end[s][j] = now
            else:
                sent = forward_end[s - 1][j] if s > 0 else now
                if sent is None:
                    break
                if s > 0:
                    now = max(now, sent + hop[s - 1])
                now = now + forward[s]
                forward_end[s][j] = now
            position[s] += 1
            neighbour = s - 1 if is_backward else s + 1
            if 0 <= neighbour < depth:
                pending.append(neighbour)
        clock[s] = now
    assert position == [len(order) for order in orders], "1F1B cannot block"
    return clock


def _most_in_flight(order: tuple[tuple[bool, int], ...]) -> int:
    live, most = 0, 0
    for is_backward, _ in order:
        live += -1 if is_backward else 1
        most = max(most, live)
    return most


def run_replayed(
    pipeline: plan.Pipeline, micro_batch_size: int, gpus_per_node: int, prof: profile.Profile
) -> PipelineRun:
    """Compile and replay `pipeline` as a plan of its own."""
    alone = plan.Plan(
        pipelines=(pipeline,), micro_batch_size=micro_batch_size, gpus_per_node=gpus_per_node
    )
    sched = schedule.compile_schedule(alone)
    result = execution.replay(sched, estimator.ProfileCosts(sched, prof))
    execution.raise_if_stuck(sched, result)
    # one pipeline holds every layer once: its tail is the optimizer step and the snapshot
    arrival = {s.worker: result.events[s.worker][-2].ready_s for s in sched.streams}
    return PipelineRun(
        arrival_s=tuple(arrival[stage.workers[0]] for stage in pipeline.stages),
        step_s=result.step_s,
        peak_bytes=memory.estimate_memory(sched, prof).peak_bytes,
    )


def run_rerouted(
    plan_: plan.Plan, involved: Sequence[int], prof: profile.Profile
) -> tuple[dict[plan.WorkerId, float], int] | None:
    """Replay the pipelines `involved` in `plan_`'s reroutes (in plan order) as a plan of their
    own: each (first) worker's arrival at its tail and the largest peak; None when that plan
    could order its streams differently, so the whole plan must be replayed. Pipelines outside
    the reroutes run their micro-batch j in slot j (`timeline.pack_slots`) and share no worker
    with the others, so the slots of the involved ones, and hence their streams, are the same
    in both plans when the involved ones use at least as many slots. Timed by
    `rerouted_timing.run_routed`
    when the profile fits the plan, else compiled and replayed (`run_sub_replayed`, which
    raises what the schedule and the replay raise)."""
    index = {p: i for i, p in enumerate(involved)}
    others = [p.num_micro_batches for q, p in enumerate(plan_.pipelines) if q not in index]
    if max(others, default=0) > max(plan_.pipelines[p].num_micro_batches for p in involved):
        return None
    sub = plan.Plan(
        pipelines=tuple(plan_.pipelines[p] for p in involved),
        micro_batch_size=plan_.micro_batch_size,
        gpus_per_node=plan_.gpus_per_node,
        reroutes=tuple(
            replace(r, pipeline=index[r.pipeline], peer_pipeline=index[r.peer_pipeline])
            for r in plan_.reroutes
        ),
    )
    widest = max(len(stage.workers) for p in sub.pipelines for stage in p.stages)
    if prof.num_layers == sub.num_layers and widest <= prof.max_gpus_per_stage:
        return rerouted_timing.run_routed(sub, prof)
    return run_sub_replayed(sub, prof)


def run_sub_replayed(
    plan_: plan.Plan, prof: profile.Profile
) -> tuple[dict[plan.WorkerId, float], int]:
    """Compile and replay `plan_`: each stream's arrival at its tail and the largest peak."""
    sched = schedule.compile_schedule(plan_)
    result = execution.replay(sched, estimator.ProfileCosts(sched, prof))
    execution.raise_if_stuck(sched, result)
    arrival = {}
    for stream in sched.streams:
        tail = next(i for i, op in enumerate(stream.instructions) if isinstance(op, _TAIL))
        arrival[stream.worker] = result.events[stream.worker][tail].ready_s
    return arrival, memory.estimate_memory(sched, prof).peak_bytes


_TAIL = (instructions.AllReduce, instructions.OptimizerStep)


def involved(plan_: plan.Plan) -> tuple[int, ...]:
    """Pipelines that lost a stage or run another's micro-batches, in plan order."""
    found = {r.pipeline for r in plan_.reroutes} | {r.peer_pipeline for r in plan_.reroutes}
    for p, pipeline in enumerate(plan_.pipelines):
        if any(not stage.workers for stage in pipeline.stages):
            found.add(p)
    return tuple(sorted(found))


def step_s(
    plan_: plan.Plan, arrival: Mapping[plan.WorkerId, float], prof: profile.Profile
) -> float:
    """The step of `plan_` given when each (first) worker of a stage reaches its tail: the
    all-reduces, optimizer steps and snapshots replayed from there. Each distinct stage's
    optimizer step and each distinct all-reduce's cost is computed once (the same float for
    the same layers and width: ~1,000 pipelines come in a handful of shapes)."""
    clock = dict(arrival)
    width: dict[plan.WorkerId, int] = {}
    stages: list[tuple[int, int, int]] = []  # (layer_start, layer_stop, width) of each stage
    for pipeline in plan_.pipelines:
        for s in pipeline.stages:
            if s.workers:
                width[s.workers[0]] = len(s.workers)
                stages.append((s.layer_start, s.layer_stop, len(s.workers)))
    costs: dict[tuple[bool, tuple[int, ...], int, int], float] = {}
    for reduction in sorted(schedule.all_reductions(plan_), key=lambda r: (r.round, r.layers[0])):
        group = reduction.group
        start = max(map(clock.__getitem__, group))
        link = estimator.link_among(prof, plan_.gpus_per_node, group)
        narrowest = min(map(width.__getitem__, group))
        cost = (link is prof.intra_node, reduction.layers, narrowest, len(group))
        if cost not in costs:
            costs[cost] = estimator.allreduce_s(link, prof, reduction, narrowest)
        clock.update(dict.fromkeys(group, start + costs[cost]))
    # the commit barrier (`execution`) among the streams (a stage's first worker runs one)
    link = estimator.link_among(prof, plan_.gpus_per_node, clock)
    passed = max(clock.values(), default=0.0) + estimator.barrier_s(link, len(clock))
    optimizers: dict[tuple[int, int, int], float] = {}
    for key in stages:
        if key not in optimizers:
            optimizers[key] = estimator.optimizer_s(prof, range(key[0], key[1]), key[2])
    ends = [passed + optimizers[key] for key in stages]
    return max(ends, default=0.0)  # the snapshot marker takes no time


def arrivals(pipeline: plan.Pipeline, run: PipelineRun) -> Iterator[tuple[plan.WorkerId, float]]:
    """(first worker, arrival) of each stage of `pipeline` from its run alone."""
    for stage, arrival in zip(pipeline.stages, run.arrival_s, strict=True):
        yield stage.workers[0], arrival
