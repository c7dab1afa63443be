"""`planaria operator` (kopf with the real handlers) on a real control plane (Kubernetes 1.20), as
the chart's ServiceAccount with the chart's Role, with no kubelet: pods are created but never
run (nothing binds them, so a deleted one goes at once).

Covered: a valid ResilientJob gets its headless Service, both TLS Secrets (the controller's
loads as the job's credentials, the agents' holds their files under the same CA) and one pod per
node, all owned by the job; deleting the job removes them (the controller manager's garbage
collector); a name too long for the job's pods (a CEL rule the 1.20 server dropped) gets phase
Invalid with a SpecValid condition saying what to fix and an InvalidSpec Event, and the operator
still handles a valid job afterwards; a deleted worker pod is created again; with peering, two
replicas get distinct priorities and the second takes over when the first stops. No call is
refused by the server (the `refusals` fixture). Every job made here is deleted before its test
ends, since the server outlives the test.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import pytest

from planaria.kube import constants, pods
from planaria.rpc import tls
from tests.kube import operating
from tests.kube.real import cluster
from tests.kube.real.conftest import NAMESPACE

SPEC = {"model": "tiny", "workers": 4, "gpusPerNode": 2, "steps": 5, "globalBatchSize": 8}

pytestmark = pytest.mark.usefixtures("as_operator")


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid]


def _pods(admin: cluster.Client, job: str) -> list[dict[str, Any]]:
    return operating.pods_of(admin, job)


async def _two_pods(admin: cluster.Client, job: str) -> None:
    await operating.wait_for(lambda: len(_pods(admin, job)) == 2, 30, f"{job}'s two pods")


async def _replaced(admin: cluster.Client, pod: str) -> None:
    """Delete `pod` and wait until the operator has created it again (a new uid)."""
    job = pod.rsplit("-", 1)[0]
    (old,) = [p["metadata"]["uid"] for p in _pods(admin, job) if p["metadata"]["name"] == pod]
    admin.delete("v1", "Pod", pod, NAMESPACE)

    def again() -> bool:
        found = _pods(admin, job)
        return any(p["metadata"]["name"] == pod and p["metadata"]["uid"] != old for p in found)

    await operating.wait_for(again, 30, f"a new pod {pod}")


def _gone(admin: cluster.Client, job: str) -> bool:
    return operating.get_job(admin, job) is None and not _pods(admin, job)


async def _deleted(admin: cluster.Client, *jobs: str) -> None:
    """Delete `jobs` (the operator, still running, removes its finalizer) and wait until they
    and their pods are gone."""
    for job in jobs:
        admin.delete(constants.API_VERSION, constants.KIND, job, NAMESPACE)
    for job in jobs:
        await operating.wait_for(functools.partial(_gone, admin, job), 60, f"{job} deleted")


@pytest.mark.asyncio
async def test_a_job_gets_its_service_secrets_and_pods_and_loses_them_when_deleted(
    admin: cluster.Client, refusals: Callable[[], list[str]]
) -> None:
    async with operating.running_operator():
        job = admin.apply(operating.job_body("tiny", **SPEC))
        uid = job["metadata"]["uid"]
        await _two_pods(admin, "tiny")
        names = sorted(p["metadata"]["name"] for p in _pods(admin, "tiny"))
        assert names == ["tiny-0", "tiny-1"]  # 4 workers, 2 per node
        assert all(_owned_by(p, uid) for p in _pods(admin, "tiny"))
        service = admin.get("v1", "Service", "tiny", NAMESPACE)
        assert service is not None and _owned_by(service, uid)
        secret = admin.get("v1", "Secret", constants.controller_secret_name("tiny"), NAMESPACE)
        assert secret is not None and _owned_by(secret, uid)
        assert tls.from_controller_files(pods.secret_files(secret)).job == "tiny"
        agent = admin.get("v1", "Secret", constants.agent_secret_name("tiny"), NAMESPACE)
        assert agent is not None and _owned_by(agent, uid)
        assert set(agent["data"]) == set(tls.AGENT_FILES)
        mine, theirs = pods.secret_files(secret), pods.secret_files(agent)
        assert theirs[tls.CA_CERT] == mine[tls.CA_CERT]  # one pair, whoever made it

        await _deleted(admin, "tiny")
        owned = (
            ("Service", "tiny"),
            ("Secret", constants.controller_secret_name("tiny")),
            ("Secret", constants.agent_secret_name("tiny")),
        )
        await operating.wait_for(
            lambda: all(admin.get("v1", kind, name, NAMESPACE) is None for kind, name in owned),
            60,
            "the Service and Secrets garbage-collected",
        )
    assert refusals() == []  # no call outside the chart's Role


@pytest.mark.asyncio
async def test_an_invalid_spec_is_reported_and_a_valid_job_still_runs_after_it(
    admin: cluster.Client, refusals: Callable[[], list[str]]
) -> None:
    # The name's length is checked by a root-level CEL rule, which a 1.20 server drops: the
    # operator's own check catches it, as on any cluster whose CRD lacks the rules.
    bad = "a-resilient-job-whose-name-is-far-too-long-for-pods"
    async with operating.running_operator():
        admin.apply(operating.job_body(bad, **SPEC))

        def invalid() -> dict[str, Any] | None:
            job = operating.get_job(admin, bad)
            status = (job or {}).get("status") or {}
            return status if status.get("phase") == "Invalid" else None

        status = await operating.wait_for(invalid, 30, "the Invalid status")
        (condition,) = status["conditions"]
        assert condition["type"] == "SpecValid" and condition["status"] == "False"
        assert condition["message"].startswith("metadata.name:")
        assert "give at most 40" in condition["message"]

        def warned() -> bool:  # kopf posts its Events from a queue, after the status patch
            return any(
                e.get("reason") == "InvalidSpec" and e["involvedObject"].get("name") == bad
                for e in admin.list("v1", "Event", NAMESPACE)
            )

        await operating.wait_for(warned, 30, "the InvalidSpec Event")
        assert not _pods(admin, bad)

        admin.apply(operating.job_body("good", **SPEC))
        await _two_pods(admin, "good")
        await _deleted(admin, bad, "good")
    assert refusals() == []


@pytest.mark.asyncio
async def test_a_deleted_worker_pod_is_created_again(
    admin: cluster.Client, refusals: Callable[[], list[str]]
) -> None:
    async with operating.running_operator():
        admin.apply(operating.job_body("again", **SPEC))
        await _two_pods(admin, "again")
        await _replaced(admin, "again-1")
        await _deleted(admin, "again")
    assert refusals() == []


@pytest.mark.asyncio
async def test_with_peering_a_second_replica_takes_over_when_the_first_stops(
    admin: cluster.Client, refusals: Callable[[], list[str]]
) -> None:
    # The chart creates the peering object when it runs more than one replica; kopf only
    # patches it (the Role allows no create).
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering"}
    admin.apply({**peering, "metadata": {"name": "planaria", "namespace": NAMESPACE}})
    flags = ("--peering", "planaria")
    try:
        async with contextlib.AsyncExitStack() as second:
            async with operating.running_operator(*flags):
                await second.enter_async_context(operating.running_operator(*flags))

                def replicas() -> list[int] | None:
                    found = admin.get("kopf.dev/v1", "KopfPeering", "planaria", NAMESPACE) or {}
                    listed = [peer["priority"] for peer in (found.get("status") or {}).values()]
                    return listed if len(listed) == 2 else None

                priorities = await operating.wait_for(replicas, 30, "two replicas in the peering")
                assert len(set(priorities)) == 2  # distinct: kopf would pause both on a tie
                admin.apply(operating.job_body("peer", **SPEC))
                await _two_pods(admin, "peer")
            # The first replica stopped (its peering record goes with it): the second works now.
            await _replaced(admin, "peer-1")
            await _deleted(admin, "peer")
    finally:
        admin.delete("kopf.dev/v1", "KopfPeering", "planaria", NAMESPACE)
    assert refusals() == []
