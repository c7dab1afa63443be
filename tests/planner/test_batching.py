"""Batch distribution (planaria.planner.batching).

Covers: the distribution minimises the slowest pipeline's time exactly (brute force over every
split on small inputs), sums to the global batch with at least one micro-batch per pipeline;
the jump-started greedy matches the plain greedy on large batches, and counting each distinct
pipeline cost once gives the same micro-batches as pipeline by pipeline; a pipeline whose time does
not grow takes the surplus; the linear cost a + c N_b reproduces eq. 1-4's closed form; global
batches that cannot be split are refused with the nearest one that can be, never changed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors
from planaria.planner import batching, stage_mapping, stage_table
from tests import strategies


def _costs(pairs: list[tuple[float, float]]) -> list[batching.PipelineCost]:
    return [batching.PipelineCost(fixed_s=a, per_micro_batch_s=c) for a, c in pairs]


def _splits(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(strategies.pipeline_costs(), min_size=1, max_size=4),
    st.integers(1, 14),
    st.integers(1, 3),
)
def test_the_slowest_pipeline_is_as_fast_as_any_split_allows(
    pairs: list[tuple[float, float]], extra: int, micro_batch_size: int
) -> None:
    costs = _costs(pairs)
    total = len(costs) + extra - 1
    result = batching.distribute(costs, total * micro_batch_size, micro_batch_size)
    best = min(
        max(c.time_s(n) for c, n in zip(costs, split, strict=True))
        for split in _splits(total, len(costs))
    )
    assert result.iteration_time_s == best
    assert sum(result.micro_batches) == total and min(result.micro_batches) >= 1
    assert result.pipeline_times_s == tuple(
        c.time_s(n) for c, n in zip(costs, result.micro_batches, strict=True)
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(strategies.pipeline_costs(), min_size=1, max_size=6), st.integers(0, 3000))
def test_large_batches_match_the_plain_greedy(pairs: list[tuple[float, float]], extra: int) -> None:
    costs = _costs(pairs)
    total = len(costs) + extra
    counts = [1] * len(costs)
    batching._hand_out(costs, counts, total - len(costs))
    plain = max(c.time_s(n) for c, n in zip(costs, counts, strict=True))
    assert batching.distribute(costs, total, 1).iteration_time_s == plain


def pipeline_by_pipeline_jump_start(costs: list[batching.PipelineCost], total: int) -> list[int]:
    """The greedy's jump start as it was before #17 (every pipeline's slots counted at every
    bisection step): the oracle of the one that counts each distinct cost once."""
    ones = [1] * len(costs)
    if any(c.per_micro_batch_s == 0 for c in costs) or total <= 2 * len(costs):
        return ones

    def upto(threshold: float) -> list[int]:
        out = []
        for c in costs:
            room = (threshold - c.fixed_s) / c.per_micro_batch_s
            out.append(total if room >= total else math.floor(room) if room >= 1 else 1)
        return out

    lo = max(c.time_s(1) for c in costs)
    hi = max(c.time_s(total) for c in costs)
    for _ in range(100):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        lo, hi = (mid, hi) if sum(upto(mid)) <= total else (lo, mid)
    counts = upto(lo)
    return counts if sum(counts) <= total and batching._is_cheapest_set(costs, counts) else ones


@settings(max_examples=100, deadline=None)
@given(
    st.lists(strategies.pipeline_costs(), min_size=1, max_size=3),
    st.lists(st.integers(0, 2), min_size=1, max_size=12),
    st.integers(0, 3000),
)
def test_distinct_costs_distribute_as_pipeline_by_pipeline(
    pairs: list[tuple[float, float]], picks: list[int], extra: int
) -> None:
    # few distinct costs, many pipelines: the case (one template, many pipelines) counted once
    costs = [_costs(pairs)[i % len(pairs)] for i in picks]
    total = len(costs) + extra
    counts = pipeline_by_pipeline_jump_start(costs, total)
    assert batching._jump_start(costs, total) == counts
    batching._hand_out(costs, counts, total - sum(counts))
    assert batching.distribute(costs, total, 1).micro_batches == tuple(counts)


def test_a_pipeline_whose_time_does_not_grow_takes_the_surplus() -> None:
    costs = _costs([(5.0, 1.0), (3.0, 0.0)])
    result = batching.distribute(costs, 1000, 1)
    assert result.micro_batches == (1, 999)
    assert result.iteration_time_s == 6.0


def test_faster_pipelines_get_more_micro_batches() -> None:
    result = batching.distribute(_costs([(1.0, 1.0), (1.0, 3.0)]), 16, 2)
    assert result.micro_batches == (6, 2)
    assert result.throughput(16) == 16 / 7.0


@given(st.lists(st.floats(0, 10), min_size=1, max_size=6), st.integers(1, 50))
def test_the_linear_cost_is_the_closed_form(times: list[float], n_b: int) -> None:
    stages = tuple(
        stage_mapping.MappedStage(
            layer_start=i, layer_stop=i + 1, node=i, gpu_start=0, num_gpus=1, time_s=t
        )
        for i, t in enumerate(times)
    )
    mapping = stage_mapping.StageMapping(num_nodes=len(times), gpus_per_node=1, stages=stages)
    cost = batching.pipeline_cost(mapping)
    expected = stage_table.pipeline_time_s(times, n_b)
    assert cost.time_s(n_b) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(
    ("global_batch", "micro_batch_size", "pipelines", "nearest"),
    [
        pytest.param(10, 4, 1, 12, id="not a multiple: the nearer multiple above"),
        pytest.param(9, 4, 1, 8, id="not a multiple: the nearer multiple below"),
        pytest.param(6, 4, 1, 8, id="halfway: round up"),
        pytest.param(8, 4, 3, 12, id="fewer micro-batches than pipelines: one each"),
        pytest.param(13, 4, 3, 12, id="not a multiple and at least one each"),
    ],
)
def test_undistributable_batches_are_refused_with_the_nearest_that_works(
    global_batch: int, micro_batch_size: int, pipelines: int, nearest: int
) -> None:
    costs = _costs([(1.0, 1.0)] * pipelines)
    with pytest.raises(batching.UndistributableBatchError, match=str(nearest)) as caught:
        batching.distribute(costs, global_batch, micro_batch_size)
    assert caught.value.recommended_global_batch == nearest
    assert isinstance(caught.value, ValueError | errors.InfeasibleError)
    batching.distribute(costs, nearest, micro_batch_size)
