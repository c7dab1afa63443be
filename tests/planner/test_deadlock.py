"""Schedule checker (planaria.planner.deadlock) on compiled and hand-broken schedules.

Covers:
- every compiled schedule passes: symmetric (2x2, 3x4), heterogeneous (stage counts [3, 2],
  [2, 2, 1], [4, 3, 3]), with failed stages rerouted to their peers, 1..8 micro-batches per
  pipeline; and the contract's general plans (tests.strategies.plans: partial reroutes,
  tensor-parallel stages, several GPUs per node);
- the checker catches: two workers receiving from each other first; collectives met in a cyclic
  order; a missing send (deadlock); a missing receive, a reordered pair of sends, a wrong peer,
  repeated or missing work, a backward without its forward, an all-reduce over the wrong group
  or before the last backward, two overlapping collectives in one round, a missing optimizer
  step, work after the optimizer step, a holder left out of an agreed group (each a
  ScheduleError naming the problem).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, instructions, plan, schedule
from planaria.planner import deadlock
from tests import strategies

W = plan.WorkerId


@settings(max_examples=25, deadline=None)
@pytest.mark.parametrize(
    ("counts", "aligned", "holes"),
    [
        ((2, 2), True, 0),
        ((4, 4, 4), True, 0),
        ((3, 2), False, 0),
        ((2, 2, 1), False, 0),
        ((4, 3, 3), False, 0),
        ((2, 2), True, 1),
        ((4, 4, 4), True, 2),
        ((3, 3, 2), True, 2),
        ((4, 3, 3), False, 2),
    ],
    ids=[
        "symmetric 2x2",
        "symmetric 3x4",
        "stage counts 3 and 2",
        "stage counts 2, 2 and 1",
        "stage counts 4, 3 and 3",
        "2x2 with a failed stage",
        "3x4 with two failed stages",
        "3, 3, 2 with two failed stages",
        "4, 3, 3 with two failed stages",
    ],
)
@given(data=st.data())
def test_compiled_schedules_of_shaped_plans_pass(
    counts: tuple[int, ...], aligned: bool, holes: int, data: st.DataObject
) -> None:
    p = data.draw(strategies.shaped_plans(counts, aligned=aligned, max_holes=holes))
    deadlock.check_schedule(schedule.compile_schedule(p))


@settings(max_examples=80, deadline=None)
@given(p=strategies.plans(max_gpus_per_node=2))
def test_compiled_schedules_of_general_plans_pass(p: plan.Plan) -> None:
    deadlock.check_schedule(schedule.compile_schedule(p))


def stream(
    worker: int, layers: tuple[int, int], ops: list[instructions.Instruction]
) -> schedule.WorkerStream:
    return schedule.WorkerStream(
        worker=W(worker),
        pipeline=0,
        stage=0,
        layer_start=layers[0],
        layer_stop=layers[1],
        stage_workers=(W(worker),),
        instructions=tuple(ops),
    )


def test_two_workers_receiving_from_each_other_first_deadlock() -> None:
    sched = schedule.Schedule(
        num_layers=2,
        num_micro_batches=1,
        gpus_per_node=1,
        num_rounds=0,
        streams=(
            stream(0, (0, 1), [instructions.RecvGrad(source=W(1), micro_batch=0, tag=0)]),
            stream(1, (1, 2), [instructions.RecvActivation(source=W(0), micro_batch=0, tag=0)]),
        ),
    )
    with pytest.raises(errors.DeadlockError) as caught:
        deadlock.check_schedule(sched)
    assert "worker 0 waits at #0 RecvGrad" in str(caught.value)
    assert "worker 1 waits at #0 RecvActivation" in str(caught.value)


def test_collectives_met_in_a_cyclic_order_deadlock() -> None:
    def reduce(layer: int, *group: int) -> instructions.AllReduce:
        return instructions.AllReduce(layers=(layer,), group=tuple(W(w) for w in group), round=0)

    sched = schedule.Schedule(
        num_layers=1,
        num_micro_batches=0,
        gpus_per_node=1,
        num_rounds=1,
        streams=(
            stream(0, (0, 1), [reduce(0, 0, 1), reduce(0, 0, 2)]),
            stream(1, (0, 1), [reduce(0, 1, 2), reduce(0, 0, 1)]),
            stream(2, (0, 1), [reduce(0, 0, 2), reduce(0, 1, 2)]),
        ),
    )
    with pytest.raises(errors.DeadlockError, match="worker 2 waits at #0 AllReduce"):
        deadlock.check_schedule(sched)


def two_pipelines() -> schedule.Schedule:
    """Two pipelines of two one-layer stages, two micro-batches each: workers 0-1 and 2-3."""
    pipelines = tuple(
        plan.Pipeline(
            stages=(
                plan.Stage(layer_start=0, layer_stop=1, workers=(W(2 * p),)),
                plan.Stage(layer_start=1, layer_stop=2, workers=(W(2 * p + 1),)),
            ),
            num_micro_batches=2,
        )
        for p in range(2)
    )
    return schedule.compile_schedule(plan.Plan(pipelines=pipelines, micro_batch_size=1))


Edit = Callable[[list[instructions.Instruction]], list[instructions.Instruction]]


def edited(sched: schedule.Schedule, worker: int, edit: Edit) -> schedule.Schedule:
    streams = tuple(
        dataclasses.replace(s, instructions=tuple(edit(list(s.instructions))))
        if s.worker == worker
        else s
        for s in sched.streams
    )
    return dataclasses.replace(sched, streams=streams)


def without(kind: type, nth: int = 0) -> Edit:
    def edit(ops: list[instructions.Instruction]) -> list[instructions.Instruction]:
        positions = [i for i, op in enumerate(ops) if isinstance(op, kind)]
        del ops[positions[nth]]
        return ops

    return edit


def swapped(kind: type) -> Edit:
    """Exchange the first two instructions of `kind` (keeping everything else in place)."""

    def edit(ops: list[instructions.Instruction]) -> list[instructions.Instruction]:
        a, b = [i for i, op in enumerate(ops) if isinstance(op, kind)][:2]
        ops[a], ops[b] = ops[b], ops[a]
        return ops

    return edit


def replaced(kind: type, **changes: object) -> Edit:
    def edit(ops: list[instructions.Instruction]) -> list[instructions.Instruction]:
        i = next(i for i, op in enumerate(ops) if isinstance(op, kind))
        ops[i] = dataclasses.replace(ops[i], **changes)  # type: ignore[arg-type]
        return ops

    return edit


def doubled(kind: type) -> Edit:
    def edit(ops: list[instructions.Instruction]) -> list[instructions.Instruction]:
        i = next(i for i, op in enumerate(ops) if isinstance(op, kind))
        return [*ops[: i + 1], ops[i], *ops[i + 1 :]]

    return edit


def moved_first(kind: type) -> Edit:
    def edit(ops: list[instructions.Instruction]) -> list[instructions.Instruction]:
        i = next(i for i, op in enumerate(ops) if isinstance(op, kind))
        return [ops[i], *ops[:i], *ops[i + 1 :]]

    return edit


@pytest.mark.parametrize(
    ("worker", "edit", "error", "message"),
    [
        (0, without(instructions.SendActivation), errors.DeadlockError, "RecvActivation"),
        (1, without(instructions.RecvActivation), errors.ScheduleError, "exactly one receive"),
        (0, swapped(instructions.SendActivation), errors.ScheduleError, "not 0, 1, 2"),
        (0, swapped(instructions.RecvGrad), errors.ScheduleError, "not 0, 1, 2"),
        (1, replaced(instructions.SendGrad, destination=W(2)), errors.DeadlockError, "RecvGrad"),
        (0, doubled(instructions.Forward), errors.ScheduleError, "forward twice"),
        (1, without(instructions.Backward, 1), errors.ScheduleError, "not forwarded and backward"),
        (1, moved_first(instructions.Backward), errors.ScheduleError, "needs its own forward"),
        (
            1,
            replaced(instructions.AllReduce, group=(W(1), W(2))),
            errors.DeadlockError,
            r"worker 1 waits at #\d+ AllReduce",
        ),
        (2, moved_first(instructions.AllReduce), errors.ScheduleError, "before its last backward"),
        (3, without(instructions.OptimizerStep), errors.ScheduleError, "0 optimizer steps"),
        (3, moved_first(instructions.OptimizerStep), errors.ScheduleError, "after the optimizer"),
    ],
    ids=[
        "a missing send leaves its receiver stuck",
        "a missing receive leaves a send unmatched",
        "sends of one pair posted out of tag order",
        "receives of one pair posted out of tag order",
        "a gradient sent to the wrong worker",
        "a forward done twice",
        "a backward left out",
        "a backward before its forward",
        "one member reducing over another group",
        "an all-reduce before the last backward",
        "no optimizer step",
        "work after the optimizer step",
    ],
)
def test_the_checker_catches_a_broken_schedule(
    worker: int, edit: Edit, error: type[Exception], message: str
) -> None:
    sched = two_pipelines()
    deadlock.check_schedule(sched)
    with pytest.raises(error, match=message):
        deadlock.check_schedule(edited(sched, worker, edit))


def test_the_checker_catches_overlapping_collectives_in_one_round() -> None:
    """Heterogeneous buckets {0} over (0, 2) and {1} over (0, 3) share worker 0: forcing both
    into one round is caught even though the replay would finish."""
    pipelines = (
        plan.Pipeline(
            stages=(
                plan.Stage(layer_start=0, layer_stop=2, workers=(W(0),)),
                plan.Stage(layer_start=2, layer_stop=4, workers=(W(1),)),
            ),
            num_micro_batches=1,
        ),
        plan.Pipeline(
            stages=(
                plan.Stage(layer_start=0, layer_stop=1, workers=(W(2),)),
                plan.Stage(layer_start=1, layer_stop=4, workers=(W(3),)),
            ),
            num_micro_batches=1,
        ),
    )
    sched = schedule.compile_schedule(plan.Plan(pipelines=pipelines, micro_batch_size=1))
    deadlock.check_schedule(sched)

    def one_round(ops: list[instructions.Instruction]) -> list[instructions.Instruction]:
        return [
            dataclasses.replace(op, round=0) if isinstance(op, instructions.AllReduce) else op
            for op in ops
        ]

    for worker in (0, 1, 2, 3):
        sched = edited(sched, worker, one_round)
    with pytest.raises(errors.ScheduleError, match="round 0 has collectives whose groups share"):
        deadlock.check_schedule(sched)


def test_the_checker_catches_an_agreed_group_that_leaves_out_a_holder() -> None:
    """Three one-stage pipelines; workers 0 and 1 reduce between themselves only and worker 2
    skips the all-reduce: the replay finishes, but worker 2's gradient is lost."""
    pipelines = tuple(
        plan.Pipeline(
            stages=(plan.Stage(layer_start=0, layer_stop=1, workers=(W(p),)),),
            num_micro_batches=1,
        )
        for p in range(3)
    )
    sched = schedule.compile_schedule(plan.Plan(pipelines=pipelines, micro_batch_size=1))
    deadlock.check_schedule(sched)
    for worker in (0, 1):
        sched = edited(sched, worker, replaced(instructions.AllReduce, group=(W(0), W(1))))
    sched = edited(sched, 2, without(instructions.AllReduce))
    with pytest.raises(errors.ScheduleError, match=r"reduced over \(0, 1\), its holders are"):
        deadlock.check_schedule(sched)
