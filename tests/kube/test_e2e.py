"""Issue #9's acceptance, end to end: `planaria operator` (kopf, the real handlers) against the API
emulator, with the kubelet harness running each worker pod's container as a real
`planaria agent` process (mutual TLS from the job's Secret, snapshots in the pod's emptyDir),
the tiny model on a small corpus, 3 workers.

Covered: a job runs to Succeeded with the CRD status showing its steps; one pod's agent killed
(the pod goes Failed) -> the survivors are reconfigured over gRPC without a restart (same
pids), the status shows the recovery (lastRecovery tier, seconds, reason) with Recovered,
PlanChanged and Succeeded Events, the dead pod is replaced, and the job Succeeds; the operator
stopped mid-job and a new one started -> the job goes on with the same agent processes and
Succeeds; one pipeline of three stages whose middle pod is killed (its layers' only replica and
its emptyDir gone) -> rebuilt from the snapshot mirrors on the other pods, and Succeeds;
every API request the operator made is covered by `constants.RBAC_RULES`; a job
that ended has its pods deleted.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from planaria.kube import constants
from tests.e2e import local_job
from tests.kube import operating
from tests.kube.support import emulator, kubelet, serving

ENDED = ("Succeeded", "Failed")
RUN_S = 120.0


def _status(kube_api: serving.KubeApi, name: str) -> dict[str, Any]:
    job = operating.get_job(kube_api, name) or {}
    status: dict[str, Any] = job.get("status") or {}
    return status


def _pods(kube_api: serving.KubeApi, job: str) -> list[dict[str, Any]]:
    return operating.pods_of(kube_api, job)


def _pids(harness: kubelet.Kubelet, pods: tuple[str, ...]) -> dict[str, int]:
    return {p.pod: p.pid for p in harness.processes() if p.pod in pods and p.returncode is None}


async def _until(kube_api: serving.KubeApi, name: str, check: Any, what: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = _status(kube_api, name)
        return status if check(status) else None

    return await operating.wait_for(probe, RUN_S, f"{name}: {what} ({_status(kube_api, name)})")


def _assert_rbac_covers(calls: list[emulator.ApiCall]) -> None:
    ours = [c for c in calls if c.user_agent != "kubelet-harness"]
    outside = [
        c
        for c in ours
        if not any(
            r.api_group == c.group
            and r.resource == (f"{c.resource}/{c.subresource}" if c.subresource else c.resource)
            and c.verb in r.verbs
            for r in constants.RBAC_RULES
        )
    ]
    assert not outside, f"requests outside RBAC_RULES: {outside}"
    used = sorted({(c.group, c.resource, c.subresource or "", c.verb) for c in ours})
    print(f"operator API calls (group, resource, subresource, verb): {used}")


# Long enough that the timer (every 0.3 s here) replaces the dead pod before the job ends:
# the recovery comes at step 3 or later, and a step takes tens of milliseconds.
STEPS = 60


@pytest.mark.asyncio
async def test_a_killed_pod_is_survived_without_restarting_the_others(
    kube_api: serving.KubeApi, kubelet: kubelet.Kubelet, corpus: pathlib.Path
) -> None:
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("kill", **operating.e2e_spec(corpus, steps=STEPS)))
        await _until(
            kube_api, "kill", lambda s: s.get("phase") == "Running" and s["step"] >= 3, "step 3"
        )
        before = _pids(kubelet, ("kill-0", "kill-2"))
        assert len(before) == 2
        (old,) = [
            p["metadata"]["uid"]
            for p in _pods(kube_api, "kill")
            if p["metadata"]["name"] == "kill-1"
        ]
        await kubelet.kill("kill-1")
        # The survivors may break their epoch before worker 1's death reaches the controller:
        # then a regroup comes first (no worker failed) and the loss of worker 1 after it.
        recovered = await _until(
            kube_api,
            "kill",
            lambda s: (s.get("lastRecovery") or {}).get("failedWorkers") == [1],
            "the recovery from worker 1's loss",
        )
        recovery = recovered["lastRecovery"]
        assert recovery["reason"] and recovery["tier"] in ("kept", "live_replica")
        await _until(kube_api, "kill", lambda s: s["lastRecovery"]["seconds"] > 0, "its seconds")
        assert _pids(kubelet, ("kill-0", "kill-2")) == before  # reconfigured, not restarted
        final = await _until(kube_api, "kill", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == STEPS and final["recoveries"] >= 1
        # The timer replaced the failed pod so that worker 1 could come back. The emulator's
        # history, not a poll: a replacement made just before the job ended lives milliseconds.
        replacements = [
            p["metadata"]["uid"]
            for p in kube_api.created("v1", "Pod", operating.NAMESPACE)
            if p["metadata"]["name"] == "kill-1" and p["metadata"]["uid"] != old
        ]
        assert replacements, "the failed pod kill-1 was never replaced"
        await operating.wait_for(lambda: not _pods(kube_api, "kill"), 30, "the pods deleted")
        events = kube_api.list("v1", "Event", operating.NAMESPACE)
        reasons = {e.get("reason") for e in events}
        assert {"Recovered", "PlanChanged", "Succeeded"} <= reasons
    _assert_rbac_covers(kube_api.requests)


@pytest.mark.asyncio
async def test_an_operator_restarted_mid_job_adopts_the_running_agents(
    kube_api: serving.KubeApi, kubelet: kubelet.Kubelet, corpus: pathlib.Path
) -> None:
    pods = ("adopt-0", "adopt-1", "adopt-2")
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("adopt", **operating.e2e_spec(corpus, steps=40)))
        await _until(
            kube_api, "adopt", lambda s: s.get("phase") == "Running" and s["step"] >= 3, "step 3"
        )
        before = _pids(kubelet, pods)
        assert len(before) == 3
    left = _status(kube_api, "adopt")
    assert left["phase"] not in ENDED, "the job ended before the operator restart"
    assert _pids(kubelet, pods) == before  # a stopping operator leaves the agents training
    async with operating.running_operator(kube_api, load_crd=False):
        # The agents train on while no operator watches: on a quiet machine they may finish
        # the job before the new operator adopts them, and it then goes straight to Succeeded.
        await _until(
            kube_api,
            "adopt",
            lambda s: (
                (s.get("phase") == "Running" and s["step"] >= left["step"] + 3)
                or s.get("phase") in ENDED
            ),
            "training under the new operator",
        )
        assert _pids(kubelet, pods) == before  # adopted, not restarted
        final = await _until(kube_api, "adopt", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == 40
        await operating.wait_for(lambda: not _pods(kube_api, "adopt"), 30, "the pods deleted")
    _assert_rbac_covers(kube_api.requests)


@pytest.mark.asyncio
async def test_a_pod_holding_a_stages_only_replica_is_rebuilt_from_its_mirrors(
    kube_api: serving.KubeApi, kubelet: kubelet.Kubelet, corpus: pathlib.Path
) -> None:
    """Issue #20 on the operator: one pipeline of three stages (the device too small for the
    model, no fault tolerance), and the pod of one stage killed: its layers' only replica and
    its own snapshot (its emptyDir) are gone, but each member's snapshot is mirrored on another
    pod, sent over the epoch's group at every snapshot: the job goes on from those copies
    (tier peer_snapshot, or local_snapshot where the new plan gives a lost layer to the pod that
    mirrors it), without the checkpoint, and Succeeds."""
    spec = operating.e2e_spec(corpus, steps=STEPS)
    spec.update(faultTolerance=0, deviceMemory=str(local_job.pipelined_profile(1).memory_bytes))
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("mirror", **spec))
        running = await _until(
            kube_api, "mirror", lambda s: s.get("phase") == "Running" and s["step"] >= 3, "step 3"
        )
        assert running["plan"].startswith("[3]"), running["plan"]  # one pipeline of 3 stages
        await kubelet.kill("mirror-1")
        recovered = await _until(
            kube_api,
            "mirror",
            lambda s: 1 in ((s.get("lastRecovery") or {}).get("failedWorkers") or []),
            "the recovery from worker 1's loss",
        )
        recovery = recovered["lastRecovery"]
        assert "no live replica" in recovery["reason"], recovery
        # peer_snapshot when a survivor given a lost layer receives it from its mirror,
        # local_snapshot when the new plan gives it to its mirror itself: a copy that survived
        # on another pod either way, never the checkpoint (none is configured)
        assert recovery["tier"] in ("peer_snapshot", "local_snapshot"), recovery
        final = await _until(kube_api, "mirror", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == STEPS
