"""Recovery policies (planaria.sim.policies) on scripted failures of a 2 x 3 grid.

Covers: Planaria's recovery is `policy.decide`'s choice with its transition as the pause;
dynamic-only never reroutes; rerouting-only reroutes, and when a stage lost both replicas it
falls back to a re-plan; Bamboo merges a failed stage into its predecessor's worker (the first
stage into its successor's) with a regroup pause and the step of the merged plan times 1 +
RC_OVERHEAD, restarts from a checkpoint when the backup is dead or already covering, trains on
the fastest grid whose redundant copies fit, and does not train when none does; Varuna restarts
on every failure in its plan (pause = regroup + restart + checkpoint load) and ignores failures
outside it; the ideal moves at no cost; a failure of every worker leaves nothing to train.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from planaria.contract import plan
from planaria.planner import candidates, distribution, policy, transfers
from planaria.sim import planning, policies
from tests import strategies
from tests.sim import conftest

W = plan.WorkerId


def grid(planner: planning.Planner) -> policies.Running:
    """2 pipelines x 3 stages of 2 layers (tiny has 6 planner layers), 8 micro-batches each:
    pipeline 0 on workers 0, 1, 2 and pipeline 1 on 3, 4, 5."""
    pipelines = tuple(
        distribution.pipeline_of((2, 2, 2), [W(3 * p + s) for s in range(3)], 8) for p in range(2)
    )
    running = plan.Plan(pipelines=pipelines, micro_batch_size=1)
    return policies.Running(plan=running, step_s=planner.step_s(running))


def live(*dead: int) -> frozenset[plan.WorkerId]:
    return frozenset(W(w) for w in range(conftest.NUM_NODES) if w not in dead)


def ttf(num_live: int) -> float:
    return 600.0


def test_planaria_takes_the_decision_of_eq_8(planner: planning.Planner) -> None:
    running = grid(planner)
    recovery = policies.Planaria(planner, ttf).on_failure(running, frozenset({W(1)}), live(1))
    assert recovery is not None and recovery.running.plan is not None
    assert running.plan is not None
    failure = candidates.Failure(
        running=running.plan, failed=frozenset({W(1)}), spare=frozenset({W(6), W(7)})
    )
    decision, _ = policy.decide(
        failure, planning.Planner(conftest.tiny_job()).estimates, 600.0, policy.PolicySettings()
    )
    assert recovery.running.plan == decision.choice.plan
    assert recovery.pause_s == pytest.approx(decision.choice.transition.total_s)
    assert recovery.running.step_s == pytest.approx(decision.choice.estimate.step_s)


def test_dynamic_only_never_reroutes(planner: planning.Planner) -> None:
    recovery = policies.DynamicOnly(planner, ttf).on_failure(
        grid(planner), frozenset({W(1)}), live(1)
    )
    assert recovery is not None and recovery.running.plan is not None
    assert not recovery.running.plan.reroutes
    assert W(1) not in recovery.running.plan.workers


def test_rerouting_only_reroutes_then_falls_back_when_a_stage_is_gone(
    planner: planning.Planner,
) -> None:
    recycle = policies.ReroutingOnly(planner, ttf)
    first = recycle.on_failure(grid(planner), frozenset({W(1)}), live(1))
    assert first is not None and first.running.plan is not None
    assert first.running.plan.reroutes and first.running.note.startswith("reroute")
    assert first.pause_s == pytest.approx(transfers.Overheads().regroup_s)
    # worker 4 holds the other replica of stage 1: rerouting is impossible now
    second = recycle.on_failure(first.running, frozenset({W(4)}), live(1, 4))
    assert second is not None and second.running.plan is not None
    assert not second.running.plan.reroutes
    assert second.running.note.split(":")[0] in ("symmetric", "asymmetric")


def test_bamboo_merges_a_failed_stage_into_its_backup(planner: planning.Planner) -> None:
    bamboo = policies.Bamboo(planner, ttf)
    recovery = bamboo.on_failure(grid(planner), frozenset({W(1)}), live(1))
    assert recovery is not None and recovery.running.plan is not None and not recovery.restart
    merged = recovery.running.plan.pipelines[0]
    assert [(s.layer_start, s.layer_stop, s.workers) for s in merged.stages] == [
        (0, 4, (W(0),)),
        (4, 6, (W(2),)),
    ]
    assert recovery.pause_s == transfers.Overheads().regroup_s
    expected = planner.step_s(recovery.running.plan) * (1 + policies.RC_OVERHEAD)
    assert recovery.running.step_s == pytest.approx(expected)
    # the first stage's backup is its successor
    first = policies.Bamboo(planner, ttf).on_failure(grid(planner), frozenset({W(3)}), live(3))
    assert first is not None and first.running.plan is not None
    assert first.running.plan.pipelines[1].stages[0].workers == (W(4),)


def test_bamboo_restarts_when_adjacent_nodes_fail(planner: planning.Planner) -> None:
    bamboo = policies.Bamboo(planner, ttf)
    after = bamboo.on_failure(grid(planner), frozenset({W(1)}), live(1))
    assert after is not None
    # worker 0 now covers worker 1's stage: losing it too is a restart from a checkpoint
    again = bamboo.on_failure(after.running, frozenset({W(0)}), live(0, 1))
    assert again is not None and again.restart
    assert again.pause_s == pytest.approx(policies.restart_s(planner))


def test_bamboo_does_not_train_when_its_redundant_copy_does_not_fit() -> None:
    # a one-layer stage fits (1 MB of state in 1.5 MB) but not with its successor's copy
    tight = strategies.uniform_profile(6, state_bytes=1_000_000, memory_bytes=1_500_000)
    planner = planning.Planner(planning.Job(profile=tight, global_batch=8))
    assert planner.fresh(live(), symmetric=True) is not None  # Varuna's grid fits
    running = policies.Bamboo(planner, ttf).start(live())
    assert running.plan is None and running.note.startswith("out of memory")


def test_bamboo_picks_a_grid_its_redundant_copies_fit(planner: planning.Planner) -> None:
    job = conftest.tiny_job()
    fastest = planner.fresh(live(), symmetric=True)
    assert fastest is not None
    # memory for the fastest grid alone: Bamboo must take another grid or none
    tight = dataclasses.replace(job.profile, memory_bytes=planner.peak_bytes(fastest) + 1)
    squeezed = planning.Planner(dataclasses.replace(job, profile=tight))
    bamboo = policies.Bamboo(squeezed, ttf)
    running = bamboo.start(live())
    if running.plan is not None:
        assert bamboo._redundant_peak(running.plan) <= tight.memory_bytes


def test_varuna_restarts_on_failures_in_its_plan_only(planner: planning.Planner) -> None:
    varuna = policies.Varuna(planner, ttf)
    running = varuna.start(live())
    assert running.plan is not None and running.steps_per_commit >= 10
    restart = varuna.on_failure(running, frozenset({running.plan.workers[0]}), live(0))
    assert restart is not None and restart.restart
    overheads = transfers.Overheads()
    load_s = planner.job.state_bytes / policies.CHECKPOINT_BANDWIDTH
    assert restart.pause_s == pytest.approx(overheads.regroup_s + overheads.restart_s + load_s)
    idle = sorted(set(live()) - set(running.plan.workers))
    if idle:
        assert varuna.on_failure(running, frozenset({idle[0]}), live(idle[0])) is None


def test_the_ideal_moves_for_free(planner: planning.Planner) -> None:
    recovery = policies.Ideal(planner, ttf).on_failure(grid(planner), frozenset({W(1)}), live(1))
    assert recovery is not None and recovery.pause_s == 0.0 and recovery.running.fluid
    assert recovery.running.plan == planner.fresh(live(1))


def test_losing_every_worker_leaves_nothing_to_train(planner: planning.Planner) -> None:
    everyone = frozenset(W(w) for w in range(conftest.NUM_NODES))
    for name, factory in policies.POLICIES.items():
        policy_ = factory(planner, ttf)
        running = policy_.start(everyone)
        recovery = policy_.on_failure(running, everyone, frozenset())
        assert recovery is not None and recovery.running.plan is None, name
        assert math.isinf(recovery.running.step_s), name
