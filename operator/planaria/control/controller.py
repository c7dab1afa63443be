"""The controller: one job's state machine, pure asyncio, the world behind `ports`.

    Pending -> (Profiling) -> Running <-> Recovering -> Succeeded
                                 |  ^
                                 v  |  (enough workers again)
                              Suspended                 Failed: a permanent error

Every pass takes what arrived on one queue (`connections`: heartbeats, broken streams, backend
events) into the `membership.Roster`, looks at the epoch, acts, and publishes the status. Each
concern decides in a module of its own and answers with an `outcomes.Outcome`; the pass carries
it out, and only the pass opens epochs (`_open`, through `epochs.Driver`):
- a broken epoch: `recovery` (settle, assess, decide, the resume step);
- a preemption notice, or workers that joined or returned: a planned switch (`switches`);
- Suspended: `suspension` says whether to carry on, wait or resume, and from where;
- an operator restarted mid-job (`adopt`): `adoption` says how to take the epoch over.
Every wait is bounded by the job's timeouts: a second failure during a recovery, an agent that
never answers or one that hangs leads to a new epoch, never a hang. The planner's CPU-bound
search (its templates, the first plan, the search ahead of the next failure, a recovery's
decision) runs on its executor, off the event loop (`planning` module docstring).

Errors: `run` returns the final status; a permanent error (the profile or the first plan does
not fit the job, an agent's error of the job's own) ends in phase Failed with its message, and
the status' Failed condition gives its reason.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent import futures

from planaria.contract import errors, profile
from planaria.contract import plan as plans
from planaria.control import (
    adoption,
    connections,
    epochs,
    executors,
    failures,
    history,
    membership,
    outcomes,
    planning,
    ports,
    recovery,
    suspension,
    switches,
)
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.wire import messages

LOG = logging.getLogger(__name__)
PROFILE_REPEATS = 3
Phase = statuses.Phase


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
        executor: futures.Executor | None = None,
    ) -> None:
        """`executor` runs the planner (`planning`): None gives the job a thread of its own,
        shut down when `run` ends; the virtual-time tests give `executors.Inline()`."""
        self._job, self._clock, self._sink = settings, clock, sink
        self._executor = executors.thread(settings.name) if executor is None else executor
        self._owns_executor = executor is None
        self._adopt, self._detached = adopt, False
        self._roster = roster = membership.Roster(heartbeat_timeout_s=settings.heartbeat_timeout_s)
        beats_s, configure_s = settings.heartbeat_interval_s, settings.configure_timeout_s
        self._lines = lines = connections.Connections(
            backend, clock, roster, interval_s=beats_s, timeout_s=configure_s
        )
        self._history = record = history.History(global_batch=settings.training.global_batch_size)
        self._epochs = driver = epochs.Driver(
            settings,
            store=backend.store,
            fail_epoch=backend.fail_epoch,
            clock=clock,
            roster=roster,
            lines=lines,
            record=record,
            journal=journal,
        )
        self._recovery = recovery.Handler(settings, clock, roster, driver, record)
        self._switches = switches.Switches(settings, clock, roster, driver, record)
        self._planner: planning.Planner | None = None
        self._phase, self._message = Phase.PENDING, "starting workers"
        self._reason = ""  # the Failed condition's reason, once the job failed
        self._failure: failures.JobError | None = None  # a failure from outside (`fail`)
        self._arrivals: set[plans.WorkerId] = set()
        self._suspended = suspension.Tracker(settings, roster)

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
        """The current plan's epoch (0 before any; a given-up switch leaves the one before)."""
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
            planning.preload(self._job)  # while the agents start, not while an epoch commits
            await self._publish()  # at once: starting the agents takes seconds (pods: minutes)
            await self._lines.start(plans.WorkerId(w) for w in range(self._job.workers))
            await self._publish()
            if self._adopt is not None:
                self._planner = await self._made(self._adopt.profile)
                await self._take_over(self._adopt)
            else:
                self._planner = planner = await self._made(await self._profiled())
                await self._epochs.hear_everyone()  # profiling may outlast the heartbeat timeout
                live = self._roster.live(self._clock.monotonic())
                move = await planner.call(planner.best, live, statuses.MoveKind.INITIAL)
                await self._open(outcomes.Open(move=move, resume_step=0))
            while self._phase not in (Phase.SUCCEEDED, Phase.FAILED) and self._failure is None:
                await self._pass()
        except (errors.PlannerError, ValueError, connections.Unbounded) as exc:
            self._fail(failures.ended(exc))
        finally:
            if self._owns_executor:  # first: what follows may be cancelled; a search ends unread
                self._executor.shutdown(wait=False, cancel_futures=True)
            if self._failure is not None and self._phase is not Phase.SUCCEEDED:
                self._fail(self._failure)  # the root cause of whatever else went wrong since
            if self._detached:
                await self._lines.release()
            else:
                live = self._roster.live(self._clock.monotonic())
                await self._lines.close(live, self._job.heartbeat_timeout_s)
                await self._publish()
        return self.status

    def fail(self, reason: str, message: str) -> None:
        """End the job Failed from outside the core, with the Failed condition's CamelCase
        `reason` and the status `message` (`planaria run`: the local backend gave up restarting
        a worker). The run ends after the pass under way (an epoch being opened is opened or
        given up within the job's timeouts first); the first such failure is the one kept."""
        if self._failure is None:
            self._failure = failures.JobError(reason=reason, message=message)

    def detach(self) -> None:
        """Leave the job running when `run` is cancelled next: the agents and workers stay (an
        operator stopping or losing its leadership: a successor adopts the job)."""
        self._detached = True

    async def _profiled(self) -> profile.Profile:
        measured = self._job.profile
        if measured is None:
            model, size = self._job.training.model, self._job.micro_batch_size
            self._set(Phase.PROFILING, f"profiling {model}")
            await self._publish()
            order = messages.ProfileOrder(
                model=model,
                micro_batch_size=size,
                repeats=PROFILE_REPEATS,
                precision=self._job.training.precision,
            )
            measured = await self._lines.profile(self._roster.live(self._clock.monotonic()), order)
        cap = self._job.device_memory_bytes
        if cap is None or cap >= measured.memory_bytes:
            return measured
        return dataclasses.replace(measured, memory_bytes=cap)

    async def _made(self, source: profile.Profile) -> planning.Planner:
        return await planning.Planner.made(source, self._job, self._executor)

    async def _take_over(self, record: ports.EpochRecord) -> None:
        """Adopt `record`'s epoch from a predecessor (`adoption`)."""
        await self._epochs.hear_everyone()
        now = self._clock.monotonic()
        await self._carry_out(adoption.take_over(record, self._roster, self._epochs, now))

    async def _pass(self) -> None:
        """Take in the news, act on the epoch as its state asks (module docstring), publish."""
        await self._epochs.next(self._job.heartbeat_interval_s)
        for worker in self._roster.take_joined():
            if await self._lines.connect(worker):
                self._arrivals.add(worker)
        now = self._clock.monotonic()
        self._note_returns(now)
        plan = self._epochs.plan
        if self._phase is Phase.SUSPENDED:
            outcome = await self._suspended.next(
                self._epochs, self._planner_(), now=now, arrived=bool(self._arrivals)
            )
            self._arrivals = self._arrivals if outcome is None else set()
            await self._carry_out(outcome)
        elif self._epochs.finished():
            self._succeed()
        elif self._epochs.broken(now):
            await self._carry_out(await self._recovery.recover(self._planner_(), self._announce))
        elif plan is not None and self._roster.notices & set(plan.workers):
            ttf = self._recovery.time_to_failure()
            await self._switch(await self._switches.evacuation(self._planner_(), ttf))
        elif self._arrivals:
            joined, self._arrivals = self._arrivals, set()
            await self._switch(await self._switches.scale_up(self._planner_(), joined))
        elif self._opening() and plan is not None and not self._epochs.not_running():
            # A commit that gave up on workers it had not heard yet (the loop was held past
            # the heartbeat timeout) opens nothing new; once every worker trains in the epoch,
            # it is running, whatever the commit said.
            self._set_running()
        await self._publish()

    def _opening(self) -> bool:
        return self._phase in (Phase.PENDING, Phase.RECOVERING)

    def _note_returns(self, now: float) -> None:
        """Workers heard again after a silence (a stalled machine, a stopped process), and slow
        workers now stopped, arrive when the running plan does not hold them: a scale-up or a
        resume may use them. (Restarted processes arrive as the backend's JOINED events.)"""
        plan = self._epochs.plan
        held = plan.workers if plan is not None and self._phase is not Phase.SUSPENDED else ()
        self._arrivals |= self._roster.returned(now, held) & set(self._lines.agents)

    async def _carry_out(self, outcome: outcomes.Outcome) -> None:
        """Do what a concern decided (`outcomes`)."""
        if isinstance(outcome, outcomes.Fail):
            self._fail(outcome.error)
        elif isinstance(outcome, outcomes.Suspend):
            now, need = self._clock.monotonic(), self._planner_().min_workers
            self._history.pending = None
            self._set(Phase.SUSPENDED, self._suspended.enter(outcome, now=now, need=need))
        elif isinstance(outcome, outcomes.Succeed):
            self._succeed()
        elif isinstance(outcome, outcomes.CarryOn):
            self._set_running()
        elif isinstance(outcome, outcomes.Commit):
            self._set(Phase.RECOVERING, outcome.why)
            if await self._epochs.commit():
                self._set_running()
        elif isinstance(outcome, outcomes.Open):
            await self._open(outcome)

    async def _switch(self, switch: switches.Switch | None) -> None:
        """Open a planned switch; when it came too late for some agent, try again next pass."""
        if switch is None:
            return
        if not await self._open(switch.opening):
            self._roster.notice(switch.leaving)
            self._arrivals |= switch.arrived

    async def _announce(self, message: str) -> None:
        self._set(Phase.RECOVERING, message)
        await self._publish()

    async def _open(self, opening: outcomes.Open) -> bool:
        """Open the next epoch as `opening` says; RUNNING once every worker runs in it.
        Trouble on the way is left to the next pass. False only when a planned switch reached
        some agent too late and was given up (the caller retries)."""
        move, step, record = opening.move, opening.resume_step, opening.record
        if record is not None:
            record = dataclasses.replace(record, epoch=self._epochs.next_epoch)
            self._history.begin(record, self._clock.monotonic(), step)
        phase = Phase.RECOVERING if record or opening.why else self._phase
        if phase is Phase.PROFILING:  # the profile is in: the first epoch is starting
            phase = Phase.PENDING
        summary = statuses.plan_summary(move.plan, move.kind)
        self._set(phase, f"opening epoch {self._epochs.next_epoch}: {summary}")
        await self._publish()
        planner, planned = self._planner_(), opening.planned
        if not await self._epochs.configure(move, step, planned=planned, profile=planner.source):
            gave_up = planned and await self._switches.give_up_late()
            if gave_up:
                self._set_running()
            return not gave_up
        planner.prepare(move.plan)  # Odyssey §IV-C: search ahead of the next failure, off the loop
        if await self._epochs.commit():
            self._set_running()
        return True

    # -- status -----------------------------------------------------------------------------

    def _fail(self, error: failures.JobError) -> None:
        """End the job Failed with `error` (the run loop stops after this pass)."""
        self._reason = error.reason
        self._history.pending = None
        self._set(Phase.FAILED, error.message)

    def _succeed(self) -> None:
        self._history.settle()
        self._set(Phase.SUCCEEDED, f"trained {self._job.steps} steps")

    def _set_running(self) -> None:
        summary = statuses.plan_summary(self._epochs.plan, self._epochs.kind)
        self._set(Phase.RUNNING, f"epoch {self._epochs.epoch} running: {summary}")

    def _set(self, phase: statuses.Phase, message: str) -> None:
        if (phase, message) != (self._phase, self._message):
            LOG.info("%s: %s", phase, message)
        self._phase, self._message = phase, message

    def _planner_(self) -> planning.Planner:
        assert self._planner is not None, "the planner exists once the job is profiled"
        return self._planner

    def _view(self) -> statuses.View:
        live, plan = self._roster.live(self._clock.monotonic()), self._epochs.plan
        last = self._history.steps[-1] if self._history.steps else None
        return statuses.View(
            phase=self._phase,
            epoch=self._epochs.epoch,
            step=last.step if last else 0,
            loss=last.loss if last else None,
            samples_per_s=last.samples_per_s if last else 0.0,
            live_workers=len(live & set(plan.workers) if plan is not None else live),
            total_workers=self._job.workers,
            plan=plan,
            plan_kind=self._epochs.kind,
            recoveries=tuple(self._history.recoveries),
            message=self._message,
            checkpoint_step=self._suspended.state.checkpoint,
            failure_reason=self._reason,
            suspend_reason=self._suspended.reason,
            snapshot_interval_steps=(
                None if plan is None else self._roster.snapshot_interval(plan.workers)
            ),
        )

    async def _publish(self) -> None:
        if self._sink is not None:
            await self._sink.publish(self.status)
