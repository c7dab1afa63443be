"""Failure signals read from pod bodies (`planaria.kube.signals`), table-driven.

Covered: every DIED signal (phase Failed, phase Succeeded, a DELETED event, a deletionTimestamp,
a terminated container while the pod still runs, a grown restartCount, Ready True -> False, a
DisruptionTarget condition for eviction or preemption), the PREEMPTION_NOTICE annotation, and
what is no signal (a pod becoming ready, an unchanged pod, a second look at a dead pod, a pod
first seen not ready); `serving`; reading the node and the workers from labels/annotations.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from planaria.control import ports
from planaria.kube import constants, signals

DIED = ports.EventKind.DIED
NOTICE = ports.EventKind.PREEMPTION_NOTICE


def _pod(
    *, phase: str = "Running", ready: bool = True, restarts: int = 0, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": "tiny-1",
            "uid": "u1",
            "labels": {constants.LABEL_NODE: "1"},
            "annotations": {constants.ANNOTATION_WORKERS: "2,3"},
        },
        "status": {
            "phase": phase,
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {"name": "agent-0", "restartCount": restarts, "state": {"running": {}}},
                {"name": "agent-1", "restartCount": 0, "state": {"running": {}}},
            ],
        },
    }
    for path, value in extra.items():
        where = body
        *parents, leaf = path.split("__")
        for key in parents:
            where = where.setdefault(key, {})
        where[leaf] = value
    return body


def _terminated() -> dict[str, Any]:
    body = _pod()
    body["status"]["containerStatuses"][1]["state"] = {
        "terminated": {"exitCode": 137, "reason": "Error"}
    }
    return body


def _disrupted(reason: str) -> dict[str, Any]:
    body = _pod()
    body["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "node drain"}
    )
    return body


RUNNING = _pod()
CASES = [
    ("phase Failed", RUNNING, _pod(phase="Failed", ready=False), None, DIED, "phase is Failed"),
    ("phase Succeeded", RUNNING, _pod(phase="Succeeded", ready=False), None, DIED, "Succeeded"),
    ("a DELETED event", RUNNING, RUNNING, "DELETED", DIED, "deleted"),
    (
        "a deletionTimestamp",
        RUNNING,
        _pod(metadata__deletionTimestamp="2026-01-01T00:00:00Z"),
        None,
        DIED,
        "deleted",
    ),
    ("a terminated container", RUNNING, _terminated(), None, DIED, "agent-1 exited with code 137"),
    ("a restarted container", RUNNING, _pod(restarts=1), None, DIED, "restarted"),
    ("Ready turning False", RUNNING, _pod(ready=False), None, DIED, "Ready turned False"),
    ("an eviction", RUNNING, _disrupted("EvictionByEvictionAPI"), None, DIED, "Eviction"),
    ("a preemption", RUNNING, _disrupted("PreemptionByScheduler"), None, DIED, "Preemption"),
    (
        "a preemption notice",
        RUNNING,
        _pod(metadata__annotations={constants.ANNOTATION_PREEMPTION: "spot reclaim in 2m"}),
        None,
        NOTICE,
        "spot reclaim in 2m",
    ),
    ("a pod becoming ready", _pod(phase="Pending", ready=False), RUNNING, None, None, ""),
    ("an unchanged pod", RUNNING, copy.deepcopy(RUNNING), None, None, ""),
    ("a dead pod seen again", _pod(phase="Failed"), _pod(phase="Failed"), "DELETED", None, ""),
]


@pytest.mark.parametrize(
    ("before", "after", "event", "kind", "words"),
    [case[1:] for case in CASES],
    ids=[f"{case[0]} is {case[4] or 'no signal'}" for case in CASES],
)
def test_a_pod_change_means(
    before: dict[str, Any],
    after: dict[str, Any],
    event: str | None,
    kind: ports.EventKind | None,
    words: str,
) -> None:
    verdict = signals.classify(
        signals.read(before), signals.read(after, deleted=event == "DELETED")
    )
    if kind is None:
        assert verdict is None
    else:
        assert verdict is not None and verdict[0] is kind
        assert words in verdict[1] and "tiny-1" in verdict[1]


def test_a_pod_first_seen_failed_is_dead_and_one_first_seen_running_is_not() -> None:
    failed = signals.classify(None, signals.read(_pod(phase="Failed", ready=False)))
    assert failed is not None and failed[0] is DIED
    assert signals.classify(None, signals.read(RUNNING)) is None
    assert signals.classify(None, signals.read(_pod(phase="Pending", ready=False))) is None


def test_a_pod_serves_when_running_ready_and_addressed() -> None:
    assert signals.read(RUNNING).serving
    assert not signals.read(_pod(ready=False)).serving
    assert not signals.read(_pod(status__podIP="")).serving
    assert not signals.read(_terminated()).serving


def test_the_node_and_workers_are_read_from_the_pod() -> None:
    state = signals.read(RUNNING)
    assert (state.node, state.workers, state.ip) == (1, (2, 3), "10.0.0.7")
    bare = signals.read({"metadata": {"name": "x"}})
    assert (bare.node, bare.workers, bare.phase, bare.dead) == (None, (), "Pending", "")
