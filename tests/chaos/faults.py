"""Injecting a chaos trial's faults into a running job, each where its schedule says.

    injector = Injector(draw, shape, controller, backend, net=None, pids=recorder, started=t0)
    await injector.run()  # beside the controller's run; injector.events says what landed

The faults are signals to the backend's agent processes (SIGKILL, SIGSTOP and SIGCONT), a
worker started again after its death (`LocalBackend.restart`), and a partition's cut and heal
(`netns`). Each waits for its moment: seconds after its trigger (`TRIGGERS`, for the kinds of
`schedule.DELAY_S`), else a point of the training run counted in steps, so it lands inside the
run whatever the machine's speed. Every action is an `Event` that records where the job was
(the controller's phase, epoch, committed step and what its status said it was doing).

Not here: the schedule (`schedule.draw`), the job and its invariant (`trials`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from planaria.contract import plan
from planaria.control import controller as controllers
from planaria.control import status as statuses
from planaria.local import backend as local_backend
from tests.chaos import netns, processes, schedule
from tests.e2e import local_job

Phase = statuses.Phase


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One action on a worker, with where the job was when it landed (seconds from the start;
    `doing`: the start of the status message, e.g. "opening epoch 1" or "epoch 2 running")."""

    at_s: float
    # "SIGKILL", "SIGSTOP", "SIGCONT", "cut", "heal", "restart", or "skipped ..." when it could
    # not act
    action: str
    worker: plan.WorkerId
    phase: str
    epoch: int
    step: int
    doing: str

    def describe(self) -> str:
        where = f"{self.phase} epoch {self.epoch} step {self.step}: {self.doing}"
        return f"{self.at_s:.2f}s {self.action} w{self.worker} ({where})"


class Injector:
    """One trial's faults (module docstring); `events` lists every action, in order."""

    def __init__(
        self,
        draw: schedule.Draw,
        shape: schedule.Shape,
        controller: controllers.Controller,
        backend: local_backend.LocalBackend,
        *,
        net: netns.Net | None,
        pids: processes.Recorder,
        started: float,
    ) -> None:
        self.draw, self.shape, self.controller, self.backend = draw, shape, controller, backend
        self.net, self.pids, self.started = net, pids, started  # started: time.monotonic()
        self.events: list[Event] = []

    async def run(self) -> None:
        """Inject the schedule's faults, each at its moment (returns once the last landed)."""
        kind = self.draw.kind
        await self._first_moment()
        if kind is schedule.Kind.STALL:
            await self._stall()
            return
        if kind is schedule.Kind.PARTITION:
            await self._partition(self.draw.victims[0])
            return
        signum = signal.SIGSTOP if kind is schedule.Kind.HANG else signal.SIGKILL
        for index, victim in enumerate(self.draw.victims):
            if index:
                await asyncio.sleep(self.draw.gaps_s[index - 1])
            self._signal(victim, signum)
        if kind is schedule.Kind.RETURNS:
            await self._return(self.draw.victims[0])

    async def _first_moment(self) -> None:
        """Wait for the first fault's moment. Seconds after its trigger for the kinds of
        `schedule.DELAY_S`; otherwise a point of the training run counted in steps, so the
        fault lands inside the run whatever the machine's speed: `at` of the way through
        steps 0..steps - 2, the fraction of a step slept out by the last step's duration."""
        kind = self.draw.kind
        await self._until(TRIGGERS.get(kind, _running))
        if kind in schedule.DELAY_S:
            await asyncio.sleep(self.draw.at * schedule.DELAY_S[kind])
            return
        position = self.draw.at * (self.shape.steps - 2)
        await self._until(lambda s: s.step >= int(position))
        records = self.controller.steps
        step_s = records[-1].at_s - records[-2].at_s if len(records) > 1 else 0.1
        await asyncio.sleep((position - int(position)) * step_s)

    async def _stall(self) -> None:
        """Stop every victim at once, past the heartbeat timeout, then let them go on."""
        for victim in self.draw.victims:
            self._signal(victim, signal.SIGSTOP)
        await asyncio.sleep(self.shape.heartbeat_timeout_s + 1.0)
        for victim in self.draw.victims:
            self._signal(victim, signal.SIGCONT)

    async def _partition(self, victim: plan.WorkerId) -> None:
        """Cut the victim's link for `cut_s`, then heal it (never, when infinite)."""
        assert self.net is not None
        self.net.cut()
        self._event("cut", victim)
        if math.isinf(self.draw.cut_s):
            return
        await asyncio.sleep(self.draw.cut_s)
        self.net.heal()
        self._event("heal", victim)

    async def _until(self, check: Callable[[statuses.JobStatus], bool]) -> None:
        while not check(self.controller.status):
            await asyncio.sleep(local_job.POLL_S)

    def _signal(self, worker: plan.WorkerId, signum: signal.Signals) -> None:
        if self.backend.running(worker):
            self.backend.kill(worker, signum)
            self._event(signum.name, worker)
        else:
            self._event(f"skipped {signum.name} (not running)", worker)

    async def _return(self, worker: plan.WorkerId) -> None:
        with contextlib.suppress(TimeoutError):
            await self.backend.wait_exited(worker, 10.0)
        await asyncio.sleep(self.draw.rejoin_s)
        try:
            await self.backend.restart(worker)
        except local_backend.LocalBackendError as exc:  # the job ended first: nothing to join
            self._event(f"skipped restart ({exc})", worker)
            return
        self.pids.add(self.backend.pids.values())
        self._event("restart", worker)

    def _event(self, action: str, worker: plan.WorkerId) -> None:
        status = self.controller.status
        self.events.append(
            Event(
                at_s=time.monotonic() - self.started,
                action=action,
                worker=worker,
                phase=status.phase.value,
                epoch=status.epoch,
                step=status.step,
                doing=status.message.split(":")[0],
            )
        )


def _running(status: statuses.JobStatus) -> bool:
    return status.phase is Phase.RUNNING


def _early(status: statuses.JobStatus) -> bool:
    """Profiling has begun (the first epoch's set-up follows it)."""
    return status.phase is Phase.PROFILING


def _setting_up(status: statuses.JobStatus) -> bool:
    """The first epoch is being set up (its Configures sent, the workers regrouping)."""
    return status.message.startswith("opening epoch 1") or status.phase is Phase.RUNNING


# When a kind's delay starts: a returning worker is killed while the first epoch is set up
# (seconds), so that its restart (seconds too) can come back while the job still trains.
TRIGGERS = {schedule.Kind.EARLY: _early, schedule.Kind.RETURNS: _setting_up}
