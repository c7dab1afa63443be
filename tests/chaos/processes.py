"""Which processes a trial started, and which of them (or of their sessions) outlived it.

A pid alone is not a process: pids are reused, and other tests start processes beside a trial.
`Recorder` keeps each pid with its start time (`/proc/<pid>/stat` field 22, clock ticks since
boot), so a later process that happens to get the same pid is not mistaken for a leak. A pid is
leaked when the same process still exists, running, stopped or as an unreaped zombie; and
any process whose session is one of the recorded ones (agents run in their own session, so
anything they spawned stays in it) is leaked too. A session's id is not handed to a new process
while any member of the session lives, so a member whose leader is gone is still ours.

Linux only (it reads /proc); elsewhere nothing is found, which the tests would notice by never
recording a pid.

A SIGKILLed controller's agents are re-parented to the nearest child subreaper, else to PID 1,
which in a container may reap nobody: `subreaper()` makes this process theirs while a test
runs, `reap` collects the exited ones and `kill` ends what a failed run left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterable, Iterator

from planaria.local import adoption

PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This process as the child subreaper of its descendants (OSError where refused)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reap(pids: Iterable[int], timeout_s: float = 10.0) -> None:
    """Reap those of `pids` that are our children (through the subreaper) once they exited,
    waiting at most `timeout_s`; a pid that is not our child is skipped."""
    pending, deadline = set(pids), time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for pid in sorted(pending):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0] != 0
            except ChildProcessError:
                done = True
            if done:
                pending.discard(pid)
        if pending:
            time.sleep(0.05)


def agents_of(name: str) -> list[int]:
    """Pids of every `planaria agent` process of job `name` on this machine."""
    found = []
    for entry in adoption.PROC.iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agent" in words and name.encode() in words:
            found.append(int(entry.name))
    return found


def kill(pids: Iterable[int]) -> None:
    """SIGKILL and reap what a failed run left (it is reported as leaked anyway)."""
    left = tuple(pids)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reap(left)


class Recorder:
    """Every (pid, start time) seen (module docstring)."""

    def __init__(self) -> None:
        self.started: dict[int, int] = {}

    def add(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid not in self.started and (found := adoption.stat(pid)) is not None:
                self.started[pid] = found.started

    def leaked(self) -> tuple[int, ...]:
        """Recorded processes still there, and any process in their sessions, sorted."""
        same = {pid for pid, start in self.started.items() if _start(pid) == start}
        return tuple(sorted(same | self._in_sessions()))

    def _in_sessions(self) -> set[int]:
        found = set()
        for entry in adoption.PROC.iterdir():
            info = adoption.stat(int(entry.name)) if entry.name.isdigit() else None
            if info is not None and self._ours(info.session):
                found.add(int(entry.name))
        return found

    def _ours(self, session: int) -> bool:
        return session in self.started and _start(session) in (None, self.started[session])


def _start(pid: int) -> int | None:
    found = adoption.stat(pid)
    return None if found is None else found.started
