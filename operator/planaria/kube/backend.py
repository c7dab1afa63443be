"""`KubeBackend`: a job's workers as pods (`ports.Backend`), one pod per node.

    backend = KubeBackend(client=api, owner=owner, spec=spec, image=image, tls=tls,
                          store=stores.host(pod_ip, base_port))
    await backend.start([0, 1, 2, 3])     # creates the missing pods, returns at once
    agent = await backend.connect(2, timeout_s=60)   # once pod 1 runs and is ready
    backend.observe("MODIFIED", pod_body)   # kopf's pod handler feeds every pod event
    await backend.reconcile()             # the timer: replaces dead pods, creates missing ones
    await backend.shutdown()              # deletes the pods, releases the store

The rendezvous store of the job's epochs is a torch TCPStore in the operator process
(`host_store`, advertised at the operator's POD_IP on a port from `--store-port` upward, one per
running job): never in a worker, whose death would take it along.

Worker events come from pod events (`planaria.kube.signals`): DIED once per pod (by uid) when it
fails, is deleted, evicted or disrupted, a container ends or restarts, or Ready turns False;
PREEMPTION_NOTICE when the preemption annotation appears; JOINED when a replacement pod of a node
whose workers died is serving, or whose `connect` ran out of time before it served (a slow
start: the controller counted the workers lost). A dead pod, or a ready one whose agent does
not answer, is deleted by the next `reconcile` and created again, so the node's workers return.
Pods are created without waiting for scheduling; `connect` waits (bounded) until the pod
serves, reading the pod itself when no event arrives for a while.

`close` lets go without touching the pods (an operator that exits mid-job: its successor
adopts them); `shutdown` deletes them (the job ended; each agent gets SIGTERM from its kubelet
and stops gracefully after the controller's Stop RPC already ended it).

Errors: `ports.AgentUnreachable` from `connect` (pod dead or not serving in time, agent not
answering); `StoreError` when no store port is free; API failures are `api.KubeError`s (a
failed create is retried by the next reconcile).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

# the store classes, as planaria.agent.execution.groups
from torch._C import _distributed_c10d as c10d

from planaria.contract import plan, rendezvous
from planaria.control import ports
from planaria.kube import api, constants, pods, signals
from planaria.rpc import client, tls
from planaria.spec import job

LOG = logging.getLogger(__name__)
STORE_TIMEOUT_S = 300.0
MAX_STORE_PORTS = 1000  # jobs one operator hosts stores for at once, at most
POLL_S = 1.0  # connect reads the pod itself after this long without an event


class StoreError(RuntimeError):
    """No rendezvous store could be hosted; the message says which ports were tried."""


def host_store(host: str, base_port: int, taken: set[int]) -> tuple[Any, ports.StoreAddress]:
    """A TCPStore server on the first free port from `base_port` up not in `taken` (0: any
    free port), advertised at `host`; the port is added to `taken`."""
    timeout = datetime.timedelta(seconds=STORE_TIMEOUT_S)
    candidates = [0] if base_port == 0 else range(base_port, base_port + MAX_STORE_PORTS)
    for port in candidates:
        if port in taken:
            continue
        try:
            store = c10d.TCPStore(host, port, None, True, timeout, False)
        except RuntimeError:  # the port is in use (DistNetworkError): the next one
            continue
        taken.add(store.port)
        return store, ports.StoreAddress(host=host, port=store.port)
    raise StoreError(f"no free store port from {base_port} on {host}; free one or raise the base")


class KubeBackend:
    """Worker pods of one job (module docstring)."""

    def __init__(
        self,
        *,
        client: api.Api,
        owner: pods.Owner,
        spec: job.JobSpec,
        image: str,
        tls: tls.ControllerTls,
        store: tuple[Any, ports.StoreAddress],
        taken: set[int] | None = None,
    ) -> None:
        self._api = client
        self._owner = owner
        self._spec = spec
        self._image = image
        self._tls = tls
        self._store: Any = store[0]
        self._address = store[1]
        self._taken = taken if taken is not None else set()
        self._nodes = spec.workers // spec.gpus_per_node
        self._pods: dict[int, signals.PodState] = {}
        self._reported: set[str] = set()  # uids whose DIED went out
        self._retired: set[str] = set()  # uids of pods deleted or replaced
        self._down: set[int] = set()  # nodes whose workers died and did not join again
        self._wanted: set[int] = set()
        self._synced = False
        self._changed = asyncio.Event()
        self._events: asyncio.Queue[ports.WorkerEvent | None] = asyncio.Queue()
        self._closed = False
        self._ending = False  # shutdown began: create no pod

    # -- ports.Backend -----------------------------------------------------------------------

    @property
    def store(self) -> ports.StoreAddress:
        return self._address

    def fail_epoch(self, key_prefix: str, world_size: int) -> None:
        if self._store is not None:
            store = c10d.PrefixStore(key_prefix, self._store)
            rendezvous.flag_failed(store, world_size, "operator")

    async def start(self, workers: Sequence[plan.WorkerId]) -> None:
        """Create the pods of `workers`' nodes that do not run (adopting those that do)."""
        nodes = sorted({pods.node_of(self._spec, w) for w in workers})
        self._wanted.update(nodes)
        await self._sync()
        for node in nodes:
            await self._ensure(node)

    async def connect(self, worker: plan.WorkerId, timeout_s: float) -> ports.Agent:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        node = pods.node_of(self._spec, worker)
        try:
            state = await self._serving(worker, node, deadline)
        except ports.AgentUnreachable:
            # The controller counts the worker lost; once its pod serves, it joins (JOINED).
            self._down.add(node)
            raise
        port = constants.AGENT_PORT + int(worker) - node * self._spec.gpus_per_node
        host = f"[{state.ip}]" if ":" in state.ip else state.ip
        remaining = max(0.1, deadline - loop.time())
        try:
            return await client.AgentClient.connect(
                worker, f"{host}:{port}", timeout_s=remaining, tls=self._tls
            )
        except ports.AgentUnreachable:
            # Ready yet silent: not trusted again; the next reconcile replaces the pod.
            self._report(
                state, ports.EventKind.DIED, f"pod {state.name}: its agent does not answer"
            )
            raise

    def events(self) -> AsyncIterator[ports.WorkerEvent]:
        return ports.until_closed(self._events)

    async def shutdown(self) -> None:
        """Delete the job's pods and release the store; idempotent. From its start no pod is
        created any more: a reconcile already under way deletes what it creates."""
        if self._closed:
            return
        self._ending = True
        for node in sorted(self._wanted | set(self._pods)):
            with contextlib.suppress(api.NotFound):
                await self._api.delete(
                    api.PODS, self._owner.namespace, constants.pod_name(self._owner.name, node)
                )
        self.close()

    # -- the operator's side -------------------------------------------------------------------

    def close(self) -> None:
        """Release the store and end `events`, leaving the pods as they are; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._events.put_nowait(None)
        self._taken.discard(self._address.port)
        self._store = None  # the TCPStore's server ends with its last reference

    def observe(self, kind: str | None, body: dict[str, Any]) -> None:
        """Take in one event of a pod of the job (`kind` ADDED, MODIFIED, DELETED or None for
        a listing) and queue the worker events it means (module docstring)."""
        state = signals.read(body, deleted=kind == "DELETED")
        node = state.node
        if node is None or not 0 <= node < self._nodes or state.uid in self._retired:
            return
        current = self._pods.get(node)
        before = current if current is not None and current.uid == state.uid else None
        if current is not None and before is None:
            self._replaced(current)
        verdict = signals.classify(before, state)
        self._pods[node] = state
        if verdict is not None:
            self._report(state, *verdict)
        if node in self._down and state.serving and state.uid not in self._reported:
            self._down.discard(node)
            self._emit(ports.EventKind.JOINED, state, f"pod {state.name} serves again")
        if state.deleted:
            self._retired.add(state.uid)
            del self._pods[node]
        self._changed.set()
        self._changed = asyncio.Event()

    async def reconcile(self) -> None:
        """Delete dead pods and create missing ones, for every node the job started."""
        if self._closed or self._ending:
            return
        await self._sync()
        for node in sorted(self._wanted):
            try:
                await self._ensure(node)
            except api.KubeError as exc:  # temporary: the next pass tries again
                LOG.warning("job %s node %d: %s", self._owner.name, node, exc)

    @property
    def pods(self) -> dict[int, signals.PodState]:
        """The latest state of each node's pod (nodes with no pod are absent)."""
        return dict(self._pods)

    # -- internals -------------------------------------------------------------------------------

    async def _sync(self) -> None:
        """Read the job's pods once (an operator restarted mid-job has seen no events yet)."""
        if self._synced:
            return
        selector = f"{constants.LABEL_JOB}={self._owner.name}"
        for body in await self._api.list(api.PODS, self._owner.namespace, labels=selector):
            self.observe(None, body)
        self._synced = True

    async def _ensure(self, node: int) -> None:
        """Node `node` has a pod that is not dead: delete a dead one, create a missing one; a
        pod that exists already (409) is adopted as it is."""
        state = self._pods.get(node)
        name = constants.pod_name(self._owner.name, node)
        if state is not None and not self._lost(state):
            return
        if state is not None:
            with contextlib.suppress(api.NotFound):
                await self._api.delete(api.PODS, self._owner.namespace, name)
            self.observe("DELETED", {**state_body(state), "metadata": _meta(state)})
        if self._shutting_down():
            return
        body = pods.worker_pod(self._owner, self._spec, node=node, image=self._image)
        try:
            created = await self._api.create(api.PODS, self._owner.namespace, body)
        except api.Conflict:  # still there (deleting, or made by a predecessor): adopt
            created = await self._api.get(api.PODS, self._owner.namespace, name)
        if self._shutting_down():  # ended while the pod was made: shutdown passed its node
            with contextlib.suppress(api.NotFound):
                await self._api.delete(api.PODS, self._owner.namespace, name)
            return
        self.observe(None, created)

    async def _serving(self, worker: plan.WorkerId, node: int, deadline: float) -> signals.PodState:
        loop = asyncio.get_running_loop()
        name = constants.pod_name(self._owner.name, node)
        while True:
            state = self._pods.get(node)
            if state is not None and state.serving:
                return state
            if state is not None and self._lost(state):
                why = state.dead or "its workers were reported dead"
                raise ports.AgentUnreachable(worker, f"pod {name}: {why}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                where = state.phase if state is not None else "not created"
                raise ports.AgentUnreachable(worker, f"pod {name} not serving in time ({where})")
            try:
                await asyncio.wait_for(self._changed.wait(), min(POLL_S, remaining))
            except TimeoutError:
                await self._refresh(name)

    async def _refresh(self, name: str) -> None:
        """Read pod `name` (no event came for a while); a failure leaves the state as it is."""
        try:
            self.observe(None, await self._api.get(api.PODS, self._owner.namespace, name))
        except api.KubeError as exc:
            LOG.debug("reading pod %s: %s", name, exc)

    def _shutting_down(self) -> bool:
        """Whether the job's shutdown began (no pod is created from then on); a call, read
        afresh after every await."""
        return self._ending

    def _lost(self, state: signals.PodState) -> bool:
        """Whether `state`'s pod is dead or was reported so (NotReady after Ready: it is
        replaced, not trusted again)."""
        return bool(state.dead) or state.uid in self._reported

    def _replaced(self, old: signals.PodState) -> None:
        """Another pod took `old`'s node: `old` is gone (its DELETED event may never come)."""
        self._retired.add(old.uid)
        if old.uid not in self._reported:
            self._report(old, ports.EventKind.DIED, f"pod {old.name}: replaced")

    def _report(self, state: signals.PodState, kind: ports.EventKind, detail: str) -> None:
        if kind is ports.EventKind.DIED:
            if state.uid in self._reported:
                return
            self._reported.add(state.uid)
            if state.node is not None:
                self._down.add(state.node)
        LOG.info("job %s: %s: %s", self._owner.name, kind, detail)
        self._emit(kind, state, detail)

    def _emit(self, kind: ports.EventKind, state: signals.PodState, detail: str) -> None:
        if self._closed:
            return
        node = state.node or 0
        workers = state.workers or pods.node_workers(self._spec, node)
        for worker in workers:
            self._events.put_nowait(ports.WorkerEvent(kind=kind, worker=worker, detail=detail))


def state_body(state: signals.PodState) -> dict[str, Any]:
    """A minimal pod body of `state` (phase only), for observing a deletion we made."""
    return {"status": {"phase": state.phase}}


def _meta(state: signals.PodState) -> dict[str, Any]:
    return {
        "name": state.name,
        "uid": state.uid,
        "labels": {constants.LABEL_NODE: str(state.node)},
        "annotations": {constants.ANNOTATION_WORKERS: ",".join(str(w) for w in state.workers)},
    }
