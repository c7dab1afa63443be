"""A planned switch's and a resume's question to the planner on its thread, through the
controller (planaria.control.switches, planaria.control.suspension).

Covers, for a scale-up, a preemption notice's move and a resume from Suspended: while the
planner's answer is held on its thread, the event loop runs on (every live agent's heartbeats
are taken, the running plan trains on) and the move waits for the answer; and the same events
give the same decisions and Configures as the planner run inline on the loop (a planned
switch's step taken when the answer came); a scale-up answered after its lead would have
passed is not late.

Virtual time (`scenarios`), and each run on an event loop of its own from time 0: two runs of
one job on one loop can differ by a step (their timers tie differently at another start time).
Every other call of the planner is answered before the loop goes on (`OneHeld`), so virtual
time stands still for it as inline; the held one is answered by the test, never by a clock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent import futures
from typing import ParamSpec, TypeVar

import pytest

from planaria.control import executors, status, switches
from tests.control import scenarios

P = ParamSpec("P")
T = TypeVar("T")
GUARD_S = 300.0  # a failed test releases the held thread by this bound at the latest
HOLD_S = 0.5  # virtual seconds the loop runs on while a question is held: half a heartbeat
# timeout (no worker reads as silent for it), so the held run decides as the inline one (its
# planned switch leads from a later step: the one reached when the planner answered)
Picks = Callable[[Callable[..., object], tuple[object, ...]], bool]
Scenario = Callable[[futures.Executor], Coroutine[object, object, scenarios.Run]]


class OneHeld(futures.ThreadPoolExecutor):
    """A real one-thread executor that hands back every call's answer before `submit` returns
    (the loop waits for the thread, so virtual time stands still, as with `Inline`), except
    the first call `picks` chooses: that one waits on the thread until `answer`, and the loop
    runs on meanwhile."""

    def __init__(self, picks: Picks) -> None:
        super().__init__(max_workers=1, thread_name_prefix="held-planner")
        self._picks = picks
        self._gate = threading.Event()
        self.pending: futures.Future[object] | None = None  # the held call, once asked

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> futures.Future[T]:
        if self.pending is None and self._picks(fn, args):
            held = super().submit(self._gated, fn, *args, **kwargs)
            self.pending = held  # type: ignore[assignment]
            return held
        done = super().submit(fn, *args, **kwargs)
        futures.wait([done], timeout=GUARD_S)
        return done

    def answer(self) -> None:
        """Let the held call run, and wait, holding the loop so that its time stands still,
        until the answer is handed to the loop."""
        assert self.pending is not None
        handed = threading.Event()
        # called after the loop's own callback (added when the controller awaited the call)
        self.pending.add_done_callback(lambda _: handed.set())
        self._gate.set()
        assert handed.wait(GUARD_S)

    def release(self) -> None:
        self._gate.set()

    def _gated(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self._gate.wait(GUARD_S)
        return fn(*args, **kwargs)


def _named(name: str) -> Picks:
    return lambda fn, args: getattr(fn, "__name__", "") == name


def _resume(fn: Callable[..., object], args: tuple[object, ...]) -> bool:
    return _named("best")(fn, args) and status.MoveKind.RESUME in args


async def _hold(
    run: scenarios.Run, executor: futures.Executor, *, training: bool, hold_s: float = HOLD_S
) -> None:
    """With a held question (`OneHeld`): once it is asked, let `hold_s` pass and check that the
    loop ran on (every live agent's heartbeats taken; with `training`, the running plan's
    workers trained on) while the controller's move waits for the answer; then answer."""
    if not isinstance(executor, OneHeld):
        return
    await run.until(lambda: executor.pending is not None)
    agents = run.cluster.agents
    live = [w for w, a in agents.items() if a.alive and not a.hung]
    beats, steps = {w: a.beats for w, a in agents.items()}, {w: a.step for w, a in agents.items()}
    epoch, sent = run.controller.epoch, set(run.cluster.sent)
    recoveries, phase = run.controller.recoveries, run.controller.status.phase
    await scenarios.advance(hold_s)
    assert executor.pending is not None and not executor.pending.done()
    assert all(agents[w].beats > beats[w] for w in live)
    plan = run.controller.plan
    assert plan is not None
    assert not training or all(agents[w].step > steps[w] for w in plan.workers)
    assert (run.controller.epoch, set(run.cluster.sent)) == (epoch, sent)
    assert run.controller.recoveries == recoveries
    assert run.controller.status.phase is phase
    executor.answer()


