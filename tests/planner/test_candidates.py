"""Candidate search (planaria.planner.candidates): Odyssey Alg. 1 around the running plan.

Covers: DP/PP configurations (hand list for Fig. 3; hypothesis: within the DP radius or, with
too few survivors for it, as many pipelines as possible; no deeper than the model, never more
workers than survive, the asymmetric one uses all of them with depths one apart); the search on
Fig. 3 finds rerouting and DP=2 x PP=4 [2,2,2,3] moving 3 layers; the running split is offered
too; rejections say why (memory, rerouting impossible, a whole plan over the limit); given
layouts are candidates and must keep the global batch; hypothesis: every candidate is a valid
plan over survivors with the same layers and batch whose schedule compiles; memoised estimates
(`prepare`) never change results and leave a later decision only its rerouting to estimate;
layouts and bindings remembered across decisions give the searches a new memo gives
(hypothesis); `exact`, which estimates a candidate's layout, gives what estimating its bound
target on a new memo gave (hypothesis, the oracle) and builds no target; a
wholly failed pipeline's reroute label; input errors.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, schedule
from planaria.contract import plan as plans
from planaria.planner import candidates, screening, transfers
from tests import strategies

W = plans.WorkerId


def fig3() -> candidates.Failure:
    """Odyssey Fig. 3: DP=3 x PP=3 over 9 layers; the middle node of pipeline 1 fails."""
    return candidates.Failure(
        running=strategies.grid_plan(3, (3, 6), 9, 4), failed=frozenset({W(4)})
    )


# --- configurations, placements, splits, batches -----------------------------------------------


def test_fig3_configurations_include_dp2_pp4() -> None:
    found = candidates.configurations(8, 3, 9, 12, dp_radius=1)
    assert found == ((4, 4), (2, 2, 2), (3, 3, 2), (2, 2, 2, 2))


@given(
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=0, max_value=3),
)
def test_configurations_stay_in_range_and_use_the_survivors(
    workers: int, old_dp: int, num_layers: int, micro_batches: int, radius: int
) -> None:
    for depths in candidates.configurations(workers, old_dp, num_layers, micro_batches, radius):
        most = min(workers, micro_batches)  # pipelines possible at all
        assert abs(len(depths) - old_dp) <= radius or len(depths) == most < old_dp - radius
        assert len(depths) <= micro_batches
        assert min(depths) >= 1 and max(depths) <= num_layers
        assert sum(depths) <= workers
        assert max(depths) - min(depths) <= 1
        if len(set(depths)) == 2:
            assert sum(depths) == workers
            assert list(depths) == sorted(depths, reverse=True)


# --- the search --------------------------------------------------------------------------------


def test_fig3_search_finds_rerouting_and_dp2_pp4_moving_three_layers() -> None:
    light_tail = strategies.timed_profile(
        [0.002] * 6 + [0.001] * 3
    )  # so [2, 2, 2, 3] is the fastest
    found = candidates.search(fig3(), screening.Estimates(light_tail), candidates.SearchSettings())
    by_label = {c.label: c for c in found.candidates}
    reroute = [c for c in found.candidates if c.kind == candidates.Kind.REROUTE]
    assert len(reroute) == 1 and reroute[0].transition.transfers == ()
    dp2 = by_label["DP=2 x PP=4 [2, 2, 2, 3]"]
    assert dp2.kind == candidates.Kind.SYMMETRIC
    assert len(dp2.transition.transfers) == 3
    assert found.rejected == ()


def test_the_running_split_is_offered_beside_the_fastest() -> None:
    prof = strategies.timed_profile([0.001] * 6 + [0.004])
    failure = candidates.Failure(
        running=strategies.grid_plan(3, (3,), 7, 6), failed=frozenset({W(1)})
    )
    found = candidates.search(failure, screening.Estimates(prof), candidates.SearchSettings())
    labels = [c.label for c in found.candidates]
    assert "DP=2 x PP=2 [4, 3]" in labels
    kept = next(c for c in found.candidates if c.label == "DP=2 x PP=2 [3, 4] (running split)")
    assert kept.transition.moved_bytes == 0


def test_a_whole_plan_over_the_memory_limit_is_rejected_when_estimated() -> None:
    failure = candidates.Failure(
        running=strategies.grid_plan(2, (1,), 2, 4), failed=frozenset({W(0)})
    )
    roomy = screening.Estimates(strategies.uniform_profile(2))
    candidate = next(
        c
        for c in candidates.search(failure, roomy, candidates.SearchSettings()).candidates
        if not c.exact
    )
    peak = roomy.whole(candidate.plan).peak_bytes
    tight = screening.Estimates(strategies.uniform_profile(2), memory_bytes=peak - 1)
    rejected = candidates.exact(candidate, tight)
    assert isinstance(rejected, candidates.Rejection)
    assert rejected.label == candidate.label and "(whole plan)" in rejected.why


def test_rejections_say_what_does_not_fit() -> None:
    prof = strategies.uniform_profile(4, memory_bytes=1500)  # one layer's state fits, two do not
    failure = candidates.Failure(
        running=strategies.grid_plan(2, (1, 2, 3), 4, 2), failed=frozenset({W(0)})
    )
    found = candidates.search(failure, screening.Estimates(prof), candidates.SearchSettings())
    reasons = {r.label: r.why for r in found.rejected}
    assert any("no split of 4 layers into 3 stages fits" in why for why in reasons.values())
    assert all(c.estimate.peak_bytes <= 1500 for c in found.candidates)


def test_rerouting_impossible_is_a_rejection_with_its_reason() -> None:
    failure = candidates.Failure(
        running=strategies.grid_plan(2, (1,), 2, 2), failed=frozenset({W(1), W(3)})
    )
    found = candidates.search(
        failure, screening.Estimates(strategies.uniform_profile(2)), candidates.SearchSettings()
    )
    (rejected,) = [r for r in found.rejected if r.kind == candidates.Kind.REROUTE]
    assert "rerouting is impossible" in rejected.why
    assert all(c.kind != candidates.Kind.REROUTE for c in found.candidates)
    assert all(c.transition.restores for c in found.candidates)


def test_given_layouts_are_candidates_and_must_keep_the_global_batch() -> None:
    failure = fig3()
    survivors = [w for w in failure.running.workers if w not in failure.failed]
    layout = transfers.relabel(
        strategies.grid_plan(1, (2, 4, 6, 7), 9, 12),
        dict(zip(map(W, range(5)), survivors, strict=False)),
    )
    estimates = screening.Estimates(strategies.uniform_profile(9))
    found = candidates.search(failure, estimates, candidates.SearchSettings(), given=[layout])
    (mine,) = [c for c in found.candidates if c.kind == candidates.Kind.GIVEN]
    assert mine.label == "given 0: DP=1 x PP=5"
    wrong = strategies.grid_plan(1, (2, 4, 6, 7), 9, 5)
    with pytest.raises(
        errors.PlanInputError, match="global batch of 5 samples but the job's is 12"
    ):
        candidates.search(failure, estimates, candidates.SearchSettings(), given=[wrong])


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_every_candidate_is_a_valid_plan_over_the_survivors(data: st.DataObject) -> None:
    running = data.draw(strategies.running_plans(max_workers=7))
    failed = data.draw(strategies.failed_workers(running))
    prof = strategies.uniform_profile(running.num_layers)
    failure = candidates.Failure(running=running, failed=failed)
    found = candidates.search(failure, screening.Estimates(prof), candidates.SearchSettings())
    survivors = set(running.workers) - failed
    for candidate in found.candidates:
        new = candidate.plan
        assert set(new.workers) <= survivors
        assert new.global_batch_size == running.global_batch_size
        assert new.num_layers == running.num_layers
        schedule.compile_schedule(new)
        exact = candidates.exact(candidate, screening.Estimates(prof))
        assert isinstance(exact, candidates.Candidate)  # memory is ample here
        assert exact.exact and exact.estimate.step_s > 0


def test_after_prepare_a_decision_only_estimates_its_rerouting() -> None:
    prof = strategies.timed_profile([0.001, 0.002, 0.001, 0.003, 0.001, 0.002])
    running = strategies.grid_plan(3, (2, 4), 6, 6)
    estimates = screening.Estimates(prof)
    candidates.prepare(running, estimates, candidates.SearchSettings())
    before = estimates.computed
    failure = candidates.Failure(running=running, failed=frozenset({W(1)}))
    for candidate in candidates.search(failure, estimates, candidates.SearchSettings()).candidates:
        candidates.exact(candidate, estimates)
    assert estimates.computed == before + 1


def test_prepared_estimates_give_the_same_search() -> None:
    prof = strategies.timed_profile([0.001, 0.002, 0.001, 0.003, 0.001, 0.002])
    running = strategies.grid_plan(3, (2, 4), 6, 6)
    failure = candidates.Failure(running=running, failed=frozenset({W(4)}))
    warm = screening.Estimates(prof)
    candidates.prepare(running, warm, candidates.SearchSettings())
    cold = candidates.search(failure, screening.Estimates(prof), candidates.SearchSettings())
    assert candidates.search(failure, warm, candidates.SearchSettings()) == cold


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_remembered_bindings_give_the_search_a_new_memo_gives(data: st.DataObject) -> None:
    # the re-plans' layouts and bindings are remembered across decisions (`Estimates.layouts`,
    # `.transitions`): a search after others on one memo, or the same search again, equals
    # it on a new memo, and a repeated search lays out and binds nothing anew
    running = data.draw(strategies.running_plans(max_workers=7))
    prof = strategies.uniform_profile(running.num_layers)
    shared = screening.Estimates(prof)
    for _ in range(data.draw(st.integers(1, 3))):
        failure = candidates.Failure(
            running=running, failed=data.draw(strategies.failed_workers(running))
        )
        fresh = candidates.search(failure, screening.Estimates(prof), candidates.SearchSettings())
        assert candidates.search(failure, shared, candidates.SearchSettings()) == fresh
        bound, laid_out = dict(shared.transitions), dict(shared.layouts)
        again = candidates.search(failure, shared, candidates.SearchSettings())
        assert again == fresh and shared.transitions == bound and shared.layouts == laid_out
        for old, new in zip(fresh.candidates, again.candidates, strict=True):
            assert old.transition.target == new.transition.target


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_exact_estimates_of_layouts_are_those_of_their_targets(data: st.DataObject) -> None:
    running = data.draw(strategies.running_plans(max_workers=8, max_pipelines=4))
    prof = strategies.uniform_profile(running.num_layers)
    failure = candidates.Failure(
        running=running, failed=data.draw(strategies.failed_workers(running))
    )
    estimates = screening.Estimates(prof)
    try:
        found = candidates.search(failure, estimates, candidates.SearchSettings())
    except errors.InfeasibleError:
        return
    for candidate in found.candidates:
        if candidate.exact:
            continue
        refined = candidates.exact(candidate, estimates)
        assert not candidate.transition._built  # the target was not built to estimate it
        whole = screening.Estimates(prof).whole(candidate.plan)  # `exact` before: the target
        if isinstance(refined, candidates.Rejection):
            assert not estimates.fits(whole)
        else:
            assert refined.estimate == whole and refined.exact


def test_remembered_re_plans_are_forgotten_past_their_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a controller decides for as long as its job runs: past the bound the oldest entries are
    # forgotten, the newest kept, and the searches stay those of a new memo
    monkeypatch.setattr(screening, "MAX_REMEMBERED_WORKERS", 12)
    prof = strategies.timed_profile([0.001, 0.002, 0.001, 0.003, 0.001, 0.002])
    running = strategies.grid_plan(3, (2, 4), 6, 6)
    shared = screening.Estimates(prof)
    for failed in (W(1), W(4), W(7), W(1)):
        failure = candidates.Failure(running=running, failed=frozenset({failed}))
        fresh = candidates.search(failure, screening.Estimates(prof), candidates.SearchSettings())
        assert candidates.search(failure, shared, candidates.SearchSettings()) == fresh
        held = sum(len(t.binding or ()) for t in shared.transitions.values())
        held += sum(len(layout.workers) for layout, _ in shared.layouts.values())
        assert held <= 12  # counted as they are remembered, the oldest forgotten past the bound
        newest = fresh.candidates[-1].transition
        assert newest in shared.transitions.values()  # the last binding of the search is kept


def test_inputs_that_do_not_fit_are_refused() -> None:
    with pytest.raises(errors.PlanInputError, match="at least one failed worker"):
        candidates.Failure(running=strategies.grid_plan(1, (), 2, 1), failed=frozenset())
    with pytest.raises(errors.PlanInputError, match="profile has 3 layers but the plan 2"):
        candidates.search(
            candidates.Failure(running=strategies.grid_plan(2, (), 2, 2), failed=frozenset({W(0)})),
            screening.Estimates(strategies.uniform_profile(3)),
            candidates.SearchSettings(),
        )
    with pytest.raises(errors.PlanInputError, match="memory_bytes"):
        screening.Estimates(strategies.uniform_profile(3), memory_bytes=0)
    with pytest.raises(errors.PlanInputError, match="dp_radius"):
        candidates.SearchSettings(dp_radius=-1)


def test_a_wholly_failed_pipeline_reads_as_one_reroute() -> None:
    failure = candidates.Failure(
        running=strategies.grid_plan(3, (1,), 2, 2), failed=frozenset({W(0), W(1)})
    )
    found = candidates.search(
        failure, screening.Estimates(strategies.uniform_profile(2)), candidates.SearchSettings()
    )
    assert found.candidates[0].label == "reroute pipeline 0 (all stages) -> pipelines 1, 2"


@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=40))
def test_a_given_layouts_label_counts_its_depths(depths: list[int]) -> None:
    label = candidates._depth_counts(depths)
    if len(set(depths)) == 1:
        assert label == f"DP={len(depths)} x PP={depths[0]}"
        return
    head, terms = label.split(": ")
    assert head == f"DP={len(depths)}"
    counted = [tuple(map(int, term.split(" x PP="))) for term in terms.split(" + ")]
    assert counted == [(depths.count(d), d) for d in sorted(set(depths), reverse=True)]
