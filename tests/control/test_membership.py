"""The controller's view of its workers (planaria.control.membership) and the reading of a
broken epoch (planaria.control.failures).

Covers: deaths from events and broken streams until a join; a stale connection's reports
ignored; silence past the heartbeat timeout; which heartbeat counts for an epoch (an older
one only while switching); the model's checkpoint step as the newest reported and the
snapshot step as the newest every worker reports holding complete (the oldest latest step for
reports without the list); the assessment of a broken epoch (failed, survivors, resume step,
own faults, a layer in no tier, a survivor holding no layer) and the workers not yet settled;
the roster's own changes (joins and notices handed out once, workers given up on and excused,
returns after a silence and slow workers once stopped); workers still setting up an older
epoch (an abandoned switch's acceptor too, before its heartbeat shows it) until it is over.
"""

from __future__ import annotations

import dataclasses

from planaria.contract import plan as plans
from planaria.control import failures, membership, ports, recovery
from planaria.wire import messages

W = plans.WorkerId
RUNNING, FAILED = messages.AgentState.RUNNING, messages.AgentState.FAILED
IDLE = messages.AgentState.IDLE


def _beat(
    worker: int,
    epoch: int,
    state: messages.AgentState = RUNNING,
    step: int = 5,
    *,
    error: messages.ErrorKind | None = None,
    checkpoint: int | None = None,
    snapshot: int | None = None,
) -> messages.Heartbeat:
    errors = () if error is None else (messages.LatchedError(kind=error, message="x", step=step),)
    return messages.Heartbeat(
        worker=W(worker),
        epoch=epoch,
        state=state,
        last_committed_step=step,
        loss=None,
        samples_processed=0,
        timings=messages.Timings(),
        snapshot=messages.SnapshotState(latest_step=snapshot, held_bytes=0),
        errors=errors,
        checkpoint_step=checkpoint,
    )


def _roster(*workers: int) -> membership.Roster:
    roster = membership.Roster(heartbeat_timeout_s=1.0)
    for worker in workers:
        roster.connected(W(worker), 0.0)
    return roster


def _plan(*workers: int) -> plans.Plan:
    stages = tuple(plans.Stage(layer_start=0, layer_stop=2, workers=(W(w),)) for w in workers)
    pipelines = tuple(plans.Pipeline(stages=(s,), num_micro_batches=1) for s in stages)
    return plans.Plan(pipelines=pipelines, micro_batch_size=1)


def test_a_death_lasts_until_the_worker_joins_and_reconnects() -> None:
    roster = _roster(0, 1)
    roster.absorb(
        membership.Event(event=ports.WorkerEvent(kind=ports.EventKind.DIED, worker=W(1))), 0.5
    )
    assert roster.live(0.5) == {0} and roster.dead == {1: 0.5}
    roster.absorb(
        membership.Event(event=ports.WorkerEvent(kind=ports.EventKind.JOINED, worker=W(1))), 0.6
    )
    assert roster.joined == [1]
    roster.connected(W(1), 0.7)
    assert roster.live(0.7) == {0, 1}


def test_a_stale_connections_reports_are_ignored() -> None:
    roster = _roster(0)
    old = roster.generation[W(0)]
    roster.connected(W(0), 0.1)  # reconnected: a new generation
    roster.absorb(membership.Lost(worker=W(0), generation=old, detail="old stream"), 0.2)
    roster.absorb(membership.Beat(worker=W(0), generation=old, heartbeat=_beat(0, 1)), 0.2)
    assert W(0) not in roster.dead and W(0) not in roster.beats
    roster.absorb(membership.Lost(worker=W(0), generation=old + 1, detail="broke"), 0.3)
    assert roster.dead == {0: 0.3}


def test_silence_past_the_heartbeat_timeout_makes_a_worker_gone() -> None:
    roster = _roster(0, 1)
    roster.absorb(membership.Beat(worker=W(0), generation=1, heartbeat=_beat(0, 1)), 0.9)
    assert roster.gone([W(0), W(1)], 1.5) == {1}
    assert roster.live(1.5) == {0}


