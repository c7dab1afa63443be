"""A real control plane (scripts/kube-control-plane.sh) for the operator's tests, and a small
JSON client for it.

`ControlPlane.start(workdir)` starts etcd, kube-apiserver (token authentication, RBAC) and
kube-controller-manager on loopback and reads their connection from `<workdir>/env`; `stop()`
ends them. `binaries()` is the folder of the built binaries, or None when they are not built.

`Client(server, ca_file, token)` makes plain JSON calls (`request`, and the helpers `get`,
`list`, `apply`, `delete` that the tests and tests.kube.operating use); an error
answer raises `ApiError` with the HTTP status and the server's message.
`install_chart(client, namespace)` applies the chart's CRDs exactly as shipped (waiting until
established) and the chart's ServiceAccount, Role and RoleBinding as rendered for `namespace`;
`service_account_token` asks the server for a token of that ServiceAccount (TokenRequest).
`refused_calls(records)` picks the log records that report a call refused with HTTP 403.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import pathlib
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import aiohttp
import helm_python
import yaml

Json = dict[str, Any]
ROOT = pathlib.Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "kube-control-plane.sh"
CHART = ROOT / "charts" / "planaria"
RELEASE = "planaria"

# Kinds the tests name, with their collection: (group/version path, plural).
_PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "Event": "events",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ResilientJob": "resilientjobs",
    "KopfPeering": "kopfpeerings",
    "CustomResourceDefinition": "customresourcedefinitions",
}
_CLUSTER_SCOPED = {"CustomResourceDefinition"}


class ApiError(RuntimeError):
    """An error answer: `status` is the HTTP status, `message` the server's."""

    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status, self.message = status, message


def binaries() -> pathlib.Path | None:
    """The folder of the built control plane binaries, or None when not built."""
    found = subprocess.run(["bash", str(SCRIPT), "path"], capture_output=True, text=True)
    return pathlib.Path(found.stdout.strip()) if found.returncode == 0 else None


