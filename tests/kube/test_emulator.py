"""The Kubernetes API emulator, over real HTTP (urllib, the kubernetes client, kopf).

Covers: server-owned metadata (uid, resourceVersion, creationTimestamp, generation) and the
URL's namespace; 201/409/404/422 with `Status` bodies; list with label and field selectors,
cluster-wide; PUT with resourceVersion conflicts; merge, JSON (with `test`) and strategic merge
patches; the status subresource; deletion with finalizers and graceful pods; garbage collection
through ownerReferences; watches (resourceVersion, selector transitions, timeoutSeconds, 410);
discovery of built-in kinds and of CRDs created over HTTP; CRD defaulting, pruning, schema and
CEL validation (transition rules too); events; the request log's RBAC verbs; the kubeconfig; and,
as the pattern for operator tests, kopf running embedded against the emulator.
"""

import asyncio
import json
import os
import pathlib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import kopf
import kubernetes
import pytest
import yaml

from tests.kube.support import serving, store

Json = dict[str, Any]
PODS = "/api/v1/namespaces/default/pods"
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"
MERGE = "application/merge-patch+json"

WIDGET_CRD: Json = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wd"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.size <= self.limit",
                                        "message": "size must not exceed limit",
                                    },
                                    {
                                        "rule": "self.size >= oldSelf.size",
                                        "message": "size cannot shrink",
                                    },
                                ],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "limit": {"type": "integer", "default": 10},
                                    "port": {"x-kubernetes-int-or-string": True},
                                    "extra": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, **spec: Any) -> Json:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": 1, **spec},
    }


