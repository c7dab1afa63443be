"""The emulator's discovery and custom resources, over real HTTP.

Covers: discovery of built-in kinds (`/api/v1`, `/apis`, a group version); a CRD created over
HTTP discovered with its kind, short names, scope and status subresource, served, and gone with
the CRD; `load_crd` from YAML; CRD defaulting, pruning, structural schema validation
(int-or-string, preserve-unknown-fields) and CEL rules, transition rules on update, as 422
Invalid `Status` bodies with causes; status kept on update without a status subresource.
"""

import pathlib

import pytest
import yaml

from tests.kube import samples
from tests.kube.support import serving


@pytest.fixture
def widgets(kube_api: serving.KubeApi) -> serving.KubeApi:
    kube_api.load_crd(samples.WIDGET_CRD)
    return kube_api


def test_discovery_lists_builtin_kinds(kube_api: serving.KubeApi) -> None:
    core = samples.http(kube_api, "GET", "/api/v1")[1]
    assert core["groupVersion"] == "v1"
    assert {"pods", "pods/status", "services", "secrets", "events", "namespaces", "nodes"} <= {
        r["name"] for r in core["resources"]
    }
    groups = {g["name"] for g in samples.http(kube_api, "GET", "/apis")[1]["groups"]}
    assert {"coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io"} <= groups
    leases = samples.http(kube_api, "GET", "/apis/coordination.k8s.io/v1")[1]["resources"]
    assert [(r["name"], r["namespaced"]) for r in leases] == [("leases", True)]


def test_a_crd_posted_over_http_is_discovered_and_served(kube_api: serving.KubeApi) -> None:
    status, crd = samples.http(
        kube_api,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        samples.WIDGET_CRD,
    )
    assert status == 201
    assert {c["type"] for c in crd["status"]["conditions"]} == {"Established", "NamesAccepted"}
    assert "example.com" in {g["name"] for g in samples.http(kube_api, "GET", "/apis")[1]["groups"]}
    served = {
        r["name"]: r for r in samples.http(kube_api, "GET", "/apis/example.com/v1")[1]["resources"]
    }
    assert set(served) == {"widgets", "widgets/status"}
    assert (served["widgets"]["kind"], served["widgets"]["shortNames"]) == ("Widget", ["wd"])
    assert served["widgets"]["namespaced"] is True and "watch" in served["widgets"]["verbs"]
    assert samples.http(kube_api, "POST", samples.WIDGETS, samples.widget("w"))[0] == 201
    samples.http(
        kube_api,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
    )
    assert samples.http(kube_api, "GET", samples.WIDGETS)[0] == 404


def test_load_crd_reads_yaml_files(kube_api: serving.KubeApi, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump_all([samples.WIDGET_CRD]))
    assert [crd["metadata"]["name"] for crd in kube_api.load_crd(path)] == ["widgets.example.com"]
    other = tmp_path / "other.yaml"
    other.write_text("x: 1\n")
    with pytest.raises(ValueError, match="no CustomResourceDefinition"):
        kube_api.load_crd(other)


def test_crd_defaults_prune_and_validate(widgets: serving.KubeApi) -> None:
    status, body = samples.http(
        widgets,
        "POST",
        samples.WIDGETS,
        samples.widget("w", port="http", junk=1, extra={"any": {"thing": 1}}),
    )
    assert status == 201
    assert body["spec"] == {"size": 1, "limit": 10, "port": "http", "extra": {"any": {"thing": 1}}}
    status, body = samples.http(
        widgets, "POST", samples.WIDGETS, samples.widget("bad", size=0, port=1.5)
    )
    assert (status, body["reason"], body["code"]) == (422, "Invalid", 422)
    fields = {cause["field"] for cause in body["details"]["causes"]}
    assert fields == {"spec.size", "spec.port"}
    assert body["message"].startswith('Widget.example.com "bad" is invalid: [spec.port')


def test_cel_rules_and_transition_rules(widgets: serving.KubeApi) -> None:
    status, body = samples.http(widgets, "POST", samples.WIDGETS, samples.widget("w", size=20))
    assert status == 422 and "size must not exceed limit" in body["message"]
    assert samples.http(widgets, "POST", samples.WIDGETS, samples.widget("w", size=5))[0] == 201
    status, body = samples.http(
        widgets, "PATCH", f"{samples.WIDGETS}/w", {"spec": {"size": 4}}, samples.MERGE
    )
    assert status == 422 and body["details"]["causes"][0] == {
        "reason": "FieldValueInvalid",
        "field": "spec",
        "message": 'Invalid value: "object": size cannot shrink',
    }
    assert (
        samples.http(
            widgets, "PATCH", f"{samples.WIDGETS}/w", {"spec": {"size": 6}}, samples.MERGE
        )[0]
        == 200
    )


def test_status_is_kept_by_updates_without_a_status_subresource(kube_api: serving.KubeApi) -> None:
    kube_api.load_crd(samples.peering_crd(clusterwide=True))
    path = "/apis/kopf.dev/v1/clusterkopfpeerings"
    body = {"metadata": {"name": "p"}, "status": {"me": {"priority": 1}}}
    assert samples.http(kube_api, "POST", path, body)[1]["status"] == body["status"]
    _, stored = samples.http(kube_api, "GET", f"{path}/p")
    _, replaced = samples.http(kube_api, "PUT", f"{path}/p", stored)
    assert replaced["status"] == {"me": {"priority": 1}}
    assert replaced["metadata"]["generation"] == 1  # the same status is no change
    _, patched = samples.http(
        kube_api, "PATCH", f"{path}/p", {"status": {"me": None}}, samples.MERGE
    )
    assert patched["status"] == {} and patched["metadata"]["generation"] == 2
