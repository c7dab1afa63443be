"""The simulator's questions to the planner (planaria.sim.planning) against the planner itself.

Covers: over hypothesis-drawn jobs, running plans (the fresh plan over a few workers), failed
workers and idle spares, `Planner.candidates_of` for rerouting only, re-planning only and every
kind is the list the full `candidates.search` gives filtered to those kinds, in its order (it
builds only the kinds asked for); over drawn sequences of live workers, with repeats and more
than the recent plans kept, `Planner.fresh` and the whole estimates of its plans are those of
the plan built again every time (the oracle).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, plan
from planaria.planner import candidates
from planaria.sim import planning
from tests.sim import test_fresh

W = plan.WorkerId
KINDS = [planning.REROUTED, planning.REPLANNED, planning.ALL_KINDS]


@st.composite
def failures(draw: st.DrawFn) -> tuple[planning.Planner, candidates.Failure]:
    job = draw(test_fresh.jobs())
    planner = planning.Planner(job)
    num_workers = draw(st.integers(min_value=1, max_value=8))
    running = planner.fresh([W(w) for w in range(num_workers)])
    if running is None:
        return planner, draw(st.nothing())
    workers = sorted(running.workers)
    failed = draw(st.sets(st.sampled_from(workers), min_size=1))
    idle = [W(w) for w in range(num_workers + 2) if W(w) not in running.workers]
    spare = draw(st.sets(st.sampled_from(idle))) if idle else set()
    return planner, candidates.Failure(
        running=running, failed=frozenset(failed), spare=frozenset(spare)
    )


@given(failures(), st.sampled_from(KINDS))
@settings(max_examples=100, deadline=None)
def test_candidates_of_some_kinds_are_the_full_search_filtered(
    drawn: tuple[planning.Planner, candidates.Failure], kinds: frozenset[candidates.Kind]
) -> None:
    planner, failure = drawn
    try:
        found = candidates.search(failure, planner.estimates, planner.settings.search)
    except errors.InfeasibleError:
        assert planner.candidates_of(kinds, failure) is None
        return
    expected = [c for c in found.candidates if c.kind in kinds]
    assert planner.candidates_of(kinds, failure) == expected


@given(test_fresh.jobs(), st.data())
@settings(max_examples=40, deadline=None)
def test_fresh_plans_kept_are_the_plans_built_again(job: planning.Job, data: st.DataObject) -> None:
    planner, oracle = planning.Planner(job), planning.Planner(job)
    live = st.sets(st.integers(min_value=0, max_value=test_fresh.MAX_WORKERS - 1), min_size=1)
    pool = data.draw(st.lists(live, min_size=1, max_size=planning.RECENT_PLANS + 4))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3 * len(pool)))):
        workers = [W(w) for w in sorted(data.draw(st.sampled_from(pool)))]
        symmetric = data.draw(st.booleans())
        found = oracle._search(symmetric, None).best(len(workers))  # `fresh` before it kept any
        expected = None if found is None else oracle._laid_out(found.layout, workers)
        got = planner.fresh(workers, symmetric)
        assert got == expected
        if got is not None and expected is not None:
            whole = oracle.estimates.whole(expected)
            assert (planner.step_s(got), planner.peak_bytes(got)) == (
                whole.step_s,
                whole.peak_bytes,
            )
