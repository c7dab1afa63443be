"""The template-mix search (planaria.planner.mix) against eq. 5's enumeration.

Covers: on hypothesis-drawn template sizes, affine pipeline costs (flat ones included), node
counts, fault tolerances, global and micro-batch sizes, `best_counts` returns exactly the
instantiation that ranking every enumerated one by its exact batch distribution chooses
(throughput, then fewer pipelines, then larger templates first), and None exactly when none can
take the global batch; the instantiation count equals the enumeration's length; the fewest
pipelines equals a brute force; at cluster scale (1,024 nodes) the result beats every
neighbouring mix and every single-size mix.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.planner import batching, instantiation, mix
from tests import strategies

Counts = tuple[tuple[int, int], ...]


def oracle(
    costs: dict[int, batching.PipelineCost],
    num_nodes: int,
    f: int,
    global_batch: int,
    micro_batch: int,
) -> Counts | None:
    """Rank every enumerated instantiation as instantiation.rank does."""
    best: tuple[tuple[float, int, list[int]], Counts] | None = None
    for option in instantiation.enumerate_instantiations(list(costs), num_nodes, f):
        try:
            spread = batching.distribute(
                [costs[s] for s in option.pipeline_sizes], global_batch, micro_batch
            )
        except batching.UndistributableBatchError:
            continue
        key = (
            -spread.throughput(global_batch),
            option.num_pipelines,
            [-s for s in option.pipeline_sizes],
        )
        if best is None or key < best[0]:
            best = (key, option.counts)
    return None if best is None else best[1]


def search(
    costs: dict[int, batching.PipelineCost],
    num_nodes: int,
    f: int,
    global_batch: int,
    micro_batch: int,
) -> Counts | None:
    return mix.best_counts(
        list(costs.items()),
        num_nodes=num_nodes,
        min_pipelines=f + 1,
        global_batch=global_batch,
        micro_batch_size=micro_batch,
    )


@st.composite
def size_costs(draw: st.DrawFn, max_size: int = 6) -> dict[int, batching.PipelineCost]:
    sizes = draw(st.sets(st.integers(1, max_size), min_size=1, max_size=4))
    # a few cost values repeat on purpose, so that ties between mixes are common
    pair = st.one_of(
        strategies.pipeline_costs(),
        st.tuples(st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([0.0, 0.5, 1.0])),
    )
    return {
        s: batching.PipelineCost(fixed_s=a, per_micro_batch_s=c)
        for s, (a, c) in ((s, draw(pair)) for s in sorted(sizes))
    }


@settings(max_examples=400, deadline=None)
@given(
    costs=size_costs(),
    num_nodes=st.integers(0, 14),
    f=st.integers(0, 3),
    micro_batch=st.integers(1, 3),
    micro_batches=st.integers(1, 24),
    # mostly whole micro-batches; sometimes a few samples more, which no split can take
    extra=st.sampled_from([0, 0, 0, 1]),
)
def test_the_search_chooses_what_ranking_every_instantiation_chooses(
    costs: dict[int, batching.PipelineCost],
    num_nodes: int,
    f: int,
    micro_batch: int,
    micro_batches: int,
    extra: int,
) -> None:
    global_batch = micro_batch * micro_batches + extra
    expected = oracle(costs, num_nodes, f, global_batch, micro_batch)
    assert search(costs, num_nodes, f, global_batch, micro_batch) == expected


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.sets(st.integers(1, 6), min_size=1, max_size=4),
    num_nodes=st.integers(0, 16),
    f=st.integers(0, 3),
)
def test_counting_and_the_fewest_pipelines_agree_with_the_enumeration(
    sizes: set[int], num_nodes: int, f: int
) -> None:
    options = instantiation.enumerate_instantiations(sorted(sizes), num_nodes, f)
    assert mix.count_instantiations(sorted(sizes), num_nodes, f + 1) == len(options)
    fewest = min((o.num_pipelines for o in options), default=None)
    assert mix.fewest_pipelines(sorted(sizes), num_nodes, f + 1) == fewest


def _throughput(
    costs: dict[int, batching.PipelineCost], counts: Sequence[tuple[int, int]], batch: int
) -> float:
    sizes = [s for s, c in counts for _ in range(c)]
    return batching.distribute([costs[s] for s in sizes], batch, 1).throughput(batch)


@settings(max_examples=5, deadline=None)
@given(costs=size_costs(max_size=34), f=st.integers(0, 3))
def test_at_cluster_scale_no_neighbour_or_single_size_mix_is_faster(
    costs: dict[int, batching.PipelineCost], f: int
) -> None:
    num_nodes, batch = 1024, 4096
    found = search(costs, num_nodes, f, batch, 1)
    if found is None:
        return
    assert sum(s * c for s, c in found) == num_nodes
    best = _throughput(costs, found, batch)
    chosen = instantiation.Instantiation(counts=found)
    for option in instantiation.neighbours(chosen, list(costs), f):
        if option.num_pipelines <= batch:
            assert _throughput(costs, option.counts, batch) <= best
    for s in costs:
        if num_nodes % s == 0 and f + 1 <= num_nodes // s <= batch:
            assert _throughput(costs, ((s, num_nodes // s),), batch) <= best
