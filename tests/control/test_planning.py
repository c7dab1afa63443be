"""The controller's questions to the planner (planaria.control.planning).

Covers: transfer sources restricted to the new plan (hypothesis, against a per-source oracle),
whole live nodes (brute force over small clusters), each policy's move after a death
(adaptive = policy.decide's choice, dynamic = Oobleck's reinstantiation, reroute = ReCycle's
layout), the scale-up's copies going only to workers that lack the layers, from holders in the
plan, the fewest workers any plan needs, and a profile for another micro-batch refused.
A scale-up weighed against the job's steps left (Odyssey eq. 8 bounded by the job's end): on a
profile whose numbers are computed by hand, taken when it repays its transition within them
and declined (the running plan kept, the reason giving both finishing times) when not; taken
unweighed out of a rerouted plan, out of one E cannot estimate, or without steps left (a
recovery's last resort); no move when the best plan keeps the running workers. Hypothesis
over drawn jobs: taken exactly when the brute comparison of the two finishing times (E's
estimates, the copies' time) says so.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import event, given, reject, settings
from hypothesis import strategies as st

from planaria.contract import errors, profile
from planaria.contract import plan as plans
from planaria.control import planning, status
from planaria.planner import candidates, estimator, policy, rerouting, screening, transfers
from tests import strategies
from tests.control import scenarios

W = plans.WorkerId


OUTSIDERS = (W(100), W(101), W(102))  # live workers that are not in the new plan


@given(data=st.data(), new=strategies.running_plans(max_workers=6))
def test_within_keeps_only_sources_in_the_new_plan(data: st.DataObject, new: plans.Plan) -> None:
    copies: list[plans.LayerTransfer] = []
    for _ in range(data.draw(st.integers(min_value=0, max_value=4))):
        destination = data.draw(st.sampled_from(new.workers))
        pool = [w for w in (*new.workers, *OUTSIDERS) if w != destination]
        sources = tuple(
            data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
        )
        # the planner's copies of a layer share one tuple of holders (`within` filters each once)
        shared = [c.sources for c in copies if destination not in c.sources]
        reuse: bool = data.draw(st.booleans())
        if shared and reuse:
            sources = data.draw(st.sampled_from(shared))
        layer = data.draw(st.integers(min_value=0, max_value=new.num_layers - 1))
        copies.append(plans.LayerTransfer(layer=layer, destination=destination, sources=sources))
    kept, orphaned = planning.within(copies, new)
    expected_kept, expected_orphaned = [], []
    for copy in copies:  # the oracle, one source at a time
        inside = tuple(s for s in copy.sources if s in new.workers)
        if inside:
            expected_kept.append(
                plans.LayerTransfer(layer=copy.layer, destination=copy.destination, sources=inside)
            )
        else:
            expected_orphaned.append(copy)
    assert list(kept) == expected_kept and list(orphaned) == expected_orphaned


@pytest.mark.parametrize("gpus", [1, 2, 3])
def test_whole_nodes_are_the_nodes_with_every_worker_live(gpus: int) -> None:
    workers = range(3 * gpus)
    for size in range(len(workers) + 1):
        for live in itertools.combinations(workers, size):
            expected = [n for n in range(3) if all(n * gpus + g in live for g in range(gpus))]
            assert planning.whole_nodes([W(w) for w in live], gpus) == expected


def _planner(policy_name: str) -> tuple[planning.Planner, plans.Plan]:
    job = scenarios.job(policy=policy_name)
    assert job.profile is not None
    planner = planning.Planner(job.profile, job)
    running = planner.best([W(w) for w in range(8)], status.MoveKind.INITIAL).plan
    return planner, running


def test_adaptive_adopts_the_policys_eq8_choice() -> None:
    planner, running = _planner("adaptive")
    move = planner.recover(running, {W(3)}, set(), 3600.0)
    job = scenarios.job()
    assert job.profile is not None
    decision, _ = policy.decide(
        candidates.Failure(running=running, failed=frozenset({W(3)})),
        screening.Estimates(job.profile),
        3600.0,
        policy.PolicySettings(),
        given=planner._oobleck_layouts(running, frozenset({W(3)})),
    )
    assert move.plan == decision.choice.plan
    assert decision.choice.label in move.reason


def test_dynamic_reinstantiates_on_the_surviving_nodes() -> None:
    planner, running = _planner("dynamic")
    move = planner.recover(running, {W(3)}, set(), 3600.0)
    assert move.kind == "dynamic" and not move.plan.reroutes
    assert 3 not in move.plan.workers and len(move.plan.pipelines) >= 2
    assert all(set(t.sources) <= set(move.plan.workers) for t in move.transfers)


def test_reroute_keeps_the_layout_and_reroutes_the_hole() -> None:
    planner, running = _planner("reroute")
    move = planner.recover(running, {W(3)}, set(), 3600.0)
    assert move.kind == "reroute" and move.transfers == () and move.plan.reroutes
    assert [len(p.stages) for p in move.plan.pipelines] == [
        len(p.stages) for p in running.pipelines
    ]
    assert 3 not in move.plan.workers


def test_scale_up_copies_only_what_the_new_workers_lack_from_holders_in_the_plan() -> None:
    planner, running = _planner("adaptive")
    shrunk = planner.best([W(w) for w in range(8) if w != 3], status.MoveKind.INITIAL).plan
    move = planner.grow(shrunk, {W(w) for w in range(8)})
    assert sorted(move.plan.workers) == list(range(8))
    roles = transfers.roles(move.plan)
    held = transfers.holdings(shrunk, ())
    for copy in move.transfers:
        assert copy.layer in roles[copy.destination]
        assert copy.layer not in held.get(copy.destination, frozenset())
        assert set(copy.sources) <= set(move.plan.workers)
        assert all(copy.layer in held[s] for s in copy.sources)
    assert not move.needs_snapshot


def test_min_workers_is_f_plus_one_smallest_pipelines() -> None:
    planner, _ = _planner("adaptive")
    assert planner.min_workers == 4  # 2 pipelines of 2 nodes (30 MiB per GPU)


def test_a_profile_for_another_micro_batch_is_refused() -> None:
    job = scenarios.job(micro_batch_size=4)
    assert job.profile is not None
    with pytest.raises(errors.PlanInputError, match="micro-batch size 2"):
        planning.Planner(job.profile, job)


# --- a scale-up weighed against the job's steps left -------------------------------------------


def _uniform(
    num_layers: int,
    *,
    step_s: float = 0.003,
    state_bytes: int = 7_000_000,
    bandwidth: float = 1e9,
    memory_bytes: int = 2**40,
) -> profile.Profile:
    """Equal layers of `step_s` a micro-batch (a third forward, two thirds backward) and
    `state_bytes` of parameters and optimizer state, no gradients; both links alike, no
    latency."""
    layer = profile.LayerProfile(
        name="block",
        forward_s=(step_s / 3,),
        backward_s=(step_s * 2 / 3,),
        parameter_bytes=state_bytes // 4,
        gradient_bytes=0,
        optimizer_bytes=state_bytes - state_bytes // 4,
        activation_bytes=0,
        output_bytes=0,
        optimizer_s=0.0,
    )
    link = profile.LinkProfile(bandwidth_bytes_per_s=bandwidth, latency_s=0.0)
    return profile.Profile(
        model="uniform",
        accelerator="hand",
        micro_batch_size=1,
        memory_bytes=memory_bytes,
        layers=(layer,) * num_layers,
        intra_node=link,
        inter_node=link,
    )


def _uniform_planner(
    source: profile.Profile, *, workers: int, global_batch: int
) -> planning.Planner:
    job = scenarios.job(
        profile=source,
        workers=workers,
        micro_batch_size=1,
        training=scenarios.training(global_batch_size=global_batch),
    )
    return planning.Planner(source, job)


def _data_parallel(micro_batches: tuple[int, ...], num_layers: int) -> plans.Plan:
    """One one-stage pipeline a worker (0, 1, ...), each holding every layer."""
    pipelines = tuple(
        plans.Pipeline(
            stages=(plans.Stage(layer_start=0, layer_stop=num_layers, workers=(W(w),)),),
            num_micro_batches=m,
        )
        for w, m in enumerate(micro_batches)
    )
    return plans.Plan(pipelines=pipelines, micro_batch_size=1)


def _by_hand() -> tuple[planning.Planner, plans.Plan]:
    """7 workers hold all 4 layers (3 ms a layer a micro-batch) and train 8 micro-batches, one
    of them 2: 24 ms a step, and the commit barrier's all-reduce. Worker 7 returns: the best
    plan is one micro-batch a worker, 12 ms, once the newcomer received the 4 layers of 7 MB,
    each in 7 shards of 1 MB from the 7 holders, 1 ms apiece at 1 GB/s, one after the other on
    its receiving link: 28 ms, and 40 ms of regroup and restart (`transfers.Overheads`). 12 ms
    gained a step repay 68 ms after 5.67 steps: 5 steps left decline it, 6 take it."""
    planner = _uniform_planner(_uniform(4), workers=8, global_batch=8)
    return planner, _data_parallel((2, 1, 1, 1, 1, 1, 1), 4)


def test_the_hand_numbers_are_es() -> None:
    planner, running = _by_hand()
    barrier = [2 * (p - 1) * estimator.BARRIER_BYTES / p / 1e9 for p in (7, 8)]  # ring, 16 B
    estimates = screening.Estimates(planner.source)
    grown = planner.grow(running, {W(w) for w in range(8)})
    assert estimates.whole(running).step_s == pytest.approx(0.024 + barrier[0], rel=1e-12)
    assert estimates.whole(grown.plan).step_s == pytest.approx(0.012 + barrier[1], rel=1e-12)
    copies_s = transfers.transfer_s(grown.transfers, (), planner.source, 1)
    assert copies_s == pytest.approx(0.028, rel=1e-12)


def test_a_scale_up_that_repays_its_transition_within_the_steps_left_is_taken() -> None:
    planner, running = _by_hand()
    move = planner.grow(running, {W(w) for w in range(8)}, steps_left=6)
    assert sorted(move.plan.workers) == list(range(8)) and move.kind == "scale-up"
    assert {c.destination for c in move.transfers} == {W(7)} and not move.needs_snapshot
    assert (
        "; pays: the last 6 step(s) take 0.14 s after the scale-up (transition 0.068 s + 6 x "
        "12 ms) against 0.144 s staying (24 ms a step, +100% samples/s on the new plan); they "
        "tie at 5.667 steps left"
    ) in move.reason


def test_a_scale_up_that_does_not_repay_its_transition_is_declined() -> None:
    planner, running = _by_hand()
    move = planner.grow(running, {W(w) for w in range(8)}, steps_left=5)
    assert move.plan == running and move.transfers == () and not move.needs_snapshot
    assert move.reason == (
        "declined, the running plan finishes sooner: the last 5 step(s) take 0.128 s after the "
        "scale-up (transition 0.068 s + 5 x 12 ms) against 0.12 s staying (24 ms a step, +100% "
        "samples/s on the new plan); they tie at 5.667 steps left"
    )
    # not weighed, as a recovery's last resort asks: the templates' plan whatever it costs
    assert len(planner.grow(running, {W(w) for w in range(8)}).plan.workers) == 8
    with pytest.raises(errors.PlanInputError, match="steps_left is 0; give 1 or more"):
        planner.grow(running, {W(w) for w in range(8)}, steps_left=0)


def test_a_scale_up_out_of_a_rerouted_plan_is_taken_unweighed() -> None:
    planner, running = _by_hand()
    rerouted = rerouting.reroute(running, {W(6)})
    move = planner.grow(rerouted, {W(w) for w in range(8)}, steps_left=1)
    assert sorted(move.plan.workers) == list(range(8)) and not move.plan.reroutes
    assert move.reason.endswith(
        "; not weighed: the running plan reroutes (its failed stages' layers lost holders)"
    )


def test_a_scale_up_out_of_a_plan_e_cannot_estimate_is_taken_unweighed() -> None:
    # a stage of two GPUs (worker 0 and 1 on node 0) that a profile of one-GPU stages cannot
    # time: no reason to stay on it, so the templates' plan is taken as before
    source = _uniform(4)
    job = scenarios.job(
        profile=source,
        workers=8,
        gpus_per_node=2,
        micro_batch_size=1,
        training=scenarios.training(global_batch_size=8),
    )
    planner = planning.Planner(source, job)
    wide = plans.Stage(layer_start=0, layer_stop=4, workers=(W(0), W(1)))
    alone = [plans.Stage(layer_start=0, layer_stop=4, workers=(W(w),)) for w in (2, 3, 4)]
    running = plans.Plan(
        pipelines=tuple(
            plans.Pipeline(stages=(stage,), num_micro_batches=2) for stage in (wide, *alone)
        ),
        micro_batch_size=1,
        gpus_per_node=2,
    )
    move = planner.grow(running, {W(w) for w in range(8)}, steps_left=1)
    assert sorted(move.plan.workers) == list(range(8))
    assert move.reason.endswith(
        "; not weighed: no step estimate (worker 0's stage has 2 GPUs but the profile times "
        "stages of up to 1; profile with more GPUs per stage)"
    )


def test_a_return_that_leaves_the_best_plan_on_the_running_workers_is_no_move() -> None:
    planner, running = _by_hand()
    move = planner.grow(running, set(running.workers), steps_left=1_000)
    assert move.plan == running and move.transfers == ()
    assert move.reason.startswith("the best plan has the running workers, nobody joins: ")


Job = tuple[planning.Planner, plans.Plan, set[plans.WorkerId], planning.Move]


@st.composite
def _jobs(draw: st.DrawFn) -> Job:
    """A planner for equal layers of drawn costs and sizes (memory for every layer, or for
    about half of them), the templates' best plan over 2..5 workers running, 1..2 back, and
    the scale-up not weighed (what the weighing takes or declines)."""
    num_layers = draw(st.integers(min_value=2, max_value=6))
    state = draw(st.integers(min_value=1_000, max_value=100_000_000))
    source = _uniform(
        num_layers,
        step_s=draw(st.floats(min_value=1e-4, max_value=1.0)),
        state_bytes=state,
        bandwidth=draw(st.floats(min_value=1e7, max_value=1e11)),
        memory_bytes=draw(st.sampled_from([2**40, state * (num_layers // 2 + 1) * 2])),
    )
    running_workers = draw(st.integers(min_value=2, max_value=5))
    workers = running_workers + draw(st.integers(min_value=1, max_value=2))
    global_batch = draw(st.integers(min_value=2, max_value=12))
    live = {W(w) for w in range(workers)}
    try:
        planner = _uniform_planner(source, workers=workers, global_batch=global_batch)
        first = planner.best([W(w) for w in range(running_workers)], status.MoveKind.INITIAL)
        grown = planner.grow(first.plan, live)
    except errors.PlannerError:
        reject()  # no plan for so few workers, or the batch does not spread over them
    return planner, first.plan, live, grown


@settings(max_examples=40)
@given(job=_jobs(), data=st.data())
def test_a_scale_up_is_taken_exactly_when_it_finishes_the_steps_left_sooner(
    job: Job, data: st.DataObject
) -> None:
    planner, running, live, grown = job
    estimates = screening.Estimates(planner.source)  # a memo of its own: E's numbers anew
    stay_s = estimates.whole(running).step_s
    step_s = estimates.whole(grown.plan).step_s
    overheads = transfers.Overheads()
    copies_s = transfers.transfer_s(grown.transfers, (), planner.source, 1)
    transition_s = copies_s + (overheads.regroup_s + overheads.restart_s)  # as `Transition`
    tie = transition_s / (stay_s - step_s) if stay_s > step_s else 100.0
    near = st.integers(min_value=max(1, math.floor(tie) - 1), max_value=math.ceil(tie) + 1)
    steps_left = data.draw(near | st.integers(min_value=1, max_value=math.ceil(2 * tie) + 2))
    weighed = planner.grow(running, live, steps_left)
    # the brute comparison: each state's time to the job's end, step by step, exactly
    staying = sum((Fraction(stay_s) for _ in range(steps_left)), Fraction(0))
    moving = sum((Fraction(step_s) for _ in range(steps_left)), Fraction(transition_s))
    event("taken" if moving < staying else "declined")
    if moving < staying:
        assert weighed.plan == grown.plan and weighed.transfers == grown.transfers
        assert "; pays: " in weighed.reason
    else:
        assert weighed.plan == running and weighed.transfers == ()
        assert weighed.reason.startswith("declined, the running plan finishes sooner: ")
