"""Instantiation and plan choice (planaria.planner.instantiation).

Covers: eq. 5's enumeration equals a brute force over count vectors (exactly N' nodes, at
least f + 1 pipelines, no repeats); a huge enumeration is refused before it runs; the chosen
plan is the one ranking every enumerated instantiation picks (the oracle; tests/planner/
test_mix.py has the property test), uses every node once, keeps the global
batch, places each pipeline as its template says (WorkerId = node * M + GPU) and explains the
runner-up, the best mix one split, merge or node move away; neighbours are exactly that;
instantiations that cannot take the global batch are skipped, and when none can the
error recommends the nearest global batch; too few nodes for f + 1 pipelines is refused.
Hypothesis: any f failed nodes leave every layer of a plan for fault tolerance f a live holder.
"""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, plan, shapes
from planaria.planner import accelerators, batching, instantiation, synthetic, templates


@functools.cache
def small_templates(
    num_nodes: int, gpus_per_node: int, fault_tolerance: int
) -> templates.TemplateSet:
    """Templates of the `small` model (10 planner layers) on A100s, micro-batch 2."""
    source = synthetic.synthesize(
        shapes.named("small"), accelerators.named("a100-80gb"), 2, gpus_per_node
    )
    return templates.generate_templates(
        source, num_nodes=num_nodes, gpus_per_node=gpus_per_node, fault_tolerance=fault_tolerance
    )


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.sets(st.integers(1, 6), min_size=1, max_size=4),
    num_nodes=st.integers(0, 14),
    f=st.integers(0, 3),
)
def test_enumeration_equals_a_brute_force(sizes: set[int], num_nodes: int, f: int) -> None:
    ordered = sorted(sizes)
    expected: set[tuple[tuple[int, int], ...]] = set()
    for counts in itertools.product(*(range(num_nodes // s + 1) for s in ordered)):
        used = sum(c * s for c, s in zip(counts, ordered, strict=True))
        if used == num_nodes and sum(counts) >= f + 1:
            expected.add(tuple((s, c) for s, c in zip(ordered, counts, strict=True) if c))
    found = instantiation.enumerate_instantiations(ordered, num_nodes, f)
    assert len(found) == len(expected)
    assert {tuple(sorted(x.counts)) for x in found} == expected


def test_a_huge_enumeration_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instantiation, "MAX_INSTANTIATIONS", 100)
    with pytest.raises(errors.InfeasibleError, match="raise the fault tolerance"):
        instantiation.enumerate_instantiations(range(1, 21), 20, 0)


@pytest.mark.parametrize(
    ("num_nodes", "gpus", "f", "global_batch"),
    [
        pytest.param(5, 1, 1, 64, id="five single-GPU nodes, f=1"),
        pytest.param(7, 2, 2, 96, id="seven two-GPU nodes, f=2"),
        pytest.param(4, 4, 0, 32, id="four four-GPU nodes, f=0"),
    ],
)
def test_the_chosen_plan_is_the_fastest_and_uses_every_node(
    num_nodes: int, gpus: int, f: int, global_batch: int
) -> None:
    template_set = small_templates(num_nodes, gpus, f)
    nodes = list(range(10, 10 + num_nodes))
    choice = instantiation.choose_plan(template_set, nodes, global_batch)
    options = instantiation.enumerate_instantiations(template_set.sizes, num_nodes, f)
    ranked = instantiation.rank(
        [instantiation.evaluate(o, template_set, global_batch) for o in options]
    )
    # the enumeration is the oracle: the search picks its first and builds the same plan
    assert choice.chosen == ranked[0]
    assert choice.plan == instantiation.place(template_set, ranked[0], nodes)
    assert choice.num_instantiations == len(options)
    result = choice.plan
    assert sorted({int(result.node_of(w)) for w in result.workers}) == nodes
    assert len(result.workers) == num_nodes * gpus
    assert len(result.pipelines) >= f + 1
    assert result.global_batch_size == global_batch
    assert "chose" in choice.reason
    if choice.runner_up is not None:
        assert "runner-up" in choice.reason
        assert choice.runner_up.throughput <= choice.chosen.throughput


def test_pipelines_are_placed_as_their_templates_say() -> None:
    template_set = small_templates(4, 2, 0)
    candidate = instantiation.evaluate(
        instantiation.Instantiation(counts=((3, 1), (1, 1))), template_set, 16
    )
    result = instantiation.place(template_set, candidate, [7, 2, 5, 9])
    assert [p.num_micro_batches for p in result.pipelines] == list(
        candidate.distribution.micro_batches
    )
    for pipeline, group in zip(result.pipelines, [(7, 2, 5), (9,)], strict=True):
        mapping = template_set.template(len(group)).mapping
        for stage, mapped in zip(pipeline.stages, mapping.stages, strict=True):
            assert (stage.layer_start, stage.layer_stop) == (mapped.layer_start, mapped.layer_stop)
            first = group[mapped.node] * 2 + mapped.gpu_start
            assert stage.workers == tuple(plan.WorkerId(first + j) for j in range(mapped.num_gpus))


def test_instantiations_that_cannot_take_the_batch_are_skipped() -> None:
    template_set = small_templates(5, 1, 1)
    choice = instantiation.choose_plan(template_set, list(range(5)), 2 * 2)
    assert choice.plan.global_batch_size == 4
    assert len(choice.plan.pipelines) == 2


def test_the_runner_up_is_the_best_neighbour_and_ranks_below() -> None:
    template_set = small_templates(7, 2, 2)
    choice = instantiation.choose_plan(template_set, list(range(7)), 96)
    near = instantiation.neighbours(choice.chosen.instantiation, template_set.sizes, 2)
    assert choice.runner_up is not None
    assert choice.runner_up.instantiation in near
    ranked = instantiation.rank(
        [choice.chosen, *(instantiation.evaluate(o, template_set, 96) for o in near)]
    )
    assert ranked[:2] == [choice.chosen, choice.runner_up]
    assert "runner-up" in choice.reason


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 3)), min_size=1, max_size=3),
    f=st.integers(0, 3),
)
def test_neighbours_are_one_split_merge_or_node_move_away(
    counts: list[tuple[int, int]], f: int
) -> None:
    merged: dict[int, int] = {}
    for size, count in counts:
        merged[size] = merged.get(size, 0) + count
    start = instantiation.Instantiation(counts=tuple(sorted(merged.items(), reverse=True)))
    sizes = list(range(1, 8))
    for near in instantiation.neighbours(start, sizes, f):
        assert near.num_nodes == start.num_nodes
        assert near.num_pipelines >= f + 1
        assert near != start
        before, after = list(start.pipeline_sizes), list(near.pipeline_sizes)
        for size in near.pipeline_sizes:
            if size in before:
                before.remove(size)
                after.remove(size)
        # what changed: one pipeline became two, two became one, or two became two
        assert (len(before), len(after)) in {(1, 2), (2, 1), (2, 2)}


