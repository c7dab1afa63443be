"""Layer and batch distribution (planaria.planner.distribution), Odyssey Alg. 1 lines 13-14.

Covers: remainder placements (count C(S, L mod S), each an even split plus one, in the order of
the first version); the layer split equals a brute-force search over every placement with the
same estimator and memory filter, and is None when nothing fits, also over arbitrary float
costs, where the bound that prunes it is never above the estimate (hypothesis), nor is the
tighter bound that orders the search (transfers, the commit barrier, the slowest optimizer
step) on any links and GPUs per node, the split still the brute force's (hypothesis); a second
ask is a memo look-up; a heavy last layer gets the shorter stage; more placements than
max_splits are pre-ranked by bottleneck compute, in the order heapq.nsmallest keyed by
`_stage_work_s` (kept here) gives over the first placements up to the cap (hypothesis,
arbitrary float times); a pipeline of layer counts is the
one its stages build, errors included (hypothesis); the fitted pipeline cost is E's estimate at
S and 2S micro-batches; the batch sums to the global batch, splits evenly between identical
pipelines and feeds a deeper (faster) pipeline at least as much.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.contract import profile
from planaria.planner import distribution, screening
from tests import strategies

W = plans.WorkerId


@given(st.integers(min_value=1, max_value=14), st.integers(min_value=1, max_value=8))
def test_remainder_placements_are_the_even_split_plus_one(num_layers: int, depth: int) -> None:
    if depth > num_layers:
        return
    found = list(distribution.remainder_placements(num_layers, depth))
    base, extra = divmod(num_layers, depth)
    assert len(found) == len(set(found)) == math.comb(depth, extra)
    for counts in found:
        assert sum(counts) == num_layers and set(counts) <= {base, base + 1}


@given(
    st.lists(st.sampled_from([0.001, 0.002, 0.005]), min_size=2, max_size=7),
    st.integers(min_value=1, max_value=4),
    st.sampled_from([2**40, 2600, 3600]),
)
@settings(max_examples=40, deadline=None)
def test_the_split_is_the_fastest_fitting_placement(
    times: list[float], depth: int, memory_bytes: int
) -> None:
    if depth > len(times):
        return
    prof = strategies.timed_profile(times, memory_bytes=memory_bytes)
    estimates = screening.Estimates(prof)
    running = strategies.grid_plan(1, (), len(times), 1)
    chosen = distribution.split_layers(estimates, depth, running, max_splits=32)
    scored = []
    for counts in distribution.remainder_placements(len(times), depth):
        alone = distribution.pipeline_of(counts, [W(w) for w in range(depth)], depth)
        estimate = estimates.pipeline(alone, 1, 1)
        if estimate.peak_bytes <= memory_bytes:
            scored.append((estimate.step_s, counts))
    assert chosen == (min(scored)[1] if scored else None)


def _even_split_plus_one(num_layers: int, depth: int) -> list[tuple[int, ...]]:
    """`remainder_placements` as it was written first: the oracle of the faster one."""
    base, extra = divmod(num_layers, depth)
    return [
        tuple(base + (1 if s in chosen else 0) for s in range(depth))
        for chosen in itertools.combinations(range(depth), extra)
    ]


def _stage_work_s(
    prof: profile.Profile, counts: tuple[int, ...], memo: dict[tuple[int, int], float]
) -> float:
    """The largest forward + backward compute of one stage (1 GPU), each layer range's sum
    made once: the pre-ranking's key as it was first written (the oracle)."""
    ranges = list(itertools.pairwise(itertools.accumulate(counts, initial=0)))
    for a, b in ranges:
        if (a, b) not in memo:
            memo[a, b] = sum(x.forward_s[0] + x.backward_s[0] for x in prof.layers[a:b])
    return max(map(memo.__getitem__, ranges))


