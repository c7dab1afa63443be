"""Where the controller's planner calls run (planaria.control.executors).

Covers: `Inline` runs a call at once and hands back its result or its error in a done future;
`off_loop` with `Inline` returns without a turn of the event loop (nothing else runs meanwhile,
as with a plain call), and with a thread returns the thread's answer and raises its error;
`thread` runs one call at a time, in order, on one thread that is not the loop's.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from planaria.control import executors


def _divide(a: int, b: int) -> float:
    return a / b


def test_inline_runs_the_call_at_once_and_keeps_its_result_or_error() -> None:
    done = executors.Inline().submit(_divide, 6, b=3)
    assert done.done() and done.result() == 2.0
    failed = executors.Inline().submit(_divide, 1, 0)
    assert failed.done() and isinstance(failed.exception(), ZeroDivisionError)


@pytest.mark.asyncio
async def test_off_loop_inline_takes_no_turn_of_the_loop() -> None:
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "another callback")
    assert await executors.off_loop(executors.Inline(), _divide, 6, 3) == 2.0
    assert ran == []  # a plain call would not have let it run either
    with pytest.raises(ZeroDivisionError):
        await executors.off_loop(executors.Inline(), _divide, 1, 0)


@pytest.mark.asyncio
async def test_off_loop_on_the_thread_answers_in_order_off_the_loops_thread() -> None:
    pool = executors.thread("test")
    try:
        calls = [executors.off_loop(pool, threading.get_ident) for _ in range(3)]
        idents = await asyncio.gather(*calls)
        assert len(set(idents)) == 1 and idents[0] != threading.get_ident()
        order: list[int] = []
        await asyncio.gather(*(executors.off_loop(pool, order.append, i) for i in range(5)))
        assert order == [0, 1, 2, 3, 4]
        with pytest.raises(ZeroDivisionError):
            await executors.off_loop(pool, _divide, 1, 0)
    finally:
        pool.shutdown(wait=True)