def test_a_batch_no_instantiation_can_take_recommends_the_nearest() -> None:
    template_set = small_templates(5, 1, 1)
    with pytest.raises(batching.UndistributableBatchError, match="nearest") as caught:
        instantiation.choose_plan(template_set, list(range(5)), 3)
    assert caught.value.recommended_global_batch == 4


def test_too_few_nodes_for_f_plus_one_pipelines_is_refused() -> None:
    template_set = small_templates(5, 1, 3)
    with pytest.raises(errors.InfeasibleError, match="at least 4 nodes"):
        instantiation.choose_plan(template_set, [0, 1, 2], 64)


def test_repeated_nodes_are_refused() -> None:
    with pytest.raises(errors.PlanInputError, match="distinct"):
        instantiation.choose_plan(small_templates(5, 1, 1), [0, 1, 1, 2, 3], 64)


def test_a_thousand_nodes_are_planned_without_enumerating() -> None:
    # 2.7e27-scale eq. 5 for 34 sizes; the small model's 10 sizes still give ~10^16 mixes
    template_set = small_templates(1024, 1, 1)
    choice = instantiation.choose_plan(template_set, list(range(1024)), 4096)
    assert choice.num_instantiations > instantiation.MAX_INSTANTIATIONS
    result = choice.plan
    assert sorted({int(result.node_of(w)) for w in result.workers}) == list(range(1024))
    assert result.global_batch_size == 4096
    near = instantiation.neighbours(choice.chosen.instantiation, template_set.sizes, 1)
    for option in near:
        other = instantiation.evaluate(option, template_set, 4096)
        assert instantiation.rank([choice.chosen, other])[0] is choice.chosen


@functools.cache
def _templates_cached(num_nodes: int, gpus: int, f: int) -> templates.TemplateSet:
    return small_templates(num_nodes, gpus, f)


@settings(max_examples=40, deadline=None)
@given(
    num_nodes=st.integers(2, 9),
    gpus=st.sampled_from([1, 2]),
    f=st.integers(0, 2),
    data=st.data(),
)
def test_any_f_node_failures_leave_every_layer_a_live_holder(
    num_nodes: int, gpus: int, f: int, data: st.DataObject
) -> None:
    """The planner-level guarantee of docs/resilience.md: a plan instantiated for fault
    tolerance f holds every layer on at least f + 1 distinct nodes (one per pipeline), so any f
    failed nodes leave each layer a live replica; snapshots are needed only beyond that."""
    try:
        template_set = _templates_cached(num_nodes, gpus, f)
        result = instantiation.choose_plan(template_set, list(range(num_nodes)), 64).plan
    except errors.PlannerError:
        return  # too few nodes for f + 1 pipelines of the smallest template: refused
    failed = data.draw(st.sets(st.integers(0, num_nodes - 1), max_size=f))
    for layer in range(result.num_layers):
        holders = {
            int(result.node_of(w))
            for p in result.pipelines
            for s in p.stages
            if s.layer_start <= layer < s.layer_stop
            for w in s.workers
        }
        assert len(holders) >= f + 1
        assert holders - failed, f"layer {layer} lost every holder to nodes {sorted(failed)}"
