"""Recovery's decisions, tested directly (planaria.control.recovery; the controller's recoveries
end to end are in test_controller.py and test_membership_changes.py).

Covers: the move after a broken epoch (Suspend when no worker survived, the same plan when all
are alive, the policy's plan, the templates anew when the policy has none, Suspend when nothing
fits the survivors); the resume step (the survivors' oldest step; with a layer in no live
replica, or with survivors one step ahead after a death inside the commit barrier, or after a
failed restore, their newest snapshot complete on every worker, never newer than their step nor
than the failed one; without one, the checkpoint, else step 0); the expected time to the next
failure before any is seen.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.contract import snapshot_placement
from planaria.control import (
    clock,
    failures,
    outcomes,
    planning,
    ports,
    recovery,
    settings,
    status,
)
from planaria.wire import messages
from tests import strategies
from tests.control import scenarios

W = plans.WorkerId
ALL = frozenset(W(w) for w in range(8))


def _found(failed: set[int], *, resume: int = 10, newest: int = 10) -> failures.Assessment:
    lost = frozenset(W(w) for w in failed)
    return failures.Assessment(
        failed=lost,
        survivors=ALL - lost,
        death_at=1.0,
        newest_step=newest,
        resume_step=resume,
        state_lost=False,
    )


def _planner(policy_name: str = "adaptive") -> tuple[planning.Planner, plans.Plan]:
    job = scenarios.job(policy=policy_name)
    assert job.profile is not None
    planner = planning.Planner(job.profile, job)
    return planner, planner.best(ALL, status.MoveKind.INITIAL).plan


def _decide(
    found: failures.Assessment,
    *,
    policy_name: str = "adaptive",
    own_faults: bool = False,
    steps_left: int = 1000,
) -> planning.Move | outcomes.Suspend:
    planner, running = _planner(policy_name)
    return recovery.decide(
        planner,
        running,
        found,
        live=set(found.survivors),
        own_faults=own_faults,
        policy_name=policy_name,
        time_to_failure_s=3600.0,
        steps_left=steps_left,
        lost="every worker of the plan is lost",
    )


def _move(*, needs_snapshot: bool) -> planning.Move:
    _, running = _planner()
    return planning.Move(
        plan=running,
        transfers=(),
        kind=status.MoveKind.DYNAMIC,
        reason="",
        needs_snapshot=needs_snapshot,
    )


def test_no_survivor_suspends_saying_why() -> None:
    decided = _decide(_found(set(range(8))))
    assert decided == outcomes.Suspend(
        running=_planner()[1],
        what="every worker of the plan is lost",
        reason=status.SuspendReason.WORKERS_LOST,
        retry=False,
    )


@pytest.mark.parametrize(
    ("own_faults", "words"),
    [(False, "the same plan regroups"), (True, "latched an error of its own")],
    ids=["a broken group", "errors of the workers' own"],
)
def test_every_worker_alive_regroups_the_same_plan(own_faults: bool, words: str) -> None:
    decided = _decide(_found(set()), own_faults=own_faults)
    assert isinstance(decided, planning.Move)
    assert decided.plan == _planner()[1] and decided.kind is status.MoveKind.RESTART
    assert words in decided.reason


def test_a_lost_worker_gets_the_policys_plan_without_it() -> None:
    decided = _decide(_found({3}), policy_name="dynamic")
    assert isinstance(decided, planning.Move) and decided.kind is status.MoveKind.DYNAMIC
    assert W(3) not in decided.plan.workers


def test_the_adaptive_policy_reroutes_near_the_jobs_end_where_it_replans_earlier() -> None:
    """Worker 1's stage: re-planning's faster step repays its transition over 1000 steps,
    not over the last 3 (eq. 8 bounded by the steps left, docs/policy.md)."""
    early = _decide(_found({1}), steps_left=1000)
    late = _decide(_found({1}), steps_left=3)
    assert isinstance(early, planning.Move) and isinstance(late, planning.Move)
    assert early.kind is status.MoveKind.SYMMETRIC
    assert late.kind is status.MoveKind.REROUTE and late.plan.reroutes
    assert "the job's last 3 step(s) end before the next failure" in late.reason
    assert "next best symmetric" in late.reason


def test_without_a_policy_plan_the_templates_start_anew_over_the_survivors() -> None:
    # Pipelines [0,1] [2,3] [4,5] [6,7]: rerouting cannot cover a stage lost in every
    # pipeline; the templates fit the four survivors.
    decided = _decide(_found({0, 2, 4, 6}), policy_name="reroute")
    assert isinstance(decided, planning.Move) and decided.kind is status.MoveKind.RESTART
    assert decided.reason.startswith("the reroute policy has no plan")
    assert set(decided.plan.workers) == {W(1), W(3), W(5), W(7)}


def test_too_few_survivors_for_any_plan_suspend() -> None:
    decided = _decide(_found({0, 1, 2, 3, 4, 5}), policy_name="dynamic")
    assert isinstance(decided, outcomes.Suspend) and not decided.retry
    assert "no plan for the 2 surviving workers" in decided.what
    assert decided.reason is status.SuspendReason.NO_FEASIBLE_PLAN


def test_a_resume_step_is_the_survivors_step_unless_a_layer_needs_a_snapshot() -> None:
    found = _found({3}, resume=10)
    assert recovery.resume_step(found, _move(needs_snapshot=False), None) == 10
    needs = _move(needs_snapshot=True)
    assert recovery.resume_step(found, needs, None) is None  # no snapshot held by all
    assert recovery.resume_step(found, needs, 12) is None  # newer than their step
    assert recovery.resume_step(found, needs, 8) == 8
    # Every survivor holds 10 complete (their reports say so); the dead's store is never
    # read, so whether its own snapshot of 10 was whole does not matter.
    assert recovery.resume_step(found, needs, 10) == 10


@given(
    resume=st.integers(0, 100),
    ahead=st.integers(0, 1),
    snapshot=st.none() | st.integers(0, 120),
)
def test_a_resume_step_is_never_past_the_survivors_oldest_step(
    resume: int, ahead: int, snapshot: int | None
) -> None:
    found = _found({3}, resume=resume, newest=resume + ahead)
    step = recovery.resume_step(found, _move(needs_snapshot=True), snapshot)
    assert step is None or 0 <= step <= min(resume, snapshot or 0)
    assert (step is None) == (snapshot is None or snapshot > resume)


def test_survivors_ahead_roll_back_to_a_snapshot_every_survivor_holds() -> None:
    # A death inside the commit barrier: survivors at 10 and 11, every layer still live. The
    # ones at 11 rebuild theirs from snapshots, so the resume needs a snapshot they all hold.
    split = _found({3}, resume=10, newest=11)
    live = _move(needs_snapshot=False)
    assert recovery.rolls_back(split, live, None)
    assert recovery.resume_step(split, live, None) is None  # not simply 10
    assert recovery.resume_step(split, live, 10) == 10
    assert recovery.resume_step(split, live, 9) == 9
    assert "holds no snapshot of it" in recovery.rolled_back(split, live, 9, None)
    assert recovery.rolled_back(split, live, 10, None) == ""
    level = _found({3}, resume=10, newest=10)
    assert not recovery.rolls_back(level, live, None)
    assert recovery.resume_step(level, live, None) == 10  # KEPT everywhere: no snapshot read


def test_after_a_failed_restore_only_an_older_step_is_resumed() -> None:
    found = _found(set(), resume=10, newest=11)
    live = _move(needs_snapshot=False)
    assert recovery.rolls_back(_found(set()), live, 10)
    assert recovery.restore_ceiling(found, 10) == 9
    assert recovery.restore_ceiling(found, 12) == 10
    assert recovery.resume_step(found, live, 10, below=10) is None
    assert recovery.resume_step(found, live, 8, below=10) == 8
    assert "the restore of step 10 failed" in recovery.rolled_back(found, live, 8, 10)


@pytest.mark.parametrize(
    ("checkpoint", "answer"),
    [
        (6, "the persistent checkpoint of step 6 is the next tier"),
        (None, "there is no persistent checkpoint: training restarts from step 0"),
        (12, "there is no older persistent checkpoint: training restarts from step 0"),
    ],
    ids=["an older checkpoint is next", "none: step 0", "only a newer one: step 0"],
)
def test_without_a_snapshot_every_survivor_holds_the_checkpoint_else_step_0_is_next(
    checkpoint: int | None, answer: str
) -> None:
    earlier = recovery.earlier_tier(9, checkpoint)
    if isinstance(earlier, str):
        assert answer in earlier and "at or before step 9" in earlier
    else:
        assert earlier[0] == 0 and answer in earlier[1]


@given(
    resume=st.integers(0, 100),
    ahead=st.integers(0, 1),
    needs=st.booleans(),
    snapshot=st.none() | st.integers(1, 120),
    below=st.none() | st.integers(1, 120),
)
def test_a_roll_back_resumes_only_at_a_step_every_survivor_holds_below_a_failed_restore(
    resume: int, ahead: int, needs: bool, snapshot: int | None, below: int | None
) -> None:
    """`snapshot` stands for the newest step every survivor holds at or before the ceiling
    (`Roster.snapshot_step`); the resume is that step or the survivors' own, never one a
    survivor ahead might not hold, never a failed one or newer."""
    found = _found({3}, resume=resume, newest=resume + ahead)
    move = _move(needs_snapshot=needs)
    step = recovery.resume_step(found, move, snapshot, below=below)
    if not recovery.rolls_back(found, move, below):
        assert step == resume and not ahead and not needs and below is None
        return
    ceiling = recovery.restore_ceiling(found, below)
    assert ceiling <= resume and (below is None or ceiling < below)
    fits = snapshot is not None and snapshot <= ceiling
    assert step == (snapshot if fits else None)


def _brute_beyond(
    running: plans.Plan, failed: set[int], redundancy: messages.RedundancyMode
) -> dict[int, tuple[plans.WorkerId, ...]]:
    """The oracle: every worker's store as the files it keeps (its own members' and the ones it
    mirrors), the survivors' stores pooled, each layer's members missing from the pool counted."""
    mirrors = snapshot_placement.mirrors(running)
    if redundancy is messages.RedundancyMode.NONE:  # no copies asked for: no mirrors
        mirrors = {layer: tuple(None for _ in placed) for layer, placed in mirrors.items()}
    stores: dict[int, set[tuple[int, int]]] = {}
    out = {}
    for layer in range(max(s.layer_stop for p in running.pipelines for s in p.stages)):
        stages = [s for p in running.pipelines for s in p.stages if layer in s.layers]
        group = sorted(w for s in stages for w in s.workers)
        for k, holder in enumerate(group):
            stores.setdefault(holder, set()).add((layer, k))
            mirror = mirrors[layer][k]
            if mirror is not None:
                stores.setdefault(mirror, set()).add((layer, k))
    pooled = set().union(*(files for w, files in stores.items() if w not in failed))
    for layer in range(max(s.layer_stop for p in running.pipelines for s in p.stages)):
        stages = [s for p in running.pipelines for s in p.stages if layer in s.layers]
        group = sorted(w for s in stages for w in s.workers)
        missing = [k for k in range(len(group)) if (layer, k) not in pooled]
        tolerated = 1 if redundancy is not messages.RedundancyMode.NONE and len(group) > 1 else 0
        if len(missing) > tolerated:
            behind = {group[k] for k in missing} | {mirrors[layer][k] for k in missing}
            out[layer] = tuple(sorted(W(w) for w in behind if w is not None))
    return out


@given(
    failed=st.sets(st.integers(0, 7), max_size=8),
    redundancy=st.sampled_from(list(messages.RedundancyMode)),
)
def test_layers_beyond_the_redundancy_are_those_that_lost_more_members_than_it_covers(
    failed: set[int], redundancy: messages.RedundancyMode
) -> None:
    _, running = _planner()
    lost = frozenset(W(w) for w in failed)
    beyond = recovery.beyond_redundancy(running, lost, redundancy)
    assert beyond == _brute_beyond(running, failed, redundancy)
    if beyond:
        message = recovery.beyond_message(beyond, redundancy)
        assert f"layers {sorted(beyond)}" in message and "checkpoint is the next tier" in message


@given(p=strategies.plans(), data=st.data())
def test_the_failure_guarantee_live_replicas_for_f_nodes_snapshots_beyond_every_replica(
    p: plans.Plan, data: st.DataObject
) -> None:
    """docs/resilience.md, "The guarantee": a layer held on f + 1 distinct nodes keeps a live
    replica through any f node failures; with redundancy and a mirror for every member of its
    group, on holders of distinct nodes, any 2t + 1 node failures (t its tolerated losses) leave
    it rebuildable from snapshots, every replica lost included; a failure set that takes every
    holder and every mirror of a group of two or more always needs the checkpoint."""
    nodes = sorted({p.node_of(w) for w in p.workers})
    failed_nodes = set(data.draw(st.lists(st.sampled_from(nodes), unique=True)))
    failed = frozenset(w for w in p.workers if p.node_of(w) in failed_nodes)
    beyond = recovery.beyond_redundancy(p, failed, messages.RedundancyMode.XOR)
    mirrors = snapshot_placement.mirrors(p)
    for layer in range(p.num_layers):
        holders = {w for q in p.pipelines for s in q.stages if layer in s.layers for w in s.workers}
        holder_nodes = {p.node_of(w) for w in holders}
        if len(holder_nodes) >= len(failed_nodes) + 1:
            assert holders - failed  # a live replica: no snapshot needed at all
        t = 1 if len(holders) >= 2 else 0
        mirrored = None not in mirrors[layer]
        if mirrored and len(holder_nodes) == len(holders) and len(failed_nodes) <= 2 * t + 1:
            assert layer not in beyond, (layer, sorted(failed), mirrors[layer])
        everything = holders | {w for w in mirrors[layer] if w is not None}
        if len(holders) >= 2 and everything <= failed:
            assert layer in beyond  # every replica and every mirror lost


def test_the_time_to_failure_is_the_default_before_any_failure() -> None:
    job = scenarios.job()
    handler = _handler(job, clock.RealClock())
    assert handler.time_to_failure() == recovery.DEFAULT_TIME_TO_FAILURE_S


def _handler(job: settings.JobSettings, time: ports.Clock) -> recovery.Handler:
    built = scenarios.parts(job, time)
    return recovery.Handler(job, time, built.roster, built.driver, built.record)
