"""A Kubernetes API server emulator over real HTTP, for operator tests (kopf, kubernetes client).

kmock 0.8's `KubernetesEmulator` stores objects as merged dicts without server-owned metadata:
no uid, resourceVersion, creationTimestamp or generation; the URL's namespace is not stored;
create answers 200; lists report resourceVersion "..."; PUT is not an action; labelSelector and
fieldSelector are ignored; a POSTed CRD is not discovered; no schemas, garbage collection or
pod status; its request parser fails (500) on `/api/v1/namespaces`, and `/api/v1` discovery
says groupVersion "/v1" (each checked against its source or by a request). So this
subclasses kmock's stateless `KubernetesScaffold` (kept: its aiohttp server, `/api`, `/apis`,
`/apis/<group>[/<version>]`, `/version` discovery) and serves every resource URL itself, before
kmock parses it, from `store.Store`, which has the API server's write semantics.

Emulated, per resource URL (`/api/v1/...`, `/apis/<group>/<version>/...`): get, list
(labelSelector, fieldSelector, cluster-wide), watch (`?watch=true`: resourceVersion, ADDED/
MODIFIED/DELETED with selector transitions, 410 Expired, timeoutSeconds; kept open), create
(201, 409 AlreadyExists), update (PUT, 409 Conflict on a stale resourceVersion), patch (merge,
JSON, strategic merge), delete (finalizers, graceful pods, DeleteOptions), deletecollection, the
status subresource. Every resource request is logged as an `ApiCall` with the RBAC verb.

Not emulated: authentication and RBAC enforcement (the log lets tests compare), protobuf,
server-side apply, `/openapi`, table output, watch bookmarks, subresources other than status.

Errors: answers carry Kubernetes `Status` bodies; an unexpected exception in the emulator is a
500 and is kept in `failures` (the fixture fails the test with it).
"""

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import kmock

from tests.kube.support import failures, kinds, selectors, store

_NO_WATCH_LIMIT_S = 3600.0
_PROBE_S = 0.5  # how often an idle watch checks that its client is still connected


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ApiCall:
    """One resource request, in RBAC's terms (verb, apiGroup, resource, subresource)."""

    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None
    user_agent: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """A resource URL taken apart."""

    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None


def route(path: str) -> Route | None:
    """Parse a resource URL; None for discovery and other non-resource paths."""
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    # /api/v1/namespaces/x/status is the namespace's own subresource, not a kind "status".
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    return Route(
        group=group,
        version=version,
        plural=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource="/".join(rest[2:]) or None,
    )


def verb_of(method: str, where: Route, params: dict[str, str]) -> str:
    """The Kubernetes verb of a request, as RBAC rules name it."""
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if where.name else "list"
    if method == "DELETE":
        return "delete" if where.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _predicate(params: dict[str, str]) -> selectors.Predicate:
    try:
        by_labels = selectors.label_selector(params.get("labelSelector"))
        by_fields = selectors.field_selector(params.get("fieldSelector"))
    except selectors.SelectorError as exc:
        raise failures.bad_request(str(exc)) from exc
    return lambda obj: by_labels(obj) and by_fields(obj)


