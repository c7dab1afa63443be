"""The job's status: a value computed from the controller's state on every pass, written once.

`JobStatus` is what the terminal shows, what metrics are drawn from, and what the Kubernetes
adapter writes to the CRD status (phase as a summary, conditions keyed by type, jobset-style).
`Recovery` and `StepRecord` are the history kept for the report.

`compute` is a pure function of a `View` (the controller's facts at one instant), so the status
of every situation is tested without running a controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from planaria.contract import plan as plans
from planaria.wire import messages


class Phase(StrEnum):
    """Where the job is, as one word."""

    PENDING = "Pending"
    PROFILING = "Profiling"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class SuspendReason(StrEnum):
    """Why a job is Suspended: its Suspended condition's reason."""

    STATE_LOST = "StateLost"  # a layer's state is in no host-memory tier: a checkpoint is next
    SNAPSHOT_CONFLICT = "SnapshotConflict"  # two copies of a snapshot member differ
    WORKERS_LOST = "WorkersLost"  # no worker of the plan survived
    NO_FEASIBLE_PLAN = "NoFeasiblePlan"  # no plan fits the surviving workers
    PLAN_UNKNOWN = "PlanUnknown"  # an adopted epoch's plan is not the one its workers run


class MoveKind(StrEnum):
    """How an epoch's plan was made: the kind of move that opened it."""

    INITIAL = "initial"  # the templates' best plan at the start
    DYNAMIC = "dynamic"  # Oobleck's reinstantiation after a failure (§5.1)
    REROUTE = "reroute"  # the layout kept, failed stages' micro-batches rerouted (ReCycle)
    SYMMETRIC = "symmetric"  # Odyssey's DP/PP candidates after a failure
    ASYMMETRIC = "asymmetric"
    RESTART = "restart"  # the same plan regroups, or the templates anew over the survivors
    SCALE_UP = "scale-up"  # a planned switch to a larger plan when workers joined
    RESUME = "resume"  # out of Suspended, from host-memory snapshots or a checkpoint


class ConditionType(StrEnum):
    """The conditions a status always carries, each True or False with a reason."""

    READY = "Ready"  # training at full strength
    DEGRADED = "Degraded"  # training with fewer workers than the job asked for
    RECOVERING = "Recovering"  # a failure or a join is being handled
    SUSPENDED = "Suspended"  # no way forward with the live workers (`SuspendReason` says why)
    FAILED = "Failed"  # ended on a permanent error, the reason saying which kind


@dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """One condition: `status` "True" or "False", a CamelCase `reason`, a sentence."""

    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """One recovery (or planned reconfiguration): when it started (clock seconds), the workers
    lost, the epoch it opened, the costliest tier any worker needed, the kind of move
    ("dynamic", "reroute", "restart", "scale-up", "resume"), the planner's reason, and its
    seconds: death to noticed (`detect_s`), the survivors stopping their failed step
    (`stop_s`), deciding (`plan_s`), the workers' slowest regroup
    and transfer, Configure to the first step committed in the new epoch (`resume_s`), and
    `total_s` from the death to that step. `lost_steps` were committed before and trained
    again; `transferred_bytes` moved between workers. `planned`: a switch at a future step
    boundary that lost nothing (a scale-up, or a move away from workers with a preemption
    notice, which `failed` then names)."""

    started_s: float
    failed: tuple[plans.WorkerId, ...]
    epoch: int
    tier: messages.RecoveryTier
    kind: MoveKind
    reason: str
    detect_s: float = 0.0
    stop_s: float = 0.0
    plan_s: float = 0.0
    regroup_s: float = 0.0
    transfer_s: float = 0.0
    resume_s: float = 0.0
    total_s: float = 0.0
    lost_steps: int = 0
    transferred_bytes: int = 0
    planned: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """A committed step as the controller saw it: when (clock seconds), its loss (None when
    unknown), samples per second since the previous record, and the epoch's live workers."""

    at_s: float
    step: int
    loss: float | None
    samples_per_s: float
    live_workers: int
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStatus:
    """The job's status (module docstring). `plan` summarises the plan, e.g. "[4,4,3] dynamic":
    the pipelines' worker counts and the kind of the move that made it. `snapshot_interval_steps`:
    the host-memory snapshots' achieved interval in the running epoch (steps between snapshots,
    above the configured one when the writers could not keep up; None while unknown)."""

    phase: Phase
    conditions: tuple[Condition, ...]
    epoch: int
    step: int
    loss: float | None
    samples_per_s: float
    live_workers: int
    total_workers: int
    plan: str
    last_recovery: Recovery | None
    recoveries: int
    message: str
    checkpoint_step: int | None = None
    snapshot_interval_steps: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    """The controller's facts at one instant, from which `compute` derives the status."""

    phase: Phase
    epoch: int
    step: int
    loss: float | None
    samples_per_s: float
    live_workers: int
    total_workers: int
    plan: plans.Plan | None
    plan_kind: MoveKind
    recoveries: tuple[Recovery, ...]
    message: str
    checkpoint_step: int | None = None
    failure_reason: str = ""  # CamelCase, why the job Failed ("" until it did)
    suspend_reason: SuspendReason = SuspendReason.NO_FEASIBLE_PLAN  # read while Suspended
    snapshot_interval_steps: float | None = None


