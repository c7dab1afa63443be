"""Recovery policy (planaria.planner.policy): Odyssey eq. 8 over the candidates, with a reason.

Covers: eq. 8 value and its clamp (hand numbers); the break-even formula (hand numbers;
hypothesis: both values agree at the tie and the order flips across it); the expected time to
the next failure from an MTBF or an observed rate, and its errors. The job's end bounding the
state: eq. 8 over the remaining steps (hand numbers; hypothesis: it ranks by finishing time and
the steps break-even is where those meet), rerouting chosen near the end where re-planning wins
otherwise, flipping across the reported break-even; a scale-up pays only past the
steps break-even, a tie staying (hand numbers). Scripted scenarios asserting
on the decision and its reason: frequent failures with a small rerouting slowdown choose
rerouting, with the window ending where a re-plan takes over; a long time to the next failure
chooses re-planning, with rerouting winning below the window; the decision flips across the
reported break-even; rerouting is impossible when a stage lost all its replicas (rejected with
that reason; the re-plan restores the lost layers) and when the surviving replicas are cut
differently (the re-plan copies them); nothing fits: one error listing every rejection.
Hypothesis: the choice always has a whole-plan estimate and the highest value among those,
screened candidates above it are counted, and with an unlimited budget none is; a spent budget
is reported. The rendered
reason names the choice, eq. 8's numbers, every candidate, the window and the rejections.
Input errors.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors
from planaria.contract import plan as plans
from planaria.planner import candidates, policy, screening, transfers
from tests import strategies

W = plans.WorkerId
OVERHEADS = transfers.Overheads(regroup_s=0.02, restart_s=0.02)
SETTINGS = policy.PolicySettings(search=candidates.SearchSettings(overheads=OVERHEADS))


def four_by_two() -> tuple[candidates.Failure, screening.Estimates]:
    """4 pipelines x 2 stages of 8 equal layers, 8 micro-batches each; pipeline 0's second
    stage fails. Rerouting spreads 8 micro-batches over 3 peers (about 20% slower steps)."""
    running = strategies.grid_plan(4, (4,), 8, 8)
    prof = strategies.uniform_profile(8, state_bytes=100_000, bandwidth_bytes_per_s=1e7)
    return candidates.Failure(running=running, failed=frozenset({W(1)})), screening.Estimates(prof)


# --- eq. 8 and the break-even ------------------------------------------------------------------


def test_value_is_throughput_times_the_effective_time_ratio() -> None:
    assert policy.value(64, 2.0, 10.0, 100.0) == pytest.approx(32 * 0.9)
    assert policy.value(64, 2.0, 150.0, 100.0) == 0.0  # the next failure comes first


def test_break_even_by_hand() -> None:
    # (B/1)(T - 10) = (B/2)(T - 1)  ->  2T - 20 = T - 1  ->  T = 19
    assert policy.break_even_s(1.0, 10.0, 2.0, 1.0) == pytest.approx(19.0)
    assert policy.break_even_s(1.0, 1.0, 2.0, 10.0) is None  # faster and cheaper: dominates
    assert policy.break_even_s(1.0, 1.0, 1.0, 2.0) is None  # equal steps never tie


@given(
    st.floats(min_value=0.01, max_value=10.0),
    st.floats(min_value=0.0, max_value=100.0),
    st.floats(min_value=0.01, max_value=10.0),
    st.floats(min_value=0.0, max_value=100.0),
)
def test_values_agree_at_the_break_even_and_swap_across_it(
    step1: float, cost1: float, step2: float, cost2: float
) -> None:
    tie = policy.break_even_s(step1, cost1, step2, cost2)
    if tie is None:
        return
    assert tie > max(cost1, cost2)
    assert math.isclose(
        policy.value(8, step1, cost1, tie),
        policy.value(8, step2, cost2, tie),
        rel_tol=1e-6,
        abs_tol=1e-9 * 8 / min(step1, step2),
    )
    faster_first = step1 < step2
    late = policy.value(8, step1, cost1, tie * 2) > policy.value(8, step2, cost2, tie * 2)
    assert late == faster_first


def test_time_to_failure_from_mtbf_or_observed_rate() -> None:
    assert policy.time_to_failure_s(mtbf_s=3600.0) == 3600.0
    assert policy.time_to_failure_s(num_failures=4, observed_s=1000.0) == 250.0
    with pytest.raises(errors.PlanInputError, match="mean time between failures"):
        policy.time_to_failure_s()
    with pytest.raises(errors.PlanInputError, match="mtbf_s is -1"):
        policy.time_to_failure_s(mtbf_s=-1.0)


# --- the job's end bounds the state ------------------------------------------------------------


def test_steps_left_bound_the_value_when_they_end_before_the_next_failure() -> None:
    # 10 steps of 2 s after a 10 s transition end at 30 s, before a failure at 100 s
    assert policy.value(64, 2.0, 10.0, 100.0, steps_left=10) == pytest.approx(64 * 10 / 30)
    # 100 steps would end at 210 s: the failure at 100 s bounds them, as without steps_left
    assert policy.value(64, 2.0, 10.0, 100.0, steps_left=100) == policy.value(64, 2.0, 10.0, 100.0)
    assert policy.finishes_first(2.0, 10.0, 100.0, 10)
    assert not policy.finishes_first(2.0, 10.0, 100.0, None)


def test_a_scale_up_pays_only_past_the_steps_break_even_by_hand() -> None:
    # staying: W x 1 s; moving: 25 s + W x 0.75 s; they tie at W = 100 (exact in binary)
    assert policy.break_even_steps(1.0, 0.0, 0.75, 25.0) == 100.0
    pays = [
        policy.pays(stay_step_s=1.0, step_s=0.75, transition_s=25.0, steps_left=w)
        for w in (99, 100, 101)
    ]
    assert pays == [False, False, True]  # the tie stays: nothing gained for the disruption
    assert not policy.pays(stay_step_s=1.0, step_s=1.0, transition_s=0.0, steps_left=10**6)
    assert not policy.pays(stay_step_s=1.0, step_s=2.0, transition_s=0.0, steps_left=1)


def test_break_even_steps_by_hand() -> None:
    # 0.04 + W x 1.0 = 0.02 + W x 1.01  ->  W = 2
    assert policy.break_even_steps(1.0, 0.04, 1.01, 0.02) == pytest.approx(2.0)
    assert policy.break_even_steps(1.0, 0.02, 1.01, 0.04) is None  # faster and cheaper
    assert policy.break_even_steps(1.0, 0.02, 1.0, 0.04) is None  # equal steps never tie


@given(
    st.floats(min_value=0.01, max_value=10.0),
    st.floats(min_value=0.0, max_value=100.0),
    st.floats(min_value=0.01, max_value=10.0),
    st.floats(min_value=0.0, max_value=100.0),
    st.integers(min_value=1, max_value=10_000),
)
def test_with_steps_left_the_value_is_the_remaining_work_over_the_time_to_finish(
    step1: float, cost1: float, step2: float, cost2: float, left: int
) -> None:
    """Far from the next failure, eq. 8 ranks two candidates as their finishing times do, and
    the break-even in steps is where those times meet."""
    far = 10 * (max(cost1, cost2) + left * max(step1, step2))
    v1 = policy.value(8, step1, cost1, far, steps_left=left)
    v2 = policy.value(8, step2, cost2, far, steps_left=left)
    assert math.isclose(v1, 8 * left / (cost1 + left * step1), rel_tol=1e-9)
    finish1, finish2 = cost1 + left * step1, cost2 + left * step2
    if not math.isclose(finish1, finish2, rel_tol=1e-9):
        assert (v1 > v2) == (finish1 < finish2)
    tie = policy.break_even_steps(step1, cost1, step2, cost2)
    if tie is not None:
        assert math.isclose(cost1 + tie * step1, cost2 + tie * step2, rel_tol=1e-9, abs_tol=1e-9)


def test_near_the_jobs_end_rerouting_beats_a_replan_that_would_win_otherwise() -> None:
    failure, estimates = four_by_two()
    unbounded, _ = policy.decide(failure, estimates, 1000.0, SETTINGS)
    assert unbounded.choice.kind != candidates.Kind.REROUTE
    _, long_job = policy.decide(failure, estimates, 1000.0, SETTINGS, steps_left=100_000)
    assert long_job.steps_left is None  # the next failure comes first: eq. 8 as it was
    top, reroute = (
        long_job.ranked[0],
        next(r for r in long_job.ranked if r.kind == candidates.Kind.REROUTE),
    )
    tie = policy.break_even_steps(
        top.step_s, top.transition_s, reroute.step_s, reroute.transition_s
    )
    assert tie is not None and tie > 1
    near, reason = policy.decide(
        failure, estimates, 1000.0, SETTINGS, steps_left=max(1, math.floor(tie * 0.8))
    )
    far, _ = policy.decide(failure, estimates, 1000.0, SETTINGS, steps_left=math.ceil(tie * 1.25))
    assert near.choice.kind == candidates.Kind.REROUTE
    assert far.choice.kind != candidates.Kind.REROUTE
    assert reason.steps_left == max(1, math.floor(tie * 0.8))
    text = policy.render_reason(reason)
    assert f"eq. 8 over the job's last {reason.steps_left} step(s)" in text
    assert "finish together with" in text and "with more steps left" in text


def test_steps_left_below_one_is_an_input_error() -> None:
    failure, estimates = four_by_two()
    with pytest.raises(errors.PlanInputError, match="steps_left is 0"):
        policy.decide(failure, estimates, 10.0, SETTINGS, steps_left=0)


# --- scripted scenarios ------------------------------------------------------------------------


def test_frequent_failures_and_a_small_slowdown_choose_rerouting() -> None:
    failure, estimates = four_by_two()
    decision, reason = policy.decide(failure, estimates, 0.1, SETTINGS)
    assert decision.choice.kind == candidates.Kind.REROUTE
    assert decision.choice.transition.transfers == ()
    assert decision.choice.plan.reroutes
    top = reason.ranked[0]
    assert top.kind == candidates.Kind.REROUTE and top.transition_s == pytest.approx(0.02)
    assert top.value == pytest.approx(32 / top.step_s * (0.1 - 0.02) / 0.1)
    # rerouting stays best until a faster re-plan's transition pays off
    assert reason.window.above is not None and reason.window.below is None
    taker = reason.ranked[reason.window.above - 1]
    assert taker.kind != candidates.Kind.REROUTE and taker.step_s < top.step_s
    assert 0.1 < reason.window.until_s < 1.0


def test_a_long_time_to_the_next_failure_chooses_replanning() -> None:
    failure, estimates = four_by_two()
    decision, reason = policy.decide(failure, estimates, 1000.0, SETTINGS)
    assert decision.choice.kind != candidates.Kind.REROUTE
    assert decision.choice.exact
    assert decision.choice.transition.overhead_s == pytest.approx(0.04)
    reroute = next(r for r in reason.ranked if r.kind == candidates.Kind.REROUTE)
    assert reroute.value < reason.ranked[0].value
    assert reason.ranked[0].step_s < reroute.step_s
    assert reason.window.below is not None
    assert reason.ranked[reason.window.below - 1].kind == candidates.Kind.REROUTE
    assert math.isinf(reason.window.until_s)


def test_the_decision_flips_across_the_reported_break_even() -> None:
    failure, estimates = four_by_two()
    _, reason = policy.decide(failure, estimates, 1000.0, SETTINGS)
    tie = reason.window.from_s
    short, _ = policy.decide(failure, estimates, tie * 0.8, SETTINGS)
    long, _ = policy.decide(failure, estimates, tie * 1.25, SETTINGS)
    assert short.choice.kind == candidates.Kind.REROUTE
    assert long.choice.kind != candidates.Kind.REROUTE


def test_rerouting_is_impossible_when_a_stage_lost_all_its_replicas() -> None:
    running = strategies.grid_plan(2, (2,), 4, 4)
    failure = candidates.Failure(running=running, failed=frozenset({W(1), W(3)}))
    estimates = screening.Estimates(strategies.uniform_profile(4))
    decision, reason = policy.decide(failure, estimates, 1000.0, SETTINGS)
    assert decision.choice.kind != candidates.Kind.REROUTE
    assert all(r.kind != candidates.Kind.REROUTE for r in reason.ranked)
    (rejected,) = [r for r in reason.rejected if r.kind == candidates.Kind.REROUTE]
    assert "rerouting is impossible" in rejected.why
    assert "stage layers [2, 4) lost every replica" in rejected.why
    assert {r.layer for r in decision.choice.transition.restores} == {2, 3}
    assert "rerouting is impossible" in policy.render_reason(reason)


def test_rerouting_is_impossible_when_the_survivors_are_cut_differently() -> None:
    first = plans.Pipeline(
        stages=(
            plans.Stage(layer_start=0, layer_stop=1, workers=(W(0),)),
            plans.Stage(layer_start=1, layer_stop=4, workers=(W(1),)),
        ),
        num_micro_batches=2,
    )
    second = plans.Pipeline(
        stages=(
            plans.Stage(layer_start=0, layer_stop=2, workers=(W(2),)),
            plans.Stage(layer_start=2, layer_stop=4, workers=(W(3),)),
        ),
        num_micro_batches=2,
    )
    running = plans.Plan(pipelines=(first, second), micro_batch_size=1)
    failure = candidates.Failure(running=running, failed=frozenset({W(1)}))
    estimates = screening.Estimates(strategies.uniform_profile(4))
    decision, reason = policy.decide(failure, estimates, 1000.0, SETTINGS)
    assert decision.choice.kind != candidates.Kind.REROUTE
    assert any("[1, 4) lost every replica" in r.why for r in reason.rejected)
    assert decision.choice.transition.restores == ()  # every layer still has a live replica


def test_nothing_fits_is_one_error_listing_every_rejection() -> None:
    running = strategies.grid_plan(2, (1,), 2, 2)
    failure = candidates.Failure(running=running, failed=frozenset({W(0)}))
    estimates = screening.Estimates(strategies.uniform_profile(2), memory_bytes=100)
    with pytest.raises(errors.InfeasibleError, match="no candidate can recover") as caught:
        policy.decide(failure, estimates, 100.0, SETTINGS)
    assert "reroute" in str(caught.value) and "GiB" in str(caught.value)


@given(st.data(), st.sampled_from([0.05, 1.0, 1e4]), st.sampled_from([0, 1, 4, None]))
@settings(max_examples=40, deadline=None)
def test_the_choice_is_the_best_whole_estimate_and_unbounded_it_is_the_best(
    data: st.DataObject, time_to_failure: float, max_whole: int | None
) -> None:
    running = data.draw(strategies.running_plans(max_workers=7))
    failed = data.draw(strategies.failed_workers(running))
    estimates = screening.Estimates(strategies.uniform_profile(running.num_layers))
    failure = candidates.Failure(running=running, failed=failed)
    budget = policy.PolicySettings(max_whole=max_whole, search=SETTINGS.search)
    decision, reason = policy.decide(failure, estimates, time_to_failure, budget)
    assert decision.choice.exact and reason.ranked[0].exact
    exact = [r.value for r in reason.ranked if r.exact]
    assert decision.value == reason.ranked[0].value == max(exact)
    above = [r for r in reason.ranked if not r.exact and r.value > decision.value]
    assert reason.unverified == len(above)
    if max_whole is None:
        assert reason.unverified == 0
    assert [r.rank for r in reason.ranked] == list(range(1, len(reason.ranked) + 1))
    window = reason.window
    if reason.unverified == 0 and decision.value > 0:
        assert window.from_s <= time_to_failure <= window.until_s


def test_a_spent_budget_is_reported_not_hidden() -> None:
    failure, estimates = four_by_two()
    no_budget = policy.PolicySettings(max_whole=0, search=SETTINGS.search)
    decision, reason = policy.decide(failure, estimates, 1000.0, no_budget)
    assert decision.choice.kind == candidates.Kind.REROUTE  # the only whole estimate
    assert reason.unverified >= 1
    assert "have optimistic values above the choice" in policy.render_reason(reason)


def test_the_rendered_reason_names_everything_that_decided() -> None:
    failure, estimates = four_by_two()
    _, reason = policy.decide(failure, estimates, 0.1, SETTINGS)
    text = policy.render_reason(reason)
    first_line = text.splitlines()[0]
    assert first_line.startswith("chose reroute: reroute pipeline 0 stage 1 -> pipelines 1, 2, 3")
    assert "eq. 8: 32 samples /" in text and "(0.1 s - 0.02 s) / 0.1 s" in text
    for row in reason.ranked:
        assert row.label in text
    assert "#1 stays the best at least for a time to the next failure from 0 s to" in text
    assert "break-even #1 vs #2" in text


@pytest.mark.parametrize(
    "bad", [0.0, -5.0, math.inf, math.nan], ids=["zero", "negative", "inf", "nan"]
)
def test_the_time_to_the_next_failure_must_be_positive_and_finite(bad: float) -> None:
    failure, estimates = four_by_two()
    with pytest.raises(errors.PlanInputError, match="time to the next failure"):
        policy.decide(failure, estimates, bad, SETTINGS)


def test_policy_settings_are_checked() -> None:
    with pytest.raises(errors.PlanInputError, match="exact_top"):
        policy.PolicySettings(exact_top=0)
    with pytest.raises(errors.PlanInputError, match="max_whole"):
        policy.PolicySettings(max_whole=-1)