def _json_body(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise failures.bad_request(f"the body is not JSON: {exc}") from exc


def _delete_options(raw: bytes, params: dict[str, str]) -> store.DeleteOptions:
    body = _json_body(raw) or {}
    grace = body.get("gracePeriodSeconds", params.get("gracePeriodSeconds"))
    preconditions = body.get("preconditions") or {}
    return store.DeleteOptions(
        propagation=body.get("propagationPolicy", params.get("propagationPolicy")),
        grace_period_s=int(grace) if grace is not None else None,
        uid=preconditions.get("uid"),
        resource_version=preconditions.get("resourceVersion"),
    )


def _translated(
    event: store.Event, kind: kinds.Kind, namespace: str | None, predicate: selectors.Predicate
) -> dict[str, Any] | None:
    """A store event as one watch sees it: objects leaving its selection are DELETED for it."""
    if event.storage != kind.storage:
        return None

    def selected(obj: dict[str, Any] | None) -> bool:
        in_namespace = obj is not None and namespace in (None, obj["metadata"].get("namespace"))
        return obj is not None and in_namespace and predicate(obj)

    now, before = selected(event.obj), event.type != "ADDED" and selected(event.old)
    if event.type == "DELETED":
        type_ = "DELETED" if now or before else None
    else:
        type_ = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else None
    if type_ is None:
        return None
    return {
        "type": type_,
        "object": {"apiVersion": kind.api_version, "kind": kind.kind, **event.obj},
    }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One resource request as served: the route, verb, query, headers and body."""

    where: Route
    verb: str
    params: dict[str, str]
    headers: dict[str, str]
    body: bytes


@attrs.define(kw_only=True)
class KubernetesApiEmulator(kmock.KubernetesScaffold):
    """kmock's scaffold serving resource URLs from a `store.Store` (see the module doc)."""

    objects: store.Store = attrs.field(factory=store.Store)
    calls: list[ApiCall] = attrs.field(factory=list, init=False)
    failures: list[Exception] = attrs.field(factory=list, init=False)
    _streams: set[asyncio.Queue[store.Event | None]] = attrs.field(factory=set, init=False)

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        where = route(raw.path)
        if where is None and raw.path.strip("/") == "api/v1":
            return aiohttp.web.json_response(self._core_resources())
        if where is None:
            self._sync_discovery()
            response: aiohttp.web.StreamResponse = await super().__call__(raw)
            return response
        params = dict(raw.query)
        call = Call(
            where=where,
            verb=verb_of(raw.method, where, params),
            params=params,
            headers=dict(raw.headers),
            body=await raw.read(),
        )
        self.calls.append(
            ApiCall(
                verb=call.verb,
                group=where.group,
                resource=where.plural,
                subresource=where.subresource,
                namespace=where.namespace,
                name=where.name,
                user_agent=call.headers.get("User-Agent", ""),
            )
        )
        try:
            kind = self.objects.kind(where.group, where.version, where.plural)
            if call.verb == "watch":
                return await self._watch(raw, call, kind)
            status, body = self._serve(call, kind)
        except failures.ApiError as exc:
            status, body = exc.code, exc.status()
        except Exception as exc:  # a bug here: answer 500 and fail the test at teardown
            self.failures.append(exc)
            status, body = 500, failures.ApiError(500, "InternalError", repr(exc)).status()
        return aiohttp.web.json_response(body, status=status)

    def _serve(self, call: Call, kind: kinds.Kind) -> tuple[int, dict[str, Any]]:
        where, verb = call.where, call.verb
        ns, name, sub = where.namespace, where.name, where.subresource
        if sub not in (None, "status") or (sub and verb not in ("get", "update", "patch")):
            raise failures.not_served()
        if verb == "list":
            return 200, self._list_body(
                kind, self.objects.list_objects(kind, ns, _predicate(call.params))
            )
        if verb == "create":
            return 201, self.objects.create(kind, ns, _json_body(call.body))
        if verb == "deletecollection":
            return 200, self._delete_all(call, kind)
        assert name is not None  # the remaining verbs all name an object
        if verb == "get":
            return 200, self.objects.get(kind, ns, name)
        if verb == "update":
            return 200, self.objects.replace(kind, ns, name, _json_body(call.body), sub)
        if verb == "patch":
            content_type = call.headers.get("Content-Type", "").split(";")[0].strip()
            patch = _json_body(call.body)
            return 200, self.objects.patch(kind, ns, name, content_type, patch, sub)
        if verb == "delete":
            options = _delete_options(call.body, call.params)
            return 200, self.objects.delete(kind, ns, name, options)
        raise failures.ApiError(405, "MethodNotAllowed", f"{verb} is not supported here")

    def _list_body(self, kind: kinds.Kind, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self.objects.revision)},
            "items": items,
        }

    def _delete_all(self, call: Call, kind: kinds.Kind) -> dict[str, Any]:
        options = _delete_options(call.body, call.params)
        doomed = self.objects.list_objects(kind, call.where.namespace, _predicate(call.params))
        items = [
            self.objects.delete(
                kind, obj["metadata"].get("namespace"), obj["metadata"]["name"], options
            )
            for obj in doomed
        ]
        return self._list_body(kind, items)

    async def _watch(
        self, raw: aiohttp.web.BaseRequest, call: Call, kind: kinds.Kind
    ) -> aiohttp.web.StreamResponse:
        where, params = call.where, dict(call.params)
        if where.name:  # the legacy watch of one object is a watch with a name field selector
            extra = f"metadata.name={where.name}"
            params["fieldSelector"] = ",".join(filter(None, [params.get("fieldSelector"), extra]))
        predicate = _predicate(params)
        since = params.get("resourceVersion") or "0"
        if not since.isdigit():
            raise failures.bad_request(f"invalid resourceVersion {since!r}: pass one from a list")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(raw)
            await self._feed(
                raw,
                response,
                None if since == "0" else int(since),
                params,
                lambda event: _translated(event, kind, where.namespace, predicate),
            )
        except ConnectionError:
            pass  # the client went away: its watch is over
        return response

    async def _feed(
        self,
        raw: aiohttp.web.BaseRequest,
        response: aiohttp.web.StreamResponse,
        since: int | None,
        params: dict[str, str],
        translate: Callable[[store.Event], dict[str, Any] | None],
    ) -> None:
        """Subscribe to the store and stream until the timeout, the client or the server ends."""
        queue: asyncio.Queue[store.Event | None] = asyncio.Queue()
        try:
            backlog = self.objects.subscribe(queue.put_nowait, since)
        except failures.ApiError as exc:  # 410 Expired comes as an event, as from a real server
            error = {"type": "ERROR", "object": exc.status()}
            await response.write(json.dumps(error).encode() + b"\n")
            return
        self._streams.add(queue)
        try:
            limit_s = float(params.get("timeoutSeconds") or _NO_WATCH_LIMIT_S)
            await self._stream(raw, response, backlog, queue, translate, limit_s)
        finally:
            self.objects.unsubscribe(queue.put_nowait)
            self._streams.discard(queue)

    async def _stream(
        self,
        raw: aiohttp.web.BaseRequest,
        response: aiohttp.web.StreamResponse,
        backlog: list[store.Event],
        queue: asyncio.Queue[store.Event | None],
        translate: Callable[[store.Event], dict[str, Any] | None],
        limit_s: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        for missed in backlog:
            queue.put_nowait(missed)
        transport = raw.transport
        while (remaining := deadline - loop.time()) > 0:
            try:
                event = await asyncio.wait_for(queue.get(), timeout=min(remaining, _PROBE_S))
            except TimeoutError:
                if transport is None or transport.is_closing():
                    return
                continue
            if event is None:
                return
            if (line := translate(event)) is not None:
                await response.write(json.dumps(line).encode() + b"\n")

    def close_streams(self) -> None:
        """End every open watch (before the server stops, so that it need not wait)."""
        for queue in list(self._streams):
            queue.put_nowait(None)

    def _core_resources(self) -> dict[str, Any]:
        """`/api/v1` discovery (kmock's says groupVersion "/v1")."""
        resources = [
            {
                "name": name,
                "singularName": kind.kind.lower(),
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": list(verbs),
                "shortNames": list(kind.short_names),
            }
            for kind in self.objects.served_kinds()
            if kind.group == ""
            for name, verbs in [(kind.plural, kinds.ALL_VERBS)]
            + (
                [(f"{kind.plural}/status", ("get", "patch", "update"))]
                if kind.status_subresource
                else []
            )
        ]
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": resources,
        }

    def _sync_discovery(self) -> None:
        """Make kmock's discovery (`self.resources`) list exactly the store's kinds."""
        served = {
            kmock.resource(k.group, k.version, k.plural): k for k in self.objects.served_kinds()
        }
        for stale in [res for res in self.resources if res not in served]:
            del self.resources[stale]
        for res, kind in served.items():
            self.resources[res] = kmock.ResourceInfo(
                namespaced=kind.namespaced,
                kind=kind.kind,
                singular=kind.kind.lower(),
                verbs=kinds.ALL_VERBS,
                shortnames=kind.short_names,
                subresources={"status"} if kind.status_subresource else set(),
            )
