"""The controller: one job's state machine, pure asyncio, the world behind `ports`.

    Pending -> (Profiling) -> Running <-> Recovering -> Succeeded
                                 |  ^
                                 v  |  (enough workers again)
                              Suspended                 Failed: a permanent error

Every pass takes what arrived on one queue (heartbeats from one Watch task per agent, broken
streams, backend events), looks at the epoch, acts, and publishes the status (`statuses.compute`).
Acting (docs/controller.md, the protocol of the agents in interfaces):
- a death (broken Watch, DIED event, silence past the heartbeat timeout, an agent's own latched
  error) or a peer-lost failure: wait (bounded) until the epoch's other workers settle, resume
  at the survivors' oldest committed step, ask the planner (`planning`) per the job's policy,
  Configure a new epoch, wait (bounded) until every worker runs in it;
- a preemption notice: the same move planned ahead, switching at a future step boundary;
- a JOINED worker: a planned scale-up to the templates' best plan over the live workers;
- no plan for the survivors, or a layer no recovery tier holds: Suspended, until workers join
  or a checkpoint can be resumed.
Every wait is bounded by the job's timeouts, so a second failure during a recovery, an agent
that never answers, or one that hangs leads to a new epoch, never a hang. The recovery record
(`statuses.Recovery`) is completed when the new epoch commits its first step.

Errors: `run` returns the final status; a permanent error (the profile or the first plan does
not fit the job) ends in phase Failed with its message. Transport errors are `AgentUnreachable`
and count as deaths.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from planaria.control import epochs, membership, planning, ports
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.planner import errors, policy, profile
from planaria.planner import plan as plans
from planaria.wire import messages

LOG = logging.getLogger(__name__)
T = TypeVar("T")
# A planned switch is announced this long (at least) before its step, so every agent is still
# before it when the Configure arrives; with at least this many steps of lead.
PLANNED_LEAD_S = 1.0
MIN_LEAD_STEPS = 2
DEFAULT_TIME_TO_FAILURE_S = 3600.0  # eq. 8's T_next before any failure is seen, without mtbf_s
PROFILE_REPEATS = 3


class Unbounded(TimeoutError):
    """A bounded wait of the controller ran out of time."""


async def bounded(clock: ports.Clock, awaitable: Awaitable[T], timeout_s: float) -> T:
    """`awaitable`'s result, or Unbounded after `timeout_s` on `clock`."""
    work = asyncio.ensure_future(awaitable)
    nap = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        await asyncio.wait({work, nap}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        nap.cancel()
    if not work.done():
        work.cancel()
        raise Unbounded(f"no answer within {timeout_s:g} s")
    return work.result()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Pending:
    """A recovery waiting for its epoch's first committed step."""

    record: statuses.Recovery
    death_at: float
    configured_at: float
    resume_step: int


class Controller:
    """Drives one job to Succeeded or Failed (module docstring)."""

    def __init__(
        self,
        settings: job_settings.JobSettings,
        backend: ports.Backend,
        *,
        clock: ports.Clock,
        sink: ports.StatusSink | None = None,
    ) -> None:
        self._job = settings
        self._backend = backend
        self._clock = clock
        self._sink = sink
        self._queue: asyncio.Queue[membership.Item] = asyncio.Queue()
        self._roster = membership.Roster(heartbeat_timeout_s=settings.heartbeat_timeout_s)
        self._agents: dict[plans.WorkerId, ports.Agent] = {}
        self._tasks: dict[plans.WorkerId, asyncio.Task[None]] = {}
        self._pump: asyncio.Task[None] | None = None
        self._planner: planning.Planner | None = None
        self._plan: plans.Plan | None = None
        self._kind = ""
        self._epoch = 0
        self._phase = statuses.Phase.PENDING
        self._message = "starting workers"
        self._steps: list[statuses.StepRecord] = []
        self._recoveries: list[statuses.Recovery] = []
        self._pending: _Pending | None = None
        self._suspended_step: int | None = None
        self._started_at = clock.monotonic()
        self._failures = 0
        self._arrivals: set[plans.WorkerId] = set()
        self._resume_step = 0
        self._checkpoint: int | None = None
        self._suspended_at = 0.0
        self._retry = False

    # -- the public face -------------------------------------------------------------------

    @property
    def status(self) -> statuses.JobStatus:
        return statuses.compute(self._view())

    @property
    def steps(self) -> tuple[statuses.StepRecord, ...]:
        return tuple(self._steps)

    @property
    def recoveries(self) -> tuple[statuses.Recovery, ...]:
        return tuple(self._recoveries)

    @property
    def epoch(self) -> int:
        """The latest epoch opened (0 before the first)."""
        return self._epoch

    @property
    def plan(self) -> plans.Plan | None:
        """The plan of the latest epoch."""
        return self._plan

    async def run(self) -> statuses.JobStatus:
        """Run the job until Succeeded or Failed and return the final statuses."""
        try:
            await self._start()
            source = await self._profiled()
            self._planner = planning.Planner(source, self._job)
            await self._begin()
            while self._phase not in (statuses.Phase.SUCCEEDED, statuses.Phase.FAILED):
                await self._pass()
        except (errors.PlannerError, ValueError, Unbounded) as exc:
            self._set(statuses.Phase.FAILED, str(exc))
        finally:
            await self._teardown()
            await self._publish()
        return self.status

    # -- starting and ending ----------------------------------------------------------------

    async def _start(self) -> None:
        workers = [plans.WorkerId(w) for w in range(self._job.workers)]
        await bounded(self._clock, self._backend.start(workers), self._job.configure_timeout_s)
        self._pump = asyncio.ensure_future(self._forward_events())
        await asyncio.gather(*(self._connect(w) for w in workers))
        await self._publish()

    async def _connect(self, worker: plans.WorkerId) -> bool:
        try:
            agent = await bounded(
                self._clock,
                self._backend.connect(worker, self._job.configure_timeout_s),
                self._job.configure_timeout_s,
            )
        except (ports.AgentUnreachable, Unbounded) as exc:
            LOG.warning("worker %d: not reachable: %s", worker, exc)
            self._roster.dead.setdefault(worker, self._clock.monotonic())
            return False
        old = self._tasks.pop(worker, None)
        if old is not None:
            old.cancel()
        self._agents[worker] = agent
        generation = self._roster.connected(worker, self._clock.monotonic())
        self._tasks[worker] = asyncio.ensure_future(self._watch(agent, worker, generation))
        return True

    async def _watch(self, agent: ports.Agent, worker: plans.WorkerId, generation: int) -> None:
        try:
            async for beat in agent.watch(self._job.heartbeat_interval_s):
                self._queue.put_nowait(
                    membership.Beat(worker=worker, generation=generation, heartbeat=beat)
                )
            detail = "the Watch stream ended"
        except ports.AgentUnreachable as exc:
            detail = exc.detail
        self._queue.put_nowait(membership.Lost(worker=worker, generation=generation, detail=detail))

    async def _forward_events(self) -> None:
        events: AsyncIterator[ports.WorkerEvent] = self._backend.events()
        async for event in events:
            self._queue.put_nowait(membership.Event(event=event))

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
            with contextlib.suppress(ports.AgentUnreachable, Unbounded):
                return await bounded(
                    self._clock, self._agents[worker].profile(order), self._job.configure_timeout_s
                )
        raise Unbounded("no agent could profile the model; check that the workers start")

    async def _teardown(self) -> None:
        now = self._clock.monotonic()
        grace = self._job.heartbeat_timeout_s
        stops = [
            bounded(self._clock, self._agents[w].stop(grace), self._job.configure_timeout_s)
            for w in sorted(self._roster.live(now) & set(self._agents))
        ]
        await asyncio.gather(*stops, return_exceptions=True)
        for task in [*self._tasks.values(), *([self._pump] if self._pump else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await asyncio.gather(*(a.close() for a in self._agents.values()), return_exceptions=True)
        with contextlib.suppress(Exception):  # the job's outcome stands whatever shutdown says
            await bounded(self._clock, self._backend.shutdown(), self._job.configure_timeout_s)

    # -- one pass ---------------------------------------------------------------------------

    async def _pass(self) -> None:
        await self._next(self._job.heartbeat_interval_s)
        await self._admit()
        now = self._clock.monotonic()
        if self._phase is statuses.Phase.SUSPENDED:
            await self._try_resume()
        elif self._finished():
            self._set(statuses.Phase.SUCCEEDED, f"trained {self._job.steps} steps")
        elif self._broken(now):
            await self._recover()
        elif self._plan is not None and self._roster.notices & set(self._plan.workers):
            await self._evacuate()
        elif self._arrivals:
            await self._scale_up()
        await self._publish()

    async def _next(self, timeout_s: float) -> None:
        """Wait (bounded) for something to arrive, then take in all that is queued."""
        if self._queue.empty():
            with contextlib.suppress(Unbounded):
                item = await bounded(self._clock, self._queue.get(), timeout_s)
                self._roster.absorb(item, self._clock.monotonic())
        while not self._queue.empty():
            self._roster.absorb(self._queue.get_nowait(), self._clock.monotonic())
        self._progress()

    async def _admit(self) -> None:
        """Connect the workers that joined; they are candidates for the next plans."""
        joined, self._roster.joined = self._roster.joined, []
        for worker in joined:
            if await self._connect(worker):
                self._arrivals.add(worker)

    def _finished(self) -> bool:
        if self._plan is None:
            return False
        beats = [self._roster.beat(w, self._epoch) for w in self._plan.workers]
        return all(
            b is not None
            and b.epoch == self._epoch
            and b.state is messages.AgentState.FINISHED
            and b.last_committed_step >= self._job.steps
            for b in beats
        )

    def _broken(self, now: float) -> bool:
        if self._plan is None:
            return False
        workers = self._plan.workers
        return bool(self._roster.gone(workers, now) or self._roster.failed_in(workers, self._epoch))

    # -- failures -----------------------------------------------------------------------------

    async def _recover(self) -> None:
        """A failure in the running epoch: settle, decide, open the next epoch."""
        assert self._plan is not None and self._planner is not None, "recovering needs a plan"
        running, epoch = self._plan, self._epoch
        noticed = self._clock.monotonic()
        self._set(statuses.Phase.RECOVERING, "a worker failed; waiting for the others to stop")
        await self._publish()
        unsettled = await self._settle(running, epoch)
        now = self._clock.monotonic()
        failed = (
            self._roster.gone(running.workers, now)
            | self._roster.own_faults(running.workers, epoch)
            | unsettled
        )
        survivors = set(running.workers) - failed
        death_at = min((self._roster.beat_at.get(w, noticed) for w in failed), default=noticed)
        if messages.ErrorKind.SNAPSHOT_UNAVAILABLE in self._roster.latched(survivors, epoch):
            self._suspend(
                running,
                "a layer's state is in no recovery tier (no live replica, "
                "snapshot or checkpoint of the resume step)",
                retry=True,
            )
            return
        committed = self._roster.committed(survivors, epoch)
        resume = min(committed, default=0)
        if survivors and resume >= self._job.steps:
            self._set(statuses.Phase.SUCCEEDED, f"trained {self._job.steps} steps")
            return
        move = self._decide(running, failed, survivors, now)
        if move is None:
            return
        if move.needs_snapshot:
            snapshot = self._roster.snapshot_step(survivors)
            if snapshot is None or snapshot > resume:
                self._suspend(
                    running,
                    "a lost layer has no live replica and no host-memory "
                    "snapshot to restore it from",
                    retry=True,
                )
                return
            resume = snapshot
        self._failures += 1 if failed else 0
        record = statuses.Recovery(
            started_s=death_at,
            failed=tuple(sorted(failed)),
            epoch=epoch + 1,
            tier=messages.RecoveryTier.KEPT,
            kind=move.kind,
            reason=move.reason,
            detect_s=max(0.0, noticed - death_at),
            plan_s=self._clock.monotonic() - now,
            lost_steps=max(committed, default=resume) - resume,
        )
        await self._open(move, resume, record=record)

    async def _settle(self, running: plans.Plan, epoch: int) -> set[plans.WorkerId]:
        """Wait until the epoch's live workers have all stopped (FAILED, FINISHED, PAUSED), at
        most a step timeout and a heartbeat timeout; the ones still not settled then."""
        deadline = (
            self._clock.monotonic() + self._job.step_timeout_s + self._job.heartbeat_timeout_s
        )
        while True:
            now = self._clock.monotonic()
            waiting = {
                w
                for w in set(running.workers) - self._roster.gone(running.workers, now)
                if (b := self._roster.beat(w, epoch)) is None or b.state not in membership.SETTLED
            }
            if not waiting or now >= deadline:
                return waiting
            await self._next(min(self._job.heartbeat_interval_s, deadline - now))

    def _decide(
        self,
        running: plans.Plan,
        failed: set[plans.WorkerId],
        survivors: set[plans.WorkerId],
        now: float,
    ) -> planning.Move | None:
        """The planner's move, or None after suspending when it has none."""
        assert self._planner is not None, "deciding needs the planner"
        if not survivors:
            self._suspend(running, "every worker of the plan is lost", retry=False)
            return None
        if not failed:  # everyone alive, the epoch broke anyway: the same plan, a new group
            reason = "every worker is alive but the epoch's group broke; the same plan regroups"
            return planning.Move(plan=running, transfers=(), kind="restart", reason=reason)
        spare = self._roster.live(now) - set(running.workers)
        try:
            return self._planner.recover(running, failed, spare, self._time_to_failure())
        except errors.InfeasibleError as exc:
            self._suspend(
                running, f"no plan for the {len(survivors)} surviving workers: {exc}", retry=False
            )
            return None

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
        assert self._plan is not None and self._planner is not None, "evacuating needs a plan"
        noticed = self._roster.notices & set(self._plan.workers)
        self._roster.notices -= noticed
        switch = self._switch_step()
        now = self._clock.monotonic()
        if switch is None:
            return  # the job ends first; if a worker goes before, it is a plain failure
        spare = self._roster.live(now) - set(self._plan.workers)
        try:
            move = self._planner.recover(self._plan, noticed, spare, self._time_to_failure())
        except errors.InfeasibleError as exc:
            LOG.warning("no plan without workers %s ahead of preemption: %s", sorted(noticed), exc)
            return
        if move.needs_snapshot:
            return  # some layer would have no replica left: recover when the worker goes
        reason = f"preemption notice for worker(s) {sorted(noticed)}: {move.reason}"
        record = self._planned_record(move, reason, tuple(sorted(noticed)), now)
        await self._open(move, switch, record=record, planned=True)

    async def _scale_up(self) -> None:
        """Workers joined: at a future step boundary, move to the templates' best plan over
        every live worker, copying their layers from the current holders."""
        assert self._plan is not None and self._planner is not None, "scaling needs a plan"
        arrivals, self._arrivals = self._arrivals, set()
        now = self._clock.monotonic()
        live = self._roster.live(now)
        switch = self._switch_step()
        if switch is None or not arrivals & live:
            return
        try:
            move = self._planner.grow(self._plan, live)
        except errors.PlannerError as exc:
            LOG.info("no larger plan with workers %s: %s", sorted(arrivals), exc)
            return
        if set(move.plan.workers) == set(self._plan.workers):
            return  # the templates' best plan is the running one: they stay spares
        record = self._planned_record(
            move, f"workers {sorted(arrivals)} joined: {move.reason}", (), now
        )
        await self._open(move, switch, record=record, planned=True)

    def _planned_record(
        self, move: planning.Move, reason: str, failed: tuple[plans.WorkerId, ...], now: float
    ) -> statuses.Recovery:
        return statuses.Recovery(
            started_s=now,
            failed=failed,
            epoch=self._epoch + 1,
            tier=messages.RecoveryTier.KEPT,
            kind=move.kind,
            reason=reason,
        )

    def _switch_step(self) -> int | None:
        """The step a planned switch happens after: far enough ahead that every agent is still
        before it when the Configure arrives, near enough that the new workers' rendezvous does
        not time out; None when the job ends first."""
        assert self._plan is not None, "a switch needs a plan"
        current = max(self._roster.committed(self._plan.workers, self._epoch), default=0)
        step_s = self._step_s()
        lead_s = min(PLANNED_LEAD_S, self._job.step_timeout_s / 2)
        lead = MIN_LEAD_STEPS if step_s <= 0 else max(MIN_LEAD_STEPS, math.ceil(lead_s / step_s))
        switch = current + lead
        return switch if switch < self._job.steps else None

    def _step_s(self) -> float:
        """The observed seconds per step: between the epoch's last two records, else the
        agents' own step timings."""
        recent = [r for r in self._steps[-2:] if r.epoch == self._epoch]
        if len(recent) == 2 and recent[1].step > recent[0].step:
            return (recent[1].at_s - recent[0].at_s) / (recent[1].step - recent[0].step)
        assert self._plan is not None, "step times need a plan"
        beats = (self._roster.beat(w, self._epoch) for w in self._plan.workers)
        return max((b.timings.step_s for b in beats if b is not None), default=0.0)

    # -- epochs -------------------------------------------------------------------------------

    async def _begin(self) -> None:
        """The first epoch: the templates' best plan over the workers that came up."""
        assert self._planner is not None, "planning needs the planner"
        live = self._roster.live(self._clock.monotonic())
        move = self._planner.best(live, "initial")
        await self._open(move, 0)

    async def _open(
        self,
        move: planning.Move,
        resume_step: int,
        *,
        record: statuses.Recovery | None = None,
        planned: bool = False,
    ) -> None:
        """Configure epoch E+1 of `move` resuming after `resume_step`, then wait (bounded)
        until every worker runs in it. Trouble on the way is left to the next pass."""
        assert self._planner is not None, "opening an epoch needs the planner"
        old = self._plan
        self._epoch += 1
        configs = epochs.configs(
            epoch=self._epoch,
            plan=move.plan,
            transfers=move.transfers,
            resume_step=resume_step,
            job=self._job,
            store=self._backend.store,
        )
        running = set(old.workers) if planned and old is not None else set()
        self._roster.switching = running & set(configs)
        now = self._clock.monotonic()
        if record is not None:
            self._pending = self._merged(record, now, resume_step)
        self._plan, self._kind, self._resume_step = move.plan, move.kind, resume_step
        self._set(
            statuses.Phase.RECOVERING if record else self._phase, f"opening epoch {self._epoch}"
        )
        # agents that are running must accept before they pass the switch step: first
        first = {w: c for w, c in configs.items() if w in running}
        then = {w: c for w, c in configs.items() if w not in running}
        refused = await self._configure_all(first) | await self._configure_all(then)
        self._roster.faulty |= refused
        if refused:
            return
        self._planner.prepare(move.plan)
        await self._commit(resume_step)

    def _merged(self, record: statuses.Recovery, now: float, resume_step: int) -> _Pending:
        """The pending recovery; a failure before the previous one finished extends it."""
        death_at, previous = record.started_s, self._pending
        if previous is not None:
            death_at = min(death_at, previous.death_at)
            lost = tuple(sorted({*previous.record.failed, *record.failed}))
            record = dataclasses.replace(
                record,
                started_s=death_at,
                failed=lost,
                detect_s=previous.record.detect_s,
                plan_s=previous.record.plan_s + record.plan_s,
                lost_steps=max(previous.record.lost_steps, record.lost_steps),
            )
        return _Pending(
            record=record, death_at=death_at, configured_at=now, resume_step=resume_step
        )

    async def _configure_all(
        self, configs: dict[plans.WorkerId, messages.WorkerConfig]
    ) -> set[plans.WorkerId]:
        """Send every Configure at once; the workers that refused or could not be reached."""
        answers = await asyncio.gather(*(self._configure(c) for c in configs.values()))
        return {w for w, ok in zip(configs, answers, strict=True) if not ok}

    async def _configure(self, config: messages.WorkerConfig) -> bool:
        agent = self._agents.get(config.worker)
        if agent is None:
            return False
        try:
            ack = await bounded(self._clock, agent.configure(config), self._job.configure_timeout_s)
        except (ports.AgentUnreachable, Unbounded) as exc:
            LOG.warning(
                "worker %d: Configure of epoch %d failed: %s", config.worker, config.epoch, exc
            )
            self._roster.dead.setdefault(config.worker, self._clock.monotonic())
            return False
        if not ack.accepted:
            LOG.warning("worker %d refused epoch %d: %s", config.worker, config.epoch, ack.reason)
        return ack.accepted

    async def _commit(self, resume_step: int) -> None:
        """Wait until every worker of the epoch runs in it (or finished), bounded by the time
        to reach the switch step plus the Configure and step timeouts; workers not running by
        then are faulty. A death or failure on the way ends the wait early."""
        assert self._plan is not None, "committing needs a plan"
        workers, epoch = self._plan.workers, self._epoch
        current = max(self._roster.committed(workers, epoch), default=resume_step)
        ahead_s = max(0, resume_step - current) * max(self._step_s(), 0.0)
        deadline = self._clock.monotonic() + ahead_s + self._job.configure_timeout_s
        deadline += self._job.step_timeout_s
        while True:
            now = self._clock.monotonic()
            if self._roster.gone(workers, now) or self._roster.failed_in(workers, epoch):
                return
            late = {w for w in workers if not self._running_in(w, epoch)}
            if not late:
                self._roster.switching = set()
                self._set(statuses.Phase.RUNNING, f"epoch {epoch} running: {self._summary()}")
                return
            if now >= deadline:
                LOG.warning("workers %s never ran in epoch %d", sorted(late), epoch)
                self._roster.faulty |= late
                return
            await self._next(min(self._job.heartbeat_interval_s, deadline - now))

    def _running_in(self, worker: plans.WorkerId, epoch: int) -> bool:
        beat = self._roster.beat(worker, epoch)
        running = (messages.AgentState.RUNNING, messages.AgentState.FINISHED)
        return beat is not None and beat.epoch == epoch and beat.state in running

    # -- suspended ------------------------------------------------------------------------------

    def _suspend(self, running: plans.Plan, what: str, *, retry: bool) -> None:
        """No way forward with these workers: say what is lost and what would resume it.
        `retry`: a checkpoint older than the failed resume step may be tried at once."""
        assert self._planner is not None, "suspending needs the planner"
        now = self._clock.monotonic()
        self._checkpoint = self._roster.checkpoint_step(running.workers)
        self._suspended_at = now
        self._retry = retry and self._checkpoint is not None
        self._pending = None
        live = len(self._roster.live(now))
        where = (
            f"the latest persistent checkpoint is step {self._checkpoint}"
            if self._checkpoint is not None
            else "there is no persistent checkpoint, so training restarts from step 0"
        )
        self._set(
            statuses.Phase.SUSPENDED,
            f"suspended: {what}; {where}; it resumes from there once {self._planner.min_workers} "
            f"workers are live ({live} now): start or return workers",
        )

    async def _try_resume(self) -> None:
        """Resume from the checkpoint when workers joined (or a checkpoint can be retried)."""
        assert self._planner is not None, "resuming needs the planner"
        now = self._clock.monotonic()
        live = self._roster.live(now)
        if not (self._arrivals or self._retry) or len(live) < self._planner.min_workers:
            return
        try:
            move = self._planner.best(live, "resume")
        except errors.PlannerError as exc:
            self._message = f"{self._message} (still no plan: {exc})"
            return
        step = self._checkpoint or 0
        self._arrivals, self._retry = set(), False
        record = statuses.Recovery(
            started_s=self._suspended_at,
            failed=(),
            epoch=self._epoch + 1,
            tier=messages.RecoveryTier.CHECKPOINT,
            kind="resume",
            reason=f"resumed from checkpoint step {step}: {move.reason}",
        )
        await self._open(move, step, record=record)

    # -- progress and status ------------------------------------------------------------------

    def _progress(self) -> None:
        """Record the epoch's newest committed step; finish the pending recovery at its first."""
        if self._plan is None:
            return
        beats = [b for w in self._plan.workers if (b := self._roster.beat(w, self._epoch))]
        beats = [b for b in beats if b.epoch == self._epoch]
        step = max((b.last_committed_step for b in beats), default=0)
        last = self._steps[-1] if self._steps else None
        if step <= self._resume_step or (last and (last.epoch, last.step) == (self._epoch, step)):
            return
        now = self._clock.monotonic()
        self._steps.append(
            statuses.StepRecord(
                at_s=now,
                step=step,
                loss=next(
                    (b.loss for b in beats if b.last_committed_step == step and b.loss is not None),
                    None,
                ),
                samples_per_s=self._rate(last, step, now, beats),
                live_workers=len(self._plan.workers),
                epoch=self._epoch,
            )
        )
        self._finish_recovery(beats, now)

    def _rate(
        self,
        last: statuses.StepRecord | None,
        step: int,
        now: float,
        beats: list[messages.Heartbeat],
    ) -> float:
        batch = self._job.training.global_batch_size
        if last is not None and last.epoch == self._epoch and step > last.step and now > last.at_s:
            return batch * (step - last.step) / (now - last.at_s)
        step_s = max((b.timings.step_s for b in beats), default=0.0)
        return batch / step_s if step_s > 0 else 0.0

    def _finish_recovery(self, beats: list[messages.Heartbeat], now: float) -> None:
        pending = self._pending
        if pending is None or pending.record.epoch != self._epoch:
            return
        setups = {b.worker: b.setup for b in beats if b.setup and b.setup.epoch == self._epoch}
        combined = epochs.combine(setups)
        tier = combined.tier if setups else pending.record.tier
        self._recoveries.append(
            dataclasses.replace(
                pending.record,
                tier=tier,
                regroup_s=combined.regroup_s,
                transfer_s=combined.transfer_s,
                resume_s=now - pending.configured_at,
                total_s=now - pending.death_at,
                transferred_bytes=combined.received_bytes,
            )
        )
        self._pending = None

    def _set(self, phase: statuses.Phase, message: str) -> None:
        if (phase, message) != (self._phase, self._message):
            LOG.info("%s: %s", phase, message)
        self._phase, self._message = phase, message

    def _summary(self) -> str:
        return statuses.plan_summary(self._plan, self._kind)

    def _view(self) -> statuses.View:
        now = self._clock.monotonic()
        live = self._roster.live(now)
        last = self._steps[-1] if self._steps else None
        in_plan = live & set(self._plan.workers) if self._plan is not None else live
        return statuses.View(
            phase=self._phase,
            epoch=self._epoch,
            step=last.step if last else 0,
            loss=last.loss if last else None,
            samples_per_s=last.samples_per_s if last else 0.0,
            live_workers=len(in_plan),
            total_workers=self._job.workers,
            plan=self._plan,
            plan_kind=self._kind,
            recoveries=tuple(self._recoveries),
            message=self._message,
            checkpoint_step=self._checkpoint,
        )

    async def _publish(self) -> None:
        if self._sink is not None:
            await self._sink.publish(self.status)
