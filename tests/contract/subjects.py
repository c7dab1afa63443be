"""The two implementations of the agent's side of Configure behind one driver, for the contract
suite: `RealAgent` (the agent runtime, in this process, in a one-rank gloo epoch of the tiny
model) and `FakeAgent` (the controller tests' fake agent, in its cluster on a virtual-time
loop). Both are driven synchronously by the test.

Each is started with one worker, W0, and answers what the suite asks: `configure` (the
Acknowledgement), `beat` (the heartbeat now), `wait` (until a heartbeat passes a test), `hold`
(a heartbeat of a RUNNING agent that does not step on until `release`: the real agent blocks
inside its next step through the executor's hook, the fake one does not move while its loop
does not run), `stop`.

Configures are built by the controller's own `planaria.control.epochs.configs`, so the ranks,
key prefix and settings each implementation sees are the ones the controller sends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar

import looptime
from torch._C import _distributed_c10d as c10d

from planaria.agent.runtime import runtime
from planaria.contract import plan
from planaria.control import clock, epochs, ports
from planaria.control import settings as job_settings
from planaria.wire import messages
from tests.control import fakes

W0 = plan.WorkerId(0)
WAIT_S = 120.0  # a bound on a wait for real training (a hang fails, not a slow machine)
T = TypeVar("T")

# One pipeline of one stage: the whole tiny model (6 planner layers) on worker 0, 4 micro-batches.
PLAN = plan.Plan(
    pipelines=(
        plan.Pipeline(
            stages=(plan.Stage(layer_start=0, layer_stop=6, workers=(W0,)),), num_micro_batches=4
        ),
    ),
    micro_batch_size=1,
)


def job(corpus: Path) -> job_settings.JobSettings:
    """A job that never ends by itself (its agents train until stopped)."""
    training = messages.TrainingSettings(
        model="tiny",
        seed=5,
        optimizer=messages.OptimizerSettings(lr=3e-3),
        global_batch_size=4,
        data=messages.DataSettings(corpus_paths=(str(corpus),)),
        device=messages.Device.CPU,
        snapshot_interval_steps=0,
        redundancy=messages.RedundancyMode.NONE,
    )
    return job_settings.JobSettings(
        name="contract", workers=1, steps=1_000_000, micro_batch_size=1, training=training
    )


class Subject(Protocol):
    """An agent of worker W0 as the contract suite drives it (module docstring)."""

    store: ports.StoreAddress

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement: ...
    def beat(self) -> messages.Heartbeat: ...
    def wait(self, done: Callable[[messages.Heartbeat], bool]) -> messages.Heartbeat: ...
    def hold(self) -> messages.Heartbeat: ...
    def release(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


def config_for(
    subject: Subject,
    corpus: Path,
    *,
    epoch: int,
    resume: int,
    worker: int = 0,
    device: messages.Device = messages.Device.CPU,
) -> messages.WorkerConfig:
    """W0's Configure of `epoch` as the controller builds it, sent to `worker` (another
    worker's id: a Configure that reached the wrong agent) with settings for `device`."""
    built = epochs.configs(
        epoch=epoch,
        plan=PLAN,
        transfers=(),
        resume_step=resume,
        job=job(corpus),
        store=subject.store,
    )[W0]
    settings = dataclasses.replace(built.settings, device=device)
    return dataclasses.replace(built, worker=plan.WorkerId(worker), settings=settings)


class _Gate:
    """An executor hook that blocks the training thread inside a step while closed."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self._held = threading.Event()

    def hook(self, at: int, index: int, op: object) -> None:
        if not self._open.is_set():
            self._held.set()
            self._open.wait(WAIT_S)

    def close(self) -> None:
        self._held.clear()
        self._open.clear()

    def wait_held(self) -> None:
        assert self._held.wait(WAIT_S), "the agent never reached its next step"

    def open(self) -> None:
        self._open.set()


class RealAgent:
    """The agent runtime of W0 with a rendezvous store of its own (module docstring)."""

    def __init__(self, base: Path) -> None:
        self._store = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10))
        self.store = ports.StoreAddress(host="127.0.0.1", port=self._store.port)
        self._gate = _Gate()
        self.runtime = runtime.Runtime(
            worker=W0, job="contract", snapshot_base=base, hook=self._gate.hook
        )
        self.runtime.start()

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        return self.runtime.configure(config)

    def beat(self) -> messages.Heartbeat:
        return self.runtime.heartbeat()

    def wait(self, done: Callable[[messages.Heartbeat], bool]) -> messages.Heartbeat:
        deadline = time.monotonic() + WAIT_S
        while not done(beat := self.beat()):
            assert time.monotonic() < deadline, f"still {beat}"
            time.sleep(0.01)
        return beat

    def hold(self) -> messages.Heartbeat:
        self._gate.close()
        self._gate.wait_held()
        return self.beat()

    def release(self) -> None:
        self._gate.open()

    def stop(self) -> None:
        self.release()
        assert self.runtime.stop(1.0).accepted
        assert self.runtime.wait_stopped(WAIT_S)

    def close(self) -> None:
        self.release()
        self.runtime.close()


class FakeAgent:
    """The controller tests' fake agent W0 in its cluster, on a virtual-time loop of its own
    that runs only while the suite waits on it (module docstring)."""

    def __init__(self, base: Path) -> None:
        self._loop = looptime.new_event_loop()
        self._cluster = fakes.FakeCluster(clock.RealClock(), step_s=0.1)
        self._run(self._cluster.start([W0]))
        self.store = self._cluster.store
        self.agent = self._cluster.agent(W0)

    def _run(self, work: Awaitable[T]) -> T:
        return self._loop.run_until_complete(work)

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        return self._run(self.agent.configure(config))

    def beat(self) -> messages.Heartbeat:
        return self.agent.heartbeat()

    def wait(self, done: Callable[[messages.Heartbeat], bool]) -> messages.Heartbeat:
        async def until() -> messages.Heartbeat:
            for _ in range(100_000):  # virtual seconds: costs no real time
                if done(beat := self.beat()):
                    return beat
                await asyncio.sleep(self._cluster.step_s / 2)
            raise AssertionError(f"still {self.beat()}")

        return self._run(until())

    def hold(self) -> messages.Heartbeat:
        beat = self.beat()
        assert beat.state is messages.AgentState.RUNNING, beat
        return beat

    def release(self) -> None:
        return None

    def stop(self) -> None:
        assert self._run(self.agent.stop(1.0)).accepted

    def close(self) -> None:
        self._run(self._cluster.shutdown())
        tasks = asyncio.all_tasks(self._loop)  # the cancelled ticker: let it end
        if tasks:
            self._run(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()