def test_an_older_epochs_heartbeat_counts_only_while_switching() -> None:
    roster = _roster(0)
    roster.absorb(
        membership.Beat(
            worker=W(0),
            generation=1,
            heartbeat=_beat(0, 1, FAILED, error=messages.ErrorKind.PEER_LOST),
        ),
        0.1,
    )
    assert roster.beat(W(0), 2) is None and roster.failed_in([W(0)], 2) == set()
    roster.switching = {W(0)}
    assert roster.failed_in([W(0)], 2) == {0}
    assert roster.beat(W(0), 1) is not None


def test_the_checkpoint_is_the_newest_reported_complete_and_the_snapshot_the_oldest() -> None:
    # Agents report the newest checkpoint step complete for their whole plan and keep it; a
    # dead worker's last report may lag (chaos seed 794), so the newest report is the one.
    roster = _roster(0, 1)
    roster.beats[W(0)] = _beat(0, 1, checkpoint=20, snapshot=25)
    roster.beats[W(1)] = _beat(1, 1, checkpoint=10, snapshot=30)
    assert roster.checkpoint_step([W(0), W(1)]) == 20 and roster.snapshot_step([W(0), W(1)]) == 25
    roster.beats[W(0)] = _beat(0, 1, snapshot=25)
    roster.beats[W(1)] = _beat(1, 1)
    assert roster.checkpoint_step([W(0), W(1)]) is None and roster.snapshot_step([W(0)]) == 25


def test_the_snapshot_interval_is_the_widest_any_worker_achieved() -> None:
    roster = _roster(0, 1, 2)
    assert roster.snapshot_interval([W(0), W(1)]) is None  # no heartbeat yet
    for worker, interval in ((0, 1.0), (1, 2.5), (2, 0.0)):
        beat = _beat(worker, 1)
        snapshot = messages.SnapshotState(achieved_interval_steps=interval)
        roster.beats[W(worker)] = dataclasses.replace(beat, snapshot=snapshot)
    assert roster.snapshot_interval([W(0), W(1), W(2)]) == 2.5  # a snapshot needs every part
    assert roster.snapshot_interval([W(0), W(2)]) == 1.0
    assert roster.snapshot_interval([W(2)]) is None  # fewer than two begun: unknown


def _holding(worker: int, *steps: int) -> messages.Heartbeat:
    held = tuple(messages.HeldSnapshot(step=s, digest=f"xxh3:{s:016x}") for s in steps)
    beat = _beat(worker, 1, snapshot=steps[0] if steps else None)
    return dataclasses.replace(beat, snapshot=dataclasses.replace(beat.snapshot, held=held))


def test_the_snapshot_step_is_the_newest_every_worker_reports_holding() -> None:
    # Issue #20: the controller reads which steps each store holds, instead of inferring from
    # the double buffer's timing which one is complete everywhere.
    roster = _roster(0, 1, 2)
    roster.beats[W(0)] = _holding(0, 12, 11)
    roster.beats[W(1)] = _holding(1, 12, 10)  # its snapshot of 11 was skipped
    roster.beats[W(2)] = _holding(2, 11, 10)  # its 12 was not complete when it reported
    assert roster.snapshot_step([W(0), W(1)]) == 12
    assert roster.snapshot_step([W(0), W(1)], at_most=11) is None  # they share only 12
    assert roster.snapshot_step([W(1), W(2)]) == 10
    assert roster.snapshot_step([W(0), W(1), W(2)]) is None
    assert roster.snapshot_step([W(0), W(3)]) is None  # W3 never reported


def _digests(worker: int, step: int, members: dict[tuple[int, int], str]) -> messages.Heartbeat:
    digests = tuple(
        messages.MemberDigest(layer=layer, member=member, digest=d)
        for (layer, member), d in sorted(members.items())
    )
    held = (messages.HeldSnapshot(step=step, digest=f"xxh3:{worker:016x}", members=digests),)
    beat = _beat(worker, 1, snapshot=step)
    return dataclasses.replace(beat, snapshot=dataclasses.replace(beat.snapshot, held=held))


