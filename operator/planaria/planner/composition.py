"""E's whole-plan estimate composed from its pipelines run alone and the gradient tail.

Without rerouting, the pipelines of a plan exchange nothing until their gradients: a worker's
stream is its pipeline's receives, computes and sends (`schedule` step 3), then its all-reduces,
one optimizer step and a snapshot marker (step 4). The replay (`execution`) therefore times each
pipeline's part exactly as it times that pipeline alone, whatever the others do, and a step is
decided by when each worker reaches its tail. `PipelineRun` keeps that arrival per stage from
one replay of the pipeline alone; `step_s` replays only the tail over them: each all-reduce
starts when its last member arrives and every member ends it together (the replay's rule), in
the order every member runs them, (round, first layer).

The numbers are those of replaying the whole schedule, bit for bit: every time is the same sum
of the same costs along the same chain of events (`estimator`'s cost helpers), and a maximum is
exact whatever the order (checked against the replay in tests/planner/test_composition.py). So
a candidate whose pipelines were screened costs no second replay of those pipelines, only the
tail; at 1,024 workers that is the difference between seconds and milliseconds.

Memory needs no composition: a worker's peak depends on its own stream's computes and messages
(`memory`), so a plan's peak is the largest of its pipelines'.

Not here: plans with reroutes (their pipelines share workers mid-step; `screening` replays them
whole), the memo (`screening`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from planaria.contract import colouring, errors, instructions, plan, profile, schedule
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


def step_s(plan_: plan.Plan, runs: Sequence[PipelineRun], prof: profile.Profile) -> float:
    """The step of `plan_` (no reroutes) from its pipelines' `runs` (same order): the tail of
    all-reduces, optimizer steps and snapshots replayed from each worker's arrival."""
    if plan_.reroutes:
        raise errors.PlanInputError("a plan with reroutes is estimated whole, not composed")
    clock: dict[plan.WorkerId, float] = {}
    width: dict[plan.WorkerId, int] = {}
    for pipeline, run in zip(plan_.pipelines, runs, strict=True):
        for stage, arrival in zip(pipeline.stages, run.arrival_s, strict=True):
            clock[stage.workers[0]], width[stage.workers[0]] = arrival, len(stage.workers)
    for reduction in sorted(reductions(plan_), key=lambda r: (r.round, r.layers[0])):
        start = max(clock[w] for w in reduction.group)
        nodes = {w // plan_.gpus_per_node for w in reduction.group}
        link = prof.intra_node if len(nodes) == 1 else prof.inter_node
        narrowest = min(width[w] for w in reduction.group)
        end = start + estimator.allreduce_s(link, prof, reduction, narrowest)
        for worker in reduction.group:
            clock[worker] = end
    ends = [
        clock[stage.workers[0]] + estimator.optimizer_s(prof, stage.layers, len(stage.workers))
        for pipeline in plan_.pipelines
        for stage in pipeline.stages
    ]
    return max(ends, default=0.0)  # the snapshot marker takes no time


def reductions(plan_: plan.Plan) -> list[instructions.AllReduce]:
    """The plan's all-reduces as `schedule` compiles them (Oobleck §6.1): one per bucket, a
    maximal run of layers with the same holders (first workers of the stages holding them),
    when two or more hold it, with rounds from a greedy colouring of their conflicts."""
    holders: dict[int, list[plan.WorkerId]] = defaultdict(list)
    for pipeline in plan_.pipelines:
        for stage in pipeline.stages:
            for layer in stage.layers:
                holders[layer].append(stage.workers[0])
    buckets: list[tuple[list[int], tuple[plan.WorkerId, ...]]] = []
    for layer in range(plan_.num_layers):
        group = tuple(sorted(holders[layer]))
        if buckets and buckets[-1][1] == group:
            buckets[-1][0].append(layer)
        else:
            buckets.append(([layer], group))
    shared = [(layers, group) for layers, group in buckets if len(group) > 1]
    rounds = colouring.welsh_powell(colouring.conflict_graph([g for _, g in shared]))
    return [
        instructions.AllReduce(layers=tuple(layers), group=group, round=r)
        for (layers, group), r in zip(shared, rounds, strict=True)
    ]