def pod(name: str, namespace: str = "default", labels: dict[str, str] | None = None) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def http(
    api: serving.KubeApi,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Json]:
    """One request with urllib; returns the status and the JSON body (errors included)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        api.url + path, data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def names(listing: Json) -> list[str]:
    return [item["metadata"]["name"] for item in listing["items"]]


@pytest.fixture
def widgets(kube_api: serving.KubeApi) -> serving.KubeApi:
    kube_api.load_crd(WIDGET_CRD)
    return kube_api


# -- metadata and status codes -----------------------------------------------------------------


def test_create_sets_server_metadata_and_answers_201(kube_api: serving.KubeApi) -> None:
    body = pod("p")
    del body["metadata"]["namespace"]
    status, created = http(kube_api, "POST", "/api/v1/namespaces/team/pods", body)
    meta = created["metadata"]
    assert status == 201
    assert meta["namespace"] == "team"
    assert meta["generation"] == 1 and len(meta["uid"]) == 36
    assert meta["creationTimestamp"].endswith("Z") and int(meta["resourceVersion"]) > 0
    assert created["status"]["phase"] == "Pending"


def test_conflicts_and_missing_objects_answer_status_bodies(kube_api: serving.KubeApi) -> None:
    assert http(kube_api, "POST", PODS, pod("p"))[0] == 201
    status, body = http(kube_api, "POST", PODS, pod("p"))
    assert (status, body["kind"], body["reason"], body["code"]) == (
        409,
        "Status",
        "AlreadyExists",
        409,
    )
    status, body = http(kube_api, "GET", f"{PODS}/nope")
    assert (status, body["reason"], body["message"]) == (404, "NotFound", 'pods "nope" not found')
    assert http(kube_api, "GET", "/apis/nowhere.io/v1/things")[0] == 404


def test_resource_versions_grow_per_change_and_not_on_no_op(kube_api: serving.KubeApi) -> None:
    first = kube_api.apply(pod("p"))["metadata"]["resourceVersion"]
    _, patched = http(kube_api, "PATCH", f"{PODS}/p", {"metadata": {"labels": {"a": "b"}}}, MERGE)
    _, again = http(kube_api, "PATCH", f"{PODS}/p", {"metadata": {"labels": {"a": "b"}}}, MERGE)
    assert int(patched["metadata"]["resourceVersion"]) > int(first)
    assert again["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]


def test_generation_counts_spec_changes_only(widgets: serving.KubeApi) -> None:
    widgets.apply(widget("w"))
    http(widgets, "PATCH", f"{WIDGETS}/w", {"metadata": {"labels": {"x": "y"}}}, MERGE)
    http(widgets, "PATCH", f"{WIDGETS}/w/status", {"status": {"phase": "Up"}}, MERGE)
    _, unchanged = http(widgets, "GET", f"{WIDGETS}/w")
    _, bumped = http(widgets, "PATCH", f"{WIDGETS}/w", {"spec": {"size": 2}}, MERGE)
    assert unchanged["metadata"]["generation"] == 1
    assert bumped["metadata"]["generation"] == 2


# -- list and selectors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
        ("app in (db,cache)", ["c"]),
        ("app notin (web),tier", ["c"]),
        ("app=web,tier=front", ["a"]),
    ],
    ids=lambda value: str(value),
)
def test_label_selectors_pick_pods(
    kube_api: serving.KubeApi, selector: str, expected: list[str]
) -> None:
    for name, labels in [
        ("a", {"app": "web", "tier": "front"}),
        ("b", {"app": "web"}),
        ("c", {"app": "db", "tier": "back"}),
        ("d", {}),
    ]:
        kube_api.apply(pod(name, labels=labels))
    query = urllib.parse.quote(selector)
    assert names(http(kube_api, "GET", f"{PODS}?labelSelector={query}")[1]) == expected


def test_field_selectors_and_cluster_wide_lists(kube_api: serving.KubeApi) -> None:
    kube_api.apply(pod("a"))
    kube_api.apply(pod("b", namespace="other"))
    kube_api.apply({**pod("c"), "status": {"phase": "Running"}})
    assert names(http(kube_api, "GET", "/api/v1/pods")[1]) == ["a", "c", "b"]
    assert names(http(kube_api, "GET", "/api/v1/pods?fieldSelector=metadata.name%3Db")[1]) == ["b"]
    by_ns = http(kube_api, "GET", "/api/v1/pods?fieldSelector=metadata.namespace%3Ddefault")[1]
    assert names(by_ns) == ["a", "c"]
    running = http(kube_api, "GET", "/api/v1/pods?fieldSelector=status.phase%3DRunning")[1]
    assert names(running) == ["c"]
    assert http(kube_api, "GET", "/api/v1/pods?labelSelector=a%20in%20x")[0] == 400


# -- update, patch, status ----------------------------------------------------------------------


def test_put_replaces_and_rejects_stale_resource_versions(widgets: serving.KubeApi) -> None:
    stored = widgets.apply({**widget("w"), "status": {"phase": "Up"}})
    replaced = {**stored, "spec": {"size": 3}, "status": {"phase": "Hacked"}}
    status, body = http(widgets, "PUT", f"{WIDGETS}/w", replaced)
    assert status == 200 and body["spec"] == {"size": 3, "limit": 10}
    assert body["status"] == {"phase": "Up"}  # the main endpoint ignores status
    status, conflict = http(widgets, "PUT", f"{WIDGETS}/w", replaced)  # replaced's rv is stale
    assert (status, conflict["reason"]) == (409, "Conflict")
    status, body = http(
        widgets,
        "PUT",
        f"{WIDGETS}/w/status",
        {**body, "spec": {"size": 9}, "status": {"phase": "Down"}},
    )
    assert body["status"] == {"phase": "Down"} and body["spec"]["size"] == 3


def test_merge_json_and_strategic_patches(kube_api: serving.KubeApi) -> None:
    kube_api.apply(pod("p", labels={"a": "1", "b": "2"}))
    _, merged = http(kube_api, "PATCH", f"{PODS}/p", {"metadata": {"labels": {"a": None}}}, MERGE)
    assert merged["metadata"]["labels"] == {"b": "2"}
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/metadata/labels/c", "value": "3"},
    ]
    status, body = http(kube_api, "PATCH", f"{PODS}/p", ops, "application/json-patch+json")
    assert (status, body["reason"]) == (422, "Invalid")
    ops[0]["value"] = merged["metadata"]["resourceVersion"]
    _, body = http(kube_api, "PATCH", f"{PODS}/p", ops, "application/json-patch+json")
    assert body["metadata"]["labels"] == {"b": "2", "c": "3"}
    sidecar = {
        "spec": {
            "containers": [{"name": "main", "image": "alpine"}, {"name": "side", "image": "nginx"}]
        }
    }
    _, body = http(
        kube_api, "PATCH", f"{PODS}/p", sidecar, "application/strategic-merge-patch+json"
    )
    assert [(c["name"], c["image"]) for c in body["spec"]["containers"]] == [
        ("main", "alpine"),
        ("side", "nginx"),
    ]


def test_status_subresource_patch_touches_only_status(kube_api: serving.KubeApi) -> None:
    kube_api.apply(pod("p"))
    change = {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}}
    _, body = http(kube_api, "PATCH", f"{PODS}/p/status", change, MERGE)
    assert body["status"]["phase"] == "Running" and not body["metadata"].get("labels")
    _, body = http(kube_api, "PATCH", f"{PODS}/p", {"status": {"phase": "Failed"}}, MERGE)
    assert body["status"]["phase"] == "Running"


def test_secrets_fold_string_data(kube_api: serving.KubeApi) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"token": "abc"},
    }
    _, body = http(kube_api, "POST", "/api/v1/namespaces/default/secrets", secret)
    assert body["data"] == {"token": "YWJj"} and "stringData" not in body


# -- deletion and garbage collection ------------------------------------------------------------


def test_finalizers_hold_deletion_until_removed(kube_api: serving.KubeApi) -> None:
    kube_api.apply({**pod("p"), "metadata": {"name": "p", "finalizers": ["x.io/hold"]}})
    status, body = http(kube_api, "DELETE", f"{PODS}/p")
    assert status == 200 and body["metadata"]["deletionTimestamp"]
    assert kube_api.get("v1", "Pod", "p", "default") is not None
    status, body = http(
        kube_api,
        "PATCH",
        f"{PODS}/p",
        {"metadata": {"finalizers": ["x.io/hold", "x.io/more"]}},
        MERGE,
    )
    assert status == 422 and "no new finalizers" in body["message"]
    http(kube_api, "PATCH", f"{PODS}/p", {"metadata": {"finalizers": None}}, MERGE)
    assert kube_api.get("v1", "Pod", "p", "default") is None


def test_scheduled_pods_terminate_gracefully(kube_api: serving.KubeApi) -> None:
    kube_api.apply({**pod("p"), "spec": {"nodeName": "node-1", "containers": []}})
    _, body = http(kube_api, "DELETE", f"{PODS}/p")
    assert body["metadata"]["deletionGracePeriodSeconds"] == 30
    assert kube_api.get("v1", "Pod", "p", "default") is not None
    http(kube_api, "DELETE", f"{PODS}/p", {"gracePeriodSeconds": 0})
    assert kube_api.get("v1", "Pod", "p", "default") is None


def _owned(name: str, owner: Json, kind: str = "ConfigMap") -> Json:
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [ref]},
    }


def test_deleting_an_owner_collects_its_dependents(widgets: serving.KubeApi) -> None:
    owner = widgets.apply(widget("w"))
    child = widgets.apply(_owned("child", owner))
    widgets.apply(_owned("grandchild", child, kind="Secret"))
    kept = widgets.apply(widget("other"))
    widgets.apply(_owned("kept", kept))
    http(widgets, "DELETE", f"{WIDGETS}/w")
    assert widgets.get("v1", "ConfigMap", "child", "default") is None
    assert widgets.get("v1", "Secret", "grandchild", "default") is None
    assert widgets.get("v1", "ConfigMap", "kept", "default") is not None
    http(widgets, "DELETE", f"{WIDGETS}/other", {"propagationPolicy": "Orphan"})
    assert widgets.get("v1", "ConfigMap", "kept", "default") is not None


# -- watches ------------------------------------------------------------------------------------


def _watch(api: serving.KubeApi, path: str) -> Any:
    return urllib.request.urlopen(api.url + path, timeout=5)


def _events(stream: Any, count: int) -> list[tuple[str, str]]:
    lines = [json.loads(stream.readline()) for _ in range(count)]
    return [(line["type"], line["object"]["metadata"]["name"]) for line in lines]


def test_watch_from_a_list_version_streams_changes(kube_api: serving.KubeApi) -> None:
    kube_api.apply(pod("old"))
    version = http(kube_api, "GET", PODS)[1]["metadata"]["resourceVersion"]
    with _watch(kube_api, f"{PODS}?watch=true&resourceVersion={version}&timeoutSeconds=5") as s:
        kube_api.apply(pod("new", labels={"a": "b"}))
        kube_api.apply(pod("new", labels={"a": "c"}))
        kube_api.delete("v1", "Pod", "new", "default")
        assert _events(s, 3) == [("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "new")]


def test_watch_without_version_lists_first_and_honours_selectors(kube_api: serving.KubeApi) -> None:
    kube_api.apply(pod("a", labels={"app": "web"}))
    kube_api.apply(pod("b"))
    with _watch(kube_api, f"{PODS}?watch=1&labelSelector=app%3Dweb&timeoutSeconds=5") as s:
        assert _events(s, 1) == [("ADDED", "a")]
        kube_api.apply(pod("b", labels={"app": "web"}))  # enters the selection
        kube_api.apply(pod("a", labels={"app": "db"}))  # leaves it
        assert _events(s, 2) == [("ADDED", "b"), ("DELETED", "a")]


def test_watch_ends_after_timeout_seconds(kube_api: serving.KubeApi) -> None:
    with _watch(kube_api, f"{PODS}?watch=true&timeoutSeconds=1") as stream:
        assert stream.read() == b""  # the server closed the stream


def test_watch_from_a_forgotten_version_is_expired() -> None:
    objects = store.Store(history=2)
    for name in "abc":
        objects.create(
            objects.kind("", "v1", "configmaps"), "default", {"metadata": {"name": name}}
        )
    with pytest.raises(store.ApiError) as caught:
        objects.subscribe(lambda event: None, since=1)
    assert caught.value.code == 410


# -- discovery, CRDs, schemas -------------------------------------------------------------------


def test_discovery_lists_builtin_kinds(kube_api: serving.KubeApi) -> None:
    core = http(kube_api, "GET", "/api/v1")[1]
    assert core["groupVersion"] == "v1"
    assert {"pods", "pods/status", "services", "secrets", "events", "namespaces", "nodes"} <= {
        r["name"] for r in core["resources"]
    }
    groups = {g["name"] for g in http(kube_api, "GET", "/apis")[1]["groups"]}
    assert {"coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io"} <= groups
    leases = http(kube_api, "GET", "/apis/coordination.k8s.io/v1")[1]["resources"]
    assert [(r["name"], r["namespaced"]) for r in leases] == [("leases", True)]


def test_a_crd_posted_over_http_is_discovered_and_served(kube_api: serving.KubeApi) -> None:
    status, crd = http(
        kube_api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD
    )
    assert status == 201
    assert {c["type"] for c in crd["status"]["conditions"]} == {"Established", "NamesAccepted"}
    assert "example.com" in {g["name"] for g in http(kube_api, "GET", "/apis")[1]["groups"]}
    served = {r["name"]: r for r in http(kube_api, "GET", "/apis/example.com/v1")[1]["resources"]}
    assert set(served) == {"widgets", "widgets/status"}
    assert (served["widgets"]["kind"], served["widgets"]["shortNames"]) == ("Widget", ["wd"])
    assert served["widgets"]["namespaced"] is True and "watch" in served["widgets"]["verbs"]
    assert http(kube_api, "POST", WIDGETS, widget("w"))[0] == 201
    http(
        kube_api,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
    )
    assert http(kube_api, "GET", WIDGETS)[0] == 404


def test_load_crd_reads_yaml_files(kube_api: serving.KubeApi, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump_all([WIDGET_CRD]))
    assert [crd["metadata"]["name"] for crd in kube_api.load_crd(path)] == ["widgets.example.com"]
    with pytest.raises(ValueError, match="no CustomResourceDefinition"):
        kube_api.load_crd(tmp_path / "crd.yaml" if False else _write(tmp_path, "x: 1\n"))


def _write(directory: pathlib.Path, text: str) -> pathlib.Path:
    path = directory / "other.yaml"
    path.write_text(text)
    return path


def test_crd_defaults_prune_and_validate(widgets: serving.KubeApi) -> None:
    status, body = http(
        widgets, "POST", WIDGETS, widget("w", port="http", junk=1, extra={"any": {"thing": 1}})
    )
    assert status == 201
    assert body["spec"] == {"size": 1, "limit": 10, "port": "http", "extra": {"any": {"thing": 1}}}
    status, body = http(widgets, "POST", WIDGETS, widget("bad", size=0, port=1.5))
    assert (status, body["reason"], body["code"]) == (422, "Invalid", 422)
    fields = {cause["field"] for cause in body["details"]["causes"]}
    assert fields == {"spec.size", "spec.port"}
    assert body["message"].startswith('Widget.example.com "bad" is invalid: [spec.port')


def test_cel_rules_and_transition_rules(widgets: serving.KubeApi) -> None:
    status, body = http(widgets, "POST", WIDGETS, widget("w", size=20))
    assert status == 422 and "size must not exceed limit" in body["message"]
    assert http(widgets, "POST", WIDGETS, widget("w", size=5))[0] == 201
    status, body = http(widgets, "PATCH", f"{WIDGETS}/w", {"spec": {"size": 4}}, MERGE)
    assert status == 422 and body["details"]["causes"][0] == {
        "reason": "FieldValueInvalid",
        "field": "spec",
        "message": 'Invalid value: "object": size cannot shrink',
    }
    assert http(widgets, "PATCH", f"{WIDGETS}/w", {"spec": {"size": 6}}, MERGE)[0] == 200


# -- events, the request log, the kubeconfig ----------------------------------------------------


def test_events_are_stored_and_listed(kube_api: serving.KubeApi) -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "p."},
        "involvedObject": {"kind": "Pod", "name": "p"},
        "reason": "Started",
        "message": "hi",
    }
    status, created = http(kube_api, "POST", "/api/v1/namespaces/default/events", event)
    assert status == 201 and created["metadata"]["name"].startswith("p.")
    new_style = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e"},
        "reason": "Started",
        "note": "hi",
    }
    assert (
        http(kube_api, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", new_style)[0]
        == 201
    )
    assert [e["reason"] for e in kube_api.list("v1", "Event")] == ["Started"]
    assert [e["note"] for e in kube_api.list("events.k8s.io/v1", "Event")] == ["hi"]


def test_request_log_names_rbac_verbs(kube_api: serving.KubeApi) -> None:
    http(kube_api, "POST", PODS, pod("p"))
    http(kube_api, "GET", f"{PODS}/p")
    http(kube_api, "GET", "/api/v1/pods")
    http(kube_api, "PATCH", f"{PODS}/p/status", {"status": {}}, MERGE)
    _, current = http(kube_api, "GET", f"{PODS}/p")
    http(kube_api, "PUT", f"{PODS}/p", current)
    http(kube_api, "DELETE", f"{PODS}/p")
    http(kube_api, "DELETE", "/api/v1/namespaces/default/configmaps")
    with _watch(kube_api, f"{PODS}?watch=true&timeoutSeconds=1") as stream:
        stream.read()
    calls = [(c.verb, c.resource, c.subresource, c.namespace) for c in kube_api.requests]
    assert calls == [
        ("create", "pods", None, "default"),
        ("get", "pods", None, "default"),
        ("list", "pods", None, None),
        ("patch", "pods", "status", "default"),
        ("get", "pods", None, "default"),
        ("update", "pods", None, "default"),
        ("delete", "pods", None, "default"),
        ("deletecollection", "configmaps", None, "default"),
        ("watch", "pods", None, "default"),
    ]


def test_the_kubeconfig_serves_the_kubernetes_client(kube_api: serving.KubeApi) -> None:
    # The client reads $KUBECONFIG when it is imported, before the fixture sets it: pass the path.
    config_file = os.environ["KUBECONFIG"]
    new_client = kubernetes.config.new_client_from_config
    client = new_client(config_file=config_file)  # type: ignore[no-untyped-call]
    try:
        core = kubernetes.client.CoreV1Api(client)
        config_map = kubernetes.client.V1ConfigMap(
            metadata=kubernetes.client.V1ObjectMeta(name="c"), data={"k": "v"}
        )
        core.create_namespaced_config_map("default", config_map)
        assert core.read_namespaced_config_map("c", "default").data == {"k": "v"}
        with pytest.raises(kubernetes.client.ApiException) as caught:
            core.create_namespaced_config_map("default", config_map)
        assert caught.value.status == 409
        assert json.loads(caught.value.body or "{}")["reason"] == "AlreadyExists"
    finally:
        client.close()


# -- kopf, embedded: the pattern operator tests follow ------------------------------------------


def widget_operator(registry: kopf.OperatorRegistry) -> None:
    """A throwaway operator: doubles spec.size into status, and holds deletion with a finalizer."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)  # reads $KUBECONFIG, set by kube_api

    @kopf.on.create("example.com", "v1", "widgets", id="doubler", registry=registry)
    def created(spec: kopf.Spec, body: kopf.Body, **_: Any) -> Json:
        kopf.info(body, reason="Doubled", message="doubled the size")
        return {"size": spec["size"] * 2}

    @kopf.on.delete("example.com", "v1", "widgets", id="farewell", registry=registry)
    def deleted(**_: Any) -> None:
        pass


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_kopf_runs_embedded_against_the_emulator(widgets: serving.KubeApi) -> None:
    registry = kopf.OperatorRegistry()
    widget_operator(registry)
    stop, ready = asyncio.Event(), asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            registry=registry,
            standalone=True,
            namespaces=["default"],
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), timeout=5)
        widgets.apply(widget("w", size=3))

        def done() -> bool:
            obj = widgets.get("example.com/v1", "Widget", "w", "default") or {}
            return "doubler" in obj.get("status", {})

        await eventually(done)
        obj = widgets.get("example.com/v1", "Widget", "w", "default")
        assert obj is not None and obj["status"]["doubler"] == {"size": 6}
        assert obj["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
        await eventually(lambda: any(e["reason"] == "Doubled" for e in widgets.list("v1", "Event")))
        widgets.delete("example.com/v1", "Widget", "w", "default")
        await eventually(lambda: widgets.get("example.com/v1", "Widget", "w", "default") is None)
    finally:
        stop.set()
        await asyncio.wait_for(operator, timeout=5)
    used = {(c.verb, c.group, c.resource, c.subresource) for c in widgets.requests}
    assert ("patch", "example.com", "widgets", "status") in used
    assert ("watch", "example.com", "widgets", None) in used
    assert ("create", "", "events", None) in used
