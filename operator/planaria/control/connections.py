"""The controller's lines to its agents: connecting, one Watch task per agent, one queue.

`Connections` starts the workers through the backend, connects their agents, runs one task per
agent that forwards its Watch heartbeats (and the stream's break) to a single queue, forwards
the backend's events to the same queue, and feeds everything that arrives into the `Roster`.
`bounded` is the one way the controller waits: on the injected clock, never longer than told.

Errors: `Unbounded` (a TimeoutError) when a bounded wait runs out; `ports.AgentUnreachable`
from agents is absorbed here as a death.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable
from typing import TypeVar

from planaria.contract import plan as plans
from planaria.contract import profile as profiles
from planaria.control import membership, ports
from planaria.wire import messages

LOG = logging.getLogger(__name__)
T = TypeVar("T")


class Unbounded(TimeoutError):
    """A bounded wait of the controller ran out of time."""


async def bounded(clock: ports.Clock, awaitable: Awaitable[T], timeout_s: float) -> T:
    """`awaitable`'s result, or Unbounded after `timeout_s` on `clock` (it is cancelled, and so
    it is when the caller is: an operator stopping must not wait for a call in flight)."""
    work = asyncio.ensure_future(awaitable)
    nap = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        await asyncio.wait({work, nap}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        nap.cancel()
    if not work.done():
        work.cancel()
        raise Unbounded(f"no answer within {timeout_s:g} s")
    return work.result()


class Connections:
    """The agents of one job and the queue their reports arrive on (module docstring)."""

    def __init__(
        self,
        backend: ports.Backend,
        clock: ports.Clock,
        roster: membership.Roster,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._roster = roster
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._queue: asyncio.Queue[membership.Item] = asyncio.Queue()
        self._tasks: dict[plans.WorkerId, asyncio.Task[None]] = {}
        self._pump: asyncio.Task[None] | None = None
        self.agents: dict[plans.WorkerId, ports.Agent] = {}

    async def start(self, workers: Iterable[plans.WorkerId]) -> None:
        """Start the workers, forward the backend's events, connect every agent."""
        chosen = list(workers)
        await bounded(self._clock, self._backend.start(chosen), self._timeout_s)
        self._pump = asyncio.ensure_future(self._forward_events())
        await asyncio.gather(*(self.connect(w) for w in chosen))

    async def connect(self, worker: plans.WorkerId) -> bool:
        """(Re)connect `worker`'s agent and watch it; False (and dead) when unreachable."""
        try:
            agent = await bounded(
                self._clock, self._backend.connect(worker, self._timeout_s), self._timeout_s
            )
        except (ports.AgentUnreachable, Unbounded) as exc:
            LOG.warning("worker %d: not reachable: %s", worker, exc)
            self._roster.lost(worker, self._clock.monotonic())
            return False
        old = self._tasks.pop(worker, None)
        if old is not None:
            old.cancel()
        self.agents[worker] = agent
        generation = self._roster.connected(worker, self._clock.monotonic())
        self._tasks[worker] = asyncio.ensure_future(self._watch(agent, worker, generation))
        return True

    async def profile(
        self, workers: Iterable[plans.WorkerId], order: messages.ProfileOrder
    ) -> profiles.Profile:
        """The model's profile from the lowest of `workers` whose agent measures it within the
        Configure timeout; Unbounded when none does."""
        for worker in sorted(workers):
            with contextlib.suppress(ports.AgentUnreachable, Unbounded):
                agent = self.agents[worker]
                return await bounded(self._clock, agent.profile(order), self._timeout_s)
        raise Unbounded("no agent could profile the model; check that the workers start")

    async def next(self, timeout_s: float) -> None:
        """Wait (bounded) for something to arrive, then take all that is queued."""
        if self._queue.empty():
            with contextlib.suppress(Unbounded):
                item = await bounded(self._clock, self._queue.get(), timeout_s)
                self._roster.absorb(item, self._clock.monotonic())
        while not self._queue.empty():
            self._roster.absorb(self._queue.get_nowait(), self._clock.monotonic())

    async def close(self, live: Iterable[plans.WorkerId], grace_s: float) -> None:
        """Stop the `live` agents (bounded), end every task, release the connections and the
        backend. Failures here are logged: the job's outcome is already decided."""
        stops = [
            bounded(self._clock, self.agents[w].stop(grace_s), self._timeout_s)
            for w in sorted(set(live) & set(self.agents))
        ]
        for result in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(result, BaseException):
                LOG.warning("stopping an agent: %s", result)
        await self.release()
        try:
            await bounded(self._clock, self._backend.shutdown(), self._timeout_s)
        except Exception as exc:  # a process boundary: log it, the status stands
            LOG.warning("backend shutdown: %s", exc)

    async def release(self) -> None:
        """End every task and release the connections; the agents and the backend's workers
        stay as they are (a detached controller: a successor adopts them)."""
        tasks = [*self._tasks.values(), *([self._pump] if self._pump else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.close() for a in self.agents.values()), return_exceptions=True)

    async def _watch(self, agent: ports.Agent, worker: plans.WorkerId, generation: int) -> None:
        try:
            async for beat in agent.watch(self._interval_s):
                self._queue.put_nowait(
                    membership.Beat(worker=worker, generation=generation, heartbeat=beat)
                )
            detail = "the Watch stream ended"
        except ports.AgentUnreachable as exc:
            detail = exc.detail
        except Exception as exc:  # a task boundary: an adapter's bug must still read as a loss
            LOG.exception("worker %d: the Watch task failed", worker)
            detail = f"the Watch task failed: {exc!r}"
        self._queue.put_nowait(membership.Lost(worker=worker, generation=generation, detail=detail))

    async def _forward_events(self) -> None:
        try:
            async for event in self._backend.events():
                self._queue.put_nowait(membership.Event(event=event))
        except Exception:  # a task boundary: deaths are still seen on the Watch streams
            LOG.exception("the backend's event stream failed; relying on the Watch streams")
