"""Recovery from a broken epoch: settle, assess, decide, and the step training resumes after.

A death (broken Watch, DIED event, silence past the heartbeat timeout, an agent's own latched
error) or a peer-lost failure breaks the running epoch. `Handler.recover` then
- fails the job at once on an error of the job's own (`membership.PERMANENT`: the settings, plan
  or data cannot be used), without waiting for the others to settle;
- waits (bounded by a step and a heartbeat timeout, or by a Configure and a step timeout while
  one still sets the epoch up) until the epoch's other workers settle, and reads the epoch
  (`failures.assess`): the failed, the survivors, their oldest step;
- when no worker survived but live ones latched errors of their own (INTERNAL, OUT_OF_MEMORY),
  takes those as the survivors, OWN_ERROR_RETRIES times from one step, then fails the job;
- asks the planner per the job's policy (`decide`, pure), with Oobleck's fresh instantiation
  over the survivors as the last resort, offering it the live spares but those still setting
  up an older epoch (their Configure would wait behind that set-up; a scale-up takes them
  later), unless no plan fits without them (then it waits, bounded, for that set-up to end);
- finds the resume step (`resume_step`, pure): the survivors' oldest committed step, or, when
  a layer has no live replica or some survivor is a step ahead (a death inside the commit
  barrier), the newest snapshot every survivor reports holding complete (its heartbeat's
  `held` list); without one, the persistent checkpoint, else step 0 (the job's seed rebuilds
  it exactly);
- when a survivor latched SNAPSHOT_UNAVAILABLE (the restore of the epoch's resume step failed),
  takes the next option the same way, below that step, instead of suspending (a resume from
  Suspended that fails is the suspension's to redo: its checkpoint, else step 0).
It answers with an `outcomes.Outcome` that the controller carries out: open the next epoch,
suspend, fail, or succeed (the survivors already committed the job's last step). It never opens an
epoch itself. A missed planned switch recovers from the plan the workers still hold.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection

from planaria.contract import errors, snapshot_placement
from planaria.contract import plan as plans
from planaria.control import epochs, failures, history, membership, outcomes, planning, ports
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.planner import policy
from planaria.wire import messages

LOG = logging.getLogger(__name__)
DEFAULT_TIME_TO_FAILURE_S = 3600.0  # eq. 8's T_next before any failure is seen, without mtbf_s
# An epoch no worker survived, whose live workers latched errors of their own (INTERNAL,
# OUT_OF_MEMORY), is retried with them this often from one step before the job fails: a
# transient fault (a device reset, memory another process held) passes, a deterministic one
# comes back.
OWN_ERROR_RETRIES = 1
# How long, in heartbeat intervals, the other workers of an epoch broken by one silence are
# given to fall silent too (a stalled machine) before the epoch is flagged failed.
STALL_GRACE_INTERVALS = 3
_CLOCK_SLACK_S = 1e-3  # a deadline this close is reached (a shorter wait may not advance a clock)
_STATE_LOST = statuses.SuspendReason.STATE_LOST  # no host-memory tier serves: a checkpoint next


class Handler:
    """Recovers one job's broken epochs (module docstring); counts its failures for Odyssey
    eq. 8 and its own-error retries."""

    def __init__(
        self,
        job: job_settings.JobSettings,
        clock: ports.Clock,
        roster: membership.Roster,
        driver: epochs.Driver,
        record: history.History,
    ) -> None:
        self._job = job
        self._clock = clock
        self._roster = roster
        self._epochs = driver
        self._history = record
        self._started_at = clock.monotonic()
        self._failures = 0
        self._retries = (0, 0)  # own-error retries: (the step they resume from, how many)

    def time_to_failure(self) -> float:
        """Odyssey eq. 8's expected time to the next failure (the job's, else observed)."""
        observed = self._clock.monotonic() - self._started_at
        if self._job.mtbf_s is None and (self._failures == 0 or observed <= 0):
            return DEFAULT_TIME_TO_FAILURE_S
        return policy.time_to_failure_s(
            mtbf_s=self._job.mtbf_s, num_failures=self._failures, observed_s=observed
        )

    async def recover(
        self, planner: planning.Planner, announce: Callable[[str], Awaitable[None]]
    ) -> outcomes.Outcome:
        """What to do about the broken running epoch (module docstring); `announce` tells
        the status that the controller waits for the workers to stop."""
        assert self._epochs.plan is not None, "a broken epoch has a plan"
        running, epoch, noticed = self._epochs.plan, self._epochs.epoch, self._clock.monotonic()
        if not await self._stalled(running, epoch):
            self._epochs.abandon()  # the survivors stop at once, whatever they wait for
        fatal = failures.job_error(self._roster, running.workers, epoch, membership.PERMANENT)
        if fatal is not None:  # the job's own error: no plan avoids it, so no need to settle
            return outcomes.Fail(error=fatal)
        missed = self._epochs.switch_missed()
        if missed:  # recover from the plan the workers still hold
            switched = set(running.workers)
            running = self._epochs.fall_back()
            # the switch's record goes; a recovery it had merged resumed in the old epoch
            self._history.give_up_switch(noticed)
            # a scale-up's newcomers (a first set-up of theirs failed) are spares again
            self._roster.arrive_again(switched - set(running.workers))
        await announce("a worker failed; waiting for the others to stop")
        late = await self._settle(running, epoch)
        now = self._clock.monotonic()
        opened_at = self._epochs.resume_step
        found = failures.assess(self._roster, running, epoch, late, now, opened_at=opened_at)
        self._roster.mark_slow(late, now)
        if not found.survivors:
            retry = self._retried(running, epoch, found)
            if not isinstance(retry, failures.Assessment):
                return retry
            found = retry
        failed_restore = None
        if found.state_lost and not missed:  # (a missed switch's setups latch it, short of it)
            if self._epochs.kind is statuses.MoveKind.RESUME:  # the suspension's own fallback
                lost = "a layer's state is in no recovery tier (replica, snapshot or checkpoint)"
                return outcomes.Suspend(running=running, what=lost, reason=_STATE_LOST, retry=True)
            # The restore of the epoch's resume step failed: the next option is older.
            failed_restore = self._epochs.resume_step
        elif found.survivors and found.resume_step >= self._job.steps:
            return outcomes.Succeed()
        return await self._next_epoch(
            planner, running, found, noticed, now, stopped=now - noticed, below=failed_restore
        )

    async def _next_epoch(
        self,
        planner: planning.Planner,
        running: plans.Plan,
        found: failures.Assessment,
        noticed: float,
        now: float,
        *,
        stopped: float,
        below: int | None = None,
    ) -> outcomes.Outcome:
        """The planner's move and its resume step for `found`, as an `Open` (or a Suspend);
        `below`: a resume step whose restore failed (SNAPSHOT_UNAVAILABLE), so the resume is
        an older one. The decision runs on the planner's executor, off the event loop."""
        move = await self._choose(planner, running, found, now)
        if isinstance(move, outcomes.Suspend):
            return move
        restored = self._restore(running, found, move, below)
        if isinstance(restored, outcomes.Suspend):
            return restored
        resume, why = restored
        if why:
            move = dataclasses.replace(move, reason=f"{move.reason}; {why}")
        if resume < found.resume_step:  # rolled back to a snapshot: live copies are too new
            move = dataclasses.replace(move, transfers=())
        self._failures += 1 if found.failed else 0
        record = statuses.Recovery(
            started_s=found.death_at,
            failed=tuple(sorted(found.failed)),
            epoch=self._epochs.next_epoch,
            tier=messages.RecoveryTier.KEPT,
            kind=move.kind,
            reason=move.reason,
            detect_s=max(0.0, noticed - found.death_at),
            stop_s=stopped,
            plan_s=self._clock.monotonic() - now,
            lost_steps=found.newest_step - resume,
        )
        return outcomes.Open(move=move, resume_step=resume, record=record)

    async def _choose(
        self, planner: planning.Planner, running: plans.Plan, found: failures.Assessment, now: float
    ) -> planning.Move | outcomes.Suspend:
        """`decide` over the live workers, less the spares still setting up an older epoch
        (`membership.Roster.setting_up`): an agent takes a Configure up only once its set-up
        under way ends, at its rendezvous timeout when its peers never come, so the new
        epoch's rendezvous would time out waiting for it. They arrive again, for a scale-up
        once that set-up is over. Only when no plan fits without them does the recovery wait
        (bounded) for their set-up to end and plan with them: better than a suspension."""
        live = self._roster.live(now)
        spares = live - set(running.workers)
        busy = self._roster.setting_up(spares, before=self._epochs.next_epoch)
        move = await self._decided(planner, running, found, live - busy, now)
        if busy and isinstance(move, outcomes.Suspend):
            LOG.warning("no plan without spares %s; waiting for their set-up to end", sorted(busy))
            await self._set_up_over(busy)
            now = self._clock.monotonic()
            return await self._decided(planner, running, found, self._roster.live(now), now)
        if busy:
            LOG.info("spares %s still set up an older epoch: left to a scale-up", sorted(busy))
            self._roster.arrive_again(busy)
        return move

    async def _set_up_over(self, busy: set[plans.WorkerId]) -> None:
        """Wait until none of `busy` still sets an older epoch up, at most as long as an
        epoch's commit gives a set-up (a Configure and a step timeout)."""
        timeout_s = self._job.configure_timeout_s + self._job.step_timeout_s
        deadline = self._clock.monotonic() + timeout_s
        while self._roster.setting_up(busy, before=self._epochs.next_epoch):
            now = self._clock.monotonic()
            if now >= deadline - _CLOCK_SLACK_S:
                return
            await self._epochs.next(min(self._job.heartbeat_interval_s, deadline - now))

    async def _decided(
        self,
        planner: planning.Planner,
        running: plans.Plan,
        found: failures.Assessment,
        live: set[plans.WorkerId],
        now: float,
    ) -> planning.Move | outcomes.Suspend:
        """`decide` over `live`, on the planner's executor."""
        return await planner.call(
            decide,
            planner,
            running,
            found,
            live=live,
            own_faults=bool(self._roster.own_faults(running.workers, self._epochs.epoch)),
            policy_name=self._job.policy,
            time_to_failure_s=self.time_to_failure(),
            steps_left=self._job.steps - found.resume_step,
            lost=failures.without_survivors(self._roster, found.failed, now),
        )

    def _restore(
        self,
        running: plans.Plan,
        found: failures.Assessment,
        move: planning.Move,
        below: int | None,
    ) -> tuple[int, str] | outcomes.Suspend:
        """The resume step for `move` and why, when it is not the survivors' step ("" when it
        is, or when it is the snapshot a lost layer needs), or the Suspend that says why the
        snapshot tier cannot serve: its newest snapshot every survivor holds when the resume
        rolls back (`rolls_back`), else the persistent checkpoint (a Suspend that resumes from
        it at once), else step 0 (`earlier_tier`)."""
        snapshot, ceiling = None, restore_ceiling(found, below)
        if rolls_back(found, move, below):
            if move.needs_snapshot:
                redundancy = self._job.training.redundancy
                beyond = beyond_redundancy(running, found.failed, redundancy)
                if beyond:  # the snapshot tier cannot serve: say so, the checkpoint is next
                    what = beyond_message(beyond, redundancy)
                    return outcomes.Suspend(
                        running=running, what=what, reason=_STATE_LOST, retry=True
                    )
            snapshot = self._roster.snapshot_step(found.survivors, at_most=ceiling)
            conflicts = {}
            if snapshot is not None:
                conflicts = self._roster.digest_conflicts(found.survivors, snapshot)
            if conflicts:  # two copies of a member differ: the snapshot is not trusted
                what = conflict_message(snapshot, conflicts)
                conflict = statuses.SuspendReason.SNAPSHOT_CONFLICT
                return outcomes.Suspend(running=running, what=what, reason=conflict, retry=True)
        resume = resume_step(found, move, snapshot, below=below)
        if resume is not None:
            return resume, rolled_back(found, move, resume, below)
        earlier = earlier_tier(ceiling, self._roster.checkpoint_step(running.workers))
        if isinstance(earlier, str):  # the suspension resumes from the checkpoint at once
            return outcomes.Suspend(running=running, what=earlier, reason=_STATE_LOST, retry=True)
        LOG.warning("recovery after epoch %d: %s", self._epochs.epoch, earlier[1])
        return earlier

    async def _stalled(self, running: plans.Plan, epoch: int) -> bool:
        """Whether the epoch broke only because every worker of it went silent (a stalled
        machine, or this controller's own pause): none is dead, faulty or failed. Silences
        begin up to a heartbeat interval apart, so the others are given STALL_GRACE_INTERVALS
        to fall silent too. Such an epoch is not flagged failed: no worker waits to be
        released, and when they all go on it heals (`suspension`, HEAL); when some never
        come back, the others' waits end by the epoch's own timeout. Flagged, the epoch broke
        as soon as they went on, and the job regrouped (chaos `stall`, data and pipeline)."""
        workers = set(running.workers)
        deadline = self._clock.monotonic() + STALL_GRACE_INTERVALS * self._job.heartbeat_interval_s
        while True:
            now = self._clock.monotonic()
            broken = set(self._roster.dead) | self._roster.faulty
            if workers & broken or self._roster.failed_in(workers, epoch):
                return False
            if all(self._roster.silent(w, now) for w in workers):
                return True
            if now >= deadline - _CLOCK_SLACK_S:
                return False
            await self._epochs.next(min(self._job.heartbeat_interval_s, deadline - now))

    async def _settle(self, running: plans.Plan, epoch: int) -> set[plans.WorkerId]:
        """Wait until the epoch's live workers all stopped, at most a step timeout and a
        heartbeat timeout, or, while one still sets the epoch up, as long as the epoch's
        commit gives a set-up (a Configure and a step timeout): an agent notices a lost peer
        only once its set-up ends, and a cold one on a loaded machine takes seconds. Once one
        was seen setting up, the longer bound stays: a worker just out of its set-up shows
        RUNNING for a heartbeat or two before its failed step. The ones still not stopped
        then."""
        started = self._clock.monotonic()
        deadline = started + self._job.step_timeout_s + self._job.heartbeat_timeout_s
        setting_up = started + self._job.configure_timeout_s + self._job.step_timeout_s
        while True:
            now = self._clock.monotonic()
            waiting = failures.unsettled(self._roster, running, epoch, now)
            if failures.setting_up(self._roster, waiting, epoch):
                deadline = max(deadline, setting_up)
            if not waiting or now >= deadline:
                return waiting
            await self._epochs.next(min(self._job.heartbeat_interval_s, deadline - now))

    def _retried(
        self, running: plans.Plan, epoch: int, found: failures.Assessment
    ) -> failures.Assessment | outcomes.Fail:
        """No worker of `epoch` survived: when the live ones latched errors of their own (none
        permanent), they survive it instead and try again (`failures.retried`), at most
        OWN_ERROR_RETRIES times from one step; past that the job fails with their error.
        `found` itself when none of them is live."""
        live = self._roster.live(self._clock.monotonic())
        own = self._roster.own_faults(running.workers, epoch) & live
        if not own:
            return found
        retry = failures.retried(self._roster, found, own, epoch)
        step, tries = self._retries
        tries = tries + 1 if step == retry.resume_step else 1
        self._retries = (retry.resume_step, tries)
        error = failures.job_error(self._roster, own, epoch, membership.OWN_FAULTS)
        assert error is not None, "a worker with an own fault latched an error of its own"
        if tries > OWN_ERROR_RETRIES:
            tried = "1 retry" if OWN_ERROR_RETRIES == 1 else f"{OWN_ERROR_RETRIES} retries"
            again = f"after {tried} from step {retry.resume_step}"
            return outcomes.Fail(
                error=dataclasses.replace(error, message=f"{error.message} ({again})")
            )
        LOG.warning(
            "no worker survived epoch %d, each latched an error of its own; they try again from "
            "step %d (%d of %d): %s",
            epoch,
            retry.resume_step,
            tries,
            OWN_ERROR_RETRIES,
            error.message,
        )
        return retry


