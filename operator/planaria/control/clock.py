"""The real clock: the event loop's time and asyncio sleeps.

It reads the running loop's time rather than `time.monotonic()` so that its readings and its
sleeps run on one clock by construction. On asyncio's own loops `loop.time()` is
`time.monotonic()`, so production sees no difference; the controller tests run the same clock
on a virtual-time loop (looptime), where sleeps end at once and deterministically.
"""

from __future__ import annotations

import asyncio
import time


class RealClock:
    """`ports.Clock` on the running event loop's clock."""

    def monotonic(self) -> float:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # built before its loop runs (a controller's constructor)
            return time.monotonic()  # what asyncio's loops report as their time
        return loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