def test_a_members_copies_reported_with_different_digests_are_a_conflict() -> None:
    # Issue #20: a member's holder and its mirror keep the same files, so their digests of one
    # step must agree; the controller refuses a snapshot where they do not.
    roster = _roster(0, 1, 2)
    roster.beats[W(0)] = _digests(0, 9, {(3, 0): "xxh3:a", (0, 1): "xxh3:c"})  # mirror of 3/0
    roster.beats[W(1)] = _digests(1, 9, {(3, 0): "xxh3:a", (0, 0): "xxh3:d"})  # holder of 3/0
    roster.beats[W(2)] = _digests(2, 9, {(3, 1): "xxh3:b", (0, 1): "xxh3:c"})
    assert roster.digest_conflicts([W(0), W(1), W(2)], 9) == {}
    assert roster.digest_conflicts([W(0), W(1)], 8) == {}  # nobody reports step 8
    roster.beats[W(1)] = _digests(1, 9, {(3, 0): "xxh3:x", (0, 0): "xxh3:d"})  # one copy differs
    conflicts = roster.digest_conflicts([W(0), W(1), W(2), W(5)], 9)  # W5 never reported
    assert conflicts == {(3, 0): {"xxh3:a": (W(0),), "xxh3:x": (W(1),)}}
    message = recovery.conflict_message(9, conflicts)
    assert "snapshot of step 9 disagrees: layer 3 member 0" in message
    assert "the persistent checkpoint is the next tier" in message


def test_a_broken_epoch_is_split_into_failed_and_survivors() -> None:
    roster = _roster(0, 1, 2, 3)
    peer_lost = messages.ErrorKind.PEER_LOST
    roster.beats[W(0)] = _beat(0, 1, FAILED, 7, error=peer_lost)
    roster.beats[W(1)] = _beat(1, 1, FAILED, 8, error=peer_lost)  # the death hit the barrier
    roster.beats[W(2)] = _beat(2, 1, FAILED, 7, error=messages.ErrorKind.OUT_OF_MEMORY)
    roster.beat_at[W(3)] = 0.4
    roster.dead[W(3)] = 0.6
    found = failures.assess(roster, _plan(0, 1, 2, 3), 1, set(), 0.7)
    assert found.failed == {2, 3} and found.survivors == {0, 1}
    assert (found.resume_step, found.newest_step, found.death_at) == (7, 8, 0.0)
    assert not found.state_lost


def test_a_survivor_holding_no_layer_does_not_pull_the_resume_step_to_zero() -> None:
    # Chaos seeds 29 and 48 (pipeline): a scale-up at step 16 whose newcomer, a fresh process,
    # failed its set-up (a layer copy timed out); every worker alive. The newcomer reports
    # step 0, holding nothing; the others hold their layers at 16, where the job resumes.
    roster = _roster(0, 1, 2)
    peer_lost = messages.ErrorKind.PEER_LOST
    roster.beats[W(0)] = _beat(0, 3, FAILED, 16, error=peer_lost)
    roster.beats[W(1)] = _beat(1, 3, FAILED, 16, error=peer_lost)
    roster.beats[W(2)] = _beat(2, 3, FAILED, 0, error=peer_lost)  # the newcomer
    found = failures.assess(roster, _plan(0, 1, 2), 3, set(), 0.5, opened_at=16)
    assert found.survivors == {0, 1, 2} and not found.failed
    assert (found.resume_step, found.newest_step) == (16, 16)
    # In the first epoch (opened at step 0) step 0 is where everyone is.
    first = failures.assess(roster, _plan(0, 1, 2), 3, set(), 0.5)
    assert first.resume_step == 0
    # When no survivor holds a layer, step 0 stays the answer (the job's seed rebuilds it).
    for worker in (0, 1):
        roster.beats[W(worker)] = _beat(worker, 3, FAILED, 0, error=peer_lost)
    assert failures.assess(roster, _plan(0, 1, 2), 3, set(), 0.5, opened_at=16).resume_step == 0


def test_a_layer_in_no_tier_is_reported_and_unsettled_workers_are_listed() -> None:
    roster = _roster(0, 1)
    roster.beats[W(0)] = _beat(0, 2, FAILED, 7, error=messages.ErrorKind.SNAPSHOT_UNAVAILABLE)
    roster.beats[W(1)] = _beat(1, 2, RUNNING, 7)
    assert failures.unsettled(roster, _plan(0, 1), 2, 0.5) == {1}
    found = failures.assess(roster, _plan(0, 1), 2, {W(1)}, 0.5)
    assert found.state_lost and found.failed == {1}


