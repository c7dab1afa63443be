"""The planner on a thread of its own (planaria.control.planning), through the controller.

Covers: while the search ahead of the next failure (`Planner.prepare`) is held on the planner's
thread, the event loop runs on (the epoch commits, heartbeats come in, training steps); a
recovery's decision waits for that search and opens no epoch before it ends; and the same
events give the same plans, recoveries and Configures as the planner run inline on the loop.

Virtual time (`scenarios`): the held search is released by the test, never by a clock, so
nothing here depends on how fast the thread runs. While the controller awaits the thread the
loop's time moves without it (looptime jumps to its next timer), so only what cannot change
meanwhile is checked then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from typing import ParamSpec, TypeVar

import pytest

from planaria.control import executors, status
from tests.control import scenarios

pytestmark = pytest.mark.asyncio
P = ParamSpec("P")
T = TypeVar("T")
# The controller's calls on its planner's executor, in order: the planner (its templates), the
# first plan, the search ahead of the first epoch's next failure.
SEARCH_AHEAD_CALL = 3
KILL_AT_STEP = 5
GUARD_S = 300.0  # a failed test releases the held thread by this bound at the latest


class HeldExecutor(futures.ThreadPoolExecutor):
    """A real one-thread executor whose call number `held_call` waits until `release`."""

    def __init__(self, held_call: int) -> None:
        super().__init__(max_workers=1, thread_name_prefix="held-planner")
        self.held_call = held_call
        self.calls = 0
        self.gate = threading.Event()
        self.held_done = threading.Event()  # the held call ran to its end

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> futures.Future[T]:
        self.calls += 1
        if self.calls != self.held_call:
            return super().submit(fn, *args, **kwargs)
        return super().submit(self._held, fn, *args, **kwargs)

    def release(self) -> None:
        self.gate.set()

    def _held(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.gate.wait(GUARD_S)
        try:
            return fn(*args, **kwargs)
        finally:
            self.held_done.set()


def _run(executor: futures.Executor) -> scenarios.Run:
    return scenarios.Run(scenarios.job(steps=40), executor=executor)


async def _killed_run(executor: futures.Executor) -> tuple[scenarios.Run, status.JobStatus]:
    """The job, worker 3 killed as its group reaches step KILL_AT_STEP (the cluster's own
    event, so two runs on one loop meet the same failure), run to its end (a held executor is
    released once the recovery waits for it)."""
    run = _run(executor)

    def kill(step: int) -> None:
        if step == KILL_AT_STEP:
            run.cluster.on_step = None
            run.cluster.kill(3)

    run.cluster.on_step = kill
    await run.until(lambda: run.controller.status.phase is status.Phase.RECOVERING)
    if isinstance(executor, HeldExecutor):
        await scenarios.advance(10.0)  # past the settle bound: the decision waits for the search
        assert not executor.held_done.is_set()
        assert run.controller.epoch == 1 and set(run.cluster.sent) == {1}
        assert run.controller.status.phase is status.Phase.RECOVERING
        executor.release()
    return run, await run.finish()


async def test_the_loop_runs_on_while_the_search_ahead_is_held_on_the_planner_thread() -> None:
    executor = HeldExecutor(SEARCH_AHEAD_CALL)
    try:
        run = _run(executor)
        await run.until(lambda: run.step() >= 10)
        # the epoch committed on heartbeats and trained 10 steps while the search was held
        assert not executor.held_done.is_set()
        assert run.controller.status.phase is status.Phase.RUNNING
        assert run.controller.epoch == 1
        executor.release()
        final = await run.finish()
    finally:
        executor.release()
        executor.shutdown(wait=True)
    assert final.phase is status.Phase.SUCCEEDED and executor.held_done.is_set()
    assert (final.step, final.epoch, final.recoveries) == (40, 1, 0)


async def test_a_decision_waits_for_the_search_ahead_and_chooses_as_inline() -> None:
    executor = HeldExecutor(SEARCH_AHEAD_CALL)
    try:
        threaded, final = await _killed_run(executor)
    finally:
        executor.release()
        executor.shutdown(wait=True)
    inline, expected = await _killed_run(executors.Inline())
    assert final.phase is expected.phase is status.Phase.SUCCEEDED
    assert (final.step, final.epoch, final.plan) == (expected.step, expected.epoch, expected.plan)
    assert threaded.choices() == inline.choices() and len(inline.choices()) == 1
    assert threaded.configured() == inline.configured()
