"""Reinstantiation after failures (planaria.planner.reinstantiation).

Covers: for random starting instantiations and random failure sets that leave at least
(f + 1) n0 nodes and a live replica of every layer, the new plan uses every surviving node,
has at least f + 1 pipelines, each covering every layer once, keeps the global batch, and every
merge has a template (App. B); §5.1's simple, borrow and merge steps on hand-made cases, with
untouched pipelines kept as they were; the re-optimised mix wins only on throughput or on bytes;
moved bytes are exact (nothing for an unchanged plan, a shard's missing part otherwise) and
summed by distinct placement equal the worker-by-worker sum (hypothesis, 1-3 GPUs per stage),
and a mix scored without building its plan (bytes counted per node shape) has its built
outcome's throughput and the worker-level bytes of the built plan; nodes assigned to a mix
as the list search before #17 assigned them (hypothesis oracle); failed nodes outside the
plan, lost layers, too few survivors and a plan made from other templates are
refused with reasons; survivor sets too large to list are searched (`mix`) and reach the same
best throughput as listing them.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planaria.contract import errors, plan, shapes
from planaria.planner import accelerators, instantiation, reinstantiation, synthetic, templates

MIB = 2**20


@functools.cache
def tiny_templates(
    num_nodes: int, gpus_per_node: int, f: int, memory: int
) -> templates.TemplateSet:
    """Templates of the `tiny` model (6 planner layers) on A100s, micro-batch 2."""
    source = synthetic.synthesize(
        shapes.named("tiny"), accelerators.named("a100-80gb"), 2, gpus_per_node
    )
    return templates.generate_templates(
        source,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        fault_tolerance=f,
        memory_bytes=memory,
    )


# (nodes, GPUs per node, f, memory): n0 = 1, 2 and 2 respectively.
CONFIGS = [(8, 2, 1, 80 * MIB), (8, 2, 1, 2 * MIB), (9, 1, 2, 4 * MIB)]


def _plan(template_set: templates.TemplateSet, groups: list[list[int]], batch: int) -> plan.Plan:
    option = instantiation.Instantiation(counts=tuple((len(g), 1) for g in groups))
    candidate = instantiation.evaluate(option, template_set, batch)
    return instantiation.build_plan(template_set, groups, candidate.distribution.micro_batches)


def _nodes(p: plan.Plan, pipeline: plan.Pipeline) -> list[int]:
    return sorted({int(p.node_of(w)) for w in pipeline.workers})


def _oobleck(result: reinstantiation.Reinstantiation) -> reinstantiation.Outcome:
    outcomes = (result.chosen, *result.alternatives)
    return next(o for o in outcomes if o.path is not reinstantiation.Path.REOPTIMISED)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), config=st.sampled_from(CONFIGS), batch=st.sampled_from([32, 48, 64]))
def test_survivors_are_all_used_by_at_least_f_plus_one_full_pipelines(
    data: st.DataObject, config: tuple[int, int, int, int], batch: int
) -> None:
    template_set = tiny_templates(*config)
    num_nodes = config[0]
    options = instantiation.enumerate_instantiations(
        template_set.sizes, num_nodes, template_set.fault_tolerance
    )
    option = data.draw(st.sampled_from(options))
    candidate = instantiation.evaluate(option, template_set, batch)
    start = instantiation.place(template_set, candidate, list(range(num_nodes)))
    failed = data.draw(st.sets(st.integers(0, num_nodes - 1), min_size=1, max_size=num_nodes))
    survivors = sorted(set(range(num_nodes)) - failed)
    f, n0 = template_set.fault_tolerance, template_set.min_nodes
    assume(len(survivors) >= (f + 1) * n0)
    assume(not reinstantiation._orphaned_layers(start, failed))

    result = reinstantiation.reinstantiate(start, template_set, failed)

    new = result.plan
    assert sorted({int(new.node_of(w)) for w in new.workers}) == survivors
    assert len(new.workers) == len(survivors) * template_set.gpus_per_node
    assert len(new.pipelines) >= f + 1
    assert new.global_batch_size == batch
    for pipeline in new.pipelines:
        covered = [layer for stage in pipeline.stages for layer in stage.layers]
        assert covered == list(range(template_set.num_layers))
        assert len(_nodes(new, pipeline)) in template_set.sizes
    # App. B: §5.1 never lacks a template (it may only end with too few pipelines when whole
    # pipelines were lost, and then the re-optimised plan is the one built).
    assert "lacks" not in result.reason
    for outcome in (result.chosen, *result.alternatives):
        assert set(outcome.merged_sizes) <= set(template_set.sizes)
        assert outcome.throughput <= result.chosen.throughput * (1 + 1e-9)


def test_a_pipeline_keeping_n0_nodes_is_simply_reinstantiated() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1, 2], [3, 4, 5], [6, 7]], 48)
    result = reinstantiation.reinstantiate(start, template_set, [1])
    outcome = _oobleck(result)
    assert outcome.path is reinstantiation.Path.SIMPLE
    assert [_nodes(outcome.plan, p) for p in outcome.plan.pipelines] == [[0, 2], [3, 4, 5], [6, 7]]
    assert outcome.plan.pipelines[1].stages == start.pipelines[1].stages
    assert outcome.plan.pipelines[2].stages == start.pipelines[2].stages


def test_a_short_pipeline_borrows_a_node_from_one_with_spare() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1, 2], [3, 4, 5], [6, 7]], 48)
    result = reinstantiation.reinstantiate(start, template_set, [7])
    outcome = _oobleck(result)
    assert outcome.path is reinstantiation.Path.BORROW
    # Lenders with the most spare first, ties to the earlier pipeline; it gives its last node.
    assert [_nodes(outcome.plan, p) for p in outcome.plan.pipelines] == [[0, 1], [3, 4, 5], [2, 6]]
    assert "borrow nodes [2] from pipeline 0" in " ".join(outcome.steps)
    assert outcome.plan.pipelines[1].stages == start.pipelines[1].stages


def test_short_pipelines_without_spare_nodes_merge() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1], [2, 3], [4, 5], [6, 7]], 64)
    result = reinstantiation.reinstantiate(start, template_set, [0])
    outcome = _oobleck(result)
    assert outcome.path is reinstantiation.Path.MERGE
    assert outcome.merged_sizes == (3,)
    assert [_nodes(outcome.plan, p) for p in outcome.plan.pipelines] == [[1, 2, 3], [4, 5], [6, 7]]
    # Two short pipelines merge with each other first.
    both = _oobleck(reinstantiation.reinstantiate(start, template_set, [0, 3]))
    assert both.merged_sizes == (2,)
    assert [_nodes(both.plan, p) for p in both.plan.pipelines] == [[1, 2], [4, 5], [6, 7]]


def test_the_choice_prefers_throughput_then_fewer_moved_bytes() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1], [2, 3], [4, 5], [6, 7]], 64)
    result = reinstantiation.reinstantiate(start, template_set, [0])
    for other in result.alternatives:
        faster = other.throughput > result.chosen.throughput * (1 + 1e-9)
        assert not faster
        if other.throughput >= result.chosen.throughput * (1 - 1e-9):
            assert other.moved_bytes >= result.chosen.moved_bytes
    assert "lost node(s) [0] of pipeline(s) [0]" in result.reason


def _one_stage(workers: tuple[int, ...], gpus_per_node: int = 2) -> plan.Plan:
    stage = plan.Stage(layer_start=0, layer_stop=2, workers=tuple(map(plan.WorkerId, workers)))
    return plan.Plan(
        pipelines=(plan.Pipeline(stages=(stage,), num_micro_batches=1),),
        micro_batch_size=1,
        gpus_per_node=gpus_per_node,
    )


@pytest.mark.parametrize(
    ("before", "after", "moved"),
    [
        pytest.param((0, 1), (0, 1), 0, id="an unchanged plan moves nothing"),
        pytest.param((0, 1), (2, 3), 17, id="other workers receive everything"),
        pytest.param((0, 1), (1, 0), 17, id="swapped ranks receive both halves"),
        pytest.param((0,), (0, 1), 5 + 4, id="a new second rank receives the upper halves"),
        pytest.param((0, 1), (0,), 5 + 4, id="one rank taking over receives the other half"),
    ],
)
def test_moved_bytes_count_the_missing_part_of_each_shard(
    before: tuple[int, ...], after: tuple[int, ...], moved: int
) -> None:
    # Layers of 10 and 7 bytes; with 2 ranks: [0, 5) + [5, 10) and [0, 3) + [3, 7).
    layer_bytes = (10, 7)
    old, new = _one_stage(before), _one_stage(after)
    assert reinstantiation.moved_bytes(old, new, layer_bytes) == moved


def worker_by_worker_moved_bytes(
    old: plan.Plan, new: plan.Plan, layer_bytes: tuple[int, ...]
) -> int:
    """`moved_bytes` as it was before #17, one (worker, layer) at a time: its oracle."""

    def shard(num_bytes: int, rank: int, ranks: int) -> range:
        return range(rank * num_bytes // ranks, (rank + 1) * num_bytes // ranks)

    held = {
        (w, layer): shard(layer_bytes[layer], rank, len(s.workers))
        for p in old.pipelines
        for s in p.stages
        for rank, w in enumerate(s.workers)
        for layer in s.layers
    }
    total = 0
    for s in (s for p in new.pipelines for s in p.stages):
        for rank, w in enumerate(s.workers):
            for layer in s.layers:
                need = shard(layer_bytes[layer], rank, len(s.workers))
                have = held.get((w, layer), range(0))
                total += len(need) - max(0, min(need.stop, have.stop) - max(need.start, have.start))
    return total


@st.composite
def tensor_parallel_plans(draw: st.DrawFn, num_layers: int) -> plan.Plan:
    """1..3 pipelines of up to 3 stages over `num_layers` layers, stages of 1..3 workers
    drawn from workers 0..26 without repeats (one node of 27 GPUs: no stage spans nodes)."""
    pool = draw(st.permutations(range(27)))
    pipelines, used = [], 0
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        cuts = draw(st.sets(st.integers(min_value=1, max_value=num_layers - 1), max_size=2))
        bounds = [0, *sorted(cuts), num_layers]
        stages = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            width = draw(st.integers(min_value=1, max_value=3))
            workers = tuple(plan.WorkerId(w) for w in pool[used : used + width])
            stages.append(plan.Stage(layer_start=a, layer_stop=b, workers=workers))
            used += width
        pipelines.append(plan.Pipeline(stages=tuple(stages), num_micro_batches=1))
    return plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1, gpus_per_node=27)


