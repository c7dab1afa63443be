"""All-reduce rounds by graph colouring (planaria.contract.colouring, Odyssey §IV-B).

Covers:
- Welsh-Powell on random small graphs: a proper colouring, colours numbered densely, never
  fewer colours than the exact chromatic number (brute-force oracle here), never more than
  max degree + 1;
- equality with the exact colouring where greedy must find it: no edges (symmetric pipelines:
  one round), complete graphs, cycles, stars;
- the conflict graph joins exactly the groups that share a worker; the rounds of compiled
  heterogeneous schedules are proper and at least the exact chromatic number of their buckets'
  graph; Oobleck's Fig. 9 example gives its per-layer groups in two rounds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import colouring, instructions, plan, schedule
from tests import strategies


def exact_colours(adjacency: Sequence[frozenset[int]]) -> int:
    """Chromatic number by trying every assignment with k = 1, 2, ... colours."""
    n = len(adjacency)
    if n == 0:
        return 0
    for k in range(1, n + 1):
        for colours in itertools.product(range(k), repeat=n):
            if colouring.is_proper(adjacency, colours):
                return k
    raise AssertionError("n colours always suffice")


@st.composite
def graphs(draw: st.DrawFn, max_vertices: int = 7) -> tuple[frozenset[int], ...]:
    n = draw(st.integers(min_value=0, max_value=max_vertices))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    neighbours: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        neighbours[a].add(b)
        neighbours[b].add(a)
    return tuple(frozenset(x) for x in neighbours)


@settings(max_examples=150, deadline=None)
@given(adjacency=graphs())
def test_welsh_powell_is_proper_and_between_the_optimum_and_max_degree_plus_one(
    adjacency: tuple[frozenset[int], ...],
) -> None:
    colours = colouring.welsh_powell(adjacency)
    assert colouring.is_proper(adjacency, colours)
    used = colouring.num_colours(colours)
    assert sorted(set(colours)) == list(range(used))
    assert exact_colours(adjacency) <= used
    assert used <= max((len(n) for n in adjacency), default=-1) + 1


def complete(n: int) -> tuple[frozenset[int], ...]:
    return tuple(frozenset(set(range(n)) - {v}) for v in range(n))


def cycle(n: int) -> tuple[frozenset[int], ...]:
    return tuple(frozenset({(v - 1) % n, (v + 1) % n}) for v in range(n))


def star(n: int) -> tuple[frozenset[int], ...]:
    return (frozenset(range(1, n)), *(frozenset({0}) for _ in range(1, n)))


@pytest.mark.parametrize(
    ("adjacency", "rounds"),
    [
        ((), 0),
        ((frozenset(),) * 5, 1),
        (complete(5), 5),
        (cycle(5), 3),
        (cycle(6), 2),
        (star(6), 2),
    ],
    ids=["no vertices", "no edges", "complete K5", "odd cycle C5", "even cycle C6", "star"],
)
def test_welsh_powell_is_exact_where_it_must_be(
    adjacency: tuple[frozenset[int], ...], rounds: int
) -> None:
    colours = colouring.welsh_powell(adjacency)
    assert colouring.num_colours(colours) == rounds == exact_colours(adjacency)


def test_the_conflict_graph_joins_groups_that_share_a_worker() -> None:
    groups = [{0, 2}, {0, 3}, {1, 3}, {4, 5}]
    assert colouring.conflict_graph(groups) == (
        frozenset({1}),
        frozenset({0, 2}),
        frozenset({1}),
        frozenset(),
    )


@pytest.mark.parametrize("num_pipelines", [2, 3, 4])
def test_symmetric_pipelines_need_one_round(num_pipelines: int) -> None:
    """Stage s of every pipeline forms one group; groups of different stages are disjoint."""
    groups = [{p * 3 + s for p in range(num_pipelines)} for s in range(3)]
    adjacency = colouring.conflict_graph(groups)
    assert colouring.num_colours(colouring.welsh_powell(adjacency)) == 1 == exact_colours(adjacency)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_rounds_of_heterogeneous_schedules_are_proper_and_at_least_optimal(
    data: st.DataObject,
) -> None:
    counts = data.draw(st.sampled_from([(3, 2), (2, 2, 1), (4, 3, 3), (4, 1)]))
    sched = schedule.compile_schedule(data.draw(strategies.shaped_plans(counts, aligned=False)))
    buckets = sorted(
        {
            (op.layers, op.group, op.round)
            for s in sched.streams
            for op in s.instructions
            if isinstance(op, instructions.AllReduce)
        }
    )
    adjacency = colouring.conflict_graph([set(group) for _, group, _ in buckets])
    rounds = [r for _, _, r in buckets]
    assert colouring.is_proper(adjacency, rounds)
    assert sched.num_rounds == colouring.num_colours(rounds) >= exact_colours(adjacency)


def test_oobleck_figure_9_syncs_per_layer_bucket_in_two_rounds() -> None:
    """A 6-layer model on a 2-stage and a 3-stage pipeline (Oobleck §6.1, Fig. 9): the buckets
    of layers with one group form a path in the conflict graph, so two rounds."""
    p = plan.Plan(
        pipelines=(
            plan.Pipeline(
                stages=(
                    plan.Stage(layer_start=0, layer_stop=3, workers=(plan.WorkerId(0),)),
                    plan.Stage(layer_start=3, layer_stop=6, workers=(plan.WorkerId(1),)),
                ),
                num_micro_batches=1,
            ),
            plan.Pipeline(
                stages=(
                    plan.Stage(layer_start=0, layer_stop=2, workers=(plan.WorkerId(2),)),
                    plan.Stage(layer_start=2, layer_stop=4, workers=(plan.WorkerId(3),)),
                    plan.Stage(layer_start=4, layer_stop=6, workers=(plan.WorkerId(4),)),
                ),
                num_micro_batches=1,
            ),
        ),
        micro_batch_size=1,
    )
    sched = schedule.compile_schedule(p)
    layer_groups = {
        op.layers: op.group
        for s in sched.streams
        for op in s.instructions
        if isinstance(op, instructions.AllReduce)
    }
    # the 2-stage pipeline's stages each sync with two stages of the other pipeline
    assert layer_groups == {(0, 1): (0, 2), (2,): (0, 3), (3,): (1, 3), (4, 5): (1, 4)}
    assert sched.num_rounds == 2