def decide(
    planner: planning.Planner,
    running: plans.Plan,
    found: failures.Assessment,
    *,
    live: set[plans.WorkerId],
    own_faults: bool,
    policy_name: str,
    time_to_failure_s: float,
    steps_left: int,
    lost: str,
) -> planning.Move | outcomes.Suspend:
    """The move after `found` (the planner is pure): the same plan when every worker is alive
    (`own_faults`: some latched an error of its own), the job's policy's plan, else the
    templates anew over the survivors; Suspend, saying `lost` or why, when there is none."""
    if not found.survivors:
        none = statuses.SuspendReason.WORKERS_LOST
        return outcomes.Suspend(running=running, what=lost, reason=none, retry=False)
    if not found.failed:  # all alive, yet the group broke: the same plan regroups
        reason = "every worker is alive but the epoch's group broke; the same plan regroups"
        if own_faults:
            reason = "every worker latched an error of its own; the same plan tries again"
        return planning.Move(
            plan=running, transfers=(), kind=statuses.MoveKind.RESTART, reason=reason
        )
    spare = live - set(running.workers)
    try:
        return planner.recover(running, found.failed, spare, time_to_failure_s, max(1, steps_left))
    except errors.InfeasibleError as exc:
        refused = f"the {policy_name} policy has no plan ({exc})"
    try:  # Oobleck's last resort: instantiate the templates anew over the survivors
        move = planner.grow(running, live & (found.survivors | spare))
    except errors.PlannerError as exc:
        what = f"no plan for the {len(found.survivors)} surviving workers: {exc}"
        infeasible = statuses.SuspendReason.NO_FEASIBLE_PLAN
        return outcomes.Suspend(running=running, what=what, reason=infeasible, retry=False)
    restart = statuses.MoveKind.RESTART
    return dataclasses.replace(move, kind=restart, reason=f"{refused}; {move.reason}")


