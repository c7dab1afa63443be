"""`KubeBackend`'s bookkeeping of pod events into worker events (`observe`, `events`), and its
rendezvous store; no API calls are made by these paths but the last.

Covered: a pod's death is reported once per worker of the pod (a later DELETED of the same pod
adds nothing); a replacement pod (new uid) of a dead node that becomes ready is JOINED for each
worker, one that is only Pending is not; a pod replaced before its death was seen is reported
dead; late events of a retired pod are ignored; NotReady after Ready is a death that a ready
pod again does not undo; a preemption notice is reported per worker; pods of nodes outside the
job are ignored; a pod that did not serve within `connect`'s time joins once it does; `close`
ends `events` and nothing is queued after it; `host_store` serves on a
free port and skips taken ones. One path with API calls (a fake API): a replacement pod whose
creation was under way when the job shut down is deleted, not left behind.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import kubernetes
import pytest

from planaria.contract import plan
from planaria.control import ports
from planaria.kube import api, backend, constants, pods
from planaria.rpc import tls
from planaria.spec import job

OWNER = pods.Owner(name="tiny", namespace="ml", uid="u")
DIED, JOINED = ports.EventKind.DIED, ports.EventKind.JOINED


def _backend() -> backend.KubeBackend:
    spec = job.JobSpec.model_validate({"workers": 4, "gpusPerNode": 2, "steps": 5})
    configuration = kubernetes.client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # never called by these paths
    return backend.KubeBackend(
        client=api.Api(configuration),
        owner=OWNER,
        spec=spec,
        image="i",
        tls=tls.controller_tls(tls.issue("tiny")),
        store=backend.host_store("127.0.0.1", 0, set()),
    )


def _pod(node: int, uid: str, *, phase: str = "Running", ready: bool = True) -> dict[str, Any]:
    body = pods.worker_pod(OWNER, job.JobSpec(workers=4, gpus_per_node=2), node=node, image="i")
    body["metadata"]["uid"] = uid
    body["status"] = {
        "phase": phase,
        "podIP": f"127.0.0.{node + 2}",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return body


async def _events(workers: backend.KubeBackend) -> list[tuple[ports.EventKind, int]]:
    """Every event queued so far, in order (`close` ends the stream after them)."""
    workers.close()
    return [(e.kind, int(e.worker)) async for e in workers.events()]


@pytest.mark.asyncio
async def test_a_death_is_reported_once_per_worker_and_a_ready_replacement_joins() -> None:
    workers = _backend()
    workers.observe("ADDED", _pod(1, "a"))
    workers.observe("MODIFIED", _pod(1, "a", phase="Failed", ready=False))
    workers.observe("DELETED", _pod(1, "a", phase="Failed", ready=False))
    workers.observe("ADDED", _pod(1, "b", phase="Pending", ready=False))
    workers.observe("MODIFIED", _pod(1, "a", phase="Failed"))  # a late event of the old pod
    workers.observe("MODIFIED", _pod(1, "b"))
    assert workers.pods[1].uid == "b"
    assert await _events(workers) == [(DIED, 2), (DIED, 3), (JOINED, 2), (JOINED, 3)]


@pytest.mark.asyncio
async def test_a_replacement_that_is_not_ready_yet_does_not_join() -> None:
    workers = _backend()
    workers.observe(None, _pod(1, "a", phase="Failed"))
    workers.observe("ADDED", _pod(1, "b", phase="Pending", ready=False))
    assert await _events(workers) == [(DIED, 2), (DIED, 3)]


@pytest.mark.asyncio
async def test_a_pod_replaced_before_its_death_was_seen_is_reported_dead() -> None:
    workers = _backend()
    workers.observe(None, _pod(0, "a"))
    workers.observe("ADDED", _pod(0, "b", phase="Pending", ready=False))
    workers.observe("MODIFIED", _pod(0, "b"))
    assert await _events(workers) == [(DIED, 0), (DIED, 1), (JOINED, 0), (JOINED, 1)]


@pytest.mark.asyncio
async def test_not_ready_after_ready_is_a_death_and_the_pod_is_not_trusted_again() -> None:
    workers = _backend()
    workers.observe(None, _pod(0, "a"))
    workers.observe("MODIFIED", _pod(0, "a", ready=False))
    workers.observe("MODIFIED", _pod(0, "a"))
    assert await _events(workers) == [(DIED, 0), (DIED, 1)]


@pytest.mark.asyncio
async def test_a_preemption_notice_goes_to_each_worker_of_the_pod() -> None:
    workers = _backend()
    workers.observe(None, _pod(1, "a"))
    noticed = _pod(1, "a")
    noticed["metadata"]["annotations"][constants.ANNOTATION_PREEMPTION] = "in 2 minutes"
    workers.observe("MODIFIED", noticed)
    notice = ports.EventKind.PREEMPTION_NOTICE
    assert await _events(workers) == [(notice, 2), (notice, 3)]


@pytest.mark.asyncio
async def test_pods_of_other_nodes_are_ignored_and_nothing_follows_close() -> None:
    workers = _backend()
    workers.observe(None, _pod(7, "x", phase="Failed"))
    assert workers.pods == {}
    assert await _events(workers) == []
    workers.observe(None, _pod(0, "a", phase="Failed"))
    assert [e async for e in workers.events()] == []


def test_stores_take_free_ports_from_the_base_up() -> None:
    taken: set[int] = set()
    first, where = backend.host_store("127.0.0.1", 0, taken)
    assert where.port in taken and first.port == where.port
    base = where.port  # in use now: the next store starts there and moves up
    second, there = backend.host_store("127.0.0.1", base, taken)
    assert there.port > base and there.port in taken
    del first, second


@pytest.mark.asyncio
async def test_a_pod_too_slow_for_connect_joins_once_it_serves() -> None:
    workers = _backend()
    workers.observe(None, _pod(1, "a", phase="Pending", ready=False))
    with pytest.raises(ports.AgentUnreachable, match="not serving in time"):
        await workers.connect(plan.WorkerId(2), timeout_s=0.05)
    workers.observe("MODIFIED", _pod(1, "a"))
    assert await _events(workers) == [(JOINED, 2), (JOINED, 3)]


class _SlowPods:
    """An API whose pod creations wait for `release`: a reconcile still creating when the job's
    shutdown runs. Records every pod that exists."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.creating = asyncio.Event()
        self.existing: dict[str, dict[str, Any]] = {}

    async def list(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        return list(self.existing.values())

    async def create(self, _kind: Any, _namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.creating.set()
        await self.release.wait()
        made = {**body, "metadata": {**body["metadata"], "uid": "new"}}
        self.existing[body["metadata"]["name"]] = made
        return made

    async def delete(self, _kind: Any, _namespace: str, name: str) -> None:
        self.existing.pop(name, None)


@pytest.mark.asyncio
async def test_a_pod_created_while_the_job_shuts_down_is_deleted_not_left_behind() -> None:
    """The timer's reconcile replaced a dead pod while the job ended: shutdown had already
    passed that node, so the new pod outlived the job (a flake of the operator e2e)."""
    slow = _SlowPods()
    slow.release.set()
    workers = _backend()
    workers._api = cast(api.Api, slow)  # noqa: SLF001 - the API calls are what is tested
    await workers.start([plan.WorkerId(0)])  # node 0's pod, created at once
    name = constants.pod_name(OWNER.name, 0)
    assert set(slow.existing) == {name}
    workers.observe("MODIFIED", _pod(0, "new", phase="Failed"))  # it dies
    slow.release.clear()
    reconciling = asyncio.ensure_future(workers.reconcile())
    slow.creating.clear()
    while not slow.creating.is_set():  # the timer deletes the dead pod, then creates anew
        await asyncio.sleep(0)
    await workers.shutdown()  # the job ended: every pod of the job is deleted
    slow.release.set()
    await reconciling
    assert slow.existing == {}
