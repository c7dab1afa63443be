"""`planaria operator` (kopf with the real handlers) against the Kubernetes API emulator, with
no kubelet: pods are created but never run.

Covered: a valid ResilientJob gets its headless Service, both TLS Secrets (the controller's
loads as the job's credentials) and one pod per node, all owned by the job; an invalid spec gets
phase Invalid with a SpecValid condition saying what to fix and a Warning Event, and the
operator still handles a valid job afterwards; deleting a job removes everything it owns;
every API request the operator sent is covered by `constants.RBAC_RULES` (the rules never
exercised are printed, for the report); a deleted worker pod is created again; with peering, two
replicas get distinct priorities and the second takes over when the first stops.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any

import pytest

from planaria.kube import constants, pods
from planaria.rpc import tls
from tests.kube import operating
from tests.kube.support import emulator, serving

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = {"model": "tiny", "workers": 4, "gpusPerNode": 2, "steps": 5, "globalBatchSize": 8}


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid]


def _resource(call: emulator.ApiCall) -> str:
    return f"{call.resource}/{call.subresource}" if call.subresource else call.resource


def _covered(call: emulator.ApiCall) -> bool:
    return any(
        r.api_group == call.group and r.resource == _resource(call) and call.verb in r.verbs
        for r in constants.RBAC_RULES
    )


@pytest.mark.asyncio
async def test_a_job_gets_its_service_secrets_and_pods_and_loses_them_when_deleted(
    kube_api: serving.KubeApi,
) -> None:
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("tiny", **SPEC))
        made = await operating.wait_for(lambda: len(operating.pods_of(kube_api, "tiny")) == 2)
        assert made
        job = operating.get_job(kube_api, "tiny")
        assert job is not None
        uid = job["metadata"]["uid"]
        names = sorted(p["metadata"]["name"] for p in operating.pods_of(kube_api, "tiny"))
        assert names == ["tiny-0", "tiny-1"]
        assert all(_owned_by(p, uid) for p in operating.pods_of(kube_api, "tiny"))
        service = kube_api.get("v1", "Service", "tiny", operating.NAMESPACE)
        assert service is not None and _owned_by(service, uid)
        secret = kube_api.get(
            "v1", "Secret", constants.controller_secret_name("tiny"), operating.NAMESPACE
        )
        assert secret is not None and _owned_by(secret, uid)
        assert tls.from_controller_files(pods.secret_files(secret)).job == "tiny"
        agent = kube_api.get("v1", "Secret", constants.agent_secret_name("tiny"), "default")
        assert agent is not None and set(agent["data"]) == set(tls.AGENT_FILES)
        mine, theirs = pods.secret_files(secret), pods.secret_files(agent)
        assert theirs[tls.CA_CERT] == mine[tls.CA_CERT]  # one pair, whoever made it

        kube_api.delete(constants.API_VERSION, constants.KIND, "tiny", operating.NAMESPACE)
        await operating.wait_for(lambda: operating.get_job(kube_api, "tiny") is None, 30)
        await operating.wait_for(lambda: not operating.pods_of(kube_api, "tiny"))
        for kind, name in (("Service", "tiny"), ("Secret", "tiny-agent-tls")):
            assert kube_api.get("v1", kind, name, operating.NAMESPACE) is None
    calls = kube_api.requests
    ours = [c for c in calls if not _covered(c)]
    assert not ours, f"requests outside RBAC_RULES: {ours}"
    used = {(c.group, _resource(c), c.verb) for c in calls}
    unused = [
        (r.api_group, r.resource, verb)
        for r in constants.RBAC_RULES
        for verb in r.verbs
        if (r.api_group, r.resource, verb) not in used
    ]
    print(f"RBAC calls observed: {sorted(used)}; granted but not exercised: {unused}")


@pytest.mark.asyncio
async def test_an_invalid_spec_is_reported_and_a_valid_job_still_runs_after_it(
    kube_api: serving.KubeApi,
) -> None:
    # The CRD's CEL rules refuse most bad specs at the API; the name's length is checked by a
    # root-level rule the emulator cannot evaluate, so here the operator's own check catches it
    # (as it would on a cluster whose CRD lacks the rules).
    bad = "a-resilient-job-whose-name-is-far-too-long-for-pods"
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body(bad, **SPEC))

        def invalid() -> dict[str, Any] | None:
            job = operating.get_job(kube_api, bad)
            status = (job or {}).get("status") or {}
            return status if status.get("phase") == "Invalid" else None

        status = await operating.wait_for(invalid, what="the Invalid status")
        (condition,) = status["conditions"]
        assert condition["type"] == "SpecValid" and condition["status"] == "False"
        assert condition["message"].startswith("metadata.name:")
        assert "give at most 40" in condition["message"]
        events = kube_api.list("v1", "Event", operating.NAMESPACE)
        assert any(e.get("reason") == "InvalidSpec" for e in events)
        assert not operating.pods_of(kube_api, bad)

        kube_api.apply(operating.job_body("good", **SPEC))
        await operating.wait_for(lambda: len(operating.pods_of(kube_api, "good")) == 2)


@pytest.mark.asyncio
async def test_a_deleted_worker_pod_is_created_again(kube_api: serving.KubeApi) -> None:
    async with operating.running_operator(kube_api):
        kube_api.apply(operating.job_body("again", **SPEC))
        await operating.wait_for(lambda: len(operating.pods_of(kube_api, "again")) == 2)
        (old,) = [
            p["metadata"]["uid"]
            for p in operating.pods_of(kube_api, "again")
            if p["metadata"]["name"] == "again-1"
        ]
        kube_api.delete("v1", "Pod", "again-1", operating.NAMESPACE)

        def replaced() -> bool:
            pods = operating.pods_of(kube_api, "again")
            return any(
                p["metadata"]["name"] == "again-1" and p["metadata"]["uid"] != old for p in pods
            )

        await operating.wait_for(replaced, what="a new pod again-1")


@pytest.mark.asyncio
async def test_with_peering_a_second_replica_takes_over_when_the_first_stops(
    kube_api: serving.KubeApi,
) -> None:
    kube_api.load_crd(ROOT / "charts" / "planaria" / "crds" / "kopfpeerings.yaml")
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering"}
    kube_api.apply({**peering, "metadata": {"name": "planaria", "namespace": "default"}})
    flags = ("--peering", "planaria")
    async with contextlib.AsyncExitStack() as second:
        async with operating.running_operator(kube_api, *flags):
            await second.enter_async_context(
                operating.running_operator(kube_api, *flags, load_crd=False)
            )

            def replicas() -> list[int] | None:
                found = kube_api.get("kopf.dev/v1", "KopfPeering", "planaria", "default") or {}
                listed = [peer["priority"] for peer in (found.get("status") or {}).values()]
                return listed if len(listed) == 2 else None

            priorities = await operating.wait_for(replicas, what="two replicas in the peering")
            assert len(set(priorities)) == 2  # distinct: kopf would pause both on a tie
            kube_api.apply(operating.job_body("peer", **SPEC))
            await operating.wait_for(lambda: len(operating.pods_of(kube_api, "peer")) == 2)
        # The first replica stopped (its peering record goes with it): the second works now.
        kube_api.delete("v1", "Pod", "peer-1", operating.NAMESPACE)
        await operating.wait_for(
            lambda: len(operating.pods_of(kube_api, "peer")) == 2, 30, "peer-1 created again"
        )
