"""Suspended jobs, decided by pure functions (planaria.control.suspension).

Covers: what a new suspension remembers (a failed resume from host memory sends the next one to
the checkpoint and may retry it at once); what a pass does while Suspended (carry on when the
suspended epoch's workers are back and still train in it; never resume with too few workers,
nothing new or no plan; a pass that does not ask the planner decides as if it had; hold for a
stall and for a returning worker's first heartbeat, each bounded); where a resume starts (host
memory only when newer than the checkpoint and not already failed); the step every live worker
holds; the status message and the resume's record.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.control import status, suspension
from planaria.wire import messages
from tests import strategies

W = plans.WorkerId
NEXT = suspension.Next


def _facts(**changes: object) -> suspension.Facts:
    base = suspension.Facts(
        live=frozenset(W(w) for w in range(4)),
        plan_workers=frozenset(W(w) for w in range(4)),
        arrived=True,
        min_workers=2,
        heartbeat_timeout_s=1.0,
        step_timeout_s=2.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _beat(worker: int, *, step: int, snapshot: int | None) -> messages.Heartbeat:
    return messages.Heartbeat(
        worker=W(worker),
        epoch=1,
        state=messages.AgentState.PAUSED,
        last_committed_step=step,
        loss=None,
        samples_processed=0,
        timings=messages.Timings(),
        snapshot=messages.SnapshotState(latest_step=snapshot, held_bytes=0),
    )


@given(strategies.suspensions(), st.none() | st.integers(0, 100), st.booleans())
def test_a_suspension_retries_only_what_can_be_tried(
    before: suspension.Suspension, checkpoint: int | None, retry: bool
) -> None:
    after = suspension.suspend(before, checkpoint=checkpoint, now=7.0, retry=retry)
    assert (after.checkpoint, after.since_s, after.from_snapshot) == (checkpoint, 7.0, False)
    assert after.retry == ((retry and checkpoint is not None) or before.from_snapshot)
    assert after.snapshot_failed == (before.snapshot_failed or before.from_snapshot or retry)


def test_a_failed_resume_from_host_memory_resumes_from_the_checkpoint_next() -> None:
    resumed = suspension.Suspension(from_snapshot=True)
    again = suspension.suspend(resumed, checkpoint=None, now=3.0, retry=False)
    assert again.retry and again.snapshot_failed
    start, _ = suspension.resume_point(again, held=40)
    assert start == suspension.Resume(step=0, from_memory=False)


@given(strategies.suspensions(), strategies.suspension_facts(), st.floats(0.0, 200.0))
def test_a_suspended_job_never_resumes_without_workers_news_or_a_plan(
    state: suspension.Suspension, facts: suspension.Facts, now: float
) -> None:
    verdict, after, why = suspension.next_move(state, facts, now)
    assert why
    if verdict is NEXT.RESUME:
        assert facts.arrived or state.retry
        assert len(facts.live) >= facts.min_workers and not facts.infeasible
        assert not after.retry and after.unheard_since is None
    carry_on = facts.plan_workers is not None and facts.plan_workers <= facts.live & facts.ran
    assert (verdict is NEXT.HEAL) == carry_on
    assert (after.checkpoint, after.since_s) == (state.checkpoint, state.since_s)


@given(strategies.suspensions(), strategies.suspension_facts(), st.floats(0.0, 200.0), st.text())
def test_a_pass_that_does_not_ask_the_planner_decides_the_same_whatever_it_would_say(
    state: suspension.Suspension, facts: suspension.Facts, now: float, refusal: str
) -> None:
    asks = suspension.asks_planner(
        state, arrived=facts.arrived, live=len(facts.live), min_workers=facts.min_workers
    )
    if not asks:  # the survey then gives no move and no refusal: the same as any answer's
        answered = suspension.next_move(state, dataclasses.replace(facts, infeasible=refusal), now)
        unasked = suspension.next_move(state, dataclasses.replace(facts, infeasible=""), now)
        assert answered == unasked and unasked[0] is not NEXT.RESUME


@given(strategies.suspensions(), strategies.suspension_facts(), st.floats(0.0, 200.0))
def test_holding_a_resume_for_a_stall_is_bounded(
    state: suspension.Suspension, facts: suspension.Facts, now: float
) -> None:
    _, after, why = suspension.next_move(state, facts, now)
    if "stall" in why:
        assert after.stall_since is not None
        assert now - after.stall_since < facts.heartbeat_timeout_s + facts.step_timeout_s


def test_workers_back_from_a_silence_and_still_training_carry_the_epoch_on() -> None:
    facts = _facts(ran=frozenset(W(w) for w in range(4)), arrived=False)
    verdict, after, _ = suspension.next_move(suspension.Suspension(retry=True), facts, 1.0)
    assert verdict is NEXT.HEAL and not after.retry


def test_a_resume_waits_for_a_stall_to_end_worker_by_worker_then_goes_on() -> None:
    facts = _facts(live=frozenset({W(0), W(1), W(2)}), silent=frozenset({W(3)}))
    state = suspension.Suspension()
    verdict, state, why = suspension.next_move(state, facts, 10.0)
    assert (verdict, state.stall_since) == (NEXT.WAIT, 10.0) and "stall" in why
    verdict, state, _ = suspension.next_move(state, facts, 12.9)
    assert verdict is NEXT.WAIT
    verdict, state, _ = suspension.next_move(state, facts, 13.0)  # 1 s + 2 s later
    assert verdict is NEXT.RESUME


def test_a_resume_waits_a_heartbeat_timeout_for_a_returning_workers_first_beat() -> None:
    facts = _facts(unheard=True)
    verdict, state, _ = suspension.next_move(suspension.Suspension(), facts, 5.0)
    assert (verdict, state.unheard_since) == (NEXT.WAIT, 5.0)
    verdict, _, _ = suspension.next_move(state, facts, 6.0)
    assert verdict is NEXT.RESUME
    failed = suspension.Suspension(snapshot_failed=True)  # the checkpoint needs no beats
    assert suspension.next_move(failed, facts, 5.0)[0] is NEXT.RESUME


def test_no_plan_for_the_live_workers_says_why_it_waits() -> None:
    verdict, _, why = suspension.next_move(
        suspension.Suspension(), _facts(infeasible="2 nodes, 3 needed"), 0.0
    )
    assert verdict is NEXT.WAIT and why.endswith("2 nodes, 3 needed")


@given(strategies.suspensions(), st.none() | st.integers(0, 1000))
def test_a_resume_uses_host_memory_only_when_newer_than_the_checkpoint(
    state: suspension.Suspension, held: int | None
) -> None:
    start, after = suspension.resume_point(state, held)
    checkpoint = state.checkpoint or 0
    usable = held is not None and held > checkpoint and not state.snapshot_failed
    assert start.from_memory == usable == after.from_snapshot
    assert start.step == (held if usable else checkpoint)
    assert not after.snapshot_failed


def test_the_held_step_is_the_oldest_of_workers_at_most_one_step_apart() -> None:
    beats = {W(0): _beat(0, step=12, snapshot=11), W(1): _beat(1, step=0, snapshot=11)}
    assert suspension.held_step(beats, [W(0), W(1)]) == 11
    assert suspension.held_step(beats, [W(0), W(1), W(2)]) is None  # one never reported
    beats[W(1)] = _beat(1, step=0, snapshot=9)
    assert suspension.held_step(beats, [W(0), W(1)]) is None  # too far apart
    beats[W(1)] = _beat(1, step=0, snapshot=None)
    assert suspension.held_step(beats, [W(0), W(1)]) is None  # nothing held


def test_the_message_and_record_say_where_training_resumes() -> None:
    text = suspension.message("every worker of the plan is lost", None, need=4, live=1)
    assert "snapshot every returning worker holds, else from step 0" in text
    assert "once 4 workers are live (1 now)" in text
    state = suspension.Suspension(since_s=2.5)
    record = suspension.resumed(
        state, suspension.Resume(step=30, from_memory=True), epoch=4, reason="best plan"
    )
    assert (record.kind, record.epoch, record.started_s) == (status.MoveKind.RESUME, 4, 2.5)
    assert record.tier is messages.RecoveryTier.LOCAL_SNAPSHOT and "step 30" in record.reason
    assert (record.failed, record.lost_steps) == ((), 0)


def test_a_resume_below_the_step_reached_counts_the_steps_trained_again() -> None:
    # Every worker of a plan lost at step 12: the record names them and the 12 steps redone
    # when nothing newer than step 0 survived (seen on a GPU: the first snapshot was still
    # being written when the only worker died, and the record said "0 steps lost").
    state = suspension.suspend(
        suspension.Suspension(),
        checkpoint=None,
        now=1.0,
        retry=False,
        reached=12,
        lost=[W(1), W(0)],
    )
    from_zero = suspension.resumed(
        state, suspension.Resume(step=0, from_memory=False), epoch=2, reason="r"
    )
    assert (from_zero.failed, from_zero.lost_steps, from_zero.tier) == (
        (W(0), W(1)),
        12,
        messages.RecoveryTier.CHECKPOINT,
    )
    from_memory = suspension.resumed(
        state, suspension.Resume(step=10, from_memory=True), epoch=2, reason="r"
    )
    assert from_memory.lost_steps == 2
    # A second suspension that reached less (it resumed from an older step) keeps the newest.
    again = suspension.suspend(state, checkpoint=None, now=5.0, retry=False, reached=3, lost=[W(0)])
    assert (again.reached, again.lost) == (12, (W(0),))
