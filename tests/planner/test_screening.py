"""Memoised estimates (planaria.planner.screening): E's estimators, keyed by node pattern.

Covers: E's step and peak memory are invariant under relabelling nodes and GPUs within nodes
(hypothesis over plans with holes, reroutes and multi-GPU stages), which is what makes the
canonical key sound; the memo returns exactly E's numbers; a pipeline alone equals the whole
estimate of a one-pipeline plan; relabelled plans share one memo entry; the canonical form;
the memory limit and its check; a whole plan is never faster than its slowest pipeline alone
(hypothesis over heterogeneous plans: the screen is optimistic).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, profile, schedule
from planaria.contract import plan as plans
from planaria.planner import estimator, memory, screening, transfers
from tests import strategies

W = plans.WorkerId


def profile_for(num_layers: int, max_gpus: int) -> profile.Profile:
    """Layers with distinct costs, timed for 1..max_gpus GPUs, links of different speeds."""
    layers = tuple(
        profile.LayerProfile(
            name=f"layer{i}",
            forward_s=tuple((1 + i % 3) * 0.01 / k for k in range(1, max_gpus + 1)),
            backward_s=tuple((1 + i % 3) * 0.02 / k for k in range(1, max_gpus + 1)),
            parameter_bytes=1000 * (i + 1),
            gradient_bytes=1000 * (i + 1),
            optimizer_bytes=4000,
            activation_bytes=300,
            output_bytes=200 + i,
            optimizer_s=0.001,
        )
        for i in range(num_layers)
    )
    return profile.Profile(
        model="screening",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**30,
        layers=layers,
        intra_node=profile.LinkProfile(bandwidth_bytes_per_s=1e6, latency_s=1e-4),
        inter_node=profile.LinkProfile(bandwidth_bytes_per_s=1e5, latency_s=1e-3),
    )


def relabelled(plan_: plans.Plan, seed: int) -> plans.Plan:
    """The plan with its nodes permuted (onto fresh node ids) and GPUs permuted within each."""
    rng = random.Random(seed)
    gpus = plan_.gpus_per_node
    nodes = sorted({w // gpus for w in plan_.workers})
    targets = rng.sample(range(len(nodes) + 5), len(nodes))
    binding = {}
    for node, target in zip(nodes, targets, strict=True):
        order = rng.sample(range(gpus), gpus)
        for g in range(gpus):
            binding[W(node * gpus + g)] = W(target * gpus + order[g])
    return transfers.relabel(plan_, binding)


def direct(plan_: plans.Plan, prof: profile.Profile) -> screening.Estimate:
    sched = schedule.compile_schedule(plan_)
    return screening.Estimate(
        step_s=estimator.estimate_step(sched, prof).step_s,
        peak_bytes=memory.estimate_memory(sched, prof).peak_bytes,
    )


@given(strategies.plans(max_layers=5, max_pipelines=3, max_gpus_per_node=2), st.integers(0, 99))
@settings(max_examples=60, deadline=None)
def test_estimates_do_not_depend_on_node_and_gpu_labels(plan_: plans.Plan, seed: int) -> None:
    prof = profile_for(plan_.num_layers, plan_.gpus_per_node)
    assert direct(relabelled(plan_, seed), prof) == direct(plan_, prof)


@given(strategies.plans(max_layers=5, max_pipelines=3, max_gpus_per_node=2), st.integers(0, 99))
@settings(max_examples=30, deadline=None)
def test_the_memo_returns_e_numbers_once_per_node_pattern(plan_: plans.Plan, seed: int) -> None:
    prof = profile_for(plan_.num_layers, plan_.gpus_per_node)
    estimates = screening.Estimates(prof)
    first = estimates.whole(plan_)
    assert first == direct(plan_, prof)
    other = relabelled(plan_, seed)
    assert screening.canonical(other.pipelines, other.gpus_per_node) == screening.canonical(
        plan_.pipelines, plan_.gpus_per_node
    )
    assert estimates.whole(other) is first


def test_a_pipeline_alone_is_a_one_pipeline_plan() -> None:
    prof = strategies.timed_profile([0.001, 0.003, 0.002, 0.001])
    running = strategies.grid_plan(2, (1, 3), 4, 5)
    estimates = screening.Estimates(prof)
    alone = estimates.pipeline(running.pipelines[1], 1, 1)
    one = plans.Plan(pipelines=(running.pipelines[1],), micro_batch_size=1)
    assert alone == direct(one, prof)
    assert estimates.pipeline(running.pipelines[0], 1, 1) is alone  # same shape, other workers


def test_canonical_numbers_nodes_by_first_use() -> None:
    stage = plans.Stage
    pipeline = plans.Pipeline(
        stages=(
            stage(layer_start=0, layer_stop=1, workers=(W(7),)),
            stage(layer_start=1, layer_stop=2, workers=(W(6),)),
            stage(layer_start=2, layer_stop=3, workers=(W(2), W(3))),
        ),
        num_micro_batches=4,
    )
    # with 2 GPUs per node: node 3 -> 0 (GPUs in order of use: 7 -> 0, 6 -> 1), node 1 -> 1
    assert screening.canonical((pipeline,), 2) == (
        (((0, 1, (0,)), (1, 2, (1,)), (2, 3, (2, 3))), 4),
    )


def test_fits_compares_with_the_limit() -> None:
    estimates = screening.Estimates(strategies.uniform_profile(2), memory_bytes=100)
    assert estimates.fits(screening.Estimate(step_s=1.0, peak_bytes=100))
    assert not estimates.fits(screening.Estimate(step_s=1.0, peak_bytes=101))
    assert screening.Estimates(strategies.uniform_profile(2)).memory_bytes == 2**40
    with pytest.raises(errors.PlanInputError, match="memory_bytes is 0"):
        screening.Estimates(strategies.uniform_profile(2), memory_bytes=0)


@given(strategies.running_plans(max_workers=8, max_layers=6, max_pipelines=3))
@settings(max_examples=60, deadline=None)
def test_a_whole_plan_is_never_faster_than_its_slowest_pipeline_alone(plan_: plans.Plan) -> None:
    # what makes the eq. 10 screen optimistic, and the policy's lazy refinement exact
    estimates = screening.Estimates(profile_for(plan_.num_layers, 1))
    alone = [estimates.pipeline(p, 1, plan_.gpus_per_node).step_s for p in plan_.pipelines]
    assert estimates.whole(plan_).step_s >= max(alone)


@st.composite
def _one_gpu_pipelines(draw: st.DrawFn) -> tuple[plans.Pipeline, ...]:
    """1-3 pipelines of 1-3 stages over workers 0-5 (repeats across stages and pipelines,
    empty and wide stages included), for the one-GPU-per-node memo key."""
    pipelines = []
    for _ in range(draw(st.integers(1, 3))):
        stages, start = [], 0
        for _ in range(draw(st.integers(1, 3))):
            workers = draw(st.lists(st.integers(0, 5), max_size=3, unique=True))
            stop = start + draw(st.integers(1, 2))
            stages.append(
                plans.Stage(layer_start=start, layer_stop=stop, workers=tuple(map(W, workers)))
            )
            start = stop
        pipelines.append(
            plans.Pipeline(stages=tuple(stages), num_micro_batches=draw(st.integers(0, 3)))
        )
    return tuple(pipelines)


@given(_one_gpu_pipelines(), _one_gpu_pipelines(), st.integers(1, 3))
@settings(max_examples=600, deadline=None)
def test_the_memo_key_groups_pipelines_as_canonical_does(
    a: tuple[plans.Pipeline, ...], b: tuple[plans.Pipeline, ...], gpus: int
) -> None:
    # the memo's key: equal exactly when `canonical` is, so the memo hands out the same
    # estimates; a plan (no worker twice) may skip the check
    key, canonical = screening._shape, screening.canonical
    assert (key(a, gpus) == key(b, gpus)) == (canonical(a, gpus) == canonical(b, gpus))
    for pipelines in (a, b):
        workers = [w for p in pipelines for s in p.stages for w in s.workers]
        if len(set(workers)) != len(workers):
            continue
        assert key(pipelines, gpus, distinct=True) == key(pipelines, gpus)
        # canonical's numbers follow from the counts: 0, 1, 2, ... in order of use with one
        # GPU per node; with more, each worker's node numbered by first use, then its GPU the
        # count of that node's workers before it
        if gpus == 1:
            order: tuple[int, ...] = tuple(range(len(workers)))
            counted = screening._one_gpu_shape(pipelines)
        else:
            counted = screening._one_gpu_shape(pipelines)
            shape = canonical(pipelines, gpus)
            order = tuple(n // gpus for stages, _ in shape for _, _, mine in stages for n in mine)
            assert key(pipelines, gpus) == ("nodes", counted, order)
        assert _numbered(counted, order, gpus) == canonical(pipelines, gpus)


def _numbered(
    counted: tuple[tuple[tuple[tuple[int, int, int], ...], int], ...],
    order: tuple[int, ...],
    gpus: int,
) -> tuple[object, ...]:
    """`canonical`'s form from the counts and the nodes in order of use: each worker's GPU
    the count of its node's workers before it."""
    nodes, used = iter(order), dict[int, int]()

    def number(node: int) -> int:
        used[node] = used.get(node, 0) + 1
        return node * gpus + used[node] - 1

    return tuple(
        (tuple((s, e, tuple(number(next(nodes)) for _ in range(n))) for s, e, n in st), m)
        for st, m in counted
    )