def beyond_redundancy(
    running: plans.Plan, failed: Collection[plans.WorkerId], redundancy: messages.RedundancyMode
) -> dict[int, tuple[plans.WorkerId, ...]]:
    """Layer -> the failed workers behind its lost snapshot members, for every layer of
    `running` whose snapshot the survivors cannot rebuild: more members of its sharding group
    (REFT §4.2) lost than `redundancy` tolerates (one with COPY, XOR or RECOMPUTE in a group of
    two or more, none otherwise, as the agents' `snapshots.tolerated_losses`), where a member
    is lost only when its holder and its mirror on another node are both lost
    (`snapshot_placement`). A lost worker's store is gone with it (issue #20): only the
    checkpoint holds such a layer."""
    protected = redundancy is not messages.RedundancyMode.NONE
    beyond = snapshot_placement.beyond_redundancy(running, failed, protected=protected)
    return {
        layer: snapshot_placement.member_workers(running, {layer: members}, protected=protected)
        for layer, members in beyond.items()
    }


def beyond_message(
    beyond: dict[int, tuple[plans.WorkerId, ...]], redundancy: messages.RedundancyMode
) -> str:
    """The status message for `beyond_redundancy`'s answer, plainly."""
    layers = sorted(beyond)
    workers = sorted({w for lost in beyond.values() for w in lost})
    return (
        f"layers {layers} lost their snapshot members on workers {workers}, more than "
        f"redundancy {redundancy.value!r} recovers; the persistent checkpoint is the next tier"
    )


