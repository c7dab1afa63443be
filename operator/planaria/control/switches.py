"""Planned switches: moves made at a future step boundary, while the running epoch trains on.

- A preemption notice (`Switches.evacuation`): the recovery the job's policy would make if the
  noticed workers failed, made ahead of the loss; none when a layer would lose its last replica
  (the workers' loss is then recovered as a failure).
- Workers that joined, or were heard again after a silence that the plan left out
  (`Switches.scale_up`): the templates' best plan over the live workers, the running ones
  keeping their layers and the new ones receiving copies, when it pays within the job's steps
  after the switch (`Planner.grow`; unweighed when the running plan does not train: some of
  its workers not training in its epoch, or the arrivals its own). A scale-up declined (or
  whose best plan is the running one) leaves the newcomers spares, and is not asked again
  until the live workers change: the arrivals are taken once (`membership.Roster.returned`),
  and with fewer steps left the same move pays even less.
The switch step (`switch_step`, pure) leads the running epoch's current step by PLANNED_LEAD_S
(at least MIN_LEAD_STEPS), so every agent is still before it when the Configure arrives; it is
taken once the planner answered (the running epoch trains on while the planner's thread
searches: a scale-up's search of 1.3 s made the switch late when the step was read first). A
switch that reaches agents already past its step (a stale view of the step on a loaded machine)
is given up without blaming them (`Switches.give_up_late`, `late_refusals`), and the next one
leads by twice as many steps, up to MAX_LEAD_SCALE times. Opening the epoch is the
controller's; a `Switch` carries what to put back for the next pass when it comes too late.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from planaria.contract import errors
from planaria.contract import plan as plans
from planaria.control import epochs, history, membership, outcomes, planning, ports
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.wire import messages

LOG = logging.getLogger(__name__)
PLANNED_LEAD_S = 1.0
MIN_LEAD_STEPS = 2
MAX_LEAD_SCALE = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Switch:
    """A planned move (`opening`); when it comes too late, the preemption notices of `leaving`
    and the arrivals `arrived` are handled again next pass."""

    opening: outcomes.Open
    leaving: frozenset[plans.WorkerId] = frozenset()
    arrived: frozenset[plans.WorkerId] = frozenset()


def switch_step(
    *, current: int, step_s: float, lead_scale: int, step_timeout_s: float, steps: int
) -> int | None:
    """The step a planned switch follows: far enough ahead of `current` that every agent is
    still before it when the Configure arrives, near enough that the new workers' rendezvous
    does not time out (half a step timeout); None when the job's last step comes first."""
    lead_s = min(PLANNED_LEAD_S * lead_scale, step_timeout_s / 2)
    least = MIN_LEAD_STEPS * lead_scale
    lead = least if step_s <= 0 else max(least, math.ceil(lead_s / step_s))
    return current + lead if current + lead < steps else None


# a worker at or past a switch step in its older epoch: still training, or done with the job
_PAST = (messages.AgentState.RUNNING, messages.AgentState.FINISHED)


def late_refusals(
    refused: set[plans.WorkerId],
    beats: Mapping[plans.WorkerId, messages.Heartbeat],
    *,
    epoch: int,
    switch: int,
) -> set[plans.WorkerId]:
    """Those of the workers that `refused` a switch after step `switch` only because they
    still train in an older epoch than `epoch` and already committed the switch step (or have
    since finished the job there: a Configure slow to arrive near the end)."""
    return {
        w
        for w in refused
        if (b := beats.get(w)) is not None
        and b.epoch < epoch
        and b.state in _PAST
        and b.last_committed_step >= switch
    }


