"""Jobs and drivers shared by the controller tests: a synthetic profile whose memory limit
forces pipelines of several stages, job settings around it, and `Run`, which drives a
controller against a FakeCluster in simulated time (no real sleeps).

Time is virtual: the async tests that drive a controller run on looptime's event loop
(`loop_factories`, given to pytest-asyncio by the conftests), whose time moves only when no
task is ready to run, straight to the next timer, so `asyncio.sleep(30)` ends at once and every
run is the same on any machine and under any load. The controller and the fakes use the
shipped `RealClock`, which reads that loop's time. `advance` is how a test lets time pass.
The planner runs inline, on the loop (`INLINE`): a thread's answer would arrive in real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from concurrent import futures

import looptime

from planaria.contract import plan, profile, shapes
from planaria.control import (
    clock,
    connections,
    controller,
    epochs,
    executors,
    history,
    membership,
    planning,
    ports,
    settings,
    status,
)
from planaria.planner import accelerators, synthetic
from planaria.wire import messages
from tests.control import fakes

MIB = 2**20
# Virtual time runs in whole microseconds (looptime's default resolution): `advance` waits one
# more tick, which the loop reaches only once idle, so everything due by then has run.
JUST_AFTER_S = 1e-6
# The planner runs in its caller, on the loop's thread, as virtual time needs
# (`executors.Inline`); tests/control/test_planner_thread.py runs it on a thread.
INLINE = executors.Inline()


def loop_factories() -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """pytest-asyncio's event loops for the tests that drive a controller: virtual time only."""
    return {"virtual-time": looptime.new_event_loop}


async def advance(seconds: float) -> None:
    """Let `seconds` of virtual time pass, and every task due by then run until it waits."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, looptime.LoopTimeEventLoop) and loop.looptime_on, (
        "a test that moves the controller's time runs on the virtual-time loop (conftest)"
    )
    await asyncio.sleep(seconds)
    await asyncio.sleep(JUST_AFTER_S)


def small_profile(memory_mib: int = 30) -> profile.Profile:
    """The `small` model (10 planner layers), b = 2, one GPU per node, `memory_mib` per GPU:
    30 MiB gives 8 workers [2,2,2,2] and needs 4; 24 MiB gives [4,4] and needs 6 (fp32)."""
    source = synthetic.synthesize(
        shapes.named("small"), accelerators.named("a100-80gb"), 2, 1, synthetic.Precision.FP32
    )
    return dataclasses.replace(source, memory_bytes=memory_mib * MIB)


def paced(source: profile.Profile, factor: int = 100) -> profile.Profile:
    """`source` with every layer's compute `factor` times slower, its links as they are. At
    100, `small_profile`'s steps take about as long as the fake agents' (0.1 s) rather than
    about 1 ms, so a scale-up's fixed transition (0.04 s, `transfers.Overheads`) pays within a
    few steps, as a real job's does, not hundreds (`Planner.grow` weighs it)."""
    layers = tuple(
        dataclasses.replace(
            layer,
            forward_s=tuple(t * factor for t in layer.forward_s),
            backward_s=tuple(t * factor for t in layer.backward_s),
            optimizer_s=layer.optimizer_s * factor,
        )
        for layer in source.layers
    )
    return dataclasses.replace(source, layers=layers)