def conflict_message(
    step: int | None, conflicts: dict[tuple[int, int], dict[str, tuple[plans.WorkerId, ...]]]
) -> str:
    """The status message for `membership.Roster.digest_conflicts`' answer, plainly."""
    (layer, member), digests = next(iter(conflicts.items()))
    sides = " and ".join(f"{d} on workers {list(ws)}" for d, ws in digests.items())
    more = f" (and {len(conflicts) - 1} more members)" if len(conflicts) > 1 else ""
    return (
        f"the snapshot of step {step} disagrees: layer {layer} member {member} has {sides}{more}; "
        "it is not resumed from, the persistent checkpoint is the next tier"
    )


def rolls_back(found: failures.Assessment, move: planning.Move, below: int | None) -> bool:
    """Whether the resume needs host-memory snapshots: a layer of `move` has no live replica;
    some survivor is ahead of the others (a death inside the commit barrier: it holds no layer
    at their step and rebuilds its layers from the snapshot tiers, which need not hold that
    step: its snapshot of it may have failed, been skipped or not be due); or the restore of
    step `below` failed already."""
    return move.needs_snapshot or found.newest_step > found.resume_step or below is not None


def restore_ceiling(found: failures.Assessment, below: int | None) -> int:
    """The newest step a roll-back may resume at: the survivors' oldest committed step, and
    older than `below`, a resume step whose restore failed."""
    return found.resume_step if below is None else min(found.resume_step, below - 1)


