"""Batch distribution by runs of one cost (planaria.planner.batching `_Runs`).

Covers: `distribute` over pipelines listed as runs of a few cost objects (the fresh search's
~1,000 pipelines of one or two templates) gives the same micro-batches and the same times,
bit for bit, as the pipeline-by-pipeline greedy it replaced (`_jump_start` then `_hand_out` on
every pipeline, still the path for costs that are not finite or do not grow): runs in any
order, repeated objects, equal costs in distinct objects (a zero's sign included), slopes so
small against the fixed time that successive slots round to the same time (ties broken by
pipeline index), batches from one micro-batch per pipeline to many; and the run finder.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.planner import batching


def _pipeline_by_pipeline(costs: list[batching.PipelineCost], total: int) -> batching.Distribution:
    """`distribute` as it was before the runs: the oracle."""
    counts = batching._jump_start(costs, total)
    batching._hand_out(costs, counts, total - sum(counts))
    return batching.Distribution(
        micro_batches=tuple(counts),
        pipeline_times_s=tuple(c.time_s(n) for c, n in zip(costs, counts, strict=True)),
    )


def _bits(distribution: batching.Distribution) -> tuple[tuple[int, ...], tuple[str, ...]]:
    return distribution.micro_batches, tuple(t.hex() for t in distribution.pipeline_times_s)


_fixed = st.one_of(
    st.floats(0.0, 50.0),
    st.sampled_from([0.0, -0.0, 1e16, 3e15, 2.5]),
    st.floats(-5.0, 1e17),
)
_slope = st.one_of(st.floats(1e-3, 5.0), st.sampled_from([1.0, 0.5, 1e-9, 3.0]))


@st.composite
def _run_costs(draw: st.DrawFn) -> list[batching.PipelineCost]:
    """Pipelines as runs of a few cost objects, some of them equal in value."""
    kinds = draw(st.lists(st.tuples(_fixed, _slope), min_size=1, max_size=4))
    objects = [batching.PipelineCost(fixed_s=a, per_micro_batch_s=c) for a, c in kinds]
    # an equal cost in another object (the same value, maybe the other zero)
    objects += [
        batching.PipelineCost(
            fixed_s=-o.fixed_s if o.fixed_s == 0 else o.fixed_s,
            per_micro_batch_s=o.per_micro_batch_s,
        )
        for o in objects[: draw(st.integers(0, len(objects)))]
    ]
    runs = draw(
        st.lists(
            st.tuples(st.integers(0, len(objects) - 1), st.integers(1, 40)), min_size=1, max_size=8
        )
    )
    costs = [objects[k] for k, length in runs for _ in range(length)]
    if draw(st.booleans()):  # shuffle a few pipelines out of their runs
        for i, j in draw(
            st.lists(
                st.tuples(st.integers(0, len(costs) - 1), st.integers(0, len(costs) - 1)),
                max_size=4,
            )
        ):
            costs[i], costs[j] = costs[j], costs[i]
    return costs


@settings(max_examples=400, deadline=None)
@given(_run_costs(), st.integers(0, 2000))
def test_runs_distribute_as_pipeline_by_pipeline(
    costs: list[batching.PipelineCost], extra: int
) -> None:
    total = len(costs) + extra
    assert batching._Runs.of(costs) is not None or len(costs) > 32
    assert _bits(batching.distribute(costs, total, 1)) == _bits(_pipeline_by_pipeline(costs, total))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([1e16, 2.0**53, 7.0]), st.sampled_from([1.0, 0.5, 2.0])),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.integers(1, 30), min_size=1, max_size=4),
    st.integers(0, 200),
)
def test_slots_that_round_to_one_time_go_by_pipeline_index(
    kinds: list[tuple[float, float]], lengths: list[int], extra: int
) -> None:
    # fixed times so large that the next slots cost the same after rounding: the heap then
    # gives one pipeline several slots of a time before the next pipeline gets one
    objects = [batching.PipelineCost(fixed_s=a, per_micro_batch_s=c) for a, c in kinds]
    costs = [objects[r % len(objects)] for r, n in enumerate(lengths) for _ in range(n)]
    total = len(costs) + extra
    assert _bits(batching.distribute(costs, total, 1)) == _bits(_pipeline_by_pipeline(costs, total))


def test_costs_that_do_not_grow_or_are_not_finite_go_pipeline_by_pipeline() -> None:
    flat = batching.PipelineCost(fixed_s=1.0, per_micro_batch_s=0.0)
    endless = batching.PipelineCost(fixed_s=float("inf"), per_micro_batch_s=1.0)
    grows = batching.PipelineCost(fixed_s=1.0, per_micro_batch_s=1.0)
    assert batching._Runs.of([grows, flat]) is None
    assert batching._Runs.of([grows, endless]) is None
    assert batching.distribute([grows, flat], 9, 1).micro_batches == (1, 8)


@given(st.lists(st.integers(0, 2), min_size=1, max_size=60), st.integers(0, 59))
def test_a_run_ends_at_the_first_other_cost(picks: list[int], start: int) -> None:
    objects = [batching.PipelineCost(fixed_s=float(k), per_micro_batch_s=1.0) for k in range(3)]
    costs = [objects[k] for k in picks]
    start %= len(costs)
    end = batching._run_end(costs, start)
    assert all(c is costs[start] for c in costs[start:end])
    assert end == len(costs) or costs[end] is not costs[start]


def _old_runs_jump_start(runs: batching._Runs, total: int) -> list[int]:
    """`_Runs._jump_start` before it stopped once the counts at both ends agreed (the oracle):
    the bisection to the end, then the counts at its threshold."""
    ones = [1] * len(runs.costs)
    if total <= 2 * sum(runs.sizes):
        return ones
    lo = max(cost.time_s(1) for cost in runs.costs)
    hi = max(cost.time_s(total) for cost in runs.costs)
    for _ in range(100):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        slots = batching._slots_upto(runs.costs, mid, total)
        taken = sum(size * slots[c] for c, size in zip(runs.costs, runs.sizes, strict=True))
        lo, hi = (mid, hi) if taken <= total else (lo, mid)
    slots = batching._slots_upto(runs.costs, lo, total)
    counts = [slots[cost] for cost in runs.costs]
    fits = sum(size * n for size, n in zip(runs.sizes, counts, strict=True)) <= total
    return counts if fits and batching._is_cheapest_set(runs.costs, counts) else ones


@settings(max_examples=300, deadline=None)
@given(_run_costs(), st.integers(0, 2000))
def test_the_jump_start_stopped_early_is_the_full_bisections(
    costs: list[batching.PipelineCost], total: int
) -> None:
    runs = batching._Runs.of(costs)
    if runs is not None:
        assert runs._jump_start(total) == _old_runs_jump_start(runs, total)
