"""The controller's questions to the planner (planaria.control.planning).

Covers: transfer sources restricted to the new plan (hypothesis, against a per-source oracle),
whole live nodes (brute force over small clusters), each policy's move after a death
(adaptive = policy.decide's choice, dynamic = Oobleck's reinstantiation, reroute = ReCycle's
layout), the scale-up's copies going only to workers that lack the layers, from holders in the
plan, the fewest workers any plan needs, and a profile for another micro-batch refused.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import errors
from planaria.contract import plan as plans
from planaria.control import planning, status
from planaria.planner import candidates, policy, screening, transfers
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
