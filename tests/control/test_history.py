"""Recovery records wait for every worker's setup report (heartbeats lag behind the step).

Covers: a recovery is timed at the first committed step of its epoch but recorded only once
every worker of the epoch has reported its setup, so the costliest tier is the one a late
worker needed (a roll-back from peers' snapshots), not the first worker's (kept); without the
late report it is recorded SETUP_REPORTS_WAIT_S after the first step with those it has; a new
failure after the epoch resumed is a new recovery, not merged into the old one (a record merged
with a failure is not `planned`); `settle` records a resumed recovery when the job ends.
"""

from __future__ import annotations

import dataclasses

from planaria.contract import plan
from planaria.control import history, status
from planaria.wire import messages

W = plan.WorkerId
Tier = messages.RecoveryTier


def _beat(worker: int, step: int, tier: Tier | None) -> messages.Heartbeat:
    setup = None if tier is None else messages.EpochSetup(epoch=2, tier=tier, regroup_s=0.01)
    return messages.Heartbeat(
        worker=W(worker),
        epoch=2,
        state=messages.AgentState.RUNNING,
        last_committed_step=step,
        loss=1.0 if step else None,
        samples_processed=0,
        timings=messages.Timings(),
        snapshot=messages.SnapshotState(),
        setup=setup,
    )


def _record(started: float) -> status.Recovery:
    return status.Recovery(
        started_s=started,
        failed=(W(3),),
        epoch=2,
        tier=Tier.KEPT,
        kind=status.MoveKind.REROUTE,
        reason="test",
        detect_s=0.1,
        plan_s=0.01,
        regroup_s=0.0,
        transfer_s=0.0,
        resume_s=0.0,
        total_s=0.0,
        lost_steps=1,
        transferred_bytes=0,
    )


def _observe(h: history.History, now: float, *beats: messages.Heartbeat) -> None:
    h.observe(list(beats), epoch=2, resume_step=49, live_workers=2, now=now)


def test_the_record_waits_for_the_late_workers_setup_and_keeps_the_first_step_time() -> None:
    h = history.History(global_batch=8)
    h.begin(_record(10.0), now=10.5, resume_step=49)
    _observe(h, 11.0, _beat(0, 50, Tier.KEPT), _beat(1, 49, None))
    assert h.recoveries == []
    _observe(h, 11.1, _beat(0, 50, Tier.KEPT), _beat(1, 50, Tier.PEER_SNAPSHOT))
    [done] = h.recoveries
    assert done.tier is Tier.PEER_SNAPSHOT
    assert (done.resume_s, done.total_s) == (0.5, 1.0)


def test_without_the_late_report_it_is_recorded_after_the_wait() -> None:
    h = history.History(global_batch=8)
    h.begin(_record(10.0), now=10.5, resume_step=49)
    _observe(h, 11.0, _beat(0, 50, Tier.KEPT), _beat(1, 49, None))
    _observe(h, 11.0 + history.SETUP_REPORTS_WAIT_S, _beat(0, 51, Tier.KEPT), _beat(1, 49, None))
    [done] = h.recoveries
    assert done.tier is Tier.KEPT and done.total_s == 1.0


def test_a_failure_after_the_epoch_resumed_is_a_new_recovery() -> None:
    h = history.History(global_batch=8)
    h.begin(_record(10.0), now=10.5, resume_step=49)
    _observe(h, 11.0, _beat(0, 50, Tier.KEPT), _beat(1, 49, None))
    h.begin(_record(11.5), now=12.0, resume_step=50)
    assert [r.started_s for r in h.recoveries] == [10.0]
    assert h.pending is not None and h.pending.death_at == 11.5


def test_settle_records_a_resumed_recovery_when_the_job_ends() -> None:
    h = history.History(global_batch=8)
    h.begin(_record(10.0), now=10.5, resume_step=49)
    h.settle()
    assert h.recoveries == []  # not resumed yet: nothing to time it by
    _observe(h, 11.0, _beat(0, 50, Tier.KEPT), _beat(1, 49, None))
    h.settle()
    assert len(h.recoveries) == 1


def test_a_failure_merged_into_a_planned_switch_is_no_longer_planned() -> None:
    h = history.History(global_batch=8)
    planned = dataclasses.replace(
        _record(10.0), failed=(), kind=status.MoveKind.SCALE_UP, planned=True
    )
    h.begin(planned, now=10.5, resume_step=49)
    h.begin(_record(10.8), now=11.0, resume_step=49)  # a worker died before it resumed
    h.begin(planned, now=11.2, resume_step=49)  # and a planned switch followed, unresumed
    assert h.pending is not None
    assert not h.pending.record.planned and h.pending.record.failed == (W(3),)


def _at(epoch: int, step: int, at_s: float) -> status.StepRecord:
    return status.StepRecord(
        at_s=at_s, step=step, loss=1.0, samples_per_s=1.0, live_workers=2, epoch=epoch
    )


def test_the_latest_step_time_is_the_newest_pace_of_one_epoch_whatever_epoch_it_is() -> None:
    """A new epoch has no step time of its own: a planned switch leads by the pace of the
    newest epoch that had one (chaos pipeline seed 10: 2 steps of lead, not PLANNED_LEAD_S)."""
    h = history.History(global_batch=8)
    assert h.latest_step_s() == 0.0
    h.steps += [_at(1, 10, 1.0), _at(1, 14, 2.0)]
    assert h.latest_step_s() == 0.25
    h.steps.append(_at(2, 15, 9.0))  # the new epoch's first record: still epoch 1's pace
    assert h.latest_step_s() == 0.25
    assert h.step_s(2, []) == 0.0
    h.steps.append(_at(2, 17, 9.5))
    assert h.latest_step_s() == h.step_s(2, []) == 0.25


def test_a_given_up_switch_gives_back_the_recovery_it_had_merged() -> None:
    """A reroute's epoch commits and a scale-up's switch begins before its first step is seen;
    the switch comes too late and is given up: the reroute is recorded on its own, timed at
    its epoch's first step (chaos pipeline seed 6: moves [] after the give-up)."""
    h = history.History(global_batch=8)
    h.begin(_record(10.0), now=10.5, resume_step=49)  # the reroute (epoch 2), from step 49
    planned = dataclasses.replace(
        _record(11.0), failed=(), kind=status.MoveKind.SCALE_UP, epoch=3, planned=True
    )
    h.begin(planned, now=11.0, resume_step=52)
    merged = h.pending.record.kind if h.pending is not None else None
    assert merged is status.MoveKind.SCALE_UP
    h.steps += [_at(2, 49, 10.4), _at(2, 50, 11.5), _at(2, 53, 12.0)]
    h.give_up_switch(now=13.0)
    assert h.pending is None
    (recorded,) = h.recoveries
    assert recorded.kind is status.MoveKind.REROUTE and recorded.failed == (W(3),)
    assert recorded.total_s == 11.5 - 10.0 and recorded.resume_s == 11.5 - 10.5


def test_a_given_up_switch_alone_records_nothing() -> None:
    h = history.History(global_batch=8)
    planned = dataclasses.replace(_record(11.0), failed=(), kind=status.MoveKind.SCALE_UP)
    h.begin(dataclasses.replace(planned, planned=True), now=11.0, resume_step=52)
    h.give_up_switch(now=13.0)
    assert h.pending is None and h.recoveries == []
