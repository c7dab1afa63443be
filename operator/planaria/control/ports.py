"""Ports: what the controller core needs from the world, as Protocols.

The core (`planaria.control`) drives a job through these and nothing else, so it runs the same
against agents over gRPC (`planaria.rpc`), processes on this machine (`planaria.local`), pods
(`planaria.kube`) and the in-memory fakes of its tests, with a real or an injected clock.

    Agent     one worker's agent: Configure, the Watch heartbeat stream, Pause/Resume/Stop,
              Profile, LoadSnapshot. Every call raises `AgentUnreachable` when the transport
              fails or its deadline passes; `watch` raises it when the stream breaks, which is
              how a death is noticed within a heartbeat.
    Backend   where the workers run: starts them, connects to their agents, hosts the
              rendezvous store of the epochs' process groups, and reports worker events
              (deaths, preemption notices, returns) as they happen.
    Clock     monotonic time and sleeping, on the event loop (tests run it in virtual time).
    StatusSink  receives the job's status value after every pass (the terminal, the CRD).
    Journal   durably records each epoch before its agents hear of it (the operator's state
              ConfigMap), so that a successor controller adopts the running job
              (`Controller(adopt=...)`) instead of starting it over.

Rules every implementation keeps:
- An epoch's process group is the plan's workers, ranked by worker id
  (`planaria.contract.configure_rules.ranks`, which the agents use too); the controller sends
  Configure to exactly those workers. Layer transfer sources are live workers of the new plan.
- `Backend.events` yields each event once, in the order they happened; a worker reported DIED
  stays dead until a JOINED event for it (a restarted or returning worker).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from planaria.contract import plan, profile
from planaria.control import status as statuses
from planaria.wire import messages


class AgentUnreachable(Exception):
    """An agent could not be reached, its call outlived the deadline, or its stream broke."""

    def __init__(self, worker: plan.WorkerId, detail: str) -> None:
        super().__init__(f"agent of worker {worker} unreachable: {detail}")
        self.worker = worker
        self.detail = detail


class Agent(Protocol):
    """One worker's agent, as the controller reaches it."""

    @property
    def worker(self) -> plan.WorkerId:
        """The worker id this agent serves."""
        ...

    async def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        """Open `config.epoch` on the agent; it answers once the configuration is checked."""
        ...

    def watch(self, interval_s: float) -> AsyncIterator[messages.Heartbeat]:
        """Heartbeats every `interval_s` until the agent stops (the iterator ends) or the stream
        breaks (AgentUnreachable)."""
        ...

    async def pause(self, epoch: int) -> messages.Acknowledgement: ...

    async def resume(self, epoch: int) -> messages.Acknowledgement: ...

    async def stop(self, grace_s: float) -> messages.Acknowledgement: ...

    async def profile(self, order: messages.ProfileOrder) -> profile.Profile: ...

    async def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement: ...

    async def close(self) -> None:
        """Release the connection (not the agent)."""
        ...


class EventKind(StrEnum):
    """What happened to a worker."""

    DIED = "died"  # the process or pod is gone (exit, kill, node loss, eviction)
    PREEMPTION_NOTICE = "preemption_notice"  # it will be taken away soon (spot notice)
    JOINED = "joined"  # a new, restarted or returning worker is up and reachable


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEvent:
    """One event of one worker, with the backend's words for it (exit code, pod phase...)."""

    kind: EventKind
    worker: plan.WorkerId
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreAddress:
    """Where the rendezvous store (a torch TCPStore the backend hosts) listens."""

    host: str
    port: int


async def until_closed(
    queue: asyncio.Queue[WorkerEvent | None],
) -> AsyncIterator[WorkerEvent]:
    """The events put on `queue`, in order, until the None that closes it, which stays queued
    so every later reader ends too: `Backend.events` for backends that queue their events."""
    while True:
        event = await queue.get()
        if event is None:
            queue.put_nowait(None)
            return
        yield event


class Backend(Protocol):
    """Where the job's workers run."""

    @property
    def store(self) -> StoreAddress:
        """The rendezvous store of the job's epochs (hosted by the backend, never a worker)."""
        ...

    async def start(self, workers: Sequence[plan.WorkerId]) -> None:
        """Start (or adopt already running) agents for `workers`; returns once launched."""
        ...

    def fail_epoch(self, key_prefix: str, world_size: int) -> None:
        """Flag the epoch under `key_prefix` failed in the store
        (`planaria.contract.rendezvous.flag_failed`), so that every worker of it stops
        waiting at once; quick (the store is in this process), idempotent, and a no-op once
        the store is closed."""
        ...

    async def connect(self, worker: plan.WorkerId, timeout_s: float) -> Agent:
        """The agent of a started worker, once it answers (AgentUnreachable past timeout_s)."""
        ...

    def events(self) -> AsyncIterator[WorkerEvent]:
        """Worker events as they happen, until `shutdown`."""
        ...

    async def shutdown(self) -> None:
        """Stop every worker the backend started and release the store; idempotent."""
        ...


class Clock(Protocol):
    """Time for the core: `clock.RealClock`, on the loop's time (virtual in tests)."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class StatusSink(Protocol):
    """Receives the job's status after every pass."""

    async def publish(self, status: statuses.JobStatus) -> None: ...


Transfers = tuple[plan.LayerTransfer, ...]  # (a field of EpochRecord is named `plan`)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochRecord:
    """An epoch as the controller opened it: its number, plan, how the plan was made ("initial",
    "dynamic", "reroute", ...), the step it resumes after, the profile the planner used, the
    layer copies into the plan, and whether it is a planned switch (running agents move at
    `resume_step`) rather than an epoch opened after a failure, at the start or a resume. A
    successor can send its Configures again from the record alone."""

    epoch: int
    plan: plan.Plan
    kind: statuses.MoveKind
    resume_step: int
    profile: profile.Profile
    transfers: Transfers = ()
    planned: bool = False


class Journal(Protocol):
    """Keeps the latest `EpochRecord` where a successor controller can read it back."""

    async def record(self, entry: EpochRecord) -> None:
        """Store `entry` durably; raise on failure (the controller logs it and opens the epoch
        anyway: a successor then finds the agents ahead of the record and recovers)."""
        ...
