"""A rerouted plan timed without compiling its schedule (planaria.planner.rerouted_timing).

Covers, against the path it replaces (compile the schedule, replay it, read each stream's
arrival at its first all-reduce or optimizer step and the memory estimate's peak; kept here as
the oracle): the same arrivals, in the same order, and the same peak, compared as the floats'
reprs, over
- plans with reroutes, holes, tensor-parallel stages and pipelines of different cuts, with
  profiles of arbitrary float times, bytes and links (hypothesis);
- one-GPU pipelines of 2..5 stages with up to three holes and up to 12 micro-batches each, on
  nodes of one or two GPUs (hypothesis);
- plans rerouted by `rerouting.reroute` after failures in a grid of identical pipelines, the
  planner's own case at small scale (hypothesis);
and `run_rerouted` (the involved pipelines cut out of the plan) equals the oracle on the same
cut; a profile that does not fit the plan still gets the compile path's error.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planaria.contract import errors, instructions, plan, profile, schedule
from planaria.planner import (
    composition,
    rerouted_timing,
    rerouting,
)
from tests import strategies


def assert_same(plan_: plan.Plan, prof: profile.Profile) -> None:
    """The oracle is compile + replay (`composition.run_sub_replayed`, what `run_rerouted`
    did for every plan before, and still does where the profile does not fit)."""
    timed = rerouted_timing.run_routed(plan_, prof)
    want = composition.run_sub_replayed(plan_, prof)
    assert repr(timed) == repr(want)  # bit for bit, and the arrivals in stream order


@st.composite
def drawn_profile(draw: st.DrawFn, num_layers: int, max_gpus: int) -> profile.Profile:
    """Arbitrary float times and bytes per layer, arbitrary links."""
    return profile.Profile(
        model="rerouted",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=tuple(draw(strategies.layer_profiles(max_gpus)) for _ in range(num_layers)),
        intra_node=draw(strategies.link_profiles()),
        inter_node=draw(strategies.link_profiles()),
    )


def widest(plan_: plan.Plan) -> int:
    return max(len(stage.workers) for p in plan_.pipelines for stage in p.stages)


@given(
    strategies.plans(max_layers=6, max_pipelines=4, max_gpus_per_node=3),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_a_rerouted_plan_timed_without_compiling_is_its_replay_bit_for_bit(
    plan_: plan.Plan, data: st.DataObject
) -> None:
    prof = data.draw(drawn_profile(plan_.num_layers, widest(plan_)))
    assert_same(plan_, prof)


@given(
    st.lists(st.integers(min_value=2, max_value=5), min_size=2, max_size=5).map(tuple),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_one_gpu_pipelines_with_holes_and_many_micro_batches_are_their_replay(
    depths: tuple[int, ...], data: st.DataObject
) -> None:
    plan_ = data.draw(
        strategies.shaped_plans(
            depths, aligned=data.draw(st.booleans()), max_holes=3, max_micro_batches=12
        )
    )
    prof = data.draw(drawn_profile(plan_.num_layers, 1))
    assert_same(plan_, prof)


@given(
    st.integers(min_value=2, max_value=5),
    st.integers(min_value=2, max_value=5),
    st.integers(min_value=1, max_value=12),
    st.data(),
)
@settings(max_examples=100, deadline=None)
def test_plans_rerouted_after_failures_are_their_replay(
    num_pipelines: int, depth: int, micro_batches: int, data: st.DataObject
) -> None:
    """The planner's case: identical pipelines, some workers lost, their stages' micro-batches
    spread over the live peers (`rerouting.reroute`); cut to the involved pipelines as
    `run_rerouted` does."""
    num_layers = depth + data.draw(st.integers(min_value=0, max_value=2))
    cuts = tuple(
        sorted(
            data.draw(
                st.sets(st.integers(1, num_layers - 1), min_size=depth - 1, max_size=depth - 1)
            )
        )
    )
    running = strategies.grid_plan(num_pipelines, cuts, num_layers, micro_batches)
    lost = data.draw(strategies.failed_workers(running))
    # every layer range has a live copy left, so every hole has a peer
    assume(
        all(
            any(w not in lost for w in column)
            for column in zip(*(p.workers for p in running.pipelines), strict=True)
        )
    )
    rerouted = rerouting.reroute(running, lost)
    rerouted = replace(rerouted, gpus_per_node=data.draw(st.sampled_from([1, 2, 4])))
    prof = data.draw(drawn_profile(num_layers, 1))
    assert_same(rerouted, prof)
    involved = composition.involved(rerouted)
    if involved:
        got = composition.run_rerouted(rerouted, involved, prof)
        assert repr(got) == repr(composition.run_sub_replayed(cut(rerouted, involved), prof))


def cut(plan_: plan.Plan, involved: tuple[int, ...]) -> plan.Plan:
    """The involved pipelines as a plan of their own (as `run_rerouted` cuts them)."""
    index = {p: i for i, p in enumerate(involved)}
    return replace(
        plan_,
        pipelines=tuple(plan_.pipelines[p] for p in involved),
        reroutes=tuple(
            replace(r, pipeline=index[r.pipeline], peer_pipeline=index[r.peer_pipeline])
            for r in plan_.reroutes
        ),
    )


def test_a_profile_that_does_not_fit_gets_the_compile_paths_error() -> None:
    running = strategies.grid_plan(3, (2,), 4, 3)
    rerouted = rerouting.reroute(running, frozenset({plan.WorkerId(1)}))
    involved = composition.involved(rerouted)
    short = strategies.timed_profile([0.001, 0.002, 0.003])  # three layers, the plan has four
    with pytest.raises(errors.PlanInputError, match="the profile has 3 layers but the plan 4"):
        composition.run_rerouted(rerouted, involved, short)


def late_sends_plan() -> plan.Plan:
    """Worker 8 runs its own micro-batch (2) of stage [3, 4) and pipeline 0's (0), forward in
    that order, but worker 9 receives them the other way round (the tag order), so the send of
    2's activation waits until 0's is made: a send posted after a later compute than the one
    that made it (found by hypothesis; the drawn plans above rarely hold one)."""
    W = plan.WorkerId

    def stages(*bounds: tuple[int, int, tuple[int, ...]]) -> tuple[plan.Stage, ...]:
        return tuple(
            plan.Stage(layer_start=a, layer_stop=b, workers=tuple(W(w) for w in ws))
            for a, b, ws in bounds
        )

    return plan.Plan(
        pipelines=(
            plan.Pipeline(
                stages=stages((0, 1, ()), (1, 2, (1,)), (2, 3, (2,)), (3, 4, ()), (4, 5, ())),
                num_micro_batches=1,
            ),
            plan.Pipeline(stages=stages((0, 1, (5,)), (1, 5, (6,))), num_micro_batches=1),
            plan.Pipeline(
                stages=stages((0, 3, (7,)), (3, 4, (8,)), (4, 5, (9,))), num_micro_batches=1
            ),
        ),
        micro_batch_size=1,
        reroutes=(
            plan.Reroute(pipeline=0, stage=0, peer_pipeline=1, micro_batches=(0,)),
            plan.Reroute(pipeline=0, stage=3, peer_pipeline=2, micro_batches=(0,)),
            plan.Reroute(pipeline=0, stage=4, peer_pipeline=2, micro_batches=(0,)),
        ),
    )


@given(drawn_profile(5, 1))
@settings(max_examples=50, deadline=None)
def test_sends_held_back_for_the_receivers_order_are_timed_as_replayed(
    prof: profile.Profile,
) -> None:
    plan_ = late_sends_plan()
    body = schedule.compile_schedule(plan_).stream(plan.WorkerId(8)).instructions
    computes = [i for i, op in enumerate(body) if isinstance(op, instructions.Compute)]
    # micro-batch 2's activation waits for micro-batch 0's, which worker 9 receives first
    assert not isinstance(body[computes[0] + 1], instructions.Send)
    held = body[computes[1] + 1 : computes[1] + 3]
    assert held == (
        instructions.SendActivation(destination=plan.WorkerId(9), micro_batch=0, tag=0),
        instructions.SendActivation(destination=plan.WorkerId(9), micro_batch=2, tag=1),
    )
    assert_same(plan_, prof)
