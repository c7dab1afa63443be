"""The operator end to end on a real control plane (Kubernetes 1.20: etcd, kube-apiserver with
RBAC, kube-controller-manager), as the chart's ServiceAccount with the chart's Role; the
kubelet harness runs each worker pod's container as a real `planaria agent` process.

Covered: a job runs with one pod's agent killed -> the survivors are reconfigured without a
restart (same pids), the dead pod is replaced, the status shows the recovery and the job
Succeeds, with Recovered / PlanChanged / Succeeded Events; an operator stopped mid-job and a new
one started adopts the running agents; a job deleted while running has its pods, Service,
Secrets and state ConfigMap removed (the controller manager's garbage collector, through their
ownerReferences). Any call outside the chart's Role would be refused by the server (HTTP 403)
and fail the job, so these tests also check the Role.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from planaria.kube import constants
from tests.kube import operating
from tests.kube.real import cluster
from tests.kube.real.conftest import NAMESPACE
from tests.kube.support import kubelet

ENDED = ("Succeeded", "Failed")
RUN_S = 180.0
STEPS = 60

pytestmark = pytest.mark.usefixtures("as_operator")


def _status(admin: cluster.Client, name: str) -> dict[str, Any]:
    job = operating.get_job(admin, name) or {}  # type: ignore[arg-type]
    status: dict[str, Any] = job.get("status") or {}
    return status


def _pods(admin: cluster.Client, job: str) -> list[dict[str, Any]]:
    return operating.pods_of(admin, job)  # type: ignore[arg-type]


def _pids(harness: kubelet.Kubelet, pods: tuple[str, ...]) -> dict[str, int]:
    return {p.pod: p.pid for p in harness.processes() if p.pod in pods and p.returncode is None}


async def _until(admin: cluster.Client, name: str, check: Any, what: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = _status(admin, name)
        return status if check(status) else None

    return await operating.wait_for(probe, RUN_S, f"{name}: {what} ({_status(admin, name)})")


def _running(name: str) -> Any:
    return lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 3


@contextlib.asynccontextmanager
async def _recording(plane: cluster.ControlPlane) -> AsyncIterator[set[tuple[str, str]]]:
    seen: set[tuple[str, str]] = set()
    task = asyncio.create_task(cluster.record_pods(plane, NAMESPACE, seen))
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_a_killed_pod_is_survived_without_restarting_the_others(
    control_plane: cluster.ControlPlane,
    admin: cluster.Client,
    real_kubelet: kubelet.Kubelet,
    corpus: pathlib.Path,
) -> None:
    async with (
        _recording(control_plane) as seen,
        operating.running_operator(
            admin,  # type: ignore[arg-type]
            load_crd=False,
        ),
    ):
        admin.apply(operating.job_body("kill", **operating.e2e_spec(corpus, steps=STEPS)))
        await _until(admin, "kill", _running("kill"), "step 3")
        before = _pids(real_kubelet, ("kill-0", "kill-2"))
        assert len(before) == 2
        (old,) = [
            p["metadata"]["uid"] for p in _pods(admin, "kill") if p["metadata"]["name"] == "kill-1"
        ]
        await real_kubelet.kill("kill-1")
        recovered = await _until(
            admin,
            "kill",
            lambda s: (s.get("lastRecovery") or {}).get("failedWorkers") == [1],
            "the recovery from worker 1's loss",
        )
        assert recovered["lastRecovery"]["tier"] in ("kept", "live_replica")
        assert _pids(real_kubelet, ("kill-0", "kill-2")) == before  # reconfigured, not restarted
        final = await _until(admin, "kill", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == STEPS and final["recoveries"] >= 1
        assert {uid for name, uid in seen if name == "kill-1"} - {old}, "kill-1 never replaced"
        await operating.wait_for(lambda: not _pods(admin, "kill"), 60, "the pods deleted")
        events = admin.list("v1", "Event", NAMESPACE)
        reasons = {e.get("reason") for e in events if e["involvedObject"].get("name") == "kill"}
        assert {"Recovered", "PlanChanged", "Succeeded"} <= reasons


@pytest.mark.asyncio
async def test_an_operator_restarted_mid_job_adopts_the_running_agents(
    admin: cluster.Client, real_kubelet: kubelet.Kubelet, corpus: pathlib.Path
) -> None:
    pods = ("adopt-0", "adopt-1", "adopt-2")
    async with operating.running_operator(admin, load_crd=False):  # type: ignore[arg-type]
        admin.apply(operating.job_body("adopt", **operating.e2e_spec(corpus, steps=40)))
        await _until(admin, "adopt", _running("adopt"), "step 3")
        before = _pids(real_kubelet, pods)
        assert len(before) == 3
    left = _status(admin, "adopt")
    assert left["phase"] not in ENDED, "the job ended before the operator restart"
    assert _pids(real_kubelet, pods) == before  # a stopping operator leaves the agents training
    async with operating.running_operator(admin, load_crd=False):  # type: ignore[arg-type]
        # On a quiet machine the agents may finish before the new operator adopts them; the
        # job then goes straight to Succeeded.
        await _until(
            admin,
            "adopt",
            lambda s: (
                (s.get("phase") == "Running" and s["step"] >= left["step"] + 3)
                or s.get("phase") in ENDED
            ),
            "training under the new operator",
        )
        assert _pids(real_kubelet, pods) == before  # adopted, not restarted
        final = await _until(admin, "adopt", lambda s: s.get("phase") in ENDED, "the end")
        assert final["phase"] == "Succeeded", final.get("message")
        assert final["step"] == 40
        await operating.wait_for(lambda: not _pods(admin, "adopt"), 60, "the pods deleted")


def _owned_by(admin: cluster.Client, uid: str) -> list[str]:
    """Kind/name of every object in the namespace whose owner is `uid`."""
    return [
        f"{kind}/{o['metadata']['name']}"
        for kind in ("Pod", "Service", "Secret", "ConfigMap")
        for o in admin.list("v1", kind, NAMESPACE)
        if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences") or [])
    ]


@pytest.mark.asyncio
async def test_a_deleted_job_takes_its_pods_service_secrets_and_state_with_it(
    admin: cluster.Client, real_kubelet: kubelet.Kubelet, corpus: pathlib.Path
) -> None:
    async with operating.running_operator(admin, load_crd=False):  # type: ignore[arg-type]
        job = admin.apply(operating.job_body("gone", **operating.e2e_spec(corpus, steps=100_000)))
        await _until(admin, "gone", _running("gone"), "step 3")
        owned = _owned_by(admin, job["metadata"]["uid"])
        kinds = {o.split("/")[0] for o in owned}
        assert kinds == {"Pod", "Service", "Secret", "ConfigMap"}, owned
        admin.delete(constants.API_VERSION, constants.KIND, "gone", NAMESPACE)
        # The finalizer goes once the job's daemon has stopped: kopf waits up to
        # handlers.DAEMON_EXIT_S for that (without it, a deleted running job kept its finalizer
        # for handlers.DAEMON_CANCEL_S, 60 s, unless another change to it came first).
        started = time.monotonic()
        await operating.wait_for(
            lambda: operating.get_job(admin, "gone") is None,  # type: ignore[arg-type]
            30,
            "the job deleted",
        )
        print(f"deleting the running job took {time.monotonic() - started:.1f} s")
        await operating.wait_for(
            lambda: not _owned_by(admin, job["metadata"]["uid"]),
            120,
            f"the job's objects garbage-collected ({_owned_by(admin, job['metadata']['uid'])})",
        )
        assert not [
            p
            for p in real_kubelet.processes()
            if p.pod.startswith("gone-") and p.returncode is None
        ]