def training(**changes: object) -> messages.TrainingSettings:
    base = messages.TrainingSettings(
        model="small",
        seed=7,
        optimizer=messages.OptimizerSettings(lr=1e-3),
        global_batch_size=16,
        data=messages.DataSettings(corpus_paths=("corpus.txt",)),
        device=messages.Device.CPU,
        snapshot_interval_steps=1,
        redundancy=messages.RedundancyMode.XOR,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def epoch_record(epoch: int = 3) -> ports.EpochRecord:
    """A journal's record: the templates' best plan over 8 workers, with copies, planned (every
    field away from its default, so a codec that drops one fails a round trip)."""
    chosen = job()
    assert chosen.profile is not None
    move = planning.Planner(chosen.profile, chosen).best(
        frozenset(plan.WorkerId(w) for w in range(8)), status.MoveKind.INITIAL
    )
    copies = (
        plan.LayerTransfer(layer=2, destination=plan.WorkerId(5), sources=(plan.WorkerId(1),)),
        plan.LayerTransfer(
            layer=0, destination=plan.WorkerId(0), sources=(plan.WorkerId(2), plan.WorkerId(3))
        ),
    )
    return ports.EpochRecord(
        epoch=epoch,
        plan=move.plan,
        kind=status.MoveKind.DYNAMIC,
        resume_step=41,
        profile=chosen.profile,
        transfers=copies,
        planned=True,
    )


def job(**changes: object) -> settings.JobSettings:
    base = settings.JobSettings(
        name="test",
        workers=8,
        steps=60,
        micro_batch_size=2,
        training=training(),
        profile=small_profile(),
        heartbeat_interval_s=0.1,
        heartbeat_timeout_s=1.0,
        step_timeout_s=2.0,
        configure_timeout_s=3.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def condition(value: status.JobStatus, kind: status.ConditionType) -> tuple[str, str]:
    """`kind`'s condition in `value`: its status ("True" / "False") and reason."""
    [found] = [c for c in value.conditions if c.type == kind]
    return found.status, found.reason


@dataclasses.dataclass(frozen=True)
class Parts:
    """A controller's roster, fake cluster, connections and epoch driver, for the tests that
    drive one concern without the controller (`parts`)."""

    roster: membership.Roster
    cluster: fakes.FakeCluster
    lines: connections.Connections
    record: history.History
    driver: epochs.Driver


def parts(job_settings: settings.JobSettings, time: ports.Clock) -> Parts:
    roster = membership.Roster(heartbeat_timeout_s=job_settings.heartbeat_timeout_s)
    cluster = fakes.FakeCluster(time)
    lines = connections.Connections(cluster, time, roster, interval_s=0.1, timeout_s=1.0)
    record = history.History(global_batch=job_settings.training.global_batch_size)
    driver = epochs.Driver(
        job_settings,
        store=cluster.store,
        fail_epoch=cluster.fail_epoch,
        clock=time,
        roster=roster,
        lines=lines,
        record=record,
    )
    return Parts(roster=roster, cluster=cluster, lines=lines, record=record, driver=driver)


class Sink:
    """A StatusSink keeping every status published."""

    def __init__(self) -> None:
        self.published: list[status.JobStatus] = []

    async def publish(self, value: status.JobStatus) -> None:
        self.published.append(value)


class Run:
    """A controller and its fake cluster on one clock, in virtual time (module docstring)."""

    def __init__(
        self,
        job_settings: settings.JobSettings,
        *,
        executor: futures.Executor = INLINE,
        **cluster: object,
    ) -> None:
        """`executor`: the planner's (tests/control/test_planner_thread*.py give a thread)."""
        self.clock = clock.RealClock()
        self.cluster = fakes.FakeCluster(self.clock, **cluster)  # type: ignore[arg-type]
        self.sink = Sink()
        self.controller = controller.Controller(
            job_settings, self.cluster, clock=self.clock, sink=self.sink, executor=executor
        )
        self.task: asyncio.Task[status.JobStatus] | None = None

    async def until(
        self, condition: Callable[[], bool], *, limit_s: float = 60.0, tick_s: float = 0.05
    ) -> None:
        """Advance simulated time until `condition` holds (fails past `limit_s` from now)."""
        if self.task is None:
            self.task = asyncio.ensure_future(self.controller.run())
        deadline = self.clock.monotonic() + limit_s
        while not condition():
            assert self.clock.monotonic() < deadline, (
                f"not reached in {limit_s} s: {self.controller.status}"
            )
            if self.task.done():
                self.task.result()  # raise what ended it
                assert condition(), f"the controller ended first: {self.controller.status}"
            await advance(tick_s)

    async def finish(self, *, limit_s: float = 120.0) -> status.JobStatus:
        """Run until the controller returns (it must within `limit_s` simulated seconds)."""
        await self.until(lambda: self.task is not None and self.task.done(), limit_s=limit_s)
        assert self.task is not None
        return self.task.result()

    def step(self) -> int:
        return self.controller.status.step

    def choices(self) -> list[tuple[tuple[plan.WorkerId, ...], str, str]]:
        """Every recovery's failed workers, kind and the planner's reason, in order."""
        return [(r.failed, r.kind, r.reason) for r in self.controller.recoveries]

    def configured(self) -> dict[int, list[tuple[plan.Plan, int]]]:
        """Every epoch's Configures: the plan and resume step each worker was sent."""
        return {
            epoch: sorted(((c.plan, c.resume_step) for c in configs), key=repr)
            for epoch, configs in self.cluster.sent.items()
        }

    def ranks_ok(self) -> list[str]:
        """Problems with the ranks of every epoch's Configures (empty when none): all of an
        epoch's carry one plan, each its worker's position in the sorted plan workers and the
        plan's size as world size, no two the same rank. (A Configure that could not be
        delivered, to a dead agent, is not recorded, so an epoch may have fewer.)"""
        problems = []
        for epoch, configs in self.cluster.sent.items():
            plan_workers = sorted(configs[0].plan.workers)
            ranks = [c.rendezvous.rank for c in configs]
            if any(c.plan != configs[0].plan for c in configs) or len(set(ranks)) < len(ranks):
                problems.append(f"epoch {epoch}: plans differ or ranks repeat: {ranks}")
            for c in configs:
                if c.worker not in plan_workers or (
                    c.rendezvous.rank,
                    c.rendezvous.world_size,
                ) != (plan_workers.index(c.worker), len(plan_workers)):
                    problems.append(f"epoch {epoch}: worker {c.worker} rank {c.rendezvous.rank}")
        return problems


async def given_up_scale_up(job_settings: settings.JobSettings) -> tuple[Run, int]:
    """Run `job_settings` (Configures taking 1.5 s, steps 0.5 s) until worker 3 died, was
    recovered from, and came back with a cold set-up of 7 s: the scale-up that takes it in is
    given up (its Configures outlast the switch's lead, chaos seed 10 of the pipeline config).
    The run and that scale-up's epoch."""
    run = Run(job_settings, configure_delay_s=1.5, step_s=0.5)
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: len(run.controller.recoveries) == 1)
    given_up = run.controller.epoch + 1
    run.cluster.join(3, cold_s=7.0)
    return run, given_up