def collection(api_version: str, kind: str, namespace: str | None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    where = "" if kind in _CLUSTER_SCOPED or namespace is None else f"/namespaces/{namespace}"
    return f"{base}{where}/{_PLURALS[kind]}"


class Client:
    """JSON over HTTPS to the API server with one bearer token."""

    def __init__(self, server: str, ca_file: pathlib.Path, token: str) -> None:
        self.server, self.ca_file, self.token = server, ca_file, token
        self._tls = ssl.create_default_context(cafile=str(ca_file))

    def request(
        self, method: str, path: str, body: Any = None, content: str = "application/json"
    ) -> Json:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content
        call = urllib.request.Request(self.server + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(call, context=self._tls, timeout=30) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = str(json.loads(raw).get("message", ""))
            except ValueError:
                message = raw[:300].decode("utf-8", "replace")
            raise ApiError(f"{method} {path}", exc.code, message) from None
        decoded: Json = json.loads(text) if text else {}
        return decoded

    # get / list / apply / delete, as tests.kube.operating and the tests use them.

    def get(self, api_version: str, kind: str, name: str, namespace: str | None) -> Json | None:
        try:
            return self.request("GET", f"{collection(api_version, kind, namespace)}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str = ""
    ) -> list[Json]:
        query = f"?labelSelector={urllib.parse.quote(label_selector)}" if label_selector else ""
        found = self.request("GET", collection(api_version, kind, namespace) + query)
        items: list[Json] = found.get("items") or []
        return items

    def apply(self, obj: Json) -> Json:
        """Create `obj`, or replace it (with the stored resourceVersion) if it exists; the
        fields the server sets (uid, resourceVersion, ...) in `obj` are ignored."""
        server_set = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink")
        meta = {k: v for k, v in obj["metadata"].items() if k not in server_set}
        obj = {**obj, "metadata": meta}
        path = collection(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        try:
            return self.request("POST", path, obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
        stored = self.request("GET", f"{path}/{meta['name']}")
        replaced = {
            **obj,
            "metadata": {**meta, "resourceVersion": stored["metadata"]["resourceVersion"]},
        }
        return self.request("PUT", f"{path}/{meta['name']}", replaced)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None) -> None:
        self.request("DELETE", f"{collection(api_version, kind, namespace)}/{name}")


@dataclasses.dataclass
class ControlPlane:
    """The servers started by scripts/kube-control-plane.sh in `workdir`."""

    workdir: pathlib.Path
    server: str
    ca_file: pathlib.Path
    admin_token: str
    version: str

    @classmethod
    def start(cls, workdir: pathlib.Path) -> ControlPlane:
        started = subprocess.run(
            ["bash", str(SCRIPT), "start", str(workdir)], capture_output=True, text=True
        )
        if started.returncode != 0:
            subprocess.run(["bash", str(SCRIPT), "stop", str(workdir)], capture_output=True)
            raise RuntimeError(f"the control plane did not start: {started.stderr.strip()}")
        env = dict(
            line.split("=", 1) for line in (workdir / "env").read_text().splitlines() if line
        )
        return cls(
            workdir=workdir,
            server=env["KUBE_SERVER"],
            ca_file=pathlib.Path(env["KUBE_CA"]),
            admin_token=env["KUBE_TOKEN"],
            version=env["KUBE_VERSION"],
        )

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop", str(self.workdir)], check=True)

    def admin(self) -> Client:
        return Client(self.server, self.ca_file, self.admin_token)

    def kubeconfig(self, path: pathlib.Path, token: str, namespace: str) -> pathlib.Path:
        """A kubeconfig for this server authenticating with `token`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "real",
                    "context": {"cluster": "real", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "real",
        }
        path.write_text(yaml.safe_dump(config))
        return path


def wait_until(check: Any, timeout_s: float, what: str) -> Any:
    """`check()`'s first truthy value, polled until `timeout_s` (AssertionError then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.1)


def shipped_crds() -> list[Json]:
    """The chart's CRDs, as shipped in charts/planaria/crds."""
    return [yaml.safe_load(path.read_text()) for path in sorted((CHART / "crds").glob("*.yaml"))]


def rendered_rbac(namespace: str) -> list[Json]:
    """The chart's ServiceAccount, Role and RoleBinding, rendered for release namespace
    `namespace` with the default values."""
    with helm_python.Chart.load(CHART) as chart:
        rendered: dict[str, str] = chart.render(
            None, name=RELEASE, namespace=namespace, is_install=True
        )
    return [
        document
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document and document["kind"] in ("ServiceAccount", "Role", "RoleBinding")
    ]


def established(client: Client, name: str) -> bool:
    crd = client.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name, None) or {}
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def install_chart(client: Client, namespace: str) -> None:
    for crd in shipped_crds():
        client.apply(crd)
    for crd in shipped_crds():
        name = crd["metadata"]["name"]
        wait_until(lambda n=name: established(client, n), 30, f"the CRD {name} established")
    for obj in rendered_rbac(namespace):
        client.apply(obj)


def service_account_token(client: Client, namespace: str, name: str) -> str:
    """A token of the ServiceAccount, issued by the API server (TokenRequest, one hour)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    issued = client.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request
    )
    token: str = issued["status"]["token"]
    return token


async def record_pods(plane: ControlPlane, namespace: str, seen: set[tuple[str, str]]) -> None:
    """Add (name, uid) of every pod of `namespace` to `seen`, as they come (until cancelled):
    a pod that lived milliseconds is still seen, which polling could miss."""
    tls = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {plane.admin_token}"}
    path = f"{plane.server}/api/v1/namespaces/{namespace}/pods"
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(path, ssl=tls) as answer:
            listing = await answer.json()
        seen.update((p["metadata"]["name"], p["metadata"]["uid"]) for p in listing["items"])
        version = listing["metadata"]["resourceVersion"]
        while True:
            params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "600"}
            async with session.get(path, params=params, ssl=tls) as stream:
                try:
                    async for line in stream.content:
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise RuntimeError(f"the pod watch ended: {event['object']}")
                        meta = event["object"]["metadata"]
                        version = meta["resourceVersion"]
                        seen.add((meta["name"], meta["uid"]))
                except asyncio.CancelledError:
                    # As the kubelet harness does: a politely closed TLS connection waits
                    # for the server's close_notify and may outlive the test's event loop.
                    if stream.connection is not None and stream.connection.transport is not None:
                        stream.connection.transport.abort()
                    raise


def refused_calls(records: list[logging.LogRecord]) -> list[str]:
    """The log lines (and logged exceptions) of `records` that report a call the API server
    refused for want of RBAC (HTTP 403, "... is forbidden: User ... cannot ..."), as the
    operator's client (`HTTP 403`), kopf's request retries (`APIForbiddenError`) and kopf's
    event posting (`Code: 403`) log them."""
    found = []
    for record in records:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text} {record.exc_info[1]!r}"
        if "403" in text and "forbidden" in text.lower():
            found.append(text)
    return found
