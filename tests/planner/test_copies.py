"""A whole plan's estimate from its kinds of pipelines (planaria.planner.copies).

Covers, against the estimate of the built plan (`screening.Estimates.whole`, composed, and the
whole compiled schedule replayed: the paths `copies` replaces in the fresh-plan search, kept as
oracles): the step and peak are equal bit for bit (hypothesis over one-GPU-node plans of 1..3
kinds of pipelines, each its own cuts and micro-batches, 1..5 copies each, laid out in any
order, under profiles of arbitrary float costs, bytes and links; a plan of one pipeline), the
same on nodes of 2..8 GPUs (`copies.Nodes`: the pipelines on consecutive workers, a kind per
split, micro-batches and first GPU within a node), and what it refuses.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import plan, profile, schedule
from planaria.planner import composition, copies, distribution, estimator, memory, screening
from tests import strategies

Kind = tuple[tuple[int, ...], int, int]  # split, micro-batches, copies


@st.composite
def kinds_and_profile(draw: st.DrawFn) -> tuple[list[Kind], list[int], profile.Profile]:
    """1..3 kinds of pipelines over 1..6 layers (each its own cuts, 1..6 micro-batches, 1..5
    copies), the order the plan lays their copies out in, and a profile of arbitrary costs."""
    num_layers = draw(st.integers(1, 6))
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        inner = st.lists(st.integers(1, num_layers - 1), unique=True) if num_layers > 1 else None
        cuts = [0, *sorted(draw(inner)), num_layers] if inner is not None else [0, 1]
        split = tuple(b - a for a, b in zip(cuts, cuts[1:], strict=False))
        kinds.append((split, draw(st.integers(1, 6)), draw(st.integers(1, 5))))
    order = draw(st.permutations([k for k, (_, _, n) in enumerate(kinds) for _ in range(n)]))
    prof = draw(strategies.sized_profiles(num_layers, 1, "copies"))
    return kinds, list(order), prof


def built(kinds: list[Kind], order: list[int], gpus_per_node: int = 1) -> plan.Plan:
    """The kinds' copies on workers 0, 1, 2, ... in `order`."""
    pipelines, used = [], 0
    for k in order:
        split, num_micro_batches, _ = kinds[k]
        workers = [plan.WorkerId(w) for w in range(used, used + len(split))]
        pipelines.append(distribution.pipeline_of(split, workers, num_micro_batches))
        used += len(split)
    return plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1, gpus_per_node=gpus_per_node)


def of_kinds(kinds: list[Kind], prof: profile.Profile) -> list[copies.Copies]:
    """Each kind with its run alone, on workers of its own."""
    out = []
    for split, num_micro_batches, count in kinds:
        workers = [plan.WorkerId(w) for w in range(len(split))]
        pipeline = distribution.pipeline_of(split, workers, num_micro_batches)
        run = composition.run_alone(pipeline, 1, 1, prof)
        out.append(copies.Copies(split=split, run=run, count=count))
    return out


@given(kinds_and_profile())
@settings(max_examples=150, deadline=None)
def test_the_step_and_peak_are_the_built_plans_bit_for_bit(
    drawn: tuple[list[Kind], list[int], profile.Profile],
) -> None:
    kinds, order, prof = drawn
    plan_ = built(kinds, order)
    step_s, peak_bytes = copies.whole(of_kinds(kinds, prof), prof)
    composed = screening.Estimates(prof).whole(plan_)
    assert (repr(step_s), peak_bytes) == (repr(composed.step_s), composed.peak_bytes)
    sched = schedule.compile_schedule(plan_)
    assert repr(step_s) == repr(estimator.estimate_step(sched, prof).step_s)
    assert peak_bytes == memory.estimate_memory(sched, prof).peak_bytes


def on_nodes(
    kinds: list[Kind], order: list[int], gpus: int, prof: profile.Profile
) -> tuple[list[copies.Copies], copies.Nodes]:
    """The copies of `built(kinds, order, gpus)`, a kind per split, micro-batches and first
    GPU within a node, each run alone from that GPU, and where they lie."""
    counts: dict[tuple[int, int], int] = {}
    keys, used = [], 0
    for k in order:
        keys.append((k, used % gpus))
        counts[keys[-1]] = counts.get(keys[-1], 0) + 1
        used += len(kinds[k][0])
    out = []
    for (k, gpu), count in counts.items():
        split, num_micro_batches, _ = kinds[k]
        workers = [plan.WorkerId(gpu + w) for w in range(len(split))]
        pipeline = distribution.pipeline_of(split, workers, num_micro_batches)
        run = composition.run_alone(pipeline, 1, gpus, prof)
        out.append(copies.Copies(split=split, run=run, count=count))
    index = list(counts)
    nodes = copies.Nodes(
        gpus_per_node=gpus,
        num_workers=used,
        first=index.index(keys[0]),
        last=index.index(keys[-1]),
    )
    return out, nodes


@given(kinds_and_profile(), st.integers(2, 8))
@settings(max_examples=150, deadline=None)
def test_on_nodes_of_several_gpus_the_step_and_peak_are_the_built_plans(
    drawn: tuple[list[Kind], list[int], profile.Profile], gpus: int
) -> None:
    kinds, order, prof = drawn
    plan_ = built(kinds, order, gpus)
    kinds_on, nodes = on_nodes(kinds, order, gpus, prof)
    step_s, peak_bytes = copies.whole(kinds_on, prof, nodes)
    composed = screening.Estimates(prof).whole(plan_)
    assert (repr(step_s), peak_bytes) == (repr(composed.step_s), composed.peak_bytes)
    sched = schedule.compile_schedule(plan_)
    assert repr(step_s) == repr(estimator.estimate_step(sched, prof).step_s)
    assert peak_bytes == memory.estimate_memory(sched, prof).peak_bytes


@given(kinds_and_profile())
@settings(max_examples=30, deadline=None)
def test_a_plan_of_one_pipeline_is_its_run(
    drawn: tuple[list[Kind], list[int], profile.Profile],
) -> None:
    kinds, _, prof = drawn
    alone = [(kinds[0][0], kinds[0][1], 1)]
    step_s, peak_bytes = copies.whole(of_kinds(alone, prof), prof)
    composed = screening.Estimates(prof).whole(built(alone, [0]))
    assert (repr(step_s), peak_bytes) == (repr(composed.step_s), composed.peak_bytes)


def test_splits_that_miss_the_profiles_layers_are_refused() -> None:
    prof = composition_profile(3)
    kind = of_kinds([((1, 2), 2, 1)], prof)[0]
    with pytest.raises(ValueError, match="4 layers"):
        copies.whole([kind], composition_profile(4))
    with pytest.raises(ValueError, match="one copy or more"):
        copies.Copies(split=(1, 2), run=kind.run, count=0)
    with pytest.raises(ValueError, match="the run of that split"):
        copies.Copies(split=(3,), run=kind.run, count=1)


def composition_profile(num_layers: int) -> profile.Profile:
    layer = profile.LayerProfile(
        name="l",
        forward_s=(1.0,),
        backward_s=(2.0,),
        parameter_bytes=8,
        gradient_bytes=8,
        optimizer_bytes=8,
        activation_bytes=8,
        output_bytes=8,
        optimizer_s=0.5,
    )
    link = profile.LinkProfile(bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    return profile.Profile(
        model="copies",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=(layer,) * num_layers,
        intra_node=link,
        inter_node=link,
    )
