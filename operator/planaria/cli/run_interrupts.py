"""Signals that stop `planaria run`: SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`, a CI cancel,
a container stop) and SIGHUP (a closed terminal), all handled alike.

    interrupts = Interrupts()
    with interrupts.installed():                 # in the event loop that runs the job
        interrupts.on_force(backend.kill_all)
        interrupts.guard(job_task)                # what the first signal cancels
        ...
    interrupts.interrupted(final.phase)           # the signal that ended the job, or None

The first signal cancels the job's task: the controller's run ends, the backend stops every
agent (Stop RPC, then SIGTERM, then SIGKILL after the graces) and removes the snapshot stores,
and the report is written saying the run was interrupted; `planaria run` exits with 128 + the
signal's number (130, 143, 129), as a shell reports a process a signal ended. A later signal
does not cancel again, which would abandon the stop half-way: it SIGKILLs every agent at once
(`LocalBackend.kill_all`), so the exit follows as soon as they are reaped, the stores removed
and the report written, and no agent outlives the run. A signal after the job Succeeded or
Failed only ends the agents' stop sooner: the outcome and the exit status stand.

The handlers live on the event loop (`loop.add_signal_handler`, so they run between its
callbacks, never inside the code they interrupt) from `installed()` on until it exits; before
and after, the defaults apply: nothing of the job runs then (a Ctrl-C raises KeyboardInterrupt,
which `planaria.cli.main` turns into exit 130).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

from planaria.control import status as statuses

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ENDED = frozenset({statuses.Phase.SUCCEEDED, statuses.Phase.FAILED})


class Interrupts:
    """The signals `planaria run` received and what they stop (module docstring)."""

    def __init__(self) -> None:
        self.signum: signal.Signals | None = None  # the first signal received
        self._job: asyncio.Future[Any] | None = None
        self._kills: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interrupts]:
        """Handle SIGNALS on the running loop while the block runs; the defaults after it."""
        loop = asyncio.get_running_loop()
        for signum in SIGNALS:
            loop.add_signal_handler(signum, self._received, signum)
        try:
            yield self
        finally:
            for signum in SIGNALS:
                loop.remove_signal_handler(signum)

    def guard(self, job: asyncio.Future[Any]) -> None:
        """`job` is what the first signal cancels; at once when one came before."""
        self._job = job
        if self.signum is not None:
            job.cancel()

    def on_force(self, kill: Callable[[], None]) -> None:
        """Call `kill` (SIGKILL the agents it knows) on every signal after the first."""
        self._kills.append(kill)

    def interrupted(self, phase: statuses.Phase) -> signal.Signals | None:
        """The signal that ended a job left in `phase`, None when none did (no signal, or
        one after the job had Succeeded or Failed)."""
        return None if phase in _ENDED else self.signum

    def _received(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signal.Signals(signum)
            if self._job is not None:
                self._job.cancel()
            return
        for kill in self._kills:
            kill()


def exit_status(signum: signal.Signals) -> int:
    """128 + the signal's number: what a shell reports for a process the signal ended."""
    return 128 + int(signum)
