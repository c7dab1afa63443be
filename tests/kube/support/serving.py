"""Run the API emulator on a loopback port in its own thread, and the handle tests hold.

The emulator runs on a private event loop in a daemon thread, so that any client works against
it: blocking ones (the `kubernetes` client, urllib) called from a test's event loop included,
and kopf embedded in the test's loop. `serve()` yields a `KubeApi`: the URL, a kubeconfig file
pointing at it (plain HTTP, a dummy token), the request log, and helpers (`apply`, `get`,
`list`, `delete`, `load_crd`) that act on the store directly, on the emulator's thread, so
they do not appear in the request log.

Errors: helpers raise `failures.ApiError` as the server would answer; `serve()` raises
`AssertionError` at exit if the emulator hit an unexpected exception while serving.
"""

import asyncio
import concurrent.futures
import contextlib
import json
import pathlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import kmock
import yaml

from tests.kube.support import emulator, failures, selectors, store

T = TypeVar("T")
_CALL_TIMEOUT_S = 10.0


class KubeApi:
    """What a test holds: see the module doc. Thread-safe; helpers block briefly."""

    def __init__(
        self,
        api: emulator.KubernetesApiEmulator,
        loop: asyncio.AbstractEventLoop,
        url: str,
        kubeconfig: pathlib.Path,
    ) -> None:
        self._api, self._loop = api, loop
        self.url, self.kubeconfig = url, kubeconfig

    @property
    def requests(self) -> list[emulator.ApiCall]:
        """Every resource request served so far, oldest first (a copy)."""
        return self._call(lambda: list(self._api.calls))

    def _call(self, fn: Callable[[], T]) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the calling thread
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=_CALL_TIMEOUT_S)

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object, or merge-patch it if it exists; its `status`, if given, is
        written through the status subresource too. Returns the stored object."""
        return self._call(lambda: self._apply(dict(obj)))

    def _apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        the = self._api.objects
        kind = the.kind_of(obj["apiVersion"], obj["kind"])
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace", "default") if kind.namespaced else None
        try:
            stored = the.get(kind, namespace, meta["name"])
        except failures.ApiError as exc:
            if exc.code != 404:
                raise
            stored = the.create(kind, namespace, obj)
        else:
            stored = the.patch(
                kind, namespace, meta["name"], "application/merge-patch+json", obj, None
            )
        if "status" in obj and kind.status_subresource:
            stored = the.patch(
                kind,
                namespace,
                meta["name"],
                "application/merge-patch+json",
                {"status": obj["status"]},
                "status",
            )
        return stored

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """The object, or None if there is none (namespace: None for cluster-scoped kinds)."""

        def find() -> dict[str, Any] | None:
            served = self._api.objects.kind_of(api_version, kind)
            try:
                return self._api.objects.get(served, namespace, name)
            except failures.ApiError as exc:
                if exc.code == 404:
                    return None
                raise

        return self._call(find)

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """Delete as a client would (finalizers and graceful pods hold the object)."""
        return self._call(
            lambda: self._api.objects.delete(
                self._api.objects.kind_of(api_version, kind), namespace, name, store.DeleteOptions()
            )
        )

    def load_crd(self, source: pathlib.Path | str | Mapping[str, Any]) -> list[dict[str, Any]]:
        """Apply the CustomResourceDefinitions in a YAML file (all its documents) or a dict."""
        if isinstance(source, Mapping):
            docs: list[Any] = [source]
        else:
            docs = list(yaml.safe_load_all(pathlib.Path(source).read_text()))
        crds = [doc for doc in docs if doc and doc.get("kind") == "CustomResourceDefinition"]
        if not crds:
            raise ValueError(f"{source!r} holds no CustomResourceDefinition: pass a CRD file")
        return [self.apply(crd) for crd in crds]

    # Last in the class: below it, `list` would name this method in annotations.
    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Objects of a kind, in one namespace or (None) all, ordered by namespace and name."""
        predicate = selectors.label_selector(label_selector)
        return self._call(
            lambda: self._api.objects.list_objects(
                self._api.objects.kind_of(api_version, kind), namespace, predicate
            )
        )


def _kubeconfig(path: pathlib.Path, url: str) -> pathlib.Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "emulator-token"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "tester", "namespace": "default"},
            }
        ],
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


@contextlib.contextmanager
def serve(directory: pathlib.Path, *, history: int = 10_000) -> Iterator[KubeApi]:
    """Start an emulator on 127.0.0.1, port 0; its kubeconfig goes into `directory`."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[tuple[emulator.KubernetesApiEmulator, str]] = (
        concurrent.futures.Future()
    )
    stop = threading.Event()
    errors: list[Exception] = []

    async def run() -> None:
        try:
            objects = store.Store(history=history)  # events kept for watches to resume from
            async with (
                emulator.KubernetesApiEmulator(objects=objects) as api,
                kmock.Server(api) as server,
            ):
                started.set_result((api, str(server.url).rstrip("/")))
                while not stop.is_set():
                    await asyncio.sleep(0.02)
                errors.extend([*api.errors, *api.failures])
                api.close_streams()
                await asyncio.sleep(0)  # let the watches see their end before the server stops
        except Exception as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    thread = threading.Thread(
        target=loop.run_until_complete, args=(run(),), name="kube-api-emulator", daemon=True
    )
    thread.start()
    try:
        api, url = started.result(timeout=_CALL_TIMEOUT_S)
        yield KubeApi(api, loop, url, _kubeconfig(directory / "kubeconfig", url))
    finally:
        stop.set()
        thread.join(timeout=_CALL_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()
    assert not errors, f"the API emulator failed while serving: {errors!r}"
