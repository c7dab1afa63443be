"""The real clock: monotonic seconds and asyncio sleeps (tests inject a manual clock)."""

from __future__ import annotations

import asyncio
import time


class RealClock:
    """`ports.Clock` on the process's monotonic clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
