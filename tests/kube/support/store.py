"""The emulator's object store: the Kubernetes API server's write semantics over plain dicts.

What lives here: `Store`, which keeps objects per kind, and on each write sets the server-owned
metadata (uid, resourceVersion from one cluster-wide counter, creationTimestamp, generation: 1
on create, +1 when anything but metadata and, for kinds with a status subresource, status
changes), keeps the status/main-endpoint split, checks resourceVersion preconditions, applies
built-in defaulting and CRD schemas, runs deletion (finalizers keep an object with a
deletionTimestamp; scheduled pods terminate gracefully until their kubelet deletes them with
grace 0), and collects garbage: removing an object deletes the objects whose ownerReferences
all name removed owners (background propagation, unless `Orphan`). Every change is an `Event`
kept in a bounded history (for watches from a resourceVersion) and handed to listeners.

What does not: HTTP (the emulator), selectors, patch formats (their own modules). Not emulated:
namespace existence and termination, admission webhooks, managedFields, foreground deletion.

Errors: `failures.ApiError` (code, reason, message, details), rendered as a `Status`.
All methods are synchronous and must run on the emulator's event loop thread.
"""

import copy
import dataclasses
import datetime
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from tests.kube.support import failures, kinds, patches, schema, selectors

Obj = dict[str, Any]
Listener = Callable[["Event"], None]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One change: ADDED, MODIFIED or DELETED, with the object after and before it."""

    revision: int
    storage: tuple[str, str]
    type: str
    obj: Obj
    old: Obj | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeleteOptions:
    """The parts of DeleteOptions that are emulated."""

    propagation: str | None = None
    grace_period_s: int | None = None
    uid: str | None = None
    resource_version: str | None = None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    """Objects of every served kind, with the write semantics described in the module doc."""

    def __init__(self, *, history: int = 10_000, clock: Callable[[], datetime.datetime] = _now):
        self._kinds: dict[tuple[str, str, str], kinds.Kind] = {}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._history: deque[Event] = deque(maxlen=history)
        self._listeners: list[Listener] = []
        self._defaults = kinds.Defaulter()
        self._clock = clock
        self.revision = 0
        for kind in kinds.BUILTIN:
            self._register(kind)
        for name in ("default", "kube-system", "kube-public"):
            self.create(self.kind("", "v1", "namespaces"), None, {"metadata": {"name": name}})

    # -- kinds -------------------------------------------------------------------------------

    def _register(self, kind: kinds.Kind) -> None:
        self._kinds[(kind.group, kind.version, kind.plural)] = kind
        self._objects.setdefault(kind.storage, {})

    def served_kinds(self) -> list[kinds.Kind]:
        return list(self._kinds.values())

    def kind(self, group: str, version: str, plural: str) -> kinds.Kind:
        found = self._kinds.get((group, version, plural))
        if found is None:
            raise failures.not_served()
        return found

    def kind_of(self, api_version: str, kind_name: str) -> kinds.Kind:
        """The served kind for an object's apiVersion and kind (for test helpers)."""
        group, _, version = api_version.rpartition("/")
        for kind in self._kinds.values():
            if (kind.group, kind.version, kind.kind) == (group, version, kind_name):
                return kind
        raise failures.ApiError(
            404, "NotFound", f"no kind {kind_name!r} is served in {api_version!r}"
        )

    # -- reads -------------------------------------------------------------------------------

    def _present(self, kind: kinds.Kind, obj: Obj) -> Obj:
        return {"apiVersion": kind.api_version, "kind": kind.kind, **copy.deepcopy(obj)}

    def _key(self, kind: kinds.Kind, namespace: str | None, name: str) -> tuple[str, str]:
        if kind.namespaced != (namespace is not None):
            raise failures.not_served()
        return (namespace or "", name)

    def _stored(self, kind: kinds.Kind, namespace: str | None, name: str) -> Obj:
        obj = self._objects[kind.storage].get(self._key(kind, namespace, name))
        if obj is None:
            raise failures.not_found(kind, name)
        return obj

    def get(self, kind: kinds.Kind, namespace: str | None, name: str) -> Obj:
        return self._present(kind, self._stored(kind, namespace, name))

    def list_objects(
        self, kind: kinds.Kind, namespace: str | None, predicate: selectors.Predicate
    ) -> list[Obj]:
        """Objects in one namespace (or all, if None), ordered by namespace and name."""
        found = sorted(self._objects[kind.storage].items())
        return [
            self._present(kind, obj)
            for (ns, _), obj in found
            if (namespace is None or ns == namespace) and predicate(obj)
        ]

    # -- events ------------------------------------------------------------------------------

    def subscribe(self, listener: Listener, since: int | None) -> list[Event]:
        """Register a listener; returns the events it missed since `since` (None: a snapshot
        of every object as ADDED). Raises 410 Expired if `since` is older than the history."""
        if since is None:
            backlog = [
                Event(
                    revision=self.revision,
                    storage=storage,
                    type="ADDED",
                    obj=copy.deepcopy(obj),
                    old=None,
                )
                for storage, objs in self._objects.items()
                for _, obj in sorted(objs.items())
            ]
        elif self._history and since < self._history[0].revision - 1:
            raise failures.ApiError(410, "Expired", f"too old resource version: {since}")
        else:
            backlog = [event for event in self._history if event.revision > since]
        self._listeners.append(listener)
        return backlog

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _commit(self, kind: kinds.Kind, type_: str, obj: Obj, old: Obj | None) -> Obj:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if type_ == "DELETED":
            del self._objects[kind.storage][key]
        else:
            self._objects[kind.storage][key] = obj
        event = Event(
            revision=self.revision,
            storage=kind.storage,
            type=type_,
            obj=copy.deepcopy(obj),
            old=copy.deepcopy(old),
        )
        self._history.append(event)
        for listener in list(self._listeners):
            listener(event)
        return self._present(kind, obj)

    # -- writes ------------------------------------------------------------------------------

    def create(self, kind: kinds.Kind, namespace: str | None, body: Obj) -> Obj:
        obj = self._checked_body(kind, body)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if namespace is None or meta.get("namespace", namespace) != namespace:
                raise failures.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise failures.invalid(
                kind, "", [("metadata.name", "Required value: name or generateName is required")]
            )
        if self._key(kind, namespace, meta["name"]) in self._objects[kind.storage]:
            raise failures.already_exists(kind, meta["name"])
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(key, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_stamp(self._clock()), generation=1)
        if kind.status_subresource:
            obj.pop("status", None)
        self._defaults.on_create(kind, obj, _stamp(self._clock()))
        obj = self._admit(kind, obj, None)
        created = self._commit(kind, "ADDED", obj, None)
        if kind == kinds.CRDS:
            for served in kinds.crd_kinds(obj):
                self._register(served)
        return created

    def _checked_body(self, kind: kinds.Kind, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise failures.bad_request("the request body must be a JSON object")
        for field, expected in (("apiVersion", kind.api_version), ("kind", kind.kind)):
            if body.get(field, expected) != expected:
                message = f"the {field} in the data ({body[field]}) does not match {expected}"
                raise failures.bad_request(message)
        return {
            key: copy.deepcopy(value)
            for key, value in body.items()
            if key not in ("apiVersion", "kind")
        }

    def _admit(self, kind: kinds.Kind, obj: Obj, old: Obj | None) -> Obj:
        self._defaults.on_write(kind, obj)
        name = obj["metadata"].get("name", "")
        if kind == kinds.CRDS and (causes := kinds.crd_problems(obj)):
            raise failures.invalid(kind, name, causes)
        if kind.schema is None:
            return obj
        try:
            return schema.admit(kind.schema, obj, old)
        except schema.SchemaError as exc:
            raise failures.invalid(kind, name, exc.causes) from exc

    def replace(
        self,
        kind: kinds.Kind,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None,
    ) -> Obj:
        """PUT: the body replaces the object (or only its status, for `status`)."""
        candidate = self._checked_body(kind, body)
        if candidate.get("metadata", {}).get("name", name) != name:
            raise failures.bad_request("the name of the object does not match the URL")
        return self._update(kind, namespace, name, candidate, subresource)

    def patch(
        self,
        kind: kinds.Kind,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str | None,
    ) -> Obj:
        """PATCH with merge, JSON or strategic merge patch (see `patches`)."""
        current = self._present(kind, self._stored(kind, namespace, name))
        apply = {
            "application/merge-patch+json": patches.merge_patch,
            "application/json-patch+json": patches.json_patch,
            "application/strategic-merge-patch+json": patches.strategic_merge_patch,
        }.get(content_type)
        if apply is None:
            raise failures.ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {content_type}",
            )
        try:
            candidate = apply(current, patch)
        except patches.PatchError as exc:
            raise failures.ApiError(422, "Invalid", f"the patch cannot be applied: {exc}") from exc
        return self._update(kind, namespace, name, self._checked_body(kind, candidate), subresource)

    def _update(
        self,
        kind: kinds.Kind,
        namespace: str | None,
        name: str,
        candidate: Obj,
        subresource: str | None,
    ) -> Obj:
        old = self._stored(kind, namespace, name)
        if subresource not in (None, "status") or (subresource and not kind.status_subresource):
            raise failures.not_served()
        expected = candidate.get("metadata", {}).get("resourceVersion")
        if expected is not None and expected != old["metadata"]["resourceVersion"]:
            raise failures.conflict(
                kind,
                name,
                "the object has been modified; please apply your "
                "changes to the latest version and try again",
            )
        new = kinds.merged_update(kind, old, candidate, subresource)
        added = set(new["metadata"].get("finalizers", [])) - set(
            old["metadata"].get("finalizers", [])
        )
        if old["metadata"].get("deletionTimestamp") and added:
            raise failures.invalid(
                kind,
                name,
                [
                    (
                        "metadata.finalizers",
                        "Forbidden: no new finalizers can be added if the object is being deleted",
                    )
                ],
            )
        new = self._admit(kind, new, old)
        if kinds.generation_part(kind, new) != kinds.generation_part(kind, old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if new == old:
            return self._present(kind, old)  # a no-op write changes nothing, not even the rv
        if self._releasable(new):
            return self._remove(kind, new, DeleteOptions())
        updated = self._commit(kind, "MODIFIED", new, old)
        if kind == kinds.CRDS:
            for served in kinds.crd_kinds(old):
                self._kinds.pop((served.group, served.version, served.plural), None)
            for served in kinds.crd_kinds(new):
                self._register(served)
        return updated

    @staticmethod
    def _releasable(obj: Obj) -> bool:
        meta = obj["metadata"]
        return (
            bool(meta.get("deletionTimestamp"))
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        )

    # -- deletion ----------------------------------------------------------------------------

    def delete(
        self, kind: kinds.Kind, namespace: str | None, name: str, options: DeleteOptions
    ) -> Obj:
        """Remove the object, or mark it with a deletionTimestamp while something holds it."""
        obj = self._stored(kind, namespace, name)
        meta = obj["metadata"]
        if options.uid not in (None, meta["uid"]) or options.resource_version not in (
            None,
            meta["resourceVersion"],
        ):
            raise failures.conflict(kind, name, "the precondition on uid or resourceVersion failed")
        grace = self._grace_s(kind, obj, options)
        if not meta.get("finalizers") and grace == 0:
            return self._remove(kind, obj, options)
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 0) <= grace:
            return self._present(kind, obj)
        new = copy.deepcopy(obj)
        deadline = self._clock() + datetime.timedelta(seconds=grace)
        new["metadata"].update(deletionTimestamp=_stamp(deadline), deletionGracePeriodSeconds=grace)
        new["metadata"]["generation"] = meta.get("generation", 1) + 1
        return self._commit(kind, "MODIFIED", new, obj)

    @staticmethod
    def _grace_s(kind: kinds.Kind, obj: Obj, options: DeleteOptions) -> int:
        """Pods bound to a node wait for their kubelet; everything else goes at once."""
        if kind.storage != ("", "pods") or not obj.get("spec", {}).get("nodeName"):
            return 0
        if obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        if options.grace_period_s is not None:
            return max(0, options.grace_period_s)
        return int(obj["spec"].get("terminationGracePeriodSeconds", 30))

    def _remove(self, kind: kinds.Kind, obj: Obj, options: DeleteOptions) -> Obj:
        gone = self._commit(kind, "DELETED", obj, obj)
        if kind == kinds.CRDS:
            self._drop_crd(obj)
        if options.propagation != "Orphan":
            self._collect_garbage()
        return gone

    def _drop_crd(self, crd: Obj) -> None:
        for served in list(kinds.crd_kinds(crd)):
            self._kinds.pop((served.group, served.version, served.plural), None)
        storage = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        served = next(kinds.crd_kinds(crd))
        for obj in list(self._objects.get(storage, {}).values()):
            self._commit(served, "DELETED", obj, obj)
        self._objects.pop(storage, None)

    def _all(self) -> Iterator[tuple[kinds.Kind, Obj]]:
        by_storage = {kind.storage: kind for kind in self._kinds.values()}
        for storage, objs in list(self._objects.items()):
            for obj in list(objs.values()):
                yield by_storage[storage], obj

    def _collect_garbage(self) -> None:
        """Delete every object whose owners are all gone (it recurses through `delete`)."""
        live = {obj["metadata"]["uid"] for _, obj in self._all()}
        for kind, obj in list(self._all()):
            meta = obj["metadata"]
            owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
            orphaned = owners and not owners & live and not meta.get("deletionTimestamp")
            # An earlier cascade in this loop may have removed it already.
            present = (meta.get("namespace", ""), meta["name"]) in self._objects[kind.storage]
            if orphaned and present:
                self.delete(kind, meta.get("namespace"), meta["name"], DeleteOptions())