@given(
    st.lists(
        st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.001, 0.002, 1e-17, 3.0])),
        min_size=1,
        max_size=14,
    ),
    st.integers(1, 14),
    st.integers(1, 40),
    st.sampled_from([3, 10, 20_000]),
)
@settings(max_examples=150, deadline=None)
def test_the_prerank_is_nsmallest_by_bottleneck_compute(
    times: list[float], depth: int, max_splits: int, most: int
) -> None:
    # arbitrary float times (ties and rounding included): the same placements in the same
    # order as heapq.nsmallest keyed by `_stage_work_s` over the first `_MAX_ENUMERATED`
    # remainder placements (a few here, to reach the cap), the ranking the arrays replaced
    if depth > len(times):
        return
    prof = strategies.timed_profile(times)
    splits = list(distribution.remainder_placements(len(times), depth))
    assert splits == _even_split_plus_one(len(times), depth)
    splits = splits[:most]
    memo: dict[tuple[int, int], float] = {}
    want = (
        heapq.nsmallest(max_splits, splits, key=lambda c: _stage_work_s(prof, c, memo))
        if len(splits) > max_splits
        else splits
    )
    capped = pytest.MonkeyPatch()
    capped.setattr(distribution, "_MAX_ENUMERATED", most)
    try:
        assert distribution._placements(prof, depth, max_splits) == want
    finally:
        capped.undo()


def test_a_heavy_head_gets_the_shorter_stage() -> None:
    estimates = screening.Estimates(strategies.timed_profile([0.001] * 6 + [0.004]))
    split = distribution.split_layers(
        estimates, 2, strategies.grid_plan(1, (), 7, 1), max_splits=32
    )
    assert split == (4, 3)


def test_more_placements_than_max_splits_are_preranked_by_bottleneck_compute() -> None:
    estimates = screening.Estimates(strategies.timed_profile([0.004] + [0.001] * 6))
    # with the heavy first layer, (3, 4)'s slowest stage computes 6 ms-units, (4, 3)'s 7
    assert distribution.split_layers(
        estimates, 2, strategies.grid_plan(1, (), 7, 1), max_splits=1
    ) == (3, 4)


def test_batch_distribution_sums_and_favours_faster_pipelines() -> None:
    estimates = screening.Estimates(strategies.uniform_profile(6))
    running = strategies.grid_plan(1, (), 6, 13)
    same = distribution.distribute_batch(estimates, [(3, 3), (3, 3)], running)
    assert sum(same) == 13 and abs(same[0] - same[1]) <= 1
    mixed = distribution.distribute_batch(estimates, [(2, 2, 2), (3, 3)], running)
    assert sum(mixed) == 13 and mixed[0] >= mixed[1] >= 1


def test_the_fitted_cost_passes_through_the_estimates_at_s_and_2s() -> None:
    estimates = screening.Estimates(strategies.uniform_profile(6))
    running = strategies.grid_plan(1, (), 6, 1)
    cost = distribution.pipeline_cost(estimates, (2, 2, 2), running)
    for m in (3, 6):
        alone = distribution.pipeline_of((2, 2, 2), [W(0), W(1), W(2)], m)
        assert math.isclose(cost.time_s(m), estimates.pipeline(alone, 1, 1).step_s)


@given(
    st.lists(strategies.layer_profiles(1), min_size=1, max_size=7),
    st.integers(min_value=1, max_value=5),
    st.integers(min_value=1, max_value=2**45),
    strategies.link_profiles(),
)
@settings(max_examples=60, deadline=None)
def test_the_pruned_search_is_the_brute_force_and_its_bound_holds(
    layers: list[profile.LayerProfile], depth: int, memory_bytes: int, link: profile.LinkProfile
) -> None:
    if depth > len(layers):
        return
    base = strategies.uniform_profile(len(layers), memory_bytes=memory_bytes)
    prof = dataclasses.replace(base, layers=tuple(layers), intra_node=link, inter_node=link)
    estimates = screening.Estimates(prof)
    scored = []
    for counts in distribution.remainder_placements(len(layers), depth):
        alone = distribution.pipeline_of(counts, [W(w) for w in range(depth)], depth)
        estimate = estimates.pipeline(alone, 1, 1)
        assert distribution.step_bound_s(prof, counts, depth) <= estimate.step_s * (1 + 1e-12)
        if estimate.peak_bytes <= memory_bytes:
            scored.append((estimate.step_s, counts))
    running = strategies.grid_plan(1, (), len(layers), 1)
    chosen = distribution.split_layers(screening.Estimates(prof), depth, running, max_splits=32)
    assert chosen == (min(scored)[1] if scored else None)