def resume_step(
    found: failures.Assessment,
    move: planning.Move,
    snapshot: int | None,
    *,
    below: int | None = None,
) -> int | None:
    """The step the next epoch resumes after: the survivors' oldest committed step when every
    layer is held there (`rolls_back` is false), else `snapshot`: the newest step every
    survivor reports holding complete (`membership.Roster.snapshot_step`, from the
    heartbeats' `held` lists), at or before `restore_ceiling`; None when there is none.

    Nothing is inferred about the dead: their stores are never read (a peer's pieces travel
    only from live workers, `planaria.agent.recovery.snapshot_exchange`), so a member whose
    snapshot is gone or half written with it counts as lost, which the group's redundancy
    covers or the agents' next tier (the checkpoint) does. Nor is a survivor ahead assumed to
    hold the step before its own: only what it reports held counts."""
    if not rolls_back(found, move, below):
        return found.resume_step
    if snapshot is None or snapshot > restore_ceiling(found, below):
        return None
    return snapshot


def rolled_back(
    found: failures.Assessment, move: planning.Move, resume: int, below: int | None
) -> str:
    """Why the resume goes back to the snapshot of `resume` although every layer has a live
    replica ("" when it does not, or when a lost layer needs a snapshot anyway)."""
    if below is not None:
        return f"the restore of step {below} failed: resumed from the older snapshot of {resume}"
    if resume < found.resume_step and not move.needs_snapshot:
        return (
            f"a survivor ahead of step {found.resume_step} holds no snapshot of it: resumed from "
            f"the snapshot of step {resume}, the newest every survivor holds"
        )
    return ""


def earlier_tier(ceiling: int, checkpoint: int | None) -> str | tuple[int, str]:
    """Where a roll-back to at most step `ceiling` goes when no host-memory snapshot every
    survivor holds serves it: to the persistent `checkpoint` when there is one at or before
    `ceiling` (the status message of the suspension that resumes from it at once), else to
    step 0, which the job's seed rebuilds exactly (the step and why)."""
    nothing = f"no host-memory snapshot at or before step {ceiling} is held by every survivor"
    if checkpoint is not None and checkpoint <= ceiling:
        return f"{nothing}; the persistent checkpoint of step {checkpoint} is the next tier"
    none = "no persistent checkpoint" if checkpoint is None else "no older persistent checkpoint"
    return 0, f"{nothing} and there is {none}: training restarts from step 0 (the job's seed)"