class Switches:
    """One job's planned switches and their lead (module docstring)."""

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
        self.lead_scale = 1  # doubles after a planned switch that came too late

    async def evacuation(
        self, planner: planning.Planner, time_to_failure_s: float
    ) -> Switch | None:
        """Preemption notices of running workers: a move away from them (None: none yet). The
        planner decides on its executor, off the event loop (`Planner.call`)."""
        await planner.ready()  # the search ahead first: its wait spends no switch lead
        running = self._running()
        noticed = self._roster.take_notices(running.workers)
        switch, now = self._step(), self._clock.monotonic()
        if switch is None:
            return None  # the job ends first; if the worker goes before, it is a plain failure
        spare = self._roster.live(now) - set(running.workers)
        # a spare still setting an older epoch up would hold the move's rendezvous up to its
        # own rendezvous timeout (as in a recovery, `recovery.Handler._choose`)
        spare -= self._roster.setting_up(spare, before=self._epochs.next_epoch)
        try:
            move = await planner.call(
                planner.recover,
                running,
                noticed,
                spare,
                time_to_failure_s,
                self._job.steps - switch,
            )
        except errors.InfeasibleError as exc:
            LOG.warning("no plan without workers %s ahead of preemption: %s", sorted(noticed), exc)
            return None
        if move.needs_snapshot:
            return None  # a layer would lose its last replica: recover when the worker goes
        await self._epochs.next(0)  # training went on while the planner searched: what the
        switch = self._step()  # workers reported meanwhile, then the lead from their step
        if switch is None:
            return None
        reason = f"preemption notice for worker(s) {sorted(noticed)}: {move.reason}"
        record = self._planned(move, reason, noticed)
        opening = outcomes.Open(move=move, resume_step=switch, record=record, planned=True)
        return Switch(opening=opening, leaving=frozenset(noticed))

    async def scale_up(
        self, planner: planning.Planner, arrived: set[plans.WorkerId]
    ) -> Switch | None:
        """Workers `arrived`: a move to the templates' best plan over every live worker (None
        when there is no larger plan, no time left for one, or it does not pay within the
        job's steps after the switch). The planner decides on its executor, off the event
        loop (`Planner.call`)."""
        await planner.ready()  # the search ahead first: its wait spends no switch lead
        running = self._running()
        live = self._roster.live(self._clock.monotonic())
        switch = self._step()
        if switch is None or not arrived & live:
            return None
        busy = self._roster.setting_up(live, before=self._epochs.next_epoch)
        if busy & arrived:  # its Configure would wait behind that set-up: offered once over
            self._roster.arrive_again(arrived)
            return None
        live -= busy
        # Weighed only against a plan that trains: one whose workers do not all train in it
        # (an epoch given up, its workers arriving again) has nothing to stay on.
        steady = not self._epochs.not_running() and not arrived & set(running.workers)
        steps_left = self._job.steps - switch if steady else None
        try:
            move = await planner.call(planner.grow, running, live, steps_left)
        except errors.PlannerError as exc:
            LOG.info("no larger plan with workers %s: %s", sorted(arrived), exc)
            return None
        if set(move.plan.workers) == set(running.workers):
            # declined, or the templates' best plan is the running one: they stay spares
            LOG.info("workers %s stay spares: %s", sorted(arrived), move.reason)
            return None
        await self._epochs.next(0)  # training went on while the planner searched: what the
        switch = self._step()  # workers reported meanwhile, then the lead from their step
        if switch is None:
            return None
        reason = f"workers {sorted(arrived)} joined: {move.reason}"
        record = self._planned(move, reason, set())
        opening = outcomes.Open(move=move, resume_step=switch, record=record, planned=True)
        return Switch(opening=opening, arrived=frozenset(arrived))

    async def give_up_late(self) -> bool:
        """A planned switch refused only by agents that had already committed its step (the
        controller's view of the step was stale, e.g. on a loaded machine): not their fault.
        The switch is given up, they train on in their epoch, and the next try leads by twice
        as many steps. False when some refusal was a real one (the next pass recovers)."""
        await self._epochs.next(0)
        refused, switch = self._epochs.refused, self._epochs.resume_step
        late = late_refusals(refused, self._roster.beats, epoch=self._epochs.epoch, switch=switch)
        if not refused or late != refused:
            return False
        LOG.warning("planned switch at step %d came too late for workers %s", switch, sorted(late))
        assert self._epochs.plan is not None, "a planned switch has a plan"
        switched = set(self._epochs.plan.workers)
        self._epochs.flag_switch()
        self._roster.excuse(late)
        running = self._epochs.fall_back()
        # its newcomers set it up alone until the flag (or their rendezvous timeout) ends it
        self._roster.abandon(switched - set(running.workers), self._epochs.epoch)
        self._history.give_up_switch(self._clock.monotonic())
        self.lead_scale = min(2 * self.lead_scale, MAX_LEAD_SCALE)
        return True

    def _step(self) -> int | None:
        return switch_step(
            current=self._epochs.current_step(),
            # a new epoch has no step time yet: the pace of the last one that had
            step_s=self._epochs.step_s() or self._history.latest_step_s(),
            lead_scale=self.lead_scale,
            step_timeout_s=self._job.step_timeout_s,
            steps=self._job.steps,
        )

    def _running(self) -> plans.Plan:
        assert self._epochs.plan is not None, "a planned switch leaves a running plan"
        return self._epochs.plan

    def _planned(
        self, move: planning.Move, reason: str, leaving: set[plans.WorkerId]
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
