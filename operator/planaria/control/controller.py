"""The controller: one job's state machine, pure asyncio, the world behind `ports`.

    Pending -> (Profiling) -> Running <-> Recovering -> Succeeded
                                 |  ^
                                 v  |  (enough workers again)
                              Suspended                 Failed: a permanent error

Every pass takes what arrived on one queue (`connections`: heartbeats from one Watch task per
agent, broken streams, backend events), looks at the epoch, acts, and publishes the status
(`status.compute`). Acting (docs/controller.md; the agents' protocol in the interfaces):
- a death (broken Watch, DIED event, silence past the heartbeat timeout, an agent's own latched
  error) or a peer-lost failure: wait (bounded) until the epoch's other workers settle, resume
  at the survivors' oldest committed step (`failures`), ask the planner per the job's policy
  (`planning`), Configure a new epoch, wait (bounded) until every worker runs in it;
- a preemption notice: the same move planned ahead, switching at a future step boundary;
- a JOINED worker, or one heard again after a silence that the plan left out: a planned
  scale-up to the templates' best plan over the live workers; a planned switch that reaches
  agents already past its step (a stale view of the step on a loaded machine) is given up and
  tried again with a longer lead, without blaming them;
- a suspended epoch whose workers were only silent (a stalled machine) and still train in it:
  Running again, in the same epoch;
- no plan for the survivors, or a layer no recovery tier holds: Suspended, until workers join
  or an older checkpoint can be resumed;
- an error of the job's own latched by any worker (`membership.PERMANENT`: the settings, plan
  or data cannot be used): Failed at once with the agent's message, without waiting for the
  others to settle; errors of a worker's own (INTERNAL, OUT_OF_MEMORY) that leave no survivor:
  the live workers that latched them survive instead and try again from their committed step,
  OWN_ERROR_RETRIES times from one step, then Failed with the message.
Every wait is bounded by the job's timeouts, so a second failure during a recovery, an agent
that never answers, or one that hangs leads to a new epoch, never a hang.

Adoption (an operator restarted mid-job): given the `ports.EpochRecord` its predecessor
journalled last, the controller connects to the running agents, takes the recorded epoch over
without a Configure (no step is lost when every worker still runs in it) and waits, bounded
like any new epoch, until every worker of the plan runs in it; a worker that failed meanwhile
makes the epoch broken and the usual recovery follows. When live workers do not train in the
recorded epoch, the old controller died while opening it: unless it was a planned switch, the
same plan, copies and resume step are opened again as the next epoch, on this controller's
store. Agents in an epoch newer than the record (its write failed three
times) run a plan the successor does not know: the job is Suspended, saying so. A
`ports.Journal` records every epoch before its Configures go out, and `detach` lets the
predecessor go without stopping anything.

Errors: `run` returns the final status; a permanent error (the profile or the first plan does
not fit the job, an agent's error above) ends in phase Failed with its message, and the status'
Failed condition gives its reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterable

from planaria.control import connections, epochs, failures, history, membership, planning, ports
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.planner import errors, policy, profile
from planaria.planner import plan as plans
from planaria.wire import messages

LOG = logging.getLogger(__name__)
# A planned switch is announced this long before its step (in steps, at least MIN_LEAD_STEPS),
# so every agent is still before it when the Configure arrives.
PLANNED_LEAD_S = 1.0
MIN_LEAD_STEPS = 2
MAX_LEAD_SCALE = 8
DEFAULT_TIME_TO_FAILURE_S = 3600.0  # eq. 8's T_next before any failure is seen, without mtbf_s
PROFILE_REPEATS = 3
JOURNAL_ATTEMPTS = 3  # a journal write is retried this often before the epoch opens anyway
JOURNAL_RETRY_S = 0.2
# An epoch no worker survived, whose live workers latched errors of their own (INTERNAL,
# OUT_OF_MEMORY), is retried with them this often from one step before the job fails: a
# transient fault (a device reset, memory another process held) passes, a deterministic one
# comes back.
OWN_ERROR_RETRIES = 1
Unbounded = connections.Unbounded


class Controller:
    """Drives one job to Succeeded or Failed (module docstring)."""

    def __init__(
        self,
        settings: job_settings.JobSettings,
        backend: ports.Backend,
        *,
        clock: ports.Clock,
        sink: ports.StatusSink | None = None,
        journal: ports.Journal | None = None,
        adopt: ports.EpochRecord | None = None,
    ) -> None:
        self._job = settings
        self._backend = backend
        self._clock = clock
        self._sink = sink
        self._journal = journal
        self._adopt = adopt
        self._detached = False
        self._roster = membership.Roster(heartbeat_timeout_s=settings.heartbeat_timeout_s)
        self._lines = connections.Connections(
            backend,
            clock,
            self._roster,
            interval_s=settings.heartbeat_interval_s,
            timeout_s=settings.configure_timeout_s,
        )
        self._history = history.History(global_batch=settings.training.global_batch_size)
        self._epochs = epochs.Driver(
            settings,
            store=backend.store,
            clock=clock,
            roster=self._roster,
            lines=self._lines,
            record=self._history,
        )
        self._planner: planning.Planner | None = None
        self._phase = statuses.Phase.PENDING
        self._message = "starting workers"
        self._reason = ""  # the Failed condition's reason, once the job failed
        self._retries = (0, 0)  # own-error retries: (the step they resume from, how many)
        self._started_at = clock.monotonic()
        self._failures = 0
        self._arrivals: set[plans.WorkerId] = set()
        self._checkpoint: int | None = None
        self._suspended_at = 0.0
        self._retry = False
        self._from_snapshot = False  # the open epoch resumed a suspension from host memory
        self._snapshot_failed = False  # ... and failed: the next resume uses the checkpoint
        self._unheard_since: float | None = None  # a resume waits for returning workers' beats
        self._was_live: set[plans.WorkerId] = set()  # live at the previous pass
        # Live workers a recovery counted failed only because they had not stopped in time
        # (a set-up still blocked on the epoch before, on a loaded machine): arrivals once
        # their heartbeat shows them stopped.
        self._slow: set[plans.WorkerId] = set()
        self._lead_scale = 1  # doubles after a planned switch that came too late
        self._stall_since: float | None = None  # a resume waits for a stall to end

    # -- the public face -------------------------------------------------------------------

    @property
    def status(self) -> statuses.JobStatus:
        return statuses.compute(self._view())

    @property
    def steps(self) -> tuple[statuses.StepRecord, ...]:
        return tuple(self._history.steps)

    @property
    def recoveries(self) -> tuple[statuses.Recovery, ...]:
        return tuple(self._history.recoveries)

    @property
    def epoch(self) -> int:
        """The epoch of the current plan (0 before the first; an abandoned planned switch
        leaves the one before it)."""
        return self._epochs.epoch

    @property
    def plan(self) -> plans.Plan | None:
        """The current plan (None before the first epoch)."""
        return self._epochs.plan

    @property
    def planner_profile(self) -> profile.Profile | None:
        """The profile the planner uses (None until measured or given)."""
        return None if self._planner is None else self._planner.source

    async def run(self) -> statuses.JobStatus:
        """Run the job until Succeeded or Failed and return the final status."""
        try:
            await self._lines.start(plans.WorkerId(w) for w in range(self._job.workers))
            await self._publish()
            if self._adopt is not None:
                self._planner = planning.Planner(self._adopt.profile, self._job)
                await self._take_over(self._adopt)
            else:
                self._planner = planning.Planner(await self._profiled(), self._job)
                await self._hear_everyone()  # profiling may outlast the heartbeat timeout
                live = self._roster.live(self._clock.monotonic())
                await self._open(self._planner.best(live, "initial"), 0)
            while self._phase not in (statuses.Phase.SUCCEEDED, statuses.Phase.FAILED):
                await self._pass()
        except (errors.PlannerError, ValueError, Unbounded) as exc:
            self._fail(failures.JobError(reason=_reason(exc), message=str(exc)))
        finally:
            if self._detached:
                await self._lines.release()
            else:
                live = self._roster.live(self._clock.monotonic())
                await self._lines.close(live, self._job.heartbeat_timeout_s)
                await self._publish()
        return self.status

    def detach(self) -> None:
        """Leave the job running when `run` is cancelled next: the agents train on and the
        backend's workers stay (an operator shutting down or losing its leadership: a
        successor adopts the job from the journal)."""
        self._detached = True

    async def _profiled(self) -> profile.Profile:
        if self._job.profile is not None:
            return self._job.profile
        self._set(statuses.Phase.PROFILING, f"profiling {self._job.training.model}")
        await self._publish()
        order = messages.ProfileOrder(
            model=self._job.training.model,
            micro_batch_size=self._job.micro_batch_size,
            repeats=PROFILE_REPEATS,
        )
        for worker in sorted(self._roster.live(self._clock.monotonic())):
            agent = self._lines.agents[worker]
            with contextlib.suppress(ports.AgentUnreachable, Unbounded):
                timeout_s = self._job.configure_timeout_s
                return await connections.bounded(self._clock, agent.profile(order), timeout_s)
        raise Unbounded("no agent could profile the model; check that the workers start")

    async def _take_over(self, record: ports.EpochRecord) -> None:
        """Adopt `record`'s epoch from a predecessor (module docstring): wait, bounded by the
        heartbeat timeout, for a heartbeat of every live worker, then adopt and commit."""
        await self._hear_everyone()
        newest = max((b.epoch for b in self._roster.beats.values()), default=0)
        self._epochs.adopt(record, newest=newest)
        if newest > record.epoch:
            unknown = (
                f"the agents run epoch {newest}, newer than the journalled epoch "
                f"{record.epoch} (its record was not written), so their plan is unknown"
            )
            self._suspend(record.plan, unknown, retry=False)
            return
        summary = statuses.plan_summary(record.plan, record.kind)
        live = self._roster.live(self._clock.monotonic())
        # Workers that failed in the epoch trained in it (or tried to): a failure to recover
        # from, at the step they committed (the next pass), not an epoch to open again.
        failed = self._roster.failed_in(record.plan.workers, record.epoch)
        unsettled = (self._epochs.not_running() - failed) & live
        if unsettled and not record.planned:
            await self._reopen(record, unsettled)
            return
        self._set(statuses.Phase.RECOVERING, f"adopting epoch {record.epoch}: {summary}")
        if await self._epochs.commit():
            self._set(statuses.Phase.RUNNING, f"epoch {record.epoch} running: {summary}")

    async def _reopen(self, record: ports.EpochRecord, unsettled: set[plans.WorkerId]) -> None:
        """The predecessor stopped while opening `record`'s epoch (after a failure, at the start
        or a resume): some workers never got its Configure, or set it up against the
        predecessor's rendezvous store, which may be gone with it. The same plan, copies and
        resume step open again as the next epoch, on this controller's store: every worker
        takes it (a newer epoch), whatever it reached of the old one."""
        LOG.warning(
            "epoch %d was still opening (workers %s not training in it): opening it again",
            record.epoch,
            sorted(unsettled),
        )
        why = f"the previous controller stopped while opening epoch {record.epoch}"
        self._set(statuses.Phase.RECOVERING, why)
        move = planning.Move(
            plan=record.plan, transfers=record.transfers, kind=record.kind, reason=why
        )
        await self._open(move, record.resume_step)

    async def _hear_everyone(self) -> None:
        """Take in what arrived, then wait (at most a heartbeat timeout) until every connected
        worker was heard within the timeout: after a long wait of the controller's own (a
        profile, a predecessor's exit) the roster must not read its queue's age as silence."""
        deadline = self._clock.monotonic() + self._job.heartbeat_timeout_s
        await self._epochs.next(0)
        while (now := self._clock.monotonic()) < deadline:
            connected = set(self._lines.agents) - set(self._roster.dead)
            fresh = {w for w in connected if not self._roster.silent(w, now)}
            if fresh == connected and connected <= set(self._roster.beats):
                return
            await self._epochs.next(min(self._job.heartbeat_interval_s, deadline - now))

    # -- one pass ---------------------------------------------------------------------------

    async def _pass(self) -> None:
        await self._epochs.next(self._job.heartbeat_interval_s)
        for worker in self._roster.joined[:]:
            self._roster.joined.remove(worker)
            if await self._lines.connect(worker):
                self._arrivals.add(worker)
        now = self._clock.monotonic()
        self._note_returns(now)
        if self._phase is statuses.Phase.SUSPENDED:
            await self._try_resume()
        elif self._epochs.finished():
            self._history.settle()
            self._set(statuses.Phase.SUCCEEDED, f"trained {self._job.steps} steps")
        elif self._epochs.broken(now):
            await self._recover()
        elif self._roster.notices & set(self._running().workers):
            await self._evacuate()
        elif self._arrivals:
            await self._scale_up()
        await self._publish()

    def _note_returns(self, now: float) -> None:
        """Workers heard again after a silence (a stalled machine, a stopped process), and
        slow workers now stopped (`_slow`), count as arrivals when the running plan does not
        hold them: a scale-up or a resume may use them. (Restarted processes arrive through the
        backend's JOINED events instead.)"""
        live = self._roster.live(now)
        held = set(self._epochs.plan.workers) if self._epochs.plan is not None else set()
        stopped = {
            w
            for w in self._slow & live
            if (b := self._roster.beats.get(w)) is not None and b.state in membership.SETTLED
        }
        self._slow -= stopped
        returned = (live - self._was_live) | stopped
        if self._phase is not statuses.Phase.SUSPENDED:
            returned -= held
        self._arrivals |= returned & set(self._lines.agents)
        self._was_live = live

    # -- failures -----------------------------------------------------------------------------

    async def _recover(self) -> None:
        """A failure in the running epoch: settle, assess, decide, open the next epoch."""
        running, epoch, noticed = self._running(), self._epochs.epoch, self._clock.monotonic()
        fatal = failures.job_error(self._roster, running.workers, epoch, membership.PERMANENT)
        if fatal is not None:  # the job's own error: no plan avoids it, so no need to settle
            self._fail(fatal)
            return
        missed = self._epochs.switch_missed()
        if missed:  # recover from the plan the workers still hold
            running = self._epochs.fall_back()
            self._history.pending = None
        self._set(statuses.Phase.RECOVERING, "a worker failed; waiting for the others to stop")
        await self._publish()
        late = await self._settle(running, epoch)
        now = self._clock.monotonic()
        found = failures.assess(self._roster, running, epoch, late, now)
        self._slow = late - self._roster.gone(late, now)
        if not found.survivors:
            retry = self._retried(running, epoch, found)
            if retry is None:
                return
            found = retry
        if found.state_lost and not missed:  # (a missed switch's setups latch it, short of it)
            lost = "a layer's state is in no recovery tier (replica, snapshot or checkpoint)"
            self._suspend(running, lost, retry=True)
            return
        if found.survivors and found.resume_step >= self._job.steps:
            self._set(statuses.Phase.SUCCEEDED, f"trained {self._job.steps} steps")
            return
        move = self._decide(running, found, now)
        resume = self._resume_for(running, move, found)
        if move is None or resume is None:
            return
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
            plan_s=self._clock.monotonic() - now,
            lost_steps=found.newest_step - resume,
        )
        await self._open(move, resume, record=record)

    async def _settle(self, running: plans.Plan, epoch: int) -> set[plans.WorkerId]:
        """Wait until the epoch's live workers all stopped, at most a step timeout and a
        heartbeat timeout; the ones still not stopped then."""
        deadline = self._clock.monotonic() + self._job.step_timeout_s
        deadline += self._job.heartbeat_timeout_s
        while True:
            now = self._clock.monotonic()
            waiting = failures.unsettled(self._roster, running, epoch, now)
            if not waiting or now >= deadline:
                return waiting
            await self._epochs.next(min(self._job.heartbeat_interval_s, deadline - now))

    def _decide(
        self, running: plans.Plan, found: failures.Assessment, now: float
    ) -> planning.Move | None:
        """The planner's move, or None after suspending when it has none."""
        assert self._planner is not None, "deciding needs the planner"
        if not found.survivors:
            lost = failures.without_survivors(self._roster, found.failed, now)
            self._suspend(running, lost, retry=False)
            return None
        if not found.failed:  # all alive, yet the group broke: the same plan regroups
            reason = "every worker is alive but the epoch's group broke; the same plan regroups"
            if self._roster.own_faults(running.workers, self._epochs.epoch):
                reason = "every worker latched an error of its own; the same plan tries again"
            return planning.Move(plan=running, transfers=(), kind="restart", reason=reason)
        live = self._roster.live(now)
        spare = live - set(running.workers)
        try:
            return self._planner.recover(running, found.failed, spare, self._time_to_failure())
        except errors.InfeasibleError as exc:
            refused = f"the {self._job.policy} policy has no plan ({exc})"
        try:  # Oobleck's last resort: instantiate the templates anew over the survivors
            move = self._planner.grow(running, live & (found.survivors | spare))
        except errors.PlannerError as exc:
            what = f"no plan for the {len(found.survivors)} surviving workers: {exc}"
            self._suspend(running, what, retry=False)
            return None
        return dataclasses.replace(move, kind="restart", reason=f"{refused}; {move.reason}")

    def _retried(
        self, running: plans.Plan, epoch: int, found: failures.Assessment
    ) -> failures.Assessment | None:
        """No worker of `epoch` survived: when the live ones latched errors of their own (none
        permanent), they survive it instead and try again (`failures.retried`), at most
        OWN_ERROR_RETRIES times from one step; past that the job fails with their error (None).
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
            self._fail(dataclasses.replace(error, message=f"{error.message} ({again})"))
            return None
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

    def _resume_for(
        self, running: plans.Plan, move: planning.Move | None, found: failures.Assessment
    ) -> int | None:
        """The resume step: the survivors' oldest step, or, when some layer has no live
        replica, their latest common snapshot (None after suspending when there is none)."""
        if move is None or not move.needs_snapshot:
            return found.resume_step
        snapshot = self._roster.snapshot_step(found.survivors)
        if snapshot is not None:
            snapshot = _complete_everywhere(found, snapshot, self._job.training)
        if snapshot is None or snapshot > found.resume_step:
            lost = "a lost layer has no live replica and no host-memory snapshot to restore"
            self._suspend(running, lost, retry=True)
            return None
        return snapshot

    def _time_to_failure(self) -> float:
        """Odyssey eq. 8's expected time to the next failure (the job's, else observed)."""
        observed = self._clock.monotonic() - self._started_at
        if self._job.mtbf_s is None and (self._failures == 0 or observed <= 0):
            return DEFAULT_TIME_TO_FAILURE_S
        return policy.time_to_failure_s(
            mtbf_s=self._job.mtbf_s, num_failures=self._failures, observed_s=observed
        )

    # -- planned moves ------------------------------------------------------------------------

    async def _evacuate(self) -> None:
        """Preemption notices: move away from those workers at a future step boundary."""
        assert self._planner is not None, "evacuating needs the planner"
        running = self._running()
        noticed = self._roster.notices & set(running.workers)
        self._roster.notices -= noticed
        switch, now = self._switch_step(), self._clock.monotonic()
        if switch is None:
            return  # the job ends first; if the worker goes before, it is a plain failure
        spare = self._roster.live(now) - set(running.workers)
        try:
            move = self._planner.recover(running, noticed, spare, self._time_to_failure())
        except errors.InfeasibleError as exc:
            LOG.warning("no plan without workers %s ahead of preemption: %s", sorted(noticed), exc)
            return
        if move.needs_snapshot:
            return  # a layer would lose its last replica: recover when the worker goes
        reason = f"preemption notice for worker(s) {sorted(noticed)}: {move.reason}"
        record = self._planned(move, reason, noticed)
        if not await self._open(move, switch, record=record, planned=True):
            self._roster.notices |= noticed  # too late for some agent: again next pass

    async def _scale_up(self) -> None:
        """Workers joined: at a future step boundary, move to the templates' best plan over
        every live worker, the new ones receiving copies from the holders."""
        assert self._planner is not None, "scaling needs the planner"
        running = self._running()
        arrivals, self._arrivals = self._arrivals, set()
        live = self._roster.live(self._clock.monotonic())
        switch = self._switch_step()
        if switch is None or not arrivals & live:
            return
        try:
            move = self._planner.grow(running, live)
        except errors.PlannerError as exc:
            LOG.info("no larger plan with workers %s: %s", sorted(arrivals), exc)
            return
        if set(move.plan.workers) == set(running.workers):
            return  # the templates' best plan is the running one: they stay spares
        reason = f"workers {sorted(arrivals)} joined: {move.reason}"
        if not await self._open(move, switch, record=self._planned(move, reason, ()), planned=True):
            self._arrivals |= arrivals  # too late for some agent: again next pass

    def _planned(
        self, move: planning.Move, reason: str, leaving: set[plans.WorkerId] | tuple[()]
    ) -> statuses.Recovery:
        return statuses.Recovery(
            started_s=self._clock.monotonic(),
            failed=tuple(sorted(leaving)),
            epoch=self._epochs.next_epoch,
            tier=messages.RecoveryTier.KEPT,
            kind=move.kind,
            reason=reason,
            planned=True,
        )

    def _switch_step(self) -> int | None:
        """The step a planned switch follows: far enough ahead that every agent is still
        before it when the Configure arrives, near enough that the new workers' rendezvous
        does not time out; None when the job ends first."""
        current, step_s = self._epochs.current_step(), self._epochs.step_s()
        lead_s = min(PLANNED_LEAD_S * self._lead_scale, self._job.step_timeout_s / 2)
        least = MIN_LEAD_STEPS * self._lead_scale
        lead = least if step_s <= 0 else max(least, math.ceil(lead_s / step_s))
        return current + lead if current + lead < self._job.steps else None

    # -- epochs -------------------------------------------------------------------------------

    async def _open(
        self,
        move: planning.Move,
        resume_step: int,
        *,
        record: statuses.Recovery | None = None,
        planned: bool = False,
    ) -> bool:
        """Open the next epoch with `move`, resuming after `resume_step`; RUNNING once every
        worker runs in it. Trouble on the way is left to the next pass. False only when a
        planned switch reached some agent too late and was given up (the caller retries)."""
        assert self._planner is not None, "opening an epoch needs the planner"
        if record is not None:
            record = dataclasses.replace(record, epoch=self._epochs.next_epoch)
            self._history.begin(record, self._clock.monotonic(), resume_step)
        phase = statuses.Phase.RECOVERING if record else self._phase
        summary = statuses.plan_summary(move.plan, move.kind)
        self._set(phase, f"opening epoch {self._epochs.next_epoch}: {summary}")
        await self._record(move, resume_step, planned=planned)
        if not await self._epochs.configure(move, resume_step, planned=planned):
            return not (planned and await self._gave_up_late_switch())
        self._planner.prepare(move.plan)  # Odyssey §IV-C: search ahead of the next failure
        if await self._epochs.commit():
            self._set(statuses.Phase.RUNNING, f"epoch {self._epochs.epoch} running: {summary}")
        return True

    async def _gave_up_late_switch(self) -> bool:
        """A planned switch refused only by agents that had already committed its step (the
        controller's view of the step was stale, e.g. on a loaded machine): not their fault.
        The switch is given up, they train on in their epoch, and the next try leads by twice
        as many steps. False when some refusal was a real one (the next pass recovers)."""
        await self._epochs.next(0)
        refused, switch = self._epochs.refused, self._epochs.resume_step
        late = {
            w
            for w in refused
            if (b := self._roster.beats.get(w)) is not None
            and b.epoch < self._epochs.epoch
            and b.state is messages.AgentState.RUNNING
            and b.last_committed_step >= switch
        }
        if not refused or late != refused:
            return False
        LOG.warning("planned switch at step %d came too late for workers %s", switch, sorted(late))
        self._roster.faulty -= late
        self._epochs.fall_back()
        self._history.pending = None
        self._lead_scale = min(2 * self._lead_scale, MAX_LEAD_SCALE)
        summary = statuses.plan_summary(self._epochs.plan, self._epochs.kind)
        self._set(statuses.Phase.RUNNING, f"epoch {self._epochs.epoch} running: {summary}")
        return True

    async def _record(self, move: planning.Move, resume_step: int, *, planned: bool) -> None:
        """Journal the epoch about to open (module docstring); a failure is logged only."""
        if self._journal is None or self._planner is None:
            return
        entry = ports.EpochRecord(
            epoch=self._epochs.next_epoch,
            plan=move.plan,
            kind=move.kind,
            resume_step=resume_step,
            profile=self._planner.source,
            transfers=move.transfers,
            planned=planned,
        )
        for attempt in range(1, JOURNAL_ATTEMPTS + 1):
            try:
                await self._journal.record(entry)
                return
            except Exception as exc:  # an adapter's I/O: the job goes on (module docstring)
                LOG.warning("epoch %d not journalled (try %d): %s", entry.epoch, attempt, exc)
            await self._clock.sleep(JOURNAL_RETRY_S)

    # -- suspended ------------------------------------------------------------------------------

    def _suspend(self, running: plans.Plan, what: str, *, retry: bool) -> None:
        """No way forward with these workers: say what is lost and what would resume it.
        `retry`: the checkpoint (older than the failed resume step) may be tried at once."""
        assert self._planner is not None, "suspending needs the planner"
        self._checkpoint = self._roster.checkpoint_step(running.workers)
        self._suspended_at = self._clock.monotonic()
        self._retry = retry and self._checkpoint is not None
        if self._from_snapshot or retry:  # host memory did not hold every layer: checkpoint
            self._snapshot_failed = True
            self._retry = self._retry or self._from_snapshot
        self._from_snapshot = False
        self._history.pending = None
        live = len(self._roster.live(self._suspended_at))
        where = (
            f"the latest persistent checkpoint is step {self._checkpoint}"
            if self._checkpoint is not None
            else "there is no persistent checkpoint, so training restarts from step 0"
        )
        need = self._planner.min_workers
        self._set(
            statuses.Phase.SUSPENDED,
            f"suspended: {what}; {where}; it resumes from there once {need} workers are live "
            f"({live} now): start or return workers",
        )

    async def _try_resume(self) -> None:
        """Resume from the checkpoint when workers joined (or a checkpoint can be retried)."""
        assert self._planner is not None, "resuming needs the planner"
        live = self._roster.live(self._clock.monotonic())
        if self._healed(live):
            summary = statuses.plan_summary(self._epochs.plan, self._epochs.kind)
            self._arrivals, self._retry = set(), False
            self._set(statuses.Phase.RUNNING, f"epoch {self._epochs.epoch} running: {summary}")
            return
        if not (self._arrivals or self._retry) or len(live) < self._planner.min_workers:
            return
        if self._stall_ending(live):
            return
        try:
            move = self._planner.best(live, "resume")
        except errors.PlannerError as exc:
            LOG.info("still suspended: %s", exc)
            return
        checkpoint = self._checkpoint or 0
        now = self._clock.monotonic()
        unheard = [w for w in live if w not in self._roster.beats]
        if unheard and not self._snapshot_failed:
            # A returning worker's first heartbeat says which snapshots it holds: wait for it
            # (bounded by the heartbeat timeout) before choosing where to resume from.
            since = self._unheard_since = self._unheard_since or now
            if now - since < self._job.heartbeat_timeout_s:
                return
        self._unheard_since = None
        held = None if self._snapshot_failed else self._held_step(live)
        from_memory = held is not None and held > checkpoint
        step = held if from_memory and held is not None else checkpoint
        self._arrivals, self._retry = set(), False
        where = "host-memory snapshots and live layers" if from_memory else "checkpoint"
        record = statuses.Recovery(
            started_s=self._suspended_at,
            failed=(),
            epoch=self._epochs.next_epoch,
            tier=messages.RecoveryTier.LOCAL_SNAPSHOT
            if from_memory
            else messages.RecoveryTier.CHECKPOINT,
            kind="resume",
            reason=f"resumed from {where} at step {step}: {move.reason}",
        )
        self._from_snapshot = from_memory
        if not from_memory:
            self._snapshot_failed = False  # a later suspension may use host memory again
        await self._open(move, step, record=record)

    def _stall_ending(self, live: set[plans.WorkerId]) -> bool:
        """Whether to hold a resume because the suspended epoch may heal by itself: some of its
        workers are back from a silence while others are still silent but not dead (a machine
        stall ends worker by worker), or a worker still trains in it (it would refuse the
        resume epoch; its group either heals or fails within a step timeout). Held at most a
        heartbeat timeout plus a step timeout from the first such pass."""
        running, epoch, now = self._epochs.plan, self._epochs.epoch, self._clock.monotonic()
        if running is None:
            return False
        workers = set(running.workers)
        silent = {w for w in workers - live if w not in self._roster.dead}
        silent -= self._roster.faulty
        training = {
            w
            for w in workers & live
            if (b := self._roster.beat(w, epoch)) is not None
            and b.epoch == epoch
            and b.state is messages.AgentState.RUNNING
        }
        if not (silent and workers & live) and not training:
            self._stall_since = None
            return False
        since = self._stall_since = self._stall_since or now
        bound = self._job.heartbeat_timeout_s + self._job.step_timeout_s
        return now - since < bound

    def _healed(self, live: set[plans.WorkerId]) -> bool:
        """Every worker of the suspended epoch's plan is live again and still trains in it (or
        finished): they were silent, not lost, and their group held, so the epoch goes on."""
        running, epoch = self._epochs.plan, self._epochs.epoch
        if running is None or not set(running.workers) <= live:
            return False
        trained = (messages.AgentState.RUNNING, messages.AgentState.FINISHED)
        beats = [self._roster.beat(w, epoch) for w in running.workers]
        return all(b is not None and b.epoch == epoch and b.state in trained for b in beats)

    def _held_step(self, live: Iterable[plans.WorkerId]) -> int | None:
        """The newest step every live worker can restore without the checkpoint: a worker
        holding layers has its committed step and, in its snapshots, the one before; a returning
        worker its latest complete host-memory snapshot and the one before. None when they are
        more than one step apart or one has nothing (the agents' tiers then decide per layer
        whether the snapshots cover every layer; if not, the next resume uses the checkpoint)."""
        steps = []
        for worker in live:
            beat = self._roster.beats.get(worker)
            if beat is None:
                return None
            held = beat.last_committed_step or beat.snapshot.latest_step
            if not held:
                return None
            steps.append(held)
        if not steps or max(steps) - min(steps) > 1:
            return None
        return min(steps)

    # -- status -------------------------------------------------------------------------------

    def _fail(self, error: failures.JobError) -> None:
        """End the job Failed with `error` (the run loop stops after this pass)."""
        self._reason = error.reason
        self._history.pending = None
        self._set(statuses.Phase.FAILED, error.message)

    def _set(self, phase: statuses.Phase, message: str) -> None:
        if (phase, message) != (self._phase, self._message):
            LOG.info("%s: %s", phase, message)
        self._phase, self._message = phase, message

    def _running(self) -> plans.Plan:
        assert self._epochs.plan is not None, "the job runs a plan once the first epoch opened"
        return self._epochs.plan

    def _view(self) -> statuses.View:
        live = self._roster.live(self._clock.monotonic())
        last = self._history.steps[-1] if self._history.steps else None
        in_plan = live & set(self._epochs.plan.workers) if self._epochs.plan is not None else live
        return statuses.View(
            phase=self._phase,
            epoch=self._epochs.epoch,
            step=last.step if last else 0,
            loss=last.loss if last else None,
            samples_per_s=last.samples_per_s if last else 0.0,
            live_workers=len(in_plan),
            total_workers=self._job.workers,
            plan=self._epochs.plan,
            plan_kind=self._epochs.kind,
            recoveries=tuple(self._history.recoveries),
            message=self._message,
            checkpoint_step=self._checkpoint,
            failure_reason=self._reason,
        )

    async def _publish(self) -> None:
        if self._sink is not None:
            await self._sink.publish(self.status)


def _reason(exc: Exception) -> str:
    """The Failed condition's reason for an error that ended `run`."""
    if isinstance(exc, errors.PlannerError):
        return "NoFeasiblePlan"
    return "Unresponsive" if isinstance(exc, Unbounded) else "InvalidJob"


def _complete_everywhere(
    found: failures.Assessment, snapshot: int, training: messages.TrainingSettings
) -> int:
    """The newest snapshot step at or before `snapshot` that is complete on every worker, the
    dead included (their stores hold the lost layers). A writer finishes step t's snapshot
    before the commit barrier of the next step, so a snapshot older than the survivors' step c
    is complete everywhere, and so is c when a worker died in the barrier after it (some
    survivors committed past c). A worker killed while training step c + 1 may still have been
    writing c's: then the one before it (the other slot of the double buffer) is the safe one."""
    split = found.newest_step > found.resume_step
    if snapshot < found.resume_step or split:
        return snapshot
    return max(0, snapshot - max(1, training.snapshot_interval_steps))