@given(st.data())
@settings(max_examples=80, deadline=None)
def test_moved_bytes_by_distinct_placement_equal_worker_by_worker(data: st.DataObject) -> None:
    layer_bytes = tuple(data.draw(st.lists(st.integers(0, 50), min_size=3, max_size=3)))
    old = data.draw(tensor_parallel_plans(3))
    new = data.draw(tensor_parallel_plans(3))
    expected = worker_by_worker_moved_bytes(old, new, layer_bytes)
    assert reinstantiation.moved_bytes(old, new, layer_bytes) == expected


@settings(max_examples=60, deadline=None)
@given(data=st.data(), config=st.sampled_from(CONFIGS), batch=st.sampled_from([32, 48, 64]))
def test_a_scored_mix_has_the_throughput_and_bytes_of_its_built_outcome(
    data: st.DataObject, config: tuple[int, int, int, int], batch: int
) -> None:
    # the re-optimised path scores tied mixes without building them, then builds the winner
    template_set = tiny_templates(*config)
    num_nodes = config[0]
    options = instantiation.enumerate_instantiations(
        template_set.sizes, num_nodes, template_set.fault_tolerance
    )
    before = instantiation.evaluate(data.draw(st.sampled_from(options)), template_set, batch)
    start = instantiation.place(template_set, before, list(range(num_nodes)))
    after = data.draw(st.sampled_from(options))
    nodes = data.draw(st.permutations(range(num_nodes)))
    groups, used = [], 0
    for size in after.pipeline_sizes:
        groups.append(list(nodes[used : used + size]))
        used += size
    layout = reinstantiation._layout(start)
    built = reinstantiation._outcome(
        layout, template_set, groups, reinstantiation.Path.REOPTIMISED, [], ()
    )
    # both count bytes per node shape: the worker-level `moved_bytes` (its own oracle above)
    # on the built plan is their reference
    expected = reinstantiation.moved_bytes(start, built.plan, template_set.layer_state_bytes)
    assert built.moved_bytes == expected
    score = reinstantiation._score(layout, template_set, groups)
    assert score == (built.throughput, expected)


