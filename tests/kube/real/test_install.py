"""The chart on a real API server (Kubernetes 1.20, RBAC enforced): the shipped CRDs are
accepted and served, the server's schema refuses an invalid ResilientJob with a message naming
the field, the operator's ServiceAccount can make exactly the calls of the chart's Role, and a
verb removed from the Role makes the matching operator call forbidden; what only a CEL rule
refuses (a 1.20 server drops those rules) is refused by the operator instead.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from planaria.kube import api, constants
from tests.kube import operating
from tests.kube.real import cluster
from tests.kube.real.conftest import NAMESPACE, operator_account

CRDS = "apiextensions.k8s.io/v1"


def _without_cel(schema: Any) -> Any:
    """`schema` without its CEL rules (x-kubernetes-validations), at any depth."""
    if isinstance(schema, dict):
        return {k: _without_cel(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if isinstance(schema, list):
        return [_without_cel(v) for v in schema]
    return schema


def test_the_shipped_crds_are_accepted_and_served(admin: cluster.Client) -> None:
    shipped = cluster.shipped_crds()
    assert {c["metadata"]["name"] for c in shipped} == {
        f"{constants.PLURAL}.{constants.GROUP}",
        "kopfpeerings.kopf.dev",
    }
    for crd in shipped:
        stored = admin.get(CRDS, "CustomResourceDefinition", crd["metadata"]["name"], None)
        assert stored is not None and cluster.established(admin, crd["metadata"]["name"])
        # Stored as shipped, except what a 1.20 server does not know: it drops the CEL rules
        # (x-kubernetes-validations, Kubernetes >= 1.25) without a word; tests/chart checks
        # them with cel-python instead.
        for sent, kept in zip(crd["spec"]["versions"], stored["spec"]["versions"], strict=True):
            assert kept["schema"] == _without_cel(sent["schema"])
            assert kept.get("subresources") == sent.get("subresources")
            assert kept.get("additionalPrinterColumns") == sent.get("additionalPrinterColumns")
    job = admin.apply(operating.job_body("accepted", model="tiny", workers=2))
    assert job["spec"]["workers"] == 2 and job["spec"]["gpusPerNode"] == 1  # defaulted
    admin.delete(constants.API_VERSION, constants.KIND, "accepted", NAMESPACE)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"model": "tiny", "workers": 0}, "spec.workers: Invalid value: 0"),
        ({"model": "no-such-model"}, 'spec.model: Unsupported value: "no-such-model"'),
        ({"model": "tiny", "workers": "three"}, 'spec.workers: Invalid value: "string"'),
    ],
)
def test_an_invalid_spec_is_refused_by_the_servers_schema(
    admin: cluster.Client, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(cluster.ApiError) as refused:
        admin.apply(operating.job_body("invalid", **spec))
    assert refused.value.status == 422
    assert message in refused.value.message, refused.value.message
    assert admin.get(constants.API_VERSION, constants.KIND, "invalid", NAMESPACE) is None


def _role(admin: cluster.Client) -> dict[str, Any]:
    role = admin.get("rbac.authorization.k8s.io/v1", "Role", operator_account(), NAMESPACE)
    assert role is not None
    return role


@pytest.fixture
def role_restored(admin: cluster.Client) -> Iterator[dict[str, Any]]:
    """The chart's Role as installed, put back after the test."""
    original = _role(admin)
    yield copy.deepcopy(original)
    admin.apply({k: v for k, v in original.items() if k != "status"})


