"""Reading a broken epoch: who failed, who survived, where training resumes (pure).

After the controller has waited (bounded) for the epoch's workers to settle, `assess` splits
the plan's workers into the failed (dead, silent, faulty, broken by an error of their own, or
still not settled past the bound) and the survivors (stopped on a lost or hung peer: the
lockstep commit barrier leaves them all at the same last committed step c, or some at c + 1
when the death hit the barrier itself), and takes the resume step as the survivors' oldest
committed step: rolling the others back one step is covered by their own snapshots.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from planaria.control import membership
from planaria.planner import plan as plans
from planaria.wire import messages


@dataclass(frozen=True, slots=True, kw_only=True)
class Assessment:
    """A broken epoch: `failed` and `survivors` of its plan, the last sign of life of the
    failed (`death_at`, clock seconds), the survivors' newest committed step and the resume
    step, and whether a survivor latched that some layer is in no recovery tier."""

    failed: frozenset[plans.WorkerId]
    survivors: frozenset[plans.WorkerId]
    death_at: float
    newest_step: int
    resume_step: int
    state_lost: bool


def assess(
    roster: membership.Roster,
    running: plans.Plan,
    epoch: int,
    unsettled: Collection[plans.WorkerId],
    now: float,
) -> Assessment:
    """The assessment of `epoch` of `running` at `now` (module docstring)."""
    workers = running.workers
    failed = frozenset(
        roster.gone(workers, now) | roster.own_faults(workers, epoch) | set(unsettled)
    )
    survivors = frozenset(workers) - failed
    committed = roster.committed(survivors, epoch)
    resume = min(committed, default=0)
    return Assessment(
        failed=failed,
        survivors=survivors,
        death_at=min((roster.beat_at.get(w, now) for w in failed), default=now),
        newest_step=max(committed, default=resume),
        resume_step=resume,
        state_lost=messages.ErrorKind.SNAPSHOT_UNAVAILABLE in roster.latched(survivors, epoch),
    )


def unsettled(
    roster: membership.Roster, running: plans.Plan, epoch: int, now: float
) -> set[plans.WorkerId]:
    """Workers of the epoch, neither gone nor stopped (FAILED, FINISHED, PAUSED) in it."""
    return {
        w
        for w in set(running.workers) - roster.gone(running.workers, now)
        if (b := roster.beat(w, epoch)) is None or b.state not in membership.SETTLED
    }