async def _scaled_up(
    executor: futures.Executor, *, steps: int = 80, hold_s: float = HOLD_S
) -> scenarios.Run:
    run = scenarios.Run(scenarios.job(steps=steps), executor=executor)
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: len(run.controller.recoveries) == 1)
    run.cluster.join(3)
    await _hold(run, executor, training=True, hold_s=hold_s)
    await run.finish()
    return run


async def _evacuated(executor: futures.Executor) -> scenarios.Run:
    run = scenarios.Run(scenarios.job(steps=80), executor=executor)
    await run.until(lambda: run.step() >= 10)
    run.cluster.notice(5)
    await _hold(run, executor, training=True)
    await run.until(lambda: len(run.controller.recoveries) == 1)
    run.cluster.kill(5)  # the preemption itself
    await run.finish()
    return run


async def _resumed(executor: futures.Executor) -> scenarios.Run:
    # 24 MiB per GPU: no plan of Oobleck's dynamic policy on fewer than 6 workers
    checkpointed = scenarios.training(
        snapshot_interval_steps=5, checkpoint_dir="/ckpt", checkpoint_interval_steps=10
    )
    chosen = scenarios.job(
        profile=scenarios.small_profile(24), policy="dynamic", training=checkpointed
    )
    run = scenarios.Run(chosen, executor=executor)
    await run.until(lambda: run.step() >= 23)
    for worker in (0, 1, 2):
        run.cluster.kill(worker)
    await run.until(lambda: run.controller.status.phase is status.Phase.SUSPENDED)
    run.cluster.join(0)
    run.cluster.join(1)
    await _hold(run, executor, training=False)
    await run.finish()
    return run


def _on_a_loop_of_its_own(scenario: Scenario, executor: futures.Executor) -> scenarios.Run:
    """`scenario` run on a new virtual-time loop, from time 0 (module docstring)."""
    with asyncio.Runner(loop_factory=scenarios.loop_factories()["virtual-time"]) as runner:
        return runner.run(scenario(executor))


@pytest.mark.parametrize(
    ("scenario", "picks", "planned"),
    [
        pytest.param(_scaled_up, _named("grow"), "scale-up", id="a scale-up"),
        pytest.param(_evacuated, _named("recover"), "reroute", id="a preemption notice's move"),
        pytest.param(_resumed, _resume, "resume", id="a resume from Suspended"),
    ],
)
def test_the_loop_runs_on_while_the_planner_thread_decides_and_it_decides_as_inline(
    scenario: Scenario, picks: Picks, planned: str
) -> None:
    executor = OneHeld(picks)
    try:
        threaded = _on_a_loop_of_its_own(scenario, executor)
    finally:
        executor.release()
        executor.shutdown(wait=True)
    assert executor.pending is not None and executor.pending.done()
    inline = _on_a_loop_of_its_own(scenario, executors.Inline())
    final, expected = threaded.controller.status, inline.controller.status
    assert final.phase is expected.phase is status.Phase.SUCCEEDED
    assert (final.step, final.epoch, final.plan) == (expected.step, expected.epoch, expected.plan)
    assert threaded.choices() == inline.choices()
    assert planned in {kind for _, kind, _ in inline.choices()}
    # the same Configures, except that a planned switch leads from the step its workers had
    # reached when the planner answered: HOLD_S later than inline, so never an earlier step
    held, asked = threaded.configured(), inline.configured()
    assert {w: [p for p, _ in c] for w, c in held.items()} == {
        w: [p for p, _ in c] for w, c in asked.items()
    }
    steps = [(h, a) for w in held for (_, h), (_, a) in zip(held[w], asked[w], strict=True)]
    assert all(h >= a for h, a in steps)


SLOW_S = 3 * switches.PLANNED_LEAD_S  # a search longer than the switch's lead
_scaled_up_slowly = functools.partial(_scaled_up, steps=120, hold_s=SLOW_S)


def test_a_scale_up_answered_after_its_lead_would_have_passed_is_not_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The switch step is taken once the planner answered: the workers trained on through a
    search three leads long, and a step read before it would be behind them (the switch given
    up as late, the newcomer offered again: chaos pipeline seed 10's first switch)."""
    executor = OneHeld(_named("grow"))
    try:
        with caplog.at_level(logging.WARNING, logger="planaria.control.switches"):
            run = _on_a_loop_of_its_own(_scaled_up_slowly, executor)
    finally:
        executor.release()
        executor.shutdown(wait=True)
    assert run.controller.status.phase is status.Phase.SUCCEEDED
    assert "scale-up" in {kind for _, kind, _ in run.choices()}
    assert "came too late" not in caplog.text