def test_the_roster_hands_out_joins_and_notices_once() -> None:
    roster = _roster(0, 1, 2)
    for worker in (2, 1):
        joined = ports.WorkerEvent(kind=ports.EventKind.JOINED, worker=W(worker))
        roster.absorb(membership.Event(event=joined), 0.1)
    assert roster.take_joined() == [2, 1] and roster.take_joined() == []
    for worker in (0, 1):
        notice = ports.WorkerEvent(kind=ports.EventKind.PREEMPTION_NOTICE, worker=W(worker))
        roster.absorb(membership.Event(event=notice), 0.1)
    assert roster.take_notices([W(1), W(2)]) == {1}
    assert roster.notices == {0}
    roster.notice([W(1)])  # a switch that came too late: handled again
    assert roster.notices == {0, 1}


def test_workers_given_up_on_are_not_live_until_excused_or_rejoined() -> None:
    roster = _roster(0, 1, 2)
    roster.give_up([W(1), W(2)])
    assert roster.live(0.1) == {0}
    roster.excuse([W(1)])
    roster.connected(W(2), 0.2)
    assert roster.live(0.2) == {0, 1, 2}
    roster.lost(W(0), 0.3)
    assert roster.live(0.3) == {1, 2} and roster.dead == {0: 0.3}


def test_returns_are_workers_heard_again_and_slow_workers_now_stopped() -> None:
    roster = _roster(0, 1, 2)
    assert roster.returned(0.0) == {0, 1, 2}  # the first call: everyone is new
    assert roster.returned(0.5) == set()
    roster.absorb(membership.Beat(worker=W(0), generation=1, heartbeat=_beat(0, 1)), 1.6)
    roster.absorb(membership.Beat(worker=W(1), generation=1, heartbeat=_beat(1, 1)), 1.6)
    assert roster.returned(1.6) == set() and roster.live(1.6) == {0, 1}  # 2 went silent
    roster.absorb(membership.Beat(worker=W(2), generation=1, heartbeat=_beat(2, 1)), 1.7)
    assert roster.returned(1.7, held=[W(0)]) == {2}  # heard again
    roster.mark_slow([W(0), W(1)], 1.7)  # late for a recovery, yet alive
    assert roster.returned(1.8) == set()  # still running
    roster.absorb(
        membership.Beat(
            worker=W(0), generation=1, heartbeat=_beat(0, 1, messages.AgentState.PAUSED)
        ),
        1.9,
    )
    assert roster.returned(1.9) == {0} and roster.slow == {1}


def test_a_worker_setting_up_an_older_epoch_is_busy_until_its_heartbeat_says_it_is_over() -> None:
    configuring = messages.AgentState.CONFIGURING
    roster = _roster(0, 1, 2)
    roster.absorb(membership.Beat(worker=W(0), generation=1, heartbeat=_beat(0, 3, RUNNING)), 0.1)
    roster.absorb(
        membership.Beat(worker=W(1), generation=1, heartbeat=_beat(1, 3, configuring)), 0.1
    )
    assert roster.setting_up([W(0), W(1)], before=4) == {1}
    assert roster.setting_up([W(1)], before=3) == set()  # the epoch it sets up is not older
    # an abandoned switch's acceptor is busy before its heartbeat shows the set-up at all
    roster.absorb(membership.Beat(worker=W(2), generation=1, heartbeat=_beat(2, 0, IDLE)), 0.1)
    roster.abandon([W(2)], 3)
    assert roster.setting_up([W(2)], before=4) == {2}
    roster.absorb(
        membership.Beat(worker=W(2), generation=1, heartbeat=_beat(2, 3, configuring)), 0.2
    )
    assert roster.setting_up([W(2)], before=4) == {2}
    timed_out = _beat(2, 3, FAILED, error=messages.ErrorKind.TIMEOUT)
    roster.absorb(membership.Beat(worker=W(2), generation=1, heartbeat=timed_out), 0.3)
    assert roster.setting_up([W(2)], before=4) == set() and roster.abandoned == {}
    roster.abandon([W(1)], 3)
    roster.connected(W(1), 0.4)  # a new process: whatever it set up is gone with the old one
    assert roster.setting_up([W(1)], before=4) == set()
