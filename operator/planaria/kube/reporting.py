"""The job's status as the ResilientJob's `status` (a `ports.StatusSink`), and the Kubernetes
Events that go with it.

    writer = StatusWriter(write=patch_status, emit=post_event, generation=3, total_steps=100,
                          previous=body.get("status"))
    controller = Controller(..., sink=writer)

`status_body` turns a `planaria.control.status.JobStatus` into the CRD's status (camelCase, the
shape of `planaria.kube.crd.StatusModel`): the controller's conditions plus `SpecValid`, each
with `observedGeneration` and a `lastTransitionTime` kept from the previous status while the
condition's status stays the same (Kubernetes conventions, STYLE rule 5). `invalid_body` is the
status of a spec that cannot run: phase Invalid and SpecValid False with what to fix.

`StatusWriter.publish` writes at most once per `min_interval_s` (default 1 s) unless the phase
changed, skips a status equal to the last one written, and only after a write succeeded sends
the Events it implies: for each new recovery `Recovered` (workers lost), `ScaledUp` (workers
added at a planned step) or `Moved` (a planned move away from workers with a preemption
notice), worded by `recovery_event`; `PlanChanged` when the plan summary changed, `Succeeded` /
`Failed` at the end. `samplesPerSecond` is rounded to one decimal for `kubectl get` (printer
columns cannot format numbers); the exact value is the `planaria_samples_per_second` metric.
An operator restarted mid-job starts the recovery count from the previous status'
(`recoveries_offset`), since its controller counts anew.

Errors: a failed write (`api.KubeError`) is logged and retried with the next status; the
controller never sees it (the job goes on, the status catches up).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from planaria.control import status as statuses
from planaria.kube import api

LOG = logging.getLogger(__name__)
SPEC_VALID = "SpecValid"
INVALID = "Invalid"
MIN_INTERVAL_S = 1.0
Json = dict[str, Any]
Write = Callable[[Json], Awaitable[None]]
Emit = Callable[[str, str, str], None]  # (type Normal|Warning, CamelCase reason, message)
_ENDED = (statuses.Phase.SUCCEEDED, statuses.Phase.FAILED)


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def timestamp(at: datetime.datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as Kubernetes writes times."""
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions(
    listed: list[statuses.Condition],
    *,
    generation: int,
    previous: Mapping[str, Any] | None,
    at: datetime.datetime,
) -> list[Json]:
    """`listed` as CRD conditions; a condition whose status did not change since `previous`
    keeps its lastTransitionTime."""
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
    out = []
    for condition in listed:
        old = before.get(condition.type) or {}
        same = old.get("status") == condition.status and old.get("lastTransitionTime")
        out.append(
            {
                "type": condition.type,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": old["lastTransitionTime"] if same else timestamp(at),
                "observedGeneration": generation,
            }
        )
    return out


def recovery_body(recovery: statuses.Recovery) -> Json:
    """The status' `lastRecovery`: what happened, from which tier, why, and its seconds."""
    return {
        "kind": recovery.kind,
        "tier": recovery.tier.value,
        "reason": recovery.reason,
        "failedWorkers": [int(w) for w in recovery.failed],
        "epoch": recovery.epoch,
        "seconds": max(0.0, recovery.total_s),
        "detectSeconds": max(0.0, recovery.detect_s),
        "stopSeconds": max(0.0, recovery.stop_s),
        "planSeconds": max(0.0, recovery.plan_s),
        "regroupSeconds": max(0.0, recovery.regroup_s),
        "transferSeconds": max(0.0, recovery.transfer_s),
        "resumeSeconds": max(0.0, recovery.resume_s),
        "lostSteps": max(0, recovery.lost_steps),
        "transferredBytes": recovery.transferred_bytes,
    }


def status_body(
    status: statuses.JobStatus,
    *,
    generation: int,
    total_steps: int,
    previous: Mapping[str, Any] | None = None,
    at: datetime.datetime | None = None,
    recoveries_offset: int = 0,
) -> Json:
    """The CRD status of `status` (module docstring); `previous` is the status it replaces."""
    at = at or now_utc()
    valid = statuses.Condition(type=SPEC_VALID, status="True", reason="Valid")
    before = previous or {}
    body: Json = {
        "phase": status.phase.value,
        "observedGeneration": generation,
        "conditions": conditions(
            [valid, *status.conditions], generation=generation, previous=previous, at=at
        ),
        "epoch": status.epoch,
        "step": status.step,
        "totalSteps": total_steps,
        "loss": status.loss,
        "samplesPerSecond": round(max(0.0, status.samples_per_s), 1),
        "liveWorkers": status.live_workers,
        "workers": status.total_workers,
        "workersReady": f"{status.live_workers}/{status.total_workers}",
        "plan": status.plan,
        "recoveries": status.recoveries + recoveries_offset,
        "lastRecovery": before.get("lastRecovery"),
        "checkpointStep": status.checkpoint_step,
        "snapshotIntervalSteps": (
            None
            if status.snapshot_interval_steps is None
            else round(status.snapshot_interval_steps, 2)
        ),
        "message": status.message,
        "startTime": before.get("startTime"),
        "completionTime": before.get("completionTime"),
    }
    if status.last_recovery is not None:
        body["lastRecovery"] = recovery_body(status.last_recovery)
    if body["startTime"] is None and status.phase is statuses.Phase.RUNNING:
        body["startTime"] = timestamp(at)
    if body["completionTime"] is None and status.phase in _ENDED:
        body["completionTime"] = timestamp(at)
    return body