def _operator_api(operator_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> api.Api:
    monkeypatch.setenv("KUBECONFIG", str(operator_kubeconfig))
    return api.Api.from_environment()


async def _create_service(operator: api.Api, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": {"app": name}, "ports": [{"port": 1}]},
    }
    await operator.create(api.SERVICES, NAMESPACE, body)


@pytest.mark.asyncio
async def test_the_operator_account_is_held_to_the_charts_role(
    admin: cluster.Client,
    operator_kubeconfig: Any,
    monkeypatch: pytest.MonkeyPatch,
    role_restored: dict[str, Any],
) -> None:
    operator = _operator_api(operator_kubeconfig, monkeypatch)
    try:
        # Granted: services create. Not granted by the chart: get on services, anything on
        # deployments.
        await _create_service(operator, "rbac-granted")
        with pytest.raises(api.KubeError) as denied:
            await operator.get(api.SERVICES, NAMESPACE, "rbac-granted")
        assert denied.value.status == 403 and "forbidden" in denied.value.detail

        # The chart's Role without `create` on services: the same call is now forbidden.
        rules = role_restored["rules"]
        (services,) = [r for r in rules if r["resources"] == ["services"]]
        services["verbs"] = [v for v in services["verbs"] if v != "create"]
        admin.apply({**role_restored, "rules": [r for r in rules if r["verbs"]]})

        async def forbidden() -> api.KubeError:
            for _ in range(100):  # the authorizer sees the new Role within moments
                try:
                    await _create_service(operator, "rbac-revoked")
                except api.KubeError as exc:
                    return exc
                admin.delete("v1", "Service", "rbac-revoked", NAMESPACE)
                await asyncio.sleep(0.1)
            raise AssertionError("services create stayed allowed after the verb was removed")

        exc = await forbidden()
        assert exc.status == 403
        assert 'cannot create resource "services"' in exc.detail, exc.detail
        assert f"system:serviceaccount:{NAMESPACE}:{operator_account()}" in exc.detail
    finally:
        operator.close()
        admin.delete("v1", "Service", "rbac-granted", NAMESPACE)


@pytest.mark.asyncio
async def test_a_verb_missing_from_the_role_stops_the_operator_at_that_call(
    admin: cluster.Client,
    as_operator: None,
    role_restored: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator itself, under the chart's Role less `create` on pods: the job's pods are
    never made, and the operator logs the refused call (HTTP 403) on each reconcile pass."""
    rules = copy.deepcopy(role_restored["rules"])
    (pods,) = [r for r in rules if r["resources"] == ["pods"]]
    pods["verbs"] = [v for v in pods["verbs"] if v != "create"]
    admin.apply({**role_restored, "rules": rules})
    caplog.set_level(logging.WARNING)
    async with operating.running_operator():
        admin.apply(operating.job_body("norbac", model="tiny", workers=2, steps=5))

        def refusal() -> str | None:
            found = [
                r.getMessage()
                for r in caplog.records
                if "POST /api/v1/namespaces/default/pods: HTTP 403" in r.getMessage()
            ]
            return found[0] if found else None

        message = await operating.wait_for(refusal, 60, "the operator's pod create refused")
        # What the e2e tests use to say that nothing was refused sees this refusal.
        assert cluster.refused_calls(caplog.records), message
        assert (
            'cannot create resource \\"pods\\"' in message
            or 'cannot create resource "pods"' in message
        ), message
        assert not operating.pods_of(admin, "norbac")
        admin.delete(constants.API_VERSION, constants.KIND, "norbac", NAMESPACE)
        await operating.wait_for(
            lambda: operating.get_job(admin, "norbac") is None,
            60,
            "the job deleted (the operator removes its finalizer)",
        )


@pytest.mark.asyncio
async def test_what_only_a_cel_rule_refuses_is_refused_by_the_operator_on_1_20(
    admin: cluster.Client, as_operator: None
) -> None:
    """A 1.20 server dropped the CEL rules: it takes a globalBatchSize that is not a multiple of
    microBatchSize, and the operator marks the job Invalid saying what to fix."""
    spec = {"model": "tiny", "workers": 2, "microBatchSize": 3, "globalBatchSize": 4}
    async with operating.running_operator():
        admin.apply(operating.job_body("celrule", **spec))  # accepted: no CEL on 1.20

        def invalid() -> dict[str, Any] | None:
            job = operating.get_job(admin, "celrule") or {}
            status: dict[str, Any] = job.get("status") or {}
            return status if status.get("phase") == "Invalid" else None

        status = await operating.wait_for(invalid, 60, "the job marked Invalid")
        assert "globalBatchSize" in status["message"], status
        assert not operating.pods_of(admin, "celrule")
        admin.delete(constants.API_VERSION, constants.KIND, "celrule", NAMESPACE)
        await operating.wait_for(
            lambda: operating.get_job(admin, "celrule") is None,
            30,
            "the job deleted",
        )
