"""Where the controller's CPU-bound calls run: the planner's search, off the event loop.

The controller shares one event loop with the Watch streams (heartbeats), the backend's events
and, under Kubernetes, kopf's handlers; a call that holds it for a second stalls them all. So
the planner's calls go to an executor and the loop awaits them (`off_loop`):
- `thread`: one thread of its own per job, in production. One thread, so the calls run one at
  a time in the order they were made (the planner's memos are not thread-safe and need not be);
- `Inline`: each call at once in the caller, on the loop, for the virtual-time tests: looptime's
  loop cannot wait for a thread deterministically, its time would run on meanwhile.
What runs where, and why the answers stay the same: `planning` and docs/controller.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent import futures
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Inline(futures.Executor):
    """Runs each call at once, in the caller's thread (the event loop's): the virtual-time
    tests' executor, since their loop cannot wait for a thread deterministically."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> futures.Future[T]:
        done: futures.Future[T] = futures.Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # the caller's to raise, as from a thread's future
            done.set_exception(exc)
        return done


def thread(job: str) -> futures.ThreadPoolExecutor:
    """The planner's executor in production: one thread of its own for `job`'s planner (its
    thread starts with the first call; `shutdown` when the job ends)."""
    return futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"planner-{job}")


async def off_loop(
    executor: futures.Executor, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """`fn(*args, **kwargs)` on `executor`, awaited without holding the event loop; at once,
    without a turn of the loop, when the executor ran it in the caller (`Inline`)."""
    future = executor.submit(fn, *args, **kwargs)
    if future.done():  # Inline: exactly as a plain call on the loop
        return future.result()
    return await asyncio.wrap_future(future)
