"""Samples for the emulator's own tests: a throwaway custom resource and raw HTTP.

`WIDGET_CRD` declares `widgets.example.com` (namespaced, status subresource, defaults, an
int-or-string field, a preserve-unknown-fields map, CEL rules including a transition rule);
`http()` sends one request with urllib and returns the status and JSON body, errors included.
"""

import json
import urllib.error
import urllib.request
from typing import Any

from tests.kube.support import serving

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


def peering_crd(*, clusterwide: bool) -> Json:
    """kopf's peering CRD (KopfPeering, or ClusterKopfPeering), as kopf's docs declare it."""
    kind = "ClusterKopfPeering" if clusterwide else "KopfPeering"
    plural = kind.lower() + "s"
    status = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": "Cluster" if clusterwide else "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"status": status}}
                    },
                }
            ],
        },
    }
