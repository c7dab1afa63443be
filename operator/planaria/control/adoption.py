"""Adoption: an operator restarted mid-job takes over its predecessor's epoch.

The epoch driver journals every epoch before its Configures go out (`epochs`). A successor
given the `ports.EpochRecord` written last connects to the running agents, hears every one of
them (bounded), and `decide` (pure) says how to take the epoch over, and why (`take_over`
hands the record to the epoch driver and answers with the `outcomes.Outcome` of it):
- ADOPT: take the recorded epoch over without a Configure (no step is lost when every worker
  still runs in it) and wait, bounded like any new epoch, until every worker of the plan runs
  in it; a worker that failed meanwhile makes the epoch broken and the usual recovery follows;
- REOPEN: live workers do not train in the recorded epoch and none committed a step of it,
  so the old controller died while opening it; unless it was a planned switch, the same plan,
  copies and resume step (`reopening`) are opened again as the next epoch, on this
  controller's store. An epoch that committed steps did open (a step commits only when every
  worker of its group set it up): its workers that stopped since (a peer lost while no
  controller watched) make it broken once adopted, and the usual recovery resumes from the
  survivors' committed step instead of retraining from the record's resume step;
- UNKNOWN_PLAN: agents run an epoch newer than the record (its write failed three times), a
  plan the successor does not know: the job is Suspended, saying so.
Carrying the decision out (committing, opening, suspending) is the controller's.
"""

from __future__ import annotations

import logging
from collections.abc import Set
from enum import StrEnum

from planaria.contract import plan as plans
from planaria.control import epochs, membership, outcomes, planning, ports
from planaria.control import status as statuses

LOG = logging.getLogger(__name__)


class Takeover(StrEnum):
    """How a successor takes its predecessor's epoch over (module docstring)."""

    ADOPT = "adopt"
    REOPEN = "reopen"
    UNKNOWN_PLAN = "unknown-plan"


def decide(
    record: ports.EpochRecord, *, newest: int, unsettled: Set[plans.WorkerId], trained: bool
) -> tuple[Takeover, str]:
    """How to take `record`'s epoch over, and why: `newest` is the highest epoch any agent
    reports, `unsettled` the live workers of the plan not training in the recorded epoch,
    `trained` whether any worker committed a step of it (past its resume step)."""
    if newest > record.epoch:
        return Takeover.UNKNOWN_PLAN, (
            f"the agents run epoch {newest}, newer than the journalled epoch "
            f"{record.epoch} (its record was not written), so their plan is unknown"
        )
    if unsettled and not record.planned and not trained:
        return Takeover.REOPEN, (
            f"the previous controller stopped while opening epoch {record.epoch}"
        )
    return Takeover.ADOPT, f"adopting epoch {record.epoch}"


def reopening(record: ports.EpochRecord, reason: str) -> planning.Move:
    """The move that opens `record`'s epoch again (REOPEN): the same plan and copies. The
    predecessor stopped while opening it (after a failure, at the start or a resume): some
    workers never got its Configure, or set it up against the predecessor's rendezvous store,
    which may be gone with it; every worker takes the next epoch, whatever it reached."""
    return planning.Move(
        plan=record.plan, transfers=record.transfers, kind=record.kind, reason=reason
    )


def take_over(
    record: ports.EpochRecord, roster: membership.Roster, driver: epochs.Driver, now: float
) -> outcomes.Outcome:
    """Hand `record`'s epoch to `driver` (its heartbeats count from now on), and what to do
    about it, as `decide` says: Commit it, Open it again, or Suspend."""
    newest = max((b.epoch for b in roster.beats.values()), default=0)
    driver.adopt(record, newest=newest)
    unsettled = driver.not_running() & roster.live(now)
    committed = roster.committed(record.plan.workers, record.epoch)
    trained = any(step > record.resume_step for step in committed)
    how, why = decide(record, newest=newest, unsettled=unsettled, trained=trained)
    if how is Takeover.UNKNOWN_PLAN:
        unknown = statuses.SuspendReason.PLAN_UNKNOWN
        return outcomes.Suspend(running=record.plan, what=why, reason=unknown, retry=False)
    if how is Takeover.REOPEN:
        LOG.warning("%s (workers %s not training in it): opening it again", why, sorted(unsettled))
        return outcomes.Open(move=reopening(record, why), resume_step=record.resume_step, why=why)
    return outcomes.Commit(why=f"{why}: {statuses.plan_summary(record.plan, record.kind)}")