@given(
    st.lists(strategies.layer_profiles(1), min_size=1, max_size=7),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=2**45),
    strategies.link_profiles(),
    strategies.link_profiles(),
)
@settings(max_examples=60, deadline=None)
def test_the_alone_bound_holds_on_any_links_and_nodes_and_the_split_is_the_brute_force(
    layers: list[profile.LayerProfile],
    depth: int,
    gpus_per_node: int,
    memory_bytes: int,
    intra: profile.LinkProfile,
    inter: profile.LinkProfile,
) -> None:
    """The bound that orders and prunes the split search (transfers, the commit barrier and
    the slowest optimizer step on the chain) is never above E's step of the pipeline alone,
    with any links and any GPUs per node, so the pruned search returns the brute force's
    fastest fitting placement (ties to the smaller layer counts)."""
    if depth > len(layers):
        return
    base = strategies.uniform_profile(len(layers), memory_bytes=memory_bytes)
    prof = dataclasses.replace(base, layers=tuple(layers), intra_node=intra, inter_node=inter)
    estimates = screening.Estimates(prof)
    scored = []
    for counts in distribution.remainder_placements(len(layers), depth):
        alone = distribution.pipeline_of(counts, [W(w) for w in range(depth)], depth)
        estimate = estimates.pipeline(alone, 1, gpus_per_node)
        bound = distribution.alone_bound_s(prof, counts, depth, gpus_per_node)
        assert bound <= estimate.step_s * (1 + 1e-12)
        assert distribution.step_bound_s(prof, counts, depth) <= bound * (1 + 1e-12)
        if estimate.peak_bytes <= memory_bytes:
            scored.append((estimate.step_s, counts))
    running = dataclasses.replace(
        strategies.grid_plan(1, (), len(layers), 1), gpus_per_node=gpus_per_node
    )
    chosen = distribution.split_layers(screening.Estimates(prof), depth, running, max_splits=32)
    assert chosen == (min(scored)[1] if scored else None)


def test_split_layers_answers_from_the_estimates_memo_the_second_time() -> None:
    """The split of a depth is searched once per (micro-batch size, GPUs per node, cap): a
    second ask costs no estimate and gives the same split."""
    prof = strategies.timed_profile([0.001, 0.005, 0.002, 0.003, 0.001], memory_bytes=2**40)
    estimates = screening.Estimates(prof)
    running = strategies.grid_plan(1, (), 5, 1)
    first = distribution.split_layers(estimates, 3, running, max_splits=32)
    computed = estimates.computed
    estimates._memo.clear()  # a second search would have to replay every placement
    estimates._runs.clear()
    assert distribution.split_layers(estimates, 3, running, max_splits=32) == first
    assert estimates.computed == computed and first is not None
    other = dataclasses.replace(running, gpus_per_node=2)
    distribution.split_layers(estimates, 3, other, max_splits=32)
    assert estimates.computed > computed  # another node pattern is another search


@given(
    st.lists(st.integers(-1, 4), min_size=0, max_size=8),
    st.integers(0, 2),
    st.integers(0, 5),
)
def test_a_pipeline_of_counts_is_the_one_its_stages_build(
    counts: list[int], fewer_workers: int, num_micro_batches: int
) -> None:
    # `pipeline_of` sets a valid stage's slots itself: the same objects as Stage(...) builds
    # (equal, hashing alike, the same fields), and the same errors for counts that are not
    workers = [W(10 + w) for w in range(max(0, len(counts) - fewer_workers))]

    def built() -> plans.Pipeline:
        bounds = list(itertools.accumulate(counts, initial=0))
        stages = tuple(
            plans.Stage(layer_start=a, layer_stop=b, workers=(w,))
            for (a, b), w in zip(itertools.pairwise(bounds), workers, strict=True)
        )
        return plans.Pipeline(stages=stages, num_micro_batches=num_micro_batches)

    try:
        want = built()
    except ValueError as error:
        with pytest.raises(type(error), match=re.escape(str(error))):
            distribution.pipeline_of(counts, workers, num_micro_batches)
        return
    got = distribution.pipeline_of(counts, workers, num_micro_batches)
    assert got == want and hash(got) == hash(want)
    assert [dataclasses.astuple(s) for s in got.stages] == [
        dataclasses.astuple(s) for s in want.stages
    ]
