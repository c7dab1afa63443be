"""Whole-plan estimates composed from pipelines alone (planaria.planner.composition).

Covers, against replaying the whole compiled schedule (the path it replaces, kept as the
oracle): the composed step time and peak memory are equal bit for bit (hypothesis over plans
with heterogeneous pipelines, multi-GPU stages and shared nodes, and over profiles with
arbitrary float times, where any change in the order of additions would show); the
all-reduces are those the schedule compiles; plans with reroutes and holes, composed from the
pipelines the reroutes tie together, equal their whole replay too (hypothesis), replaying only
those pipelines, or the whole plan when the longer pipelines beside them could reorder streams;
and the policy's decision, with its whole reason, is the same with or without
composition (hypothesis over running plans and failures). A pipeline of one-GPU stages timed
without compiling its schedule (`run_chain`) has the replay's arrivals, step and peak, bit for
bit (hypothesis: shared or separate nodes, up to 8 stages, more or fewer micro-batches than
stages), and one with a tensor-parallel stage is still replayed. Many copies of a few
pipelines (the tail's costs computed once per distinct stage and all-reduce) compose to
the whole replay too.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, instructions, plan, profile, schedule
from planaria.planner import (
    candidates,
    composition,
    distribution,
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
    prof = draw(strategies.sized_profiles(num_layers, min(2, gpus), "composed"))
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
    arrival = {
        worker: t
        for p, run in zip(plan_.pipelines, runs, strict=True)
        for worker, t in composition.arrivals(p, run)
    }
    assert composition.step_s(plan_, arrival, prof) == want.step_s  # ==, not approx
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
    assert set(schedule.all_reductions(plan_)) == compiled


@given(strategies.plans(max_layers=5, max_pipelines=4, max_gpus_per_node=2))
@settings(max_examples=150, deadline=None)
def test_a_rerouted_plan_composed_is_the_whole_replay_bit_for_bit(plan_: plan.Plan) -> None:
    width = max(len(stage.workers) for p in plan_.pipelines for stage in p.stages)
    prof = profile_with_odd_costs(plan_.num_layers, width)
    assert screening.Estimates(prof).whole(plan_) == replayed(plan_, prof)


@given(
    st.lists(st.integers(min_value=2, max_value=4), min_size=2, max_size=5).map(tuple),
    st.data(),
)
@settings(max_examples=100, deadline=None)
def test_a_plan_with_holes_composed_is_the_whole_replay_bit_for_bit(
    depths: tuple[int, ...], data: st.DataObject
) -> None:
    plan_ = data.draw(strategies.shaped_plans(depths, max_holes=2, max_micro_batches=6))
    prof = profile_with_odd_costs(plan_.num_layers, 1)
    assert screening.Estimates(prof).whole(plan_) == replayed(plan_, prof)


def test_a_reroute_replays_only_the_pipelines_it_ties_together() -> None:
    prof = strategies.timed_profile([0.001, 0.002, 0.003, 0.001])
    running = strategies.grid_plan(6, (2,), 4, 1)
    rerouted = rerouting.reroute(running, frozenset({plan.WorkerId(1)}))
    assert composition.involved(rerouted) == (0, 1)  # one micro-batch: one peer takes it
    estimates = screening.Estimates(prof)
    assert estimates.whole(rerouted) == replayed(rerouted, prof)
    assert estimates.computed == 2  # pipelines 0 and 1 together, the four others alike, once


def test_a_reroute_beside_longer_pipelines_is_replayed_whole() -> None:
    prof = strategies.timed_profile([0.001, 0.002, 0.003, 0.001])
    W = plan.WorkerId
    running = plan.Plan(
        pipelines=(
            distribution.pipeline_of((2, 2), [W(0), W(1)], 2),
            distribution.pipeline_of((2, 2), [W(2), W(3)], 2),
            distribution.pipeline_of((2, 2), [W(4), W(5)], 5),  # more slots than 0 and 1 use
        ),
        micro_batch_size=1,
    )
    rerouted = rerouting.reroute(running, frozenset({plan.WorkerId(1)}))
    assert composition.run_rerouted(rerouted, composition.involved(rerouted), prof) is None
    estimates = screening.Estimates(prof)
    assert estimates.whole(rerouted) == replayed(rerouted, prof)
    assert estimates.computed == 1


def profile_with_odd_costs(num_layers: int, max_gpus: int) -> profile.Profile:
    """Layer costs that are not round in binary, so any change in the order of additions
    shows; links of different speeds."""
    layers = tuple(
        profile.LayerProfile(
            name=f"layer{i}",
            forward_s=tuple(0.1 / (3 + i) / k for k in range(1, max_gpus + 1)),
            backward_s=tuple(0.3 / (7 + 2 * i) / k for k in range(1, max_gpus + 1)),
            parameter_bytes=997 * (i + 1),
            gradient_bytes=991 * (i + 1),
            optimizer_bytes=4001,
            activation_bytes=301,
            output_bytes=203 + i,
            optimizer_s=0.01 / (i + 3),
        )
        for i in range(num_layers)
    )
    return profile.Profile(
        model="composed",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=layers,
        intra_node=profile.LinkProfile(bandwidth_bytes_per_s=3e6, latency_s=1.3e-4),
        inter_node=profile.LinkProfile(bandwidth_bytes_per_s=7e5, latency_s=1.1e-3),
    )


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


@given(unrerouted())
@settings(max_examples=200, deadline=None)
def test_a_pipeline_of_one_gpu_stages_timed_by_the_chain_is_its_replay_bit_for_bit(
    drawn: tuple[plan.Plan, profile.Profile],
) -> None:
    """`run_chain` (no schedule compiled) against `run_replayed` (the path it replaces for
    pipelines of one-worker stages): the same arrivals, step and peak, compared as floats'
    reprs, over pipelines on shared or separate nodes with arbitrary float costs."""
    plan_, prof = drawn
    for pipeline in plan_.pipelines:
        one_gpu = plan.Pipeline(
            stages=tuple(
                plan.Stage(
                    layer_start=s.layer_start, layer_stop=s.layer_stop, workers=s.workers[:1]
                )
                for s in pipeline.stages
            ),
            num_micro_batches=pipeline.num_micro_batches,
        )
        chained = composition.run_chain(one_gpu, plan_.gpus_per_node, prof)
        want = composition.run_replayed(one_gpu, 1, plan_.gpus_per_node, prof)
        assert repr(chained) == repr(want)
        assert composition.run_alone(one_gpu, 1, plan_.gpus_per_node, prof) == want
    for pipeline in plan_.pipelines:  # a tensor-parallel stage goes to the replay
        want = composition.run_replayed(pipeline, 1, plan_.gpus_per_node, prof)
        assert composition.run_alone(pipeline, 1, plan_.gpus_per_node, prof) == want


@given(
    st.lists(strategies.layer_profiles(1), min_size=1, max_size=8),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=1, max_value=3),
    strategies.link_profiles(),
    strategies.link_profiles(),
)
@settings(max_examples=150, deadline=None)
def test_deep_pipelines_with_many_micro_batches_timed_by_the_chain_are_their_replay(
    layers: list[profile.LayerProfile],
    depth: int,
    num_micro_batches: int,
    gpus_per_node: int,
    intra: profile.LinkProfile,
    inter: profile.LinkProfile,
) -> None:
    """As above for the split search's pipelines (stages on consecutive workers, up to 8
    deep, more or fewer micro-batches than stages)."""
    if depth > len(layers):
        return
    prof = profile.Profile(
        model="chained",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=tuple(layers),
        intra_node=intra,
        inter_node=inter,
    )
    counts = next(distribution.remainder_placements(len(layers), depth))
    workers = [plan.WorkerId(w) for w in range(depth)]
    pipeline = distribution.pipeline_of(counts, workers, num_micro_batches)
    chained = composition.run_chain(pipeline, gpus_per_node, prof)
    assert repr(chained) == repr(composition.run_replayed(pipeline, 1, gpus_per_node, prof))


@given(unrerouted(), st.integers(2, 5))
@settings(max_examples=60, deadline=None)
def test_many_copies_of_a_few_pipelines_compose_to_the_whole_replay(
    drawn: tuple[plan.Plan, profile.Profile], copies: int
) -> None:
    # the fresh plans' case: each distinct stage's optimizer step and each distinct
    # all-reduce's cost computed once in the tail, the same floats as the replay's
    base, prof = drawn
    gpus = base.gpus_per_node
    nodes = 1 + max(w for p in base.pipelines for s in p.stages for w in s.workers) // gpus
    pipelines = tuple(
        plan.Pipeline(
            stages=tuple(
                plan.Stage(
                    layer_start=s.layer_start,
                    layer_stop=s.layer_stop,
                    workers=tuple(plan.WorkerId(w + k * nodes * gpus) for w in s.workers),
                )
                for s in p.stages
            ),
            num_micro_batches=p.num_micro_batches,
        )
        for k in range(copies)
        for p in base.pipelines
    )
    plan_ = plan.Plan(pipelines=pipelines, micro_batch_size=1, gpus_per_node=gpus)
    assert screening.Estimates(prof).whole(plan_) == replayed(plan_, prof)
