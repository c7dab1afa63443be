"""Suspended: no plan for the live workers, or a layer no recovery tier holds, until workers
join or return, or an older checkpoint can be tried.

`Suspension` is everything a suspension remembers, one frozen value the controller replaces:
the checkpoint it resumes from, whether host memory already failed it, and since when a resume
waits for a stall to end or for returning workers' first heartbeats. The decisions are pure:
- `suspend`: the value of a new suspension (a failed resume from host memory, or a `retry`,
  makes the next resume use the checkpoint, and lets it be tried at once);
- `next_move`, on every pass while Suspended, answers what next and why: HEAL (every worker of
  the suspended epoch was only silent and still trains in it: Running again, in the same
  epoch), WAIT (too few workers, nothing new, a machine stall that may end by itself, no plan
  yet, a returning worker's first heartbeat still due; each wait bounded), or RESUME;
- `resume_point`: where a RESUME starts, from host-memory snapshots and live layers when every
  live worker holds a step newer than the checkpoint (`held_step`), else the checkpoint.
`Tracker` holds the value for the controller, and the last suspension's `SuspendReason` (the
Suspended condition's): `enter` suspends, `next` surveys the roster, the epoch driver and,
when its answer may matter (`asks_planner`), the planner (`survey`: on the planner's executor,
off the event loop), and answers with an `outcomes.Outcome`: CarryOn, Open the resume epoch, or
nothing yet. Opening the epoch and setting the phase are the controller's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from planaria.contract import errors
from planaria.contract import plan as plans
from planaria.control import epochs, membership, outcomes, planning
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.wire import messages

LOG = logging.getLogger(__name__)
_TRAINED = (messages.AgentState.RUNNING, messages.AgentState.FINISHED)


class Next(StrEnum):
    """What a suspended job does at this pass (module docstring)."""

    HEAL = "heal"
    WAIT = "wait"
    RESUME = "resume"


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspension:
    """What the last suspension left (module docstring); the default is "never suspended".
    `from_snapshot` and `snapshot_failed` outlive the suspension: the first says the open epoch
    resumed from host memory, the second that host memory did not hold every layer, so the next
    resume uses the checkpoint."""

    checkpoint: int | None = None  # the latest persistent checkpoint of the suspended plan
    since_s: float = 0.0  # when the job was suspended (clock seconds)
    retry: bool = False  # the checkpoint may be tried at once, without new workers
    from_snapshot: bool = False
    snapshot_failed: bool = False
    unheard_since: float | None = None  # a resume waits for returning workers' first beats
    stall_since: float | None = None  # a resume waits for a stall to end
    reached: int = 0  # the newest step any suspended plan committed: a resume below it redoes
    lost: tuple[plans.WorkerId, ...] = ()  # the suspended plan's workers not live when it ended


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """What a pass knows while Suspended: the `live` workers; of the suspended epoch's plan
    (`plan_workers`, None without a plan) those that `ran` in the epoch (RUNNING or FINISHED),
    those `training` in it (live and RUNNING), and the `silent` (not live, yet neither dead nor
    faulty); whether a live worker is `unheard` (no heartbeat yet), workers `arrived`; why the
    planner has no plan for the live workers (`infeasible`, "" when it has one) and the fewest
    workers any plan needs (`min_workers`)."""

    live: frozenset[plans.WorkerId]
    plan_workers: frozenset[plans.WorkerId] | None
    ran: frozenset[plans.WorkerId] = frozenset()
    training: frozenset[plans.WorkerId] = frozenset()
    silent: frozenset[plans.WorkerId] = frozenset()
    unheard: bool = False
    arrived: bool = False
    infeasible: str = ""
    min_workers: int = 1
    heartbeat_timeout_s: float
    step_timeout_s: float


def suspend(
    state: Suspension,
    *,
    checkpoint: int | None,
    now: float,
    retry: bool,
    reached: int = 0,
    lost: Iterable[plans.WorkerId] = (),
) -> Suspension:
    """The suspension that starts at `now` with `checkpoint` the newest persistent one.
    `retry`: host memory did not hold every layer and the checkpoint may be tried at once.
    `reached`: the newest step the suspended plan committed (kept if an earlier suspension
    reached further), `lost`: its workers not live now (the resume's record names them)."""
    again = retry and checkpoint is not None
    failed = state.snapshot_failed
    if state.from_snapshot or retry:  # host memory did not hold every layer: checkpoint
        failed = True
        again = again or state.from_snapshot
    return dataclasses.replace(
        state,
        checkpoint=checkpoint,
        since_s=now,
        retry=again,
        from_snapshot=False,
        snapshot_failed=failed,
        reached=max(state.reached, reached),
        lost=tuple(sorted(lost)),
    )


def next_move(state: Suspension, facts: Facts, now: float) -> tuple[Next, Suspension, str]:
    """What a suspended job does now, the suspension after it, and why (module docstring)."""
    if facts.plan_workers is not None and facts.plan_workers <= facts.live & facts.ran:
        why = "every worker of the suspended epoch is back and still trains in it"
        return Next.HEAL, dataclasses.replace(state, retry=False), why
    if not (facts.arrived or state.retry):
        return Next.WAIT, state, "no worker joined or returned"
    if len(facts.live) < facts.min_workers:
        return Next.WAIT, state, f"{len(facts.live)} live workers of {facts.min_workers} needed"
    stall_since, stalled = _stall(state, facts, now)
    state = dataclasses.replace(state, stall_since=stall_since)
    if stalled:
        return Next.WAIT, state, "the suspended epoch may heal by itself (a stall ending)"
    if facts.infeasible:
        return Next.WAIT, state, f"no plan for the live workers: {facts.infeasible}"
    if facts.unheard and not state.snapshot_failed:
        # A returning worker's first heartbeat says which snapshots it holds: wait for it
        # (bounded by the heartbeat timeout) before choosing where to resume from.
        since = state.unheard_since or now
        if now - since < facts.heartbeat_timeout_s:
            why = "waiting for a returning worker's first heartbeat"
            return Next.WAIT, dataclasses.replace(state, unheard_since=since), why
    resumed = dataclasses.replace(state, unheard_since=None, retry=False)
    return Next.RESUME, resumed, "enough workers for a plan"


def asks_planner(state: Suspension, *, arrived: bool, live: int, min_workers: int) -> bool:
    """Whether `next_move` may read the planner's answer at this pass (its `infeasible`, the
    resume's move): only when a worker `arrived` or a retry is due, and `live` workers are
    enough for a plan. Otherwise it waits (or heals) whatever the planner would say, so the
    search (0.16 s at 1,024 nodes of 8 GPUs here, on the planner's thread) is not made at
    every pass."""
    return (arrived or state.retry) and live >= min_workers


def _stall(state: Suspension, facts: Facts, now: float) -> tuple[float | None, bool]:
    """Since when a resume is held because the suspended epoch may heal by itself, and
    whether it still is: some of its workers are back from a silence while others are still
    silent but not dead (a machine stall ends worker by worker), or a worker still trains in it
    (it would refuse the resume epoch; its group either heals or fails within a step timeout).
    Held at most a heartbeat timeout plus a step timeout from the first such pass."""
    if facts.plan_workers is None:
        return state.stall_since, False
    back = facts.plan_workers & facts.live
    if not (facts.silent and back) and not facts.training:
        return None, False
    since = state.stall_since or now
    return since, now - since < facts.heartbeat_timeout_s + facts.step_timeout_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume:
    """Where a resume starts: after `step`, from host memory or the checkpoint."""

    step: int
    from_memory: bool


def resume_point(state: Suspension, held: int | None) -> tuple[Resume, Suspension]:
    """Where to resume, given the step every live worker `held` (`held_step`), and the
    suspension after it: host memory when it holds a step newer than the checkpoint and did
    not already fail, else the checkpoint (step 0 without one)."""
    checkpoint = state.checkpoint or 0
    if state.snapshot_failed:
        held = None
    from_memory = held is not None and held > checkpoint
    step = held if from_memory and held is not None else checkpoint
    # Host memory is tried only when it had not failed, so after any resume a later
    # suspension may use it again.
    after = dataclasses.replace(state, from_snapshot=from_memory, snapshot_failed=False)
    return Resume(step=step, from_memory=from_memory), after


def held_step(
    beats: Mapping[plans.WorkerId, messages.Heartbeat], live: Iterable[plans.WorkerId]
) -> int | None:
    """The newest step every live worker can restore without the checkpoint: a worker
    holding layers has its committed step and, in its snapshots, the one before; a returning
    worker its latest complete host-memory snapshot and the one before. None when they are
    more than one step apart or one has nothing (the agents' tiers then decide per layer
    whether the snapshots cover every layer; if not, the next resume uses the checkpoint)."""
    steps = []
    for worker in live:
        beat = beats.get(worker)
        if beat is None:
            return None
        held = beat.last_committed_step or beat.snapshot.latest_step
        if not held:
            return None
        steps.append(held)
    if not steps or max(steps) - min(steps) > 1:
        return None
    return min(steps)


async def survey(
    roster: membership.Roster,
    driver: epochs.Driver,
    planner: planning.Planner,
    job: job_settings.JobSettings,
    *,
    now: float,
    arrived: bool,
    ask: bool = True,
) -> tuple[Facts, planning.Move | None]:
    """This pass's `Facts`, and the planner's resume move over the live workers (None when
    it has none, or when not to `ask`: `asks_planner`), searched on the planner's executor,
    off the event loop (`Planner.call`)."""
    move, infeasible = None, ""
    try:
        if ask:
            move = await planner.call(planner.best, roster.live(now), statuses.MoveKind.RESUME)
    except errors.PlannerError as exc:
        infeasible = str(exc)
    need = planner.min_workers
    found = facts(
        roster, driver, now, job, arrived=arrived, infeasible=infeasible, min_workers=need
    )
    return found, move


def facts(
    roster: membership.Roster,
    driver: epochs.Driver,
    now: float,
    job: job_settings.JobSettings,
    *,
    arrived: bool,
    infeasible: str,
    min_workers: int,
) -> Facts:
    """The `Facts` of this pass (`job` gives the timeouts)."""
    live = frozenset(roster.live(now))
    known = Facts(
        live=live,
        plan_workers=None,
        unheard=any(w not in roster.beats for w in live),
        arrived=arrived,
        infeasible=infeasible,
        min_workers=min_workers,
        heartbeat_timeout_s=job.heartbeat_timeout_s,
        step_timeout_s=job.step_timeout_s,
    )
    running, epoch = driver.plan, driver.epoch
    if running is None:
        return known
    workers = frozenset(running.workers)
    beats = {w: b for w in workers if (b := roster.beat(w, epoch)) is not None and b.epoch == epoch}
    return dataclasses.replace(
        known,
        plan_workers=workers,
        ran=frozenset(w for w, b in beats.items() if b.state in _TRAINED),
        training=frozenset(
            w for w, b in beats.items() if w in live and b.state is messages.AgentState.RUNNING
        ),
        silent=frozenset(
            w for w in workers - live if w not in roster.dead and w not in roster.faulty
        ),
    )


def message(what: str, checkpoint: int | None, *, need: int, live: int) -> str:
    """The status message of a suspension: what is lost and what would resume it."""
    where = (
        f"the latest persistent checkpoint is step {checkpoint}"
        if checkpoint is not None
        else "there is no persistent checkpoint, so training resumes from the host-memory "
        "snapshot every returning worker holds, else from step 0"
    )
    return (
        f"suspended: {what}; {where}; it resumes from there once {need} workers are live "
        f"({live} now): start or return workers"
    )


def resumed(state: Suspension, resume: Resume, *, epoch: int, reason: str) -> statuses.Recovery:
    """The recovery record of a resume into `epoch` (`reason`: the planner's)."""
    where = "host-memory snapshots and live layers" if resume.from_memory else "checkpoint"
    tiers = messages.RecoveryTier
    return statuses.Recovery(
        started_s=state.since_s,
        failed=state.lost,
        epoch=epoch,
        tier=tiers.LOCAL_SNAPSHOT if resume.from_memory else tiers.CHECKPOINT,
        kind=statuses.MoveKind.RESUME,
        reason=f"resumed from {where} at step {resume.step}: {reason}",
        lost_steps=max(0, state.reached - resume.step),
    )


class Tracker:
    """The job's `Suspension`, and what the pass does about it (module docstring)."""

    def __init__(self, job: job_settings.JobSettings, roster: membership.Roster) -> None:
        self._job = job
        self._roster = roster
        self.state = Suspension()
        self.reason = statuses.SuspendReason.NO_FEASIBLE_PLAN  # the last suspension's condition

    def enter(self, why: outcomes.Suspend, *, now: float, need: int) -> str:
        """Suspend the job as `why` says at `now` (`need`: the fewest workers any plan needs);
        the status message."""
        self.reason = why.reason
        roster, workers = self._roster, why.running.workers
        checkpoint = roster.checkpoint_step(workers)
        beats = [b for w in workers if (b := roster.beats.get(w)) is not None]
        reached = max((b.last_committed_step for b in beats), default=0)
        alive = roster.live(now)
        self.state = suspend(
            self.state,
            checkpoint=checkpoint,
            now=now,
            retry=why.retry,
            reached=reached,
            lost=(w for w in workers if w not in alive),
        )
        live = len(alive)
        return message(why.what, checkpoint, need=need, live=live)

    async def next(
        self, driver: epochs.Driver, planner: planning.Planner, *, now: float, arrived: bool
    ) -> outcomes.Outcome:
        """What the suspended job does at this pass (`next_move`); `arrived`: workers joined
        or returned since the last try (the caller forgets them unless the outcome is None)."""
        roster, need = self._roster, planner.min_workers
        ask = asks_planner(
            self.state, arrived=arrived, live=len(roster.live(now)), min_workers=need
        )
        found, move = await survey(
            roster, driver, planner, self._job, now=now, arrived=arrived, ask=ask
        )
        verdict, self.state, why = next_move(self.state, found, now)
        if verdict is Next.HEAL:
            return outcomes.CarryOn()
        if verdict is Next.WAIT or move is None:
            LOG.debug("still suspended: %s", why)
            return None
        held = held_step(roster.beats, found.live)
        start, self.state = resume_point(self.state, held)
        record = resumed(self.state, start, epoch=driver.next_epoch, reason=move.reason)
        return outcomes.Open(move=move, resume_step=start.step, record=record)