def list_assign(
    layout: reinstantiation._Layout, survivors: list[int], sizes: list[int]
) -> list[list[int]]:
    """`_assign` as it was before #17 (a list of sizes searched and sliced per pipeline,
    quadratic at 1,024 nodes): its oracle."""
    alive = set(survivors)
    remaining = list(sizes)
    groups, used = [], set()
    for group in layout.groups:
        if all(n in alive for n in group) and len(group) in remaining:
            remaining.remove(len(group))
            groups.append(list(group))
            used.update(group)
    pool = [n for n in survivors if n not in used]
    for size in remaining:
        chunk, pool = pool[:size], pool[size:]
        groups.append(sorted(chunk, key=lambda n: (layout.first_layer[n], n)))
    return groups


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_assigning_nodes_to_a_mix_keeps_intact_pipelines_as_the_list_search_did(
    data: st.DataObject,
) -> None:
    old_sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=8))
    nodes = data.draw(st.permutations(range(sum(old_sizes))))
    groups, used = [], 0
    for size in old_sizes:
        groups.append(list(nodes[used : used + size]))
        used += size
    first = {n: data.draw(st.integers(0, 5)) for n in nodes}
    layout = reinstantiation._Layout(groups=groups, first_layer=first)
    lost = data.draw(st.sets(st.sampled_from(nodes), max_size=len(nodes) - 1))
    survivors = [n for group in groups for n in group if n not in lost]
    sizes: list[int] = []
    while sum(sizes) < len(survivors):
        sizes.append(data.draw(st.integers(1, len(survivors) - sum(sizes))))
    assert reinstantiation._assign(layout, survivors, sizes) == list_assign(
        layout, survivors, sizes
    )


