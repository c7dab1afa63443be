"""Reading a broken epoch: who failed, who survived, where training resumes (pure).

After the controller has waited (bounded) for the epoch's workers to settle, `assess` splits
the plan's workers into the failed (dead, silent, faulty, broken by an error of their own, or
still not settled past the bound) and the survivors (stopped on a lost or hung peer: the
lockstep commit barrier leaves them all at the same last committed step c, or some at c + 1
when the death hit the barrier itself), and takes the resume step as the survivors' oldest
committed step. The ones ahead then roll back from the snapshot tiers, which need not hold that
step (their snapshot of it may have failed, been skipped or not be due): `recovery` resumes
only at a step every survivor reports holding (`recovery.rolls_back`).

An error an agent latched of its own is read here too: `job_error` words one that ends the job
(a permanent kind, or one that came back after the bounded retry) for the status (`ended` one
that ended the run before any agent's: no plan, no answer, an invalid job), `retried`
makes the live workers of an epoch that no one survived its survivors for that retry, and
`without_survivors` says truthfully why no worker survived (lost, or alive but given up on).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from planaria.contract import errors
from planaria.contract import plan as plans
from planaria.control import connections, membership
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
    *,
    opened_at: int = 0,
) -> Assessment:
    """The assessment of `epoch` of `running`, which resumed after step `opened_at`, at `now`
    (module docstring). A survivor that reports step 0 in an epoch opened after a later step
    holds no layer at all (a fresh agent process whose first set-up failed: an agent reports
    the step its layers are at): it does not pull the resume step down to 0; its layers come
    from the others' replicas or snapshots at their step, as a newcomer's do."""
    workers = running.workers
    failed = frozenset(
        roster.gone(workers, now) | roster.own_faults(workers, epoch) | set(unsettled)
    )
    survivors = frozenset(workers) - failed
    committed = roster.committed(survivors, epoch)
    holding = [step for step in committed if step > 0 or opened_at == 0]
    resume = min(holding or committed, default=0)
    return Assessment(
        failed=failed,
        survivors=survivors,
        death_at=min((roster.beat_at.get(w, now) for w in failed), default=now),
        newest_step=max(committed, default=resume),
        resume_step=resume,
        state_lost=messages.ErrorKind.SNAPSHOT_UNAVAILABLE in roster.latched(survivors, epoch),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobError:
    """An agent's error that ends the job: the Failed condition's CamelCase `reason` and the
    status message, which names the workers and says what they latched."""

    reason: str
    message: str


REASONS = {
    messages.ErrorKind.INVALID_DATA: "InvalidData",
    messages.ErrorKind.INVALID_CONFIG: "InvalidConfig",
    messages.ErrorKind.OUT_OF_MEMORY: "OutOfMemory",
    messages.ErrorKind.INTERNAL: "AgentError",
}
_WHAT = {
    messages.ErrorKind.INVALID_DATA: "the job's data cannot be read",
    messages.ErrorKind.INVALID_CONFIG: "the job's settings or plan cannot be used",
    messages.ErrorKind.OUT_OF_MEMORY: "out of memory",
    messages.ErrorKind.INTERNAL: "an internal error",
}


def job_error(
    roster: membership.Roster,
    workers: Collection[plans.WorkerId],
    epoch: int,
    kinds: Collection[messages.ErrorKind],
) -> JobError | None:
    """The error of one of `kinds` that the lowest of `workers` latched in `epoch`, naming
    every worker that latched the same (None when none did)."""
    latched = roster.errors(workers, epoch, kinds)
    if not latched:
        return None
    first = latched[0][1]
    same = sorted({w for w, e in latched if (e.kind, e.message) == (first.kind, first.message)})
    who = f"worker {same[0]}" if len(same) == 1 else f"workers {','.join(map(str, same))}"
    what = _WHAT.get(first.kind, first.kind.value)
    return JobError(
        reason=REASONS.get(first.kind, "AgentError"), message=f"{who}: {what}: {first.message}"
    )


def retried(
    roster: membership.Roster, found: Assessment, own: Collection[plans.WorkerId], epoch: int
) -> Assessment:
    """`found`, an epoch no worker survived, with the live workers that latched an error of
    their own (`own`) taken as its survivors: they hold their layers at their last committed
    step, the oldest of which is where the retry resumes."""
    committed = roster.committed(own, epoch)
    resume = min(committed, default=0)
    return dataclasses.replace(
        found,
        failed=found.failed - frozenset(own),
        survivors=frozenset(own),
        newest_step=max(committed, default=resume),
        resume_step=resume,
    )


def without_survivors(
    roster: membership.Roster, failed: Collection[plans.WorkerId], now: float
) -> str:
    """Why no worker of a plan survived, truthfully: "lost" only for the dead and silent."""
    lost = sorted(w for w in failed if w in roster.dead or roster.silent(w, now))
    kept = sorted(set(failed) - set(lost))
    if not kept:
        return "every worker of the plan is lost"
    alive = (
        f"workers {kept} are alive but were given up on (a refused or unanswered Configure, "
        "or not stopped in time)"
    )
    return f"workers {lost} are lost and {alive}" if lost else f"every worker failed: {alive}"


def unsettled(
    roster: membership.Roster, running: plans.Plan, epoch: int, now: float
) -> set[plans.WorkerId]:
    """Workers of the epoch, neither gone nor stopped (FAILED, FINISHED, PAUSED) in it."""
    return {
        w
        for w in set(running.workers) - roster.gone(running.workers, now)
        if (b := roster.beat(w, epoch)) is None or b.state not in membership.SETTLED
    }


_SETTING_UP = frozenset({messages.AgentState.CONFIGURING, messages.AgentState.TRANSFERRING})


def setting_up(
    roster: membership.Roster, workers: Collection[plans.WorkerId], epoch: int
) -> set[plans.WorkerId]:
    """Those of `workers` whose last heartbeat says they still set `epoch` up."""
    return {
        w for w in workers if (b := roster.beat(w, epoch)) is not None and b.state in _SETTING_UP
    }


def ended(exc: Exception) -> JobError:
    """The error that ended a job's run before any agent's: no plan fits (the planner's
    error), an agent never answered (`connections.Unbounded`), or the job is invalid."""
    if isinstance(exc, errors.PlannerError):
        reason = "NoFeasiblePlan"
    else:
        reason = "Unresponsive" if isinstance(exc, connections.Unbounded) else "InvalidJob"
    return JobError(reason=reason, message=str(exc))
