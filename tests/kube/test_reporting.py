"""The CRD status and Events (`planaria.kube.reporting`).

Covered: a JobStatus becomes a status valid against `crd.StatusModel` (SpecValid plus the
controller's conditions, each with observedGeneration; lastRecovery with tier, seconds and
reason; workersReady; startTime once Running, completionTime at the end); lastTransitionTime is
kept while a condition's status stays and renewed when it flips; the Invalid status says what to
fix; `StatusWriter` writes at most once per interval unless the phase changed, skips equal
statuses, flushes the held-back one, offsets the recovery count by the previous status', sends
Recovered / PlanChanged / Succeeded Events only after a successful write (a scale-up is
ScaledUp, a planned move Moved, a resume "with no worker lost"; none says "losing workers []"),
rounds samplesPerSecond to one decimal for the printer column, and survives a failed
write (retrying with the next status); a job failed on an agent's error carries its cause in
the message, the Failed condition (with the controller's reason) and a Warning Event.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from planaria.control import status as statuses
from planaria.kube import api, crd, reporting
from planaria.wire import messages

Phase = statuses.Phase
T0 = datetime.datetime(2026, 11, 21, 12, 0, 0, tzinfo=datetime.UTC)
RECOVERY = statuses.Recovery(
    started_s=10.0,
    failed=(1,),  # type: ignore[arg-type]
    epoch=2,
    tier=messages.RecoveryTier.LIVE_REPLICA,
    kind=statuses.MoveKind.DYNAMIC,
    reason="dynamic beats reroute: 1.3x the throughput",
    detect_s=0.2,
    plan_s=0.01,
    total_s=1.5,
    lost_steps=1,
)


def _status(phase: Phase = Phase.RUNNING, **changes: Any) -> statuses.JobStatus:
    view: dict[str, Any] = {
        "phase": phase,
        "epoch": 1,
        "step": 5,
        "loss": 4.2,
        "samples_per_s": 12.5,
        "live_workers": 3,
        "total_workers": 3,
        "plan": None,
        "plan_kind": "initial",
        "recoveries": (),
        "message": f"{phase.value} now",
    }
    view.update(changes)
    return statuses.compute(statuses.View(**view))


def _valid(body: dict[str, Any]) -> crd.StatusModel:
    return crd.StatusModel.model_validate(body)


def test_a_running_status_is_valid_against_the_crd_model() -> None:
    body = reporting.status_body(
        _status(recoveries=(RECOVERY,)), generation=4, total_steps=10, at=T0
    )
    model = _valid(body)
    assert model.phase == "Running" and model.observed_generation == 4
    assert model.workers_ready == "3/3" and model.step == 5 and model.total_steps == 10
    types = [c.type for c in model.conditions]
    assert types == [reporting.SPEC_VALID, "Ready", "Degraded", "Recovering", "Suspended", "Failed"]
    assert all(c.observed_generation == 4 for c in model.conditions)
    assert model.last_recovery is not None
    assert model.last_recovery.tier == "live_replica"
    assert model.last_recovery.seconds == 1.5
    assert model.last_recovery.reason.startswith("dynamic beats reroute")
    assert model.last_recovery.failed_workers == [1]
    assert model.start_time == T0 and model.completion_time is None


def test_transition_times_are_kept_until_a_condition_flips() -> None:
    first = reporting.status_body(_status(), generation=1, total_steps=10, at=T0)
    later = T0 + datetime.timedelta(minutes=5)
    same = reporting.status_body(
        _status(step=6), generation=1, total_steps=10, previous=first, at=later
    )
    assert same["conditions"] == first["conditions"]
    assert same["startTime"] == first["startTime"]
    flipped = reporting.status_body(
        _status(Phase.RECOVERING), generation=1, total_steps=10, previous=first, at=later
    )
    times = {c["type"]: c["lastTransitionTime"] for c in flipped["conditions"]}
    assert times["Recovering"] == reporting.timestamp(later)
    assert times["Ready"] == reporting.timestamp(later)
    assert times["Degraded"] == reporting.timestamp(T0)


def test_a_finished_job_has_a_completion_time() -> None:
    body = reporting.status_body(_status(Phase.SUCCEEDED), generation=1, total_steps=5, at=T0)
    assert _valid(body).completion_time == T0


def test_an_invalid_spec_status_says_what_to_fix() -> None:
    body = reporting.invalid_body("spec.workers: give whole nodes", generation=2, at=T0)
    model = _valid(body)
    assert model.phase == "Invalid"
    (condition,) = model.conditions
    assert (condition.type, condition.status, condition.reason) == (
        reporting.SPEC_VALID,
        "False",
        "InvalidSpec",
    )
    assert condition.message == "spec.workers: give whole nodes"


class _Target:
    """Where a StatusWriter writes (a list) and emits (another), with a manual clock."""

    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.now = 0.0
        self.fail = False

    async def write(self, body: dict[str, Any]) -> None:
        if self.fail:
            raise api.KubeError("PATCH status", 500, "down")
        self.writes.append(body)

    def emit(self, kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))

    def writer(self, previous: dict[str, Any] | None = None) -> reporting.StatusWriter:
        return reporting.StatusWriter(
            write=self.write,
            emit=self.emit,
            generation=1,
            total_steps=10,
            previous=previous,
            min_interval_s=1.0,
            clock=lambda: self.now,
        )


@pytest.mark.asyncio
async def test_the_writer_throttles_but_never_holds_back_a_phase_change() -> None:
    target = _Target()
    writer = target.writer()
    await writer.publish(_status(step=1))
    await writer.publish(_status(step=2))  # within the interval: held back
    assert [w["step"] for w in target.writes] == [1]
    await writer.publish(_status(Phase.RECOVERING, step=2))  # a phase change: at once
    assert [w["phase"] for w in target.writes] == ["Running", "Recovering"]
    await writer.publish(_status(Phase.RECOVERING, step=3))
    await writer.flush()
    assert [w["step"] for w in target.writes] == [1, 2, 3]
    target.now = 5.0
    await writer.publish(_status(Phase.RECOVERING, step=3))  # nothing new: no write
    assert len(target.writes) == 3


@pytest.mark.asyncio
async def test_events_follow_successful_writes_of_recoveries_and_plan_changes() -> None:
    target = _Target()
    writer = target.writer()
    await writer.publish(_status())
    target.fail = True
    await writer.publish(_status(Phase.RECOVERING, recoveries=(RECOVERY,)))
    assert target.events == [] and len(target.writes) == 1
    target.fail = False
    await writer.publish(_status(Phase.RECOVERING, recoveries=(RECOVERY,)))
    assert [e[1] for e in target.events] == ["Recovered"]
    assert "live_replica" in target.events[0][2] and "[1]" in target.events[0][2]
    await writer.publish(_status(Phase.SUCCEEDED, recoveries=(RECOVERY,)))
    assert [e[:2] for e in target.events][-1] == ("Normal", "Succeeded")


@pytest.mark.asyncio
async def test_a_successor_counts_recoveries_on_from_the_previous_status() -> None:
    target = _Target()
    previous = reporting.status_body(
        _status(recoveries=(RECOVERY, RECOVERY)), generation=1, total_steps=10, at=T0
    )
    writer = target.writer(previous)
    await writer.publish(_status(Phase.RECOVERING))
    assert target.writes[-1]["recoveries"] == 2
    assert target.writes[-1]["lastRecovery"] == previous["lastRecovery"]
    await writer.publish(_status(Phase.RUNNING, recoveries=(RECOVERY,)))
    assert target.writes[-1]["recoveries"] == 3
    assert [e[1] for e in target.events] == ["Recovered"]


@pytest.mark.asyncio
async def test_a_job_failed_on_an_agents_error_says_why_in_its_status_and_an_event() -> None:
    target = _Target()
    writer = target.writer()
    await writer.publish(_status(Phase.PROFILING))
    cause = "workers 0,1: the job's data cannot be read: corpus path '/x' does not exist"
    await writer.publish(_status(Phase.FAILED, message=cause, failure_reason="InvalidData"))
    body = target.writes[-1]
    model = _valid(body)
    assert model.phase == "Failed" and model.message == cause
    failed = {c.type: c for c in model.conditions}["Failed"]
    assert (failed.status, failed.reason, failed.message) == ("True", "InvalidData", cause)
    assert model.completion_time is not None
    assert target.events[-1] == ("Warning", "Failed", cause)


def test_samples_per_second_is_rounded_to_one_decimal_for_the_printer_column() -> None:
    body = reporting.status_body(
        _status(samples_per_s=1234.5678901234567), generation=1, total_steps=10, at=T0
    )
    assert body["samplesPerSecond"] == 1234.6 and str(body["samplesPerSecond"]) == "1234.6"
    assert _valid(body).samples_per_second == 1234.6
    column = next(c for c in crd.PRINTER_COLUMNS if c["name"] == "Samples/s")
    assert column["jsonPath"] == ".status.samplesPerSecond"


def test_the_achieved_snapshot_interval_is_in_the_status() -> None:
    unknown = reporting.status_body(_status(), generation=1, total_steps=10, at=T0)
    assert unknown["snapshotIntervalSteps"] is None
    body = reporting.status_body(
        _status(snapshot_interval_steps=2.3456), generation=1, total_steps=10, at=T0
    )
    assert body["snapshotIntervalSteps"] == 2.35
    assert _valid(body).snapshot_interval_steps == 2.35


SCALE_UP = statuses.Recovery(
    started_s=20.0,
    failed=(),
    epoch=3,
    tier=messages.RecoveryTier.KEPT,
    kind=statuses.MoveKind.SCALE_UP,
    reason="workers [3] joined: [4,4] is the templates' best plan",
    planned=True,
)
PREEMPTION = statuses.Recovery(
    started_s=30.0,
    failed=(2,),  # type: ignore[arg-type]
    epoch=4,
    tier=messages.RecoveryTier.KEPT,
    kind=statuses.MoveKind.REROUTE,
    reason="preemption notice for worker(s) [2]: reroute keeps every layer",
    planned=True,
)
RESUME = statuses.Recovery(
    started_s=40.0,
    failed=(),
    epoch=5,
    tier=messages.RecoveryTier.CHECKPOINT,
    kind=statuses.MoveKind.RESUME,
    reason="resumed from checkpoint at step 30: [2,2] dynamic",
)


@pytest.mark.parametrize(
    ("recovery", "reason", "words", "not_words"),
    [
        (RECOVERY, "Recovered", ["recovery 1: dynamic", "after losing workers [1]"], []),
        (SCALE_UP, "ScaledUp", ["scaled up (epoch 3", "workers [3] joined"], ["losing"]),
        (PREEMPTION, "Moved", ["planned reroute move away from workers [2]"], ["losing"]),
        (RESUME, "Recovered", ["resume from tier checkpoint with no worker lost"], ["losing"]),
    ],
)
@pytest.mark.asyncio
async def test_recovery_events_are_worded_for_what_happened(
    recovery: statuses.Recovery, reason: str, words: list[str], not_words: list[str]
) -> None:
    target = _Target()
    writer = target.writer()
    await writer.publish(_status())
    await writer.publish(_status(Phase.RECOVERING, recoveries=(recovery,), plan=None))
    [(kind, sent, message)] = [e for e in target.events if e[1] != "PlanChanged"]
    assert (kind, sent) == ("Normal", reason)
    assert all(w in message for w in words), message
    assert not any(w in message for w in not_words), message
    assert "[]" not in message
