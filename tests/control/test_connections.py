"""Bounded waits and clocks (planaria.control.connections, planaria.control.clock).

Covers: a bounded wait returns the result in time, raises Unbounded (a TimeoutError) and
cancels the work when the injected clock passes the bound or when the caller is cancelled;
the real clock's time moves forward and its sleep returns.
"""

from __future__ import annotations

import asyncio

import pytest

from planaria.control import clock, connections
from tests.control import fakes

pytestmark = pytest.mark.asyncio


async def test_a_bounded_wait_returns_in_time_and_times_out_on_the_injected_clock() -> None:
    manual = fakes.ManualClock()

    async def answer() -> int:
        await manual.sleep(1.0)
        return 42

    early = asyncio.ensure_future(connections.bounded(manual, answer(), 2.0))
    await manual.advance(1.0)
    assert early.done() and early.result() == 42
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    late = asyncio.ensure_future(connections.bounded(manual, never, 2.0))
    await manual.advance(1.9)
    assert not late.done()
    await manual.advance(0.2)
    with pytest.raises(connections.Unbounded, match="2 s"):
        late.result()
    assert never.cancelled()
    assert issubclass(connections.Unbounded, TimeoutError)


async def test_cancelling_a_bounded_wait_cancels_its_work() -> None:
    manual = fakes.ManualClock()
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(connections.bounded(manual, never, 60.0))
    await fakes.settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert never.cancelled()


async def test_the_real_clock_moves_forward() -> None:
    real = clock.RealClock()
    before = real.monotonic()
    await real.sleep(0.0)
    assert real.monotonic() >= before
