"""E's whole-plan estimate composed from its pipelines' replays and a replay of the gradient tail.

A worker's stream is its pipeline's receives, computes and sends (`schedule` step 3), then its
all-reduces, one optimizer step and a snapshot marker (step 4). Pipelines that take part in no
reroute exchange nothing with the others before that tail, so the replay (`execution`) times
their part exactly as it times each of them alone; a step is decided by when each worker
reaches its tail. `run_alone` keeps that arrival per stage from one replay of a pipeline alone
(identical pipelines: one replay); `run_rerouted` replays the pipelines a reroute ties together
(those with a hole and the peers that run their micro-batches) as a plan of their own; `step_s`
replays only the tail from those arrivals: each all-reduce starts when its last member arrives
and all members end it together (the replay's rule), in the order every member runs them,
(round, first layer); then the commit barrier, then each stage's optimizer step.

The numbers are those of replaying the whole schedule, bit for bit: every time is the same sum
of the same costs along the same chain of events (`estimator`'s cost helpers), and a maximum is
exact whatever the order (checked against the replay in tests/planner/test_composition.py). So a
candidate whose pipelines were screened costs no second replay of them, only the tail, and a
rerouted 1,024-worker plan replays the handful of pipelines its reroutes touch.

One case is left to the whole replay: streams are ordered on a virtual timeline with one slot
count for all pipelines (`timeline`), so the rerouted pipelines replayed on their own must use
at least as many slots as the others have micro-batches (`run_rerouted` says when not).

Memory needs no composition: a worker's peak depends on its own stream's computes and messages
(`memory`), so a plan's peak is the largest of its parts'.

Not here: the memo (`screening`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from planaria.contract import instructions, plan, profile, schedule
from planaria.planner import estimator, execution, memory


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
    """Compile and replay `pipeline` as a plan of its own. Raises PlanInputError when the
    profile does not fit it, DeadlockError when it cannot finish."""
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
    in both plans when the involved ones use at least as many slots."""
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
    sched = schedule.compile_schedule(sub)
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
    all-reduces, optimizer steps and snapshots replayed from there."""
    clock = dict(arrival)
    width = {s.workers[0]: len(s.workers) for p in plan_.pipelines for s in p.stages if s.workers}
    for reduction in sorted(schedule.all_reductions(plan_), key=lambda r: (r.round, r.layers[0])):
        start = max(clock[w] for w in reduction.group)
        nodes = {w // plan_.gpus_per_node for w in reduction.group}
        link = prof.intra_node if len(nodes) == 1 else prof.inter_node
        narrowest = min(width[w] for w in reduction.group)
        end = start + estimator.allreduce_s(link, prof, reduction, narrowest)
        for worker in reduction.group:
            clock[worker] = end
    # the commit barrier (`execution`) among the streams (a stage's first worker runs one)
    workers = list(clock)
    nodes = {w // plan_.gpus_per_node for w in workers}
    link = prof.intra_node if len(nodes) == 1 else prof.inter_node
    passed = max(clock.values(), default=0.0) + estimator.barrier_s(link, len(workers))
    ends = [
        passed + estimator.optimizer_s(prof, stage.layers, len(stage.workers))
        for pipeline in plan_.pipelines
        for stage in pipeline.stages
        if stage.workers
    ]
    return max(ends, default=0.0)  # the snapshot marker takes no time


def arrivals(pipeline: plan.Pipeline, run: PipelineRun) -> Iterator[tuple[plan.WorkerId, float]]:
    """(first worker, arrival) of each stage of `pipeline` from its run alone."""
    for stage, arrival in zip(pipeline.stages, run.arrival_s, strict=True):
        yield stage.workers[0], arrival
