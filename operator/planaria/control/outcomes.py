"""What a concern of the controller decided, for the controller's pass to carry out.

`recovery`, `suspension` and `adoption` decide; only the controller acts on the job's phase and
opens epochs. Each of them answers with one `Outcome`:

    Open      open the next epoch with a move, resuming after a step (a recovery's record)
    Suspend   no way forward with the live workers: Suspended, saying what is lost
    Fail      an error that ends the job
    Succeed   the job's last step is committed
    CarryOn   the current epoch goes on: Running again in it
    Commit    wait (bounded) until every worker runs in the current epoch (an adopted one)
    None      nothing to do at this pass
"""

from __future__ import annotations

from dataclasses import dataclass

from planaria.contract import plan as plans
from planaria.control import failures, planning
from planaria.control import status as statuses


@dataclass(frozen=True, slots=True, kw_only=True)
class Open:
    """Open the next epoch with `move`, resuming after `resume_step`; `record` the recovery it
    makes (None: none, e.g. the first epoch); `why` a reason to open that is no recovery (an
    epoch opened again after a predecessor's stop): the job is Recovering while it opens, as
    with a record. `planned`: a switch at step `resume_step` while the running epoch trains on
    towards it."""

    move: planning.Move
    resume_step: int
    record: statuses.Recovery | None = None
    why: str = ""
    planned: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspend:
    """No way forward: suspend `running`, saying `what` is lost (`reason`: the Suspended
    condition's); `retry`: the checkpoint (older than the failed resume step) may be tried at
    once."""

    running: plans.Plan
    what: str
    reason: statuses.SuspendReason
    retry: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Fail:
    """End the job with `error`."""

    error: failures.JobError


@dataclass(frozen=True, slots=True, kw_only=True)
class Succeed:
    """The job's last step is committed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CarryOn:
    """The current epoch goes on: Running again in it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """Wait (bounded) until every worker runs in the current epoch, saying `why` meanwhile."""

    why: str


Outcome = Open | Suspend | Fail | Succeed | CarryOn | Commit | None