def invalid_body(
    message: str,
    *,
    generation: int,
    previous: Mapping[str, Any] | None = None,
    at: datetime.datetime | None = None,
) -> Json:
    """The status of a spec that cannot run: phase Invalid, SpecValid False saying what to fix."""
    invalid = statuses.Condition(
        type=SPEC_VALID, status="False", reason="InvalidSpec", message=message
    )
    listed = conditions([invalid], generation=generation, previous=previous, at=at or now_utc())
    return {
        "phase": INVALID,
        "observedGeneration": generation,
        "conditions": listed,
        "message": f"invalid spec: {message}",
    }


def recovery_event(recovery: statuses.Recovery, *, count: int, plan: str) -> tuple[str, str]:
    """The (reason, message) of the Event for `recovery`, the job's `count`th, now on `plan`:
    a planned scale-up, a planned move, or a recovery from lost workers (or from none, e.g. a
    resume after a suspension)."""
    where = f"epoch {recovery.epoch}, plan {plan or '-'}"
    if recovery.planned and recovery.kind == "scale-up":
        return "ScaledUp", f"scaled up ({where}): {recovery.reason}"
    if recovery.planned:
        workers = [int(w) for w in recovery.failed]
        return "Moved", (
            f"planned {recovery.kind} move away from workers {workers}, nothing lost "
            f"({where}): {recovery.reason}"
        )
    lost = f"after losing workers {[int(w) for w in recovery.failed]}"
    return "Recovered", (
        f"recovery {count}: {recovery.kind} from tier {recovery.tier.value} "
        f"{lost if recovery.failed else 'with no worker lost'} ({where}): {recovery.reason}"
    )


class StatusWriter:
    """Writes the controller's statuses to the CRD and sends the Events (module docstring)."""

    def __init__(
        self,
        *,
        write: Write,
        emit: Emit,
        generation: int,
        total_steps: int,
        previous: Mapping[str, Any] | None = None,
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._emit = emit
        self._generation = generation
        self._total_steps = total_steps
        self._written: Json = dict(previous or {})
        self._offset = int(self._written.get("recoveries") or 0)
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._last_write = -float("inf")
        self._pending: statuses.JobStatus | None = None

    @property
    def written(self) -> Json:
        """The last status written (or the previous one given)."""
        return dict(self._written)

    async def publish(self, status: statuses.JobStatus) -> None:
        phase_changed = status.phase.value != self._written.get("phase")
        if not phase_changed and self._clock() - self._last_write < self._min_interval_s:
            self._pending = status
            return
        await self._publish(status)

    async def flush(self) -> None:
        """Write the last status held back by the throttle, if any."""
        if self._pending is not None:
            await self._publish(self._pending)

    async def _publish(self, status: statuses.JobStatus) -> None:
        body = status_body(
            status,
            generation=self._generation,
            total_steps=self._total_steps,
            previous=self._written,
            recoveries_offset=self._offset,
        )
        self._pending = None
        if body == self._written:
            return
        try:
            await self._write(body)
        except api.KubeError as exc:
            LOG.warning("status not written (the next one retries): %s", exc)
            self._pending = status
            return
        before, self._written, self._last_write = self._written, body, self._clock()
        self._announce(before, body, status.last_recovery)

    def _announce(
        self, before: Mapping[str, Any], after: Json, recovery: statuses.Recovery | None
    ) -> None:
        if recovery is not None and after["recoveries"] > int(before.get("recoveries") or 0):
            reason, message = recovery_event(
                recovery, count=after["recoveries"], plan=after["plan"] or ""
            )
            self._emit("Normal", reason, message)
        if after["plan"] and after["plan"] != before.get("plan"):
            self._emit("Normal", "PlanChanged", f"epoch {after['epoch']}: plan {after['plan']}")
        if after["phase"] != before.get("phase") and after["phase"] in _ENDED:
            kind = "Normal" if after["phase"] == statuses.Phase.SUCCEEDED else "Warning"
            self._emit(kind, after["phase"], after["message"])
