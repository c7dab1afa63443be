"""What the job did, for the status and the report: committed steps and finished recoveries.

`History` records a `StepRecord` whenever the current epoch commits a newer step, and turns a
pending recovery into a `Recovery` timed at its epoch's first committed step (`resume_s` from
the Configure, `total_s` from the death), with the workers' setup reports (costliest tier,
slowest regroup and transfer, bytes received) taken once every worker of the epoch has reported
its setup: heartbeats lag, and the first worker seen past the step need not be the one that
needed the costliest tier. A failure before a pending recovery resumed extends it (`begin`
merges): one recovery from the first death to the first step that followed; a planned switch
that merged one and was then given up gives it back (`give_up_switch`). `combine` reads an
epoch's setups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from planaria.contract import plan as plans
from planaria.control import status as statuses
from planaria.wire import messages

# How long after the first step a recovery waits for the setups of workers whose heartbeats
# have not arrived before it is recorded with those it has (a worker that died meanwhile).
SETUP_REPORTS_WAIT_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Pending:
    """A recovery waiting for its epoch's first committed step."""

    record: statuses.Recovery
    death_at: float
    configured_at: float
    resume_step: int
    first_step_at: float | None = None  # when the epoch's first step was seen committed
    setups: Mapping[plans.WorkerId, messages.EpochSetup] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class History:
    """Steps and recoveries of one job (module docstring)."""

    global_batch: int
    steps: list[statuses.StepRecord] = field(default_factory=list)
    recoveries: list[statuses.Recovery] = field(default_factory=list)
    pending: Pending | None = None
    # the unresumed recovery a planned switch's record took in (`give_up_switch`)
    merged: Pending | None = None

    def begin(self, record: statuses.Recovery, now: float, resume_step: int) -> None:
        """A recovery's epoch was configured at `now`; `record.started_s` is the death."""
        death_at, previous = record.started_s, self.pending
        if previous is not None and previous.first_step_at is not None:
            self._record(previous)  # it had resumed: this is a new recovery
            previous = None
        self.merged = previous if record.planned else None
        if previous is not None:
            death_at = min(death_at, previous.death_at)
            record = dataclasses.replace(
                record,
                started_s=death_at,
                failed=tuple(sorted({*previous.record.failed, *record.failed})),
                detect_s=previous.record.detect_s,
                stop_s=previous.record.stop_s + record.stop_s,
                plan_s=previous.record.plan_s + record.plan_s,
                lost_steps=max(previous.record.lost_steps, record.lost_steps),
                planned=previous.record.planned and record.planned,
            )
        self.pending = Pending(
            record=record, death_at=death_at, configured_at=now, resume_step=resume_step
        )

    def observe(
        self,
        beats: Sequence[messages.Heartbeat],
        *,
        epoch: int,
        resume_step: int,
        live_workers: int,
        now: float,
    ) -> None:
        """Take the heartbeats of `epoch`: record its newest committed step after
        `resume_step`, and finish the pending recovery of this epoch at its first."""
        step = max((b.last_committed_step for b in beats), default=0)
        self._finish(beats, epoch, now, live_workers, resumed=step > resume_step)
        last = self.steps[-1] if self.steps else None
        if step <= resume_step or (last is not None and (last.epoch, last.step) == (epoch, step)):
            return
        loss = next(
            (b.loss for b in beats if b.last_committed_step == step and b.loss is not None), None
        )
        self.steps.append(
            statuses.StepRecord(
                at_s=now,
                step=step,
                loss=loss,
                samples_per_s=self._rate(last, step, epoch, now, beats),
                live_workers=live_workers,
                epoch=epoch,
            )
        )

    def step_s(self, epoch: int, beats: Sequence[messages.Heartbeat]) -> float:
        """Seconds per step: between the epoch's last two records, else the agents' timings
        (0.0 when unknown)."""
        recent = [r for r in self.steps[-2:] if r.epoch == epoch]
        if len(recent) == 2 and recent[1].step > recent[0].step:
            return (recent[1].at_s - recent[0].at_s) / (recent[1].step - recent[0].step)
        return _timed_step_s(beats)

    def latest_step_s(self) -> float:
        """Seconds per step between the newest two records of one epoch, whichever epoch that
        is (0.0 when none): the pace a new epoch, which has no step time of its own yet, is
        likely to keep (a planned switch's lead in steps, `switches`)."""
        for older, newer in zip(reversed(self.steps[:-1]), reversed(self.steps), strict=False):
            if older.epoch == newer.epoch and newer.step > older.step:
                return (newer.at_s - older.at_s) / (newer.step - older.step)
        return 0.0

    def _rate(
        self,
        last: statuses.StepRecord | None,
        step: int,
        epoch: int,
        now: float,
        beats: Sequence[messages.Heartbeat],
    ) -> float:
        if last is not None and last.epoch == epoch and step > last.step and now > last.at_s:
            return self.global_batch * (step - last.step) / (now - last.at_s)
        step_s = _timed_step_s(beats)
        return self.global_batch / step_s if step_s > 0 else 0.0

    def _finish(
        self,
        beats: Sequence[messages.Heartbeat],
        epoch: int,
        now: float,
        workers: int,
        *,
        resumed: bool,
    ) -> None:
        """Time the pending recovery of `epoch` at its first step; record it once every
        worker's setup report is in (or SETUP_REPORTS_WAIT_S later, with those there are)."""
        pending = self.pending
        if pending is None or pending.record.epoch != epoch:
            return
        seen = {b.worker: b.setup for b in beats if b.setup and b.setup.epoch == epoch}
        first = pending.first_step_at
        if first is None and resumed:
            first = now
        pending = dataclasses.replace(
            pending, first_step_at=first, setups={**pending.setups, **seen}
        )
        self.pending = pending
        if first is None:
            return
        if len(pending.setups) >= workers or now - first >= SETUP_REPORTS_WAIT_S:
            self._record(pending)

    def give_up_switch(self, now: float) -> None:
        """A planned switch was given up (`switches`: it came too late) and its workers train
        on in the epoch before it: its record goes, and a recovery it had taken in, not yet
        resumed when the switch began, is recorded on its own, timed at that epoch's first
        step recorded after its resume step (at `now` when none was), since it did resume."""
        merged, self.pending, self.merged = self.merged, None, None
        if merged is None:
            return
        epoch, resume_step = merged.record.epoch, merged.resume_step
        firsts = [r.at_s for r in self.steps if r.epoch == epoch and r.step > resume_step]
        first = merged.first_step_at or min(firsts, default=now)
        self._record(dataclasses.replace(merged, first_step_at=first))

    def settle(self) -> None:
        """Record a recovery that resumed but still waits for setup reports (the job ended)."""
        if self.pending is not None and self.pending.first_step_at is not None:
            self._record(self.pending)

    def _record(self, pending: Pending) -> None:
        assert pending.first_step_at is not None
        first, setups = pending.first_step_at, pending.setups
        combined = combine(setups)
        self.recoveries.append(
            dataclasses.replace(
                pending.record,
                tier=combined.tier if setups else pending.record.tier,
                regroup_s=combined.regroup_s,
                transfer_s=combined.transfer_s,
                resume_s=first - pending.configured_at,
                total_s=first - pending.death_at,
                transferred_bytes=combined.received_bytes,
            )
        )
        self.pending = self.merged = None  # what a switch had merged is in this record


def _timed_step_s(beats: Sequence[messages.Heartbeat]) -> float:
    """The slowest step time the agents report (0.0 when none)."""
    return max((b.timings.step_s for b in beats), default=0.0)


costliest = messages.costliest_tier  # the contract's own ordering of the tiers


@dataclass(frozen=True, slots=True, kw_only=True)
class Setups:
    """An epoch's setups over its workers: the costliest tier, the slowest regroup and
    transfer (workers set up in parallel), and the bytes received in all."""

    tier: messages.RecoveryTier
    regroup_s: float
    transfer_s: float
    received_bytes: int


def combine(setups: Mapping[plans.WorkerId, messages.EpochSetup]) -> Setups:
    """`Setups` of the workers' reports of one epoch."""
    values = list(setups.values())
    return Setups(
        tier=costliest(s.tier for s in values),
        regroup_s=max((s.regroup_s for s in values), default=0.0),
        transfer_s=max((s.transfer_s + s.load_s for s in values), default=0.0),
        received_bytes=sum(s.received_bytes for s in values),
    )
