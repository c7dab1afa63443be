"""The Kubernetes API emulator, over real HTTP (urllib, the kubernetes client, kopf).

Covers: server-owned metadata (uid, resourceVersion, creationTimestamp, generation) and the
URL's namespace; 201/409/404/422 with `Status` bodies; list with label and field selectors,
cluster-wide; PUT with resourceVersion conflicts; merge, JSON (with `test`) and strategic merge
patches; the status subresource; deletion with finalizers and graceful pods; garbage collection
through ownerReferences; watches (resourceVersion, selector transitions, timeoutSeconds, 410);
events; the request log's RBAC verbs; the kubeconfig with the kubernetes client; and, as the
pattern for operator tests, kopf running embedded against the emulator. Discovery and custom
resources (schemas, CEL): test_emulator_crds.py.
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
import kubernetes.watch
import pytest

from tests.kube import samples
from tests.kube.support import serving

Json = dict[str, Any]


@pytest.fixture
def widgets(kube_api: serving.KubeApi) -> serving.KubeApi:
    kube_api.load_crd(samples.WIDGET_CRD)
    return kube_api


# -- metadata and status codes -----------------------------------------------------------------


def test_create_sets_server_metadata_and_answers_201(kube_api: serving.KubeApi) -> None:
    body = samples.pod("p")
    del body["metadata"]["namespace"]
    status, created = samples.http(kube_api, "POST", "/api/v1/namespaces/team/pods", body)
    meta = created["metadata"]
    assert status == 201
    assert meta["namespace"] == "team"
    assert meta["generation"] == 1 and len(meta["uid"]) == 36
    assert meta["creationTimestamp"].endswith("Z") and int(meta["resourceVersion"]) > 0
    assert created["status"]["phase"] == "Pending"


def test_conflicts_and_missing_objects_answer_status_bodies(kube_api: serving.KubeApi) -> None:
    assert samples.http(kube_api, "POST", samples.PODS, samples.pod("p"))[0] == 201
    status, body = samples.http(kube_api, "POST", samples.PODS, samples.pod("p"))
    assert (status, body["kind"], body["reason"], body["code"]) == (
        409,
        "Status",
        "AlreadyExists",
        409,
    )
    status, body = samples.http(kube_api, "GET", f"{samples.PODS}/nope")
    assert (status, body["reason"], body["message"]) == (404, "NotFound", 'pods "nope" not found')
    assert samples.http(kube_api, "GET", "/apis/nowhere.io/v1/things")[0] == 404


def test_resource_versions_grow_per_change_and_not_on_no_op(kube_api: serving.KubeApi) -> None:
    first = kube_api.apply(samples.pod("p"))["metadata"]["resourceVersion"]
    _, patched = samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", {"metadata": {"labels": {"a": "b"}}}, samples.MERGE
    )
    _, again = samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", {"metadata": {"labels": {"a": "b"}}}, samples.MERGE
    )
    assert int(patched["metadata"]["resourceVersion"]) > int(first)
    assert again["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]


def test_generation_counts_spec_changes_only(widgets: serving.KubeApi) -> None:
    widgets.apply(samples.widget("w"))
    samples.http(
        widgets,
        "PATCH",
        f"{samples.WIDGETS}/w",
        {"metadata": {"labels": {"x": "y"}}},
        samples.MERGE,
    )
    samples.http(
        widgets, "PATCH", f"{samples.WIDGETS}/w/status", {"status": {"phase": "Up"}}, samples.MERGE
    )
    _, unchanged = samples.http(widgets, "GET", f"{samples.WIDGETS}/w")
    _, bumped = samples.http(
        widgets, "PATCH", f"{samples.WIDGETS}/w", {"spec": {"size": 2}}, samples.MERGE
    )
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
    ids=[
        "equality",
        "inequality also picks pods without the label",
        "existence",
        "absence",
        "set membership",
        "set exclusion combined with existence",
        "two equalities",
    ],
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
        kube_api.apply(samples.pod(name, labels=labels))
    query = urllib.parse.quote(selector)
    assert (
        samples.names(samples.http(kube_api, "GET", f"{samples.PODS}?labelSelector={query}")[1])
        == expected
    )


def test_field_selectors_and_cluster_wide_lists(kube_api: serving.KubeApi) -> None:
    kube_api.apply(samples.pod("a"))
    kube_api.apply(samples.pod("b", namespace="other"))
    kube_api.apply({**samples.pod("c"), "status": {"phase": "Running"}})
    assert samples.names(samples.http(kube_api, "GET", "/api/v1/pods")[1]) == ["a", "c", "b"]
    assert samples.names(
        samples.http(kube_api, "GET", "/api/v1/pods?fieldSelector=metadata.name%3Db")[1]
    ) == ["b"]
    by_ns = samples.http(
        kube_api, "GET", "/api/v1/pods?fieldSelector=metadata.namespace%3Ddefault"
    )[1]
    assert samples.names(by_ns) == ["a", "c"]
    running = samples.http(kube_api, "GET", "/api/v1/pods?fieldSelector=status.phase%3DRunning")[1]
    assert samples.names(running) == ["c"]
    assert samples.http(kube_api, "GET", "/api/v1/pods?labelSelector=a%20in%20x")[0] == 400


# -- update, patch, status ----------------------------------------------------------------------


def test_put_replaces_and_rejects_stale_resource_versions(widgets: serving.KubeApi) -> None:
    stored = widgets.apply({**samples.widget("w"), "status": {"phase": "Up"}})
    replaced = {**stored, "spec": {"size": 3}, "status": {"phase": "Hacked"}}
    status, body = samples.http(widgets, "PUT", f"{samples.WIDGETS}/w", replaced)
    assert status == 200 and body["spec"] == {"size": 3, "limit": 10}
    assert body["status"] == {"phase": "Up"}  # the main endpoint ignores status
    status, conflict = samples.http(
        widgets, "PUT", f"{samples.WIDGETS}/w", replaced
    )  # replaced's rv is stale
    assert (status, conflict["reason"]) == (409, "Conflict")
    status, body = samples.http(
        widgets,
        "PUT",
        f"{samples.WIDGETS}/w/status",
        {**body, "spec": {"size": 9}, "status": {"phase": "Down"}},
    )
    assert body["status"] == {"phase": "Down"} and body["spec"]["size"] == 3


def test_merge_json_and_strategic_patches(kube_api: serving.KubeApi) -> None:
    kube_api.apply(samples.pod("p", labels={"a": "1", "b": "2"}))
    _, merged = samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", {"metadata": {"labels": {"a": None}}}, samples.MERGE
    )
    assert merged["metadata"]["labels"] == {"b": "2"}
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/metadata/labels/c", "value": "3"},
    ]
    status, body = samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", ops, "application/json-patch+json"
    )
    assert (status, body["reason"]) == (422, "Invalid")
    ops[0]["value"] = merged["metadata"]["resourceVersion"]
    _, body = samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", ops, "application/json-patch+json"
    )
    assert body["metadata"]["labels"] == {"b": "2", "c": "3"}
    sidecar = {
        "spec": {
            "containers": [{"name": "main", "image": "alpine"}, {"name": "side", "image": "nginx"}]
        }
    }
    _, body = samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", sidecar, "application/strategic-merge-patch+json"
    )
    assert [(c["name"], c["image"]) for c in body["spec"]["containers"]] == [
        ("main", "alpine"),
        ("side", "nginx"),
    ]


def test_status_subresource_patch_touches_only_status(kube_api: serving.KubeApi) -> None:
    kube_api.apply(samples.pod("p"))
    change = {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}}
    _, body = samples.http(kube_api, "PATCH", f"{samples.PODS}/p/status", change, samples.MERGE)
    assert body["status"]["phase"] == "Running" and not body["metadata"].get("labels")
    _, body = samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", {"status": {"phase": "Failed"}}, samples.MERGE
    )
    assert body["status"]["phase"] == "Running"


def test_secrets_fold_string_data(kube_api: serving.KubeApi) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"token": "abc"},
    }
    _, body = samples.http(kube_api, "POST", "/api/v1/namespaces/default/secrets", secret)
    assert body["data"] == {"token": "YWJj"} and "stringData" not in body


# -- deletion and garbage collection ------------------------------------------------------------


def test_finalizers_hold_deletion_until_removed(kube_api: serving.KubeApi) -> None:
    kube_api.apply({**samples.pod("p"), "metadata": {"name": "p", "finalizers": ["x.io/hold"]}})
    status, body = samples.http(kube_api, "DELETE", f"{samples.PODS}/p")
    assert status == 200 and body["metadata"]["deletionTimestamp"]
    assert kube_api.get("v1", "Pod", "p", "default") is not None
    status, body = samples.http(
        kube_api,
        "PATCH",
        f"{samples.PODS}/p",
        {"metadata": {"finalizers": ["x.io/hold", "x.io/more"]}},
        samples.MERGE,
    )
    assert status == 422 and "no new finalizers" in body["message"]
    samples.http(
        kube_api, "PATCH", f"{samples.PODS}/p", {"metadata": {"finalizers": None}}, samples.MERGE
    )
    assert kube_api.get("v1", "Pod", "p", "default") is None


def test_scheduled_pods_terminate_gracefully(kube_api: serving.KubeApi) -> None:
    kube_api.apply({**samples.pod("p"), "spec": {"nodeName": "node-1", "containers": []}})
    _, body = samples.http(kube_api, "DELETE", f"{samples.PODS}/p")
    assert body["metadata"]["deletionGracePeriodSeconds"] == 30
    assert kube_api.get("v1", "Pod", "p", "default") is not None
    samples.http(kube_api, "DELETE", f"{samples.PODS}/p", {"gracePeriodSeconds": 0})
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
    owner = widgets.apply(samples.widget("w"))
    child = widgets.apply(_owned("child", owner))
    widgets.apply(_owned("grandchild", child, kind="Secret"))
    kept = widgets.apply(samples.widget("other"))
    widgets.apply(_owned("kept", kept))
    samples.http(widgets, "DELETE", f"{samples.WIDGETS}/w")
    assert widgets.get("v1", "ConfigMap", "child", "default") is None
    assert widgets.get("v1", "Secret", "grandchild", "default") is None
    assert widgets.get("v1", "ConfigMap", "kept", "default") is not None
    samples.http(widgets, "DELETE", f"{samples.WIDGETS}/other", {"propagationPolicy": "Orphan"})
    assert widgets.get("v1", "ConfigMap", "kept", "default") is not None


# -- watches ------------------------------------------------------------------------------------


def _watch(api: serving.KubeApi, path: str) -> Any:
    return urllib.request.urlopen(api.url + path, timeout=5)


def _events(stream: Any, count: int) -> list[tuple[str, str]]:
    lines = [json.loads(stream.readline()) for _ in range(count)]
    return [(line["type"], line["object"]["metadata"]["name"]) for line in lines]


def test_watch_from_a_list_version_streams_changes(kube_api: serving.KubeApi) -> None:
    kube_api.apply(samples.pod("old"))
    version = samples.http(kube_api, "GET", samples.PODS)[1]["metadata"]["resourceVersion"]
    with _watch(
        kube_api, f"{samples.PODS}?watch=true&resourceVersion={version}&timeoutSeconds=5"
    ) as s:
        kube_api.apply(samples.pod("new", labels={"a": "b"}))
        kube_api.apply(samples.pod("new", labels={"a": "c"}))
        kube_api.delete("v1", "Pod", "new", "default")
        assert _events(s, 3) == [("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "new")]


def test_watch_without_version_lists_first_and_honours_selectors(kube_api: serving.KubeApi) -> None:
    kube_api.apply(samples.pod("a", labels={"app": "web"}))
    kube_api.apply(samples.pod("b"))
    with _watch(kube_api, f"{samples.PODS}?watch=1&labelSelector=app%3Dweb&timeoutSeconds=5") as s:
        assert _events(s, 1) == [("ADDED", "a")]
        kube_api.apply(samples.pod("b", labels={"app": "web"}))  # enters the selection
        kube_api.apply(samples.pod("a", labels={"app": "db"}))  # leaves it
        assert _events(s, 2) == [("ADDED", "b"), ("DELETED", "a")]


def test_watch_ends_after_timeout_seconds(kube_api: serving.KubeApi) -> None:
    with _watch(kube_api, f"{samples.PODS}?watch=true&timeoutSeconds=1") as stream:
        assert stream.read() == b""  # the server closed the stream


def test_watch_from_a_forgotten_version_is_expired(tmp_path: pathlib.Path) -> None:
    with serving.serve(tmp_path, history=2) as api:
        for name in "abc":
            api.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
        with _watch(api, f"{samples.PODS}?watch=true&resourceVersion=1") as stream:
            event = json.loads(stream.readline())
    assert (event["type"], event["object"]["code"], event["object"]["reason"]) == (
        "ERROR",
        410,
        "Expired",
    )


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
    status, created = samples.http(kube_api, "POST", "/api/v1/namespaces/default/events", event)
    assert status == 201 and created["metadata"]["name"].startswith("p.")
    new_style = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e"},
        "reason": "Started",
        "note": "hi",
    }
    assert (
        samples.http(
            kube_api, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", new_style
        )[0]
        == 201
    )
    assert [e["reason"] for e in kube_api.list("v1", "Event")] == ["Started"]
    assert [e["note"] for e in kube_api.list("events.k8s.io/v1", "Event")] == ["hi"]


def test_request_log_names_rbac_verbs(kube_api: serving.KubeApi) -> None:
    samples.http(kube_api, "POST", samples.PODS, samples.pod("p"))
    samples.http(kube_api, "GET", f"{samples.PODS}/p")
    samples.http(kube_api, "GET", "/api/v1/pods")
    samples.http(kube_api, "PATCH", f"{samples.PODS}/p/status", {"status": {}}, samples.MERGE)
    _, current = samples.http(kube_api, "GET", f"{samples.PODS}/p")
    samples.http(kube_api, "PUT", f"{samples.PODS}/p", current)
    samples.http(kube_api, "DELETE", f"{samples.PODS}/p")
    samples.http(kube_api, "DELETE", "/api/v1/namespaces/default/configmaps")
    _watch(kube_api, f"{samples.PODS}?watch=true").close()  # logged on arrival
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
        watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
        listed = core.list_namespaced_config_map
        for event in watch.stream(listed, "default", timeout_seconds=5):  # type: ignore[no-untyped-call]
            assert (event["type"], event["object"].metadata.name) == ("ADDED", "c")
            watch.stop()  # type: ignore[no-untyped-call]
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
        widgets.apply(samples.widget("w", size=3))

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


@pytest.mark.asyncio
async def test_kopf_peering_keeps_its_identity_in_a_peering_object(
    widgets: serving.KubeApi,
) -> None:
    widgets.load_crd(samples.peering_crd(clusterwide=False))
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "widgets", "namespace": "default"},
    }
    widgets.apply(peering)
    registry = kopf.OperatorRegistry()
    widget_operator(registry)

    def peers() -> Json:
        obj = widgets.get("kopf.dev/v1", "KopfPeering", "widgets", "default") or {}
        return dict(obj.get("status") or {})

    stop = asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            registry=registry, peering_name="widgets", namespaces=["default"], stop_flag=stop
        )
    )
    try:
        await eventually(lambda: bool(peers()))
        [(identity, peer)] = peers().items()
        assert peer["priority"] == 0 and peer["lifetime"] > 0
    finally:
        stop.set()
        await asyncio.wait_for(operator, timeout=5)
    assert identity not in peers()  # kopf removes itself on exit
