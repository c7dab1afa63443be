"""The one door to the Kubernetes API for the operator's own calls (kopf makes its own: watches,
progress annotations, peering, Events).

    api = Api.from_environment()          # in-cluster service account, else KUBECONFIG
    pod = await api.create(PODS, "ml", body)
    await api.patch(JOB_STATUS, "ml", "tiny", {"status": {...}})

Requests are plain JSON in and out (dicts), sent by the `kubernetes` client's REST layer (its
authentication: tokens, client certificates, the cluster CA) in a worker thread, so the event
loop never blocks. `Resource` names a collection path; the calls used are exactly those of
`constants.RBAC_RULES` (tests compare the emulator's request log with them).

Errors (foreign exceptions translated here):

    KubeError            any failed call; `status` is the HTTP status (0: no answer)
    ├── NotFound         404
    ├── Conflict         409: the object exists already, or a stale write
    └── Rejected         400 / 422: the server refused the object (message: its causes)
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any
from urllib import parse

import kubernetes
import urllib3
from kubernetes.client import exceptions as client_exceptions

from planaria.kube import constants

TIMEOUT_S = 10.0
MERGE_PATCH = "application/merge-patch+json"
Json = dict[str, Any]


class KubeError(RuntimeError):
    """A Kubernetes API call failed; `status` is the HTTP status (0 when none came back)."""

    def __init__(self, what: str, status: int, detail: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeError):
    """409: the object already exists, or a write raced another."""


class Rejected(KubeError):
    """400 / 422: the API server refused the object as invalid."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """A namespaced collection: `/api/v1/namespaces/NS/pods` or a custom resource's."""

    group: str  # "" for the core API
    version: str
    plural: str
    subresource: str = ""

    def path(self, namespace: str, name: str = "") -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        path = f"{base}/namespaces/{parse.quote(namespace)}/{self.plural}"
        if name:
            path += f"/{parse.quote(name)}"
        return path + (f"/{self.subresource}" if self.subresource else "")


PODS = Resource(group="", version="v1", plural="pods")
SERVICES = Resource(group="", version="v1", plural="services")
SECRETS = Resource(group="", version="v1", plural="secrets")
CONFIGMAPS = Resource(group="", version="v1", plural="configmaps")
JOB_STATUS = Resource(
    group=constants.GROUP, version=constants.VERSION, plural=constants.PLURAL, subresource="status"
)


class Api:
    """Asynchronous JSON calls over one `kubernetes` client configuration."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self._client = kubernetes.client.ApiClient(configuration)

    @classmethod
    def from_environment(cls) -> Api:
        """The in-cluster service account when running in a pod, else the kubeconfig
        (KUBECONFIG or ~/.kube/config), as kopf's own login does."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except kubernetes.config.ConfigException:
            # KUBECONFIG read now: the client's default location was fixed at its import.
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
            )
        return cls(configuration)

    async def get(self, resource: Resource, namespace: str, name: str) -> Json:
        return await self._call("GET", resource.path(namespace, name))

    async def list(self, resource: Resource, namespace: str, *, labels: str = "") -> list[Json]:
        """The items of `resource` in `namespace` matching the label selector `labels`."""
        query = f"?labelSelector={parse.quote(labels)}" if labels else ""
        found = await self._call("GET", resource.path(namespace) + query)
        items: list[Json] = found.get("items") or []
        return items

    async def create(self, resource: Resource, namespace: str, body: Json) -> Json:
        return await self._call("POST", resource.path(namespace), body)

    async def patch(self, resource: Resource, namespace: str, name: str, body: Json) -> Json:
        """A JSON merge patch (RFC 7386) of the object `name`."""
        return await self._call("PATCH", resource.path(namespace, name), body, MERGE_PATCH)

    async def delete(self, resource: Resource, namespace: str, name: str) -> None:
        """Delete `name` (background propagation: owned objects follow); NotFound when gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        await self._call("DELETE", resource.path(namespace, name), body)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    async def _call(
        self, method: str, path: str, body: Json | None = None, content: str = "application/json"
    ) -> Json:
        return await asyncio.to_thread(self._request, method, path, body, content)

    def _request(self, method: str, path: str, body: Json | None, content: str) -> Json:
        headers = {"Accept": "application/json", "Content-Type": content}
        _, url, headers, payload, _ = self._client.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        what = f"{method} {path.split('?')[0]}"
        try:
            answer = self._client.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=TIMEOUT_S
            )
            data = answer.read()  # type: ignore[no-untyped-call]
        except (client_exceptions.ApiException, urllib3.exceptions.HTTPError) as exc:
            raise KubeError(what, getattr(exc, "status", 0) or 0, str(exc)) from exc
        if answer.status >= 400:
            raise _error(what, answer.status, data)
        decoded: Json = json.loads(data) if data else {}
        return decoded


def _error(what: str, status: int, data: bytes) -> KubeError:
    """The exception for an error answer, with the server's message (a `Status` object)."""
    try:
        detail = str(json.loads(data).get("message", ""))
    except (ValueError, AttributeError):
        detail = data[:200].decode("utf-8", "replace")
    kind = {404: NotFound, 409: Conflict, 400: Rejected, 422: Rejected}.get(status, KubeError)
    return kind(what, status, detail)
