"""Whole-plan estimates composed from pipelines alone (planaria.planner.composition).

Covers, against replaying the whole compiled schedule (the path it replaces, kept as the
oracle): the composed step time and peak memory are equal bit for bit (hypothesis over plans
with heterogeneous pipelines, multi-GPU stages and shared nodes, and over profiles with
arbitrary float times, where any change in the order of additions would show); the
all-reduces are those the schedule compiles; `screening.Estimates` composes only plans without
reroutes; and the policy's decision, with its whole reason, is the same with or without
composition (hypothesis over running plans and failures).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, instructions, plan, profile, schedule
from planaria.planner import (
    candidates,
    composition,
    estimator,
    memory,
    policy,
    rerouting,
    screening,
)
from tests import strategies


@st.composite
def unrerouted(draw: st.DrawFn) -> tuple[plan.Plan, profile.Profile]:
    """A plan without reroutes: 1..4 pipelines with their own cuts of 1..6 layers, stages of
    1..2 GPUs, each on a node drawn among those with room or a new one (so all-reduce groups
    and neighbours may or may not share a node), 1..6 micro-batches each; and a profile for it
    with arbitrary float costs."""
    num_layers = draw(st.integers(min_value=1, max_value=6))
    gpus = draw(st.integers(min_value=1, max_value=4))
    shapes = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        inner = st.lists(st.integers(1, num_layers - 1), unique=True) if num_layers > 1 else None
        cuts = sorted(draw(inner)) if inner is not None else []
        bounds = list(zip((0, *cuts), (*cuts, num_layers), strict=True))
        shapes.append([(a, b, draw(st.integers(1, min(2, gpus)))) for a, b in bounds])
    free: list[list[int]] = []  # free GPUs per node opened so far
    pipelines = []
    for stages in shapes:
        built = []
        for a, b, w in stages:
            roomy = [n for n, gpus_left in enumerate(free) if len(gpus_left) >= w]
            if not roomy or draw(st.booleans()):  # a stage never spans nodes
                free.append(draw(st.permutations(range(gpus))))
                roomy = [len(free) - 1]
            node = draw(st.sampled_from(roomy))
            taken, free[node] = free[node][:w], free[node][w:]
            workers = tuple(plan.WorkerId(node * gpus + g) for g in taken)
            built.append(plan.Stage(layer_start=a, layer_stop=b, workers=workers))
        micro_batches = draw(st.integers(1, 6))
        pipelines.append(plan.Pipeline(stages=tuple(built), num_micro_batches=micro_batches))
    plan_ = plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1, gpus_per_node=gpus)
    width = min(2, gpus)
    costs = strategies.layer_profiles(width)
    layers = draw(st.lists(costs, min_size=num_layers, max_size=num_layers))
    prof = profile.Profile(
        model="composed",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=tuple(layers),
        intra_node=draw(strategies.link_profiles()),
        inter_node=draw(strategies.link_profiles()),
    )
    return plan_, prof


def replayed(plan_: plan.Plan, prof: profile.Profile) -> screening.Estimate:
    sched = schedule.compile_schedule(plan_)
    return screening.Estimate(
        step_s=estimator.estimate_step(sched, prof).step_s,
        peak_bytes=memory.estimate_memory(sched, prof).peak_bytes,
    )


@given(unrerouted())
@settings(max_examples=150, deadline=None)
def test_the_composed_estimate_is_the_whole_replay_bit_for_bit(
    drawn: tuple[plan.Plan, profile.Profile],
) -> None:
    plan_, prof = drawn
    runs = [
        composition.run_alone(p, plan_.micro_batch_size, plan_.gpus_per_node, prof)
        for p in plan_.pipelines
    ]
    want = replayed(plan_, prof)
    assert composition.step_s(plan_, runs, prof) == want.step_s  # ==, not approx
    assert max(r.peak_bytes for r in runs) == want.peak_bytes
    assert screening.Estimates(prof).whole(plan_) == want


@given(unrerouted())
@settings(max_examples=60, deadline=None)
def test_the_all_reduces_are_those_the_schedule_compiles(
    drawn: tuple[plan.Plan, profile.Profile],
) -> None:
    plan_, _ = drawn
    compiled = {
        op
        for stream in schedule.compile_schedule(plan_).streams
        for op in stream.instructions
        if isinstance(op, instructions.AllReduce)
    }
    assert set(composition.reductions(plan_)) == compiled


def test_a_plan_with_reroutes_is_replayed_whole_not_composed() -> None:
    prof = strategies.timed_profile([0.001, 0.002, 0.003, 0.001])
    running = strategies.grid_plan(3, (2,), 4, 4)
    rerouted = rerouting.reroute(running, frozenset({plan.WorkerId(1)}))
    estimates = screening.Estimates(prof)
    before = estimates.computed
    assert estimates.whole(rerouted) == replayed(rerouted, prof)
    assert estimates.computed == before + 1  # the whole schedule, once
    with pytest.raises(errors.PlanInputError, match="reroutes"):
        composition.step_s(rerouted, [], prof)


def test_identical_pipelines_are_replayed_once() -> None:
    prof = strategies.timed_profile([0.001, 0.002, 0.003, 0.001, 0.002])
    estimates = screening.Estimates(prof)
    estimates.whole(strategies.grid_plan(8, (1, 3), 5, 6))
    assert estimates.computed == 1


@given(st.data(), st.sampled_from([0.05, 60.0, 1e5]))
@settings(max_examples=40, deadline=None)
def test_the_decision_and_its_reason_are_the_same_as_replaying_whole(
    data: st.DataObject, time_to_failure: float
) -> None:
    running = data.draw(strategies.running_plans(max_workers=7, max_layers=6, max_pipelines=3))
    failed = data.draw(strategies.failed_workers(running))
    times = data.draw(
        st.lists(
            st.floats(min_value=1e-4, max_value=1e-2),
            min_size=running.num_layers,
            max_size=running.num_layers,
        )
    )
    prof = strategies.timed_profile(times)
    failure = candidates.Failure(running=running, failed=failed)
    assert decided(failure, prof, time_to_failure, True) == decided(
        failure, prof, time_to_failure, False
    )


def decided(
    failure: candidates.Failure, prof: profile.Profile, time_to_failure: float, compose: bool
) -> tuple[policy.Decision, policy.Reason] | str:
    """The decision and reason, or the refusal's text."""
    estimates = screening.Estimates(prof, compose=compose)
    try:
        return policy.decide(failure, estimates, time_to_failure, policy.PolicySettings())
    except errors.InfeasibleError as exc:
        return str(exc)
