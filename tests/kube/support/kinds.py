"""The kinds the emulator serves: built-in ones, those a CRD declares, and their defaulting.

A `Kind` is one served group/version/plural with what discovery says about it. Built in: core
v1 namespaces, nodes, pods, services, endpoints, secrets, configmaps, serviceaccounts, events;
coordination.k8s.io/v1 leases; events.k8s.io/v1 events; apiextensions.k8s.io/v1
customresourcedefinitions. A CRD adds one `Kind` per served version (all versions share one
storage, no conversion: objects are shown with the version asked for).

Built-in defaulting, a small part of the real server's: pods get status.phase Pending,
restartPolicy Always and terminationGracePeriodSeconds 30; services get a cluster IP unless
headless; secrets fold `stringData` into base64 `data`; namespaces get phase Active; CRDs get the
Established and NamesAccepted conditions.
"""

import base64
import copy
import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

Json = dict[str, Any]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Kind:
    """One served resource: where it lives in the API and what discovery reports."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    status_subresource: bool = False
    schema: Mapping[str, Any] | None = None  # the CRD version's openAPIV3Schema

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage(self) -> tuple[str, str]:
        """Versions of one resource share objects: stored by group and plural."""
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """`pods`, `resilientjobs.planaria.dev`: how the API names a resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _core(plural: str, kind: str, *, namespaced: bool = True, status: bool = False) -> Kind:
    return Kind(
        group="",
        version="v1",
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        status_subresource=status,
    )


CRDS = Kind(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    namespaced=False,
    short_names=("crd", "crds"),
    status_subresource=True,
)

BUILTIN: tuple[Kind, ...] = (
    _core("namespaces", "Namespace", namespaced=False, status=True),
    _core("nodes", "Node", namespaced=False, status=True),
    _core("pods", "Pod", status=True),
    _core("services", "Service", status=True),
    _core("endpoints", "Endpoints"),
    _core("secrets", "Secret"),
    _core("configmaps", "ConfigMap"),
    _core("serviceaccounts", "ServiceAccount"),
    _core("events", "Event"),
    Kind(group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True),
    Kind(group="events.k8s.io", version="v1", plural="events", kind="Event", namespaced=True),
    CRDS,
)


def crd_kinds(crd: Mapping[str, Any]) -> Iterator[Kind]:
    """One Kind per served version of a CustomResourceDefinition."""
    spec, names = crd["spec"], crd["spec"]["names"]
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        yield Kind(
            group=spec["group"],
            version=version["name"],
            plural=names["plural"],
            kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames", ())),
            status_subresource="status" in (version.get("subresources") or {}),
            schema=(version.get("schema") or {}).get("openAPIV3Schema"),
        )


def crd_problems(crd: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What a CRD lacks to be served, as (field, message) causes."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    causes = [
        (f"spec.{key}", "Required value") for key in ("group", "versions") if not spec.get(key)
    ]
    causes += [
        (f"spec.names.{key}", "Required value") for key in ("plural", "kind") if not names.get(key)
    ]
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if crd.get("metadata", {}).get("name") != expected:
        causes.append(
            (
                "metadata.name",
                f"Invalid value: must be spec.names.plural+'.'+spec.group: {expected}",
            )
        )
    return causes


class Defaulter:
    """Built-in defaulting on create; holds the service cluster IP allocator."""

    def __init__(self) -> None:
        self._service_ips = (f"10.96.{n // 250}.{n % 250 + 1}" for n in itertools.count(1))

    def on_create(self, kind: Kind, obj: dict[str, Any], now: str) -> None:
        """Defaults a new object gets, in place."""
        if kind.group == "" and kind.plural == "pods":
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif kind.group == "" and kind.plural == "services":
            spec = obj.setdefault("spec", {})
            if spec.get("type") != "ExternalName" and "clusterIP" not in spec:
                spec["clusterIP"] = next(self._service_ips)
            spec.setdefault("clusterIPs", [spec["clusterIP"]] if spec.get("clusterIP") else [])
        elif kind.group == "" and kind.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        elif kind == CRDS:
            obj["status"] = _crd_status(obj, now)

    def on_write(self, kind: Kind, obj: dict[str, Any]) -> None:
        """Defaults applied on every create and update, in place."""
        if kind.group == "" and kind.plural == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {}) or {}
            for key, text in obj.pop("stringData").items():
                data[key] = base64.b64encode(str(text).encode()).decode()
            obj["data"] = data


def _crd_status(crd: Mapping[str, Any], now: str) -> dict[str, Any]:
    conditions = [
        {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
        }
        for kind, reason, message in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    return {
        "conditions": conditions,
        "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
        "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
    }


SERVER_OWNED = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "name",
    "namespace",
)


def generation_part(kind: Kind, obj: Json) -> Json:
    """What generation tracks: all but metadata (and status behind a status subresource)."""
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if kind.status_subresource else set())
    return {key: value for key, value in obj.items() if key not in skip}


def merged_update(kind: Kind, old: Json, candidate: Json, subresource: str | None) -> Json:
    """The new object: server-owned metadata kept, status taken from where it may change."""
    if subresource == "status":
        new = copy.deepcopy(old)
        new.pop("status", None)
        if "status" in candidate:
            new["status"] = candidate["status"]
        return new
    new = candidate
    new.setdefault("metadata", {})
    written = new.pop("status", None)
    if kind.status_subresource and "status" in old:
        new["status"] = copy.deepcopy(old["status"])  # the main endpoint ignores status
    elif not kind.status_subresource and written is not None:
        new["status"] = written
    for key in SERVER_OWNED:
        new["metadata"].pop(key, None)
        if key in old["metadata"]:
            new["metadata"][key] = old["metadata"][key]
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
    return new
