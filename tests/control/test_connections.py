"""Bounded waits and clocks (planaria.control.connections, planaria.control.clock).

Covers: a bounded wait returns the result in time, raises Unbounded (a TimeoutError) and
cancels the work when the clock passes the bound or when the caller is cancelled (in virtual
time); the real clock's time moves forward and its sleep returns (in real time too).
"""

from __future__ import annotations

import asyncio

import pytest

from planaria.control import clock, connections
from tests.control import scenarios


@pytest.mark.asyncio
async def test_a_bounded_wait_returns_in_time_and_times_out_on_the_injected_clock() -> None:
    virtual = clock.RealClock()

    async def answer() -> int:
        await virtual.sleep(1.0)
        return 42

    early = asyncio.ensure_future(connections.bounded(virtual, answer(), 2.0))
    await scenarios.advance(1.0)
    assert early.done() and early.result() == 42
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    late = asyncio.ensure_future(connections.bounded(virtual, never, 2.0))
    await scenarios.advance(1.9)
    assert not late.done()
    await scenarios.advance(0.2)
    with pytest.raises(connections.Unbounded, match="2 s"):
        late.result()
    assert never.cancelled()
    assert issubclass(connections.Unbounded, TimeoutError)


@pytest.mark.asyncio
async def test_cancelling_a_bounded_wait_cancels_its_work() -> None:
    virtual = clock.RealClock()
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(connections.bounded(virtual, never, 60.0))
    await scenarios.advance(1.0)  # under way, well within its bound
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert never.cancelled()


def test_the_real_clock_moves_forward() -> None:
    real = clock.RealClock()
    before = real.monotonic()  # outside a loop: the process's monotonic clock
    assert asyncio.run(_slept(real)) >= before  # asyncio's own loop, in real time


async def _slept(real: clock.RealClock) -> float:
    await real.sleep(0.0)
    return real.monotonic()