def test_failed_nodes_outside_the_plan_are_refused() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1, 2], [3, 4, 5], [6, 7]], 48)
    with pytest.raises(errors.PlanInputError, match=r"\[9\] are not in the plan"):
        reinstantiation.reinstantiate(start, template_set, [9])
    with pytest.raises(errors.PlanInputError, match="at least one failed node"):
        reinstantiation.reinstantiate(start, template_set, [])


def test_a_layer_without_a_live_replica_is_refused() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1, 2], [3, 4, 5], [6, 7]], 48)
    with pytest.raises(errors.InfeasibleError, match="no live replica"):
        reinstantiation.reinstantiate(start, template_set, [0, 3, 6])


def test_too_few_survivors_for_f_plus_one_pipelines_are_refused() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1, 2], [3, 4, 5], [6, 7]], 48)
    with pytest.raises(errors.InfeasibleError, match="need 4"):
        reinstantiation.reinstantiate(start, template_set, [2, 3, 4, 5, 6])


def test_a_plan_from_other_templates_is_refused() -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    other = tiny_templates(9, 1, 2, 4 * MIB)
    start = _plan(other, [[0, 1, 2], [3, 4, 5], [6, 7, 8]], 48)
    with pytest.raises(errors.PlanInputError, match="the templates the plan came from"):
        reinstantiation.reinstantiate(start, template_set, [0])


@pytest.mark.parametrize(
    "failed", [pytest.param([0], id="one node lost"), pytest.param([3, 6], id="two nodes lost")]
)
def test_a_survivor_set_too_large_to_list_is_searched_with_the_same_best_throughput(
    monkeypatch: pytest.MonkeyPatch, failed: list[int]
) -> None:
    template_set = tiny_templates(8, 2, 1, 2 * MIB)
    start = _plan(template_set, [[0, 1], [2, 3], [4, 5], [6, 7]], 64)
    listed = reinstantiation.reinstantiate(start, template_set, failed)
    monkeypatch.setattr(reinstantiation, "_MAX_LISTED", 0)
    searched = reinstantiation.reinstantiate(start, template_set, failed)
    assert searched.chosen.throughput == listed.chosen.throughput
    assert sorted(o.path for o in searched.alternatives) == sorted(
        o.path for o in listed.alternatives
    )
