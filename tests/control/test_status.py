"""The status value as a pure function of the controller's view (planaria.control.status).

Covers: the plan summary ("[4,4,3] dynamic"), every phase's conditions (Ready only when
training at full strength, Degraded when short of workers, Recovering and Suspended with their
reasons and the message, Failed with the controller's reason and the message, or a generic
reason when none was given), and the last recovery and count carried over.
"""

from __future__ import annotations

import pytest

from planaria.contract import plan as plans
from planaria.control import status
from planaria.wire import messages


def _plan(*sizes: int) -> plans.Plan:
    pipelines, next_worker = [], 0
    for size in sizes:
        stages = tuple(
            plans.Stage(layer_start=i, layer_stop=i + 1, workers=(plans.WorkerId(next_worker + i),))
            for i in range(size)
        )
        pipelines.append(plans.Pipeline(stages=stages, num_micro_batches=2))
        next_worker += size
    # pipelines must cover the same layers: pad shorter ones' last stage
    depth = max(sizes)
    padded = tuple(
        plans.Pipeline(
            stages=(
                *p.stages[:-1],
                plans.Stage(
                    layer_start=p.stages[-1].layer_start,
                    layer_stop=depth,
                    workers=p.stages[-1].workers,
                ),
            ),
            num_micro_batches=p.num_micro_batches,
        )
        for p in pipelines
    )
    return plans.Plan(pipelines=padded, micro_batch_size=1)


def _view(phase: status.Phase, live: int = 8, **changes: object) -> status.View:
    base: dict[str, object] = {
        "phase": phase,
        "epoch": 2,
        "step": 40,
        "loss": 1.5,
        "samples_per_s": 100.0,
        "live_workers": live,
        "total_workers": 8,
        "plan": _plan(4, 4),
        "plan_kind": "initial",
        "recoveries": (),
        "message": "a message",
    }
    base.update(changes)
    return status.View(**base)  # type: ignore[arg-type]


def _conditions(value: status.JobStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in value.conditions}


def test_the_plan_summary_counts_each_pipelines_workers_and_names_the_move() -> None:
    assert status.plan_summary(_plan(4, 4, 3), status.MoveKind.DYNAMIC) == "[4,4,3] dynamic"
    assert status.plan_summary(None, status.MoveKind.DYNAMIC) == ""


@pytest.mark.parametrize(
    "phase, live, expected",
    [
        (
            status.Phase.RUNNING,
            8,
            {"Ready": ("True", "Training"), "Degraded": ("False", "FullStrength")},
        ),
        (
            status.Phase.RUNNING,
            6,
            {"Ready": ("False", "Degraded"), "Degraded": ("True", "WorkersLost")},
        ),
        (
            status.Phase.RECOVERING,
            7,
            {"Ready": ("False", "Recovering"), "Recovering": ("True", "Reconfiguring")},
        ),
        (
            status.Phase.SUSPENDED,
            3,
            {"Suspended": ("True", "NoFeasiblePlan"), "Ready": ("False", "Suspended")},
        ),
        (
            status.Phase.SUCCEEDED,
            8,
            {"Ready": ("False", "Completed"), "Recovering": ("False", "Steady")},
        ),
        (
            status.Phase.PENDING,
            0,
            {"Ready": ("False", "Starting"), "Suspended": ("False", "Feasible")},
        ),
        (
            status.Phase.FAILED,
            8,
            {"Ready": ("False", "Failed"), "Failed": ("True", "Failed")},
        ),
        (
            status.Phase.RUNNING,
            8,
            {"Failed": ("False", "NoPermanentError")},
        ),
    ],
    ids=[
        "running at full strength is ready",
        "running short of workers is degraded, not ready",
        "recovering says so",
        "suspended says so",
        "succeeded is complete",
        "pending is starting",
        "failed without a reason given says Failed",
        "running has no permanent error",
    ],
)
def test_conditions_follow_the_phase_and_strength(
    phase: status.Phase, live: int, expected: dict[str, tuple[str, str]]
) -> None:
    value = status.compute(_view(phase, live))
    found = _conditions(value)
    assert {k: found[k] for k in expected} == expected
    types = [c.type for c in value.conditions]
    assert types == ["Ready", "Degraded", "Recovering", "Suspended", "Failed"]


def test_a_failed_job_says_why_in_its_failed_condition() -> None:
    cause = "workers 0,1: the job's data cannot be read: corpus path '/x' does not exist"
    view = _view(status.Phase.FAILED, message=cause, failure_reason="InvalidData")
    by_type = {c.type: c for c in status.compute(view).conditions}
    failed = by_type["Failed"]
    assert (failed.status, failed.reason, failed.message) == ("True", "InvalidData", cause)
    assert by_type["Suspended"].status == "False" and by_type["Suspended"].message == ""


def test_a_true_condition_carries_the_message_and_degraded_counts_workers() -> None:
    value = status.compute(_view(status.Phase.SUSPENDED, 3, message="suspended: no plan"))
    by_type = {c.type: c for c in value.conditions}
    assert by_type["Suspended"].message == "suspended: no plan"
    assert by_type["Degraded"].message == "3 of 8 workers training"
    assert by_type["Recovering"].message == ""


def test_the_last_recovery_and_the_count_come_from_the_history() -> None:
    first, second = (
        status.Recovery(
            started_s=float(i),
            failed=(plans.WorkerId(i),),
            epoch=i + 1,
            tier=messages.RecoveryTier.LIVE_REPLICA,
            kind=status.MoveKind.DYNAMIC,
            reason="r",
        )
        for i in (1, 2)
    )
    value = status.compute(_view(status.Phase.RUNNING, recoveries=(first, second)))
    assert value.last_recovery == second and value.recoveries == 2
    assert (value.epoch, value.step, value.loss, value.plan) == (2, 40, 1.5, "[4,4] initial")
