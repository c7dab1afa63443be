"""What a worker pod's changes mean for its workers: pure reading of pod bodies.

`read(body)` condenses a pod (a watch event's object) into a `PodState`; `classify(before,
after)` says what changed between two states of the same pod (same uid):

    DIED               the pod is gone or going: phase Failed or Succeeded, deleted (a DELETED
                       event or a deletionTimestamp), a container terminated, a container's
                       restartCount grew, Ready turned False after it was True, or a
                       DisruptionTarget condition (eviction, preemption, node drain)
    PREEMPTION_NOTICE  the pod gained the `constants.ANNOTATION_PREEMPTION` annotation (a
                       node-termination handler, or a person, says its node goes away soon)

JOINED is not a change of one pod but of a node: a replacement pod (a new uid) for a node whose
workers died became ready; `planaria.kube.backend` keeps that bookkeeping, with `serving` here.

Not read: node taints (a spot notice as a taint on the Node would need RBAC on nodes, which the
operator deliberately lacks: docs/operator.md). Nothing raises: a body without the fields is a
pod that has not got there yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planaria.contract import plan
from planaria.control import ports
from planaria.kube import constants

ENDED_PHASES = ("Failed", "Succeeded")
DISRUPTION = "DisruptionTarget"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodState:
    """One observation of a worker pod, as much as the failure signals need."""

    name: str
    uid: str
    node: int | None
    workers: tuple[plan.WorkerId, ...]
    phase: str
    ip: str
    ready: bool  # the Ready condition is True (every container passes its probe)
    deleted: bool
    restarts: int
    terminated: str  # "agent-1 exited with code 137 (Error)"; empty when none did
    disruption: str  # the DisruptionTarget condition's reason and message; empty when none
    preemption: str  # the preemption annotation's value; empty when none
    reason: str  # the pod's status reason and message (e.g. "Evicted: ...")

    @property
    def dead(self) -> str:
        """Why the pod's workers are lost, in words; empty while they are not."""
        if self.deleted:
            return "the pod was deleted"
        if self.phase in ENDED_PHASES:
            return f"the pod's phase is {self.phase}" + (f" ({self.reason})" if self.reason else "")
        if self.terminated:
            return f"container {self.terminated}"
        if self.disruption:
            return f"the pod is being disrupted: {self.disruption}"
        return ""

    @property
    def serving(self) -> bool:
        """Running, every container ready, not going away: its agents can be connected."""
        return self.phase == "Running" and self.ready and bool(self.ip) and not self.dead


def read(body: Mapping[str, Any], *, deleted: bool = False) -> PodState:
    """The state of the pod `body`; `deleted` for a DELETED watch event's last body."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    containers = status.get("containerStatuses") or []
    annotations = meta.get("annotations") or {}
    disruption = conditions.get(DISRUPTION) or {}
    reason = ": ".join(x for x in (status.get("reason"), status.get("message")) if x)
    return PodState(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        node=_node(meta.get("labels") or {}),
        workers=_workers(annotations.get(constants.ANNOTATION_WORKERS, "")),
        phase=status.get("phase") or "Pending",
        ip=status.get("podIP") or "",
        ready=(conditions.get("Ready") or {}).get("status") == "True",
        deleted=deleted or bool(meta.get("deletionTimestamp")),
        restarts=sum(int(c.get("restartCount") or 0) for c in containers),
        terminated=_terminated(containers),
        disruption=_condition_text(disruption) if disruption.get("status") == "True" else "",
        preemption=str(annotations.get(constants.ANNOTATION_PREEMPTION, "")),
        reason=reason,
    )


def classify(before: PodState | None, after: PodState) -> tuple[ports.EventKind, str] | None:
    """The worker event that `before` -> `after` (one pod, `before` None when first seen)
    means, with its detail; None when nothing the controller must hear of changed."""
    was = before or _unseen(after)
    if not was.dead:
        if after.dead:
            return ports.EventKind.DIED, f"pod {after.name}: {after.dead}"
        if after.restarts > was.restarts:
            what = f"a container restarted ({after.restarts} restarts)"
            return ports.EventKind.DIED, f"pod {after.name}: {what}"
        if was.ready and not after.ready:
            return ports.EventKind.DIED, f"pod {after.name}: Ready turned False"
        if after.preemption and not was.preemption:
            return ports.EventKind.PREEMPTION_NOTICE, f"pod {after.name}: {after.preemption}"
    return None


def _unseen(after: PodState) -> PodState:
    """What a pod seen for the first time is compared with: alive, not ready, no notice."""
    return PodState(
        name=after.name,
        uid=after.uid,
        node=after.node,
        workers=after.workers,
        phase="Pending",
        ip="",
        ready=False,
        deleted=False,
        restarts=after.restarts,
        terminated="",
        disruption="",
        preemption="",
        reason="",
    )


def _node(labels: Mapping[str, str]) -> int | None:
    value = labels.get(constants.LABEL_NODE, "")
    return int(value) if value.isdigit() else None


def _workers(text: str) -> tuple[plan.WorkerId, ...]:
    parts = [p.strip() for p in text.split(",")]
    return tuple(plan.WorkerId(int(p)) for p in parts if p.isdigit())


def _terminated(containers: list[Mapping[str, Any]]) -> str:
    for container in containers:
        ended = (container.get("state") or {}).get("terminated")
        if ended:
            reason = f" ({ended['reason']})" if ended.get("reason") else ""
            return f"{container.get('name')} exited with code {ended.get('exitCode')}{reason}"
    return ""


def _condition_text(condition: Mapping[str, Any]) -> str:
    return ": ".join(str(x) for x in (condition.get("reason"), condition.get("message")) if x)