def plan_summary(plan: plans.Plan | None, kind: MoveKind) -> str:
    """ "[4,4,3] dynamic": each pipeline's number of workers, then how the plan was made."""
    if plan is None:
        return ""
    counts = ",".join(str(len(p.workers)) for p in plan.pipelines)
    return f"[{counts}] {kind}".rstrip()


def compute(view: View) -> JobStatus:
    """The status of `view` (pure)."""
    return JobStatus(
        phase=view.phase,
        conditions=conditions(view),
        epoch=view.epoch,
        step=view.step,
        loss=view.loss,
        samples_per_s=view.samples_per_s,
        live_workers=view.live_workers,
        total_workers=view.total_workers,
        plan=plan_summary(view.plan, view.plan_kind),
        last_recovery=view.recoveries[-1] if view.recoveries else None,
        recoveries=len(view.recoveries),
        message=view.message,
        checkpoint_step=view.checkpoint_step,
        snapshot_interval_steps=view.snapshot_interval_steps,
    )


def conditions(view: View) -> tuple[Condition, ...]:
    """Ready, Degraded, Recovering, Suspended and Failed, each True or False with a reason."""
    training = view.phase is Phase.RUNNING
    short = view.live_workers < view.total_workers
    return (
        _condition(ConditionType.READY, training and not short, _ready_reason(view), view),
        _condition(ConditionType.DEGRADED, short, "WorkersLost" if short else "FullStrength", view),
        _condition(
            ConditionType.RECOVERING,
            view.phase is Phase.RECOVERING,
            "Reconfiguring" if view.phase is Phase.RECOVERING else "Steady",
            view,
        ),
        _condition(
            ConditionType.SUSPENDED,
            view.phase is Phase.SUSPENDED,
            view.suspend_reason.value if view.phase is Phase.SUSPENDED else "Feasible",
            view,
        ),
        _condition(
            ConditionType.FAILED,
            view.phase is Phase.FAILED,
            (view.failure_reason or "Failed") if view.phase is Phase.FAILED else "NoPermanentError",
            view,
        ),
    )


def _ready_reason(view: View) -> str:
    reasons = {
        Phase.PENDING: "Starting",
        Phase.PROFILING: "Profiling",
        Phase.RUNNING: "Training",
        Phase.RECOVERING: "Recovering",
        Phase.SUCCEEDED: "Completed",
        Phase.FAILED: "Failed",
        Phase.SUSPENDED: "Suspended",
    }
    if view.phase is Phase.RUNNING and view.live_workers < view.total_workers:
        return "Degraded"
    return reasons[view.phase]


def _condition(kind: ConditionType, true: bool, reason: str, view: View) -> Condition:
    message = view.message if true else ""
    if kind is ConditionType.DEGRADED and true:
        message = f"{view.live_workers} of {view.total_workers} workers training"
    return Condition(
        type=kind.value, status="True" if true else "False", reason=reason, message=message
    )
