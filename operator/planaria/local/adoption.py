"""Agent processes a previous controller of the same run directory left running: their pid
files, which of them still run, and a handle on such a process that is not our child.

    adoption.write(folder / "worker-3.pid", pid)      # the backend, when it starts an agent
    found = adoption.running(folder)                  # {worker: (pid, start time)} still there
    process = AdoptedProcess.open(pid, started)       # watch and signal it through a pidfd

A pid alone does not name a process: pids are reused. A pid file holds the pid and the process's
start time (`/proc/<pid>/stat` field 22, clock ticks since boot), and a process counts as the
recorded one only while both match; an exited process left unreaped (a zombie: its new parent
does not reap) does not run. `AdoptedProcess` holds a pidfd (`os.pidfd_open`) taken before the
start time is checked again, so signals always reach the process the file names, never a later
one with its pid; the pidfd turns readable when the process exits, which the event loop watches
(`loop.add_reader`): a process that is not our child cannot be waited for with waitpid, and its
exit status goes to its new parent, so `wait` returns None.

Linux only (/proc, pidfds: Linux 5.3). Errors: none of its own; a pidfd that cannot be opened
means the process is gone (`open` returns None).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from planaria.contract import plan

PROC = Path("/proc")
SUFFIX = ".pid"
_GONE = frozenset({"Z", "X"})  # zombie, dead: exited, whoever reaps them


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat:
    """What `/proc/<pid>/stat` says of a process: its state letter ("R", "S", "Z", ...), its
    session id and its start time (clock ticks since boot)."""

    state: str
    session: int
    started: int


def stat(pid: int) -> Stat | None:
    """`pid`'s `Stat`, None when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rindex(")") + 2 :].split()
    return Stat(state=fields[0], session=int(fields[3]), started=int(fields[19]))


def write(path: Path, pid: int) -> None:
    """Record `pid` with its start time in `path` (nothing when it already exited)."""
    found = stat(pid)
    if found is not None:
        path.write_text(f"{pid} {found.started}\n")


def read(path: Path) -> tuple[int, int] | None:
    """(pid, start time) from a pid file; None when it is missing or not one of ours."""
    try:
        pid, started = path.read_text().split()
        return int(pid), int(started)
    except (FileNotFoundError, ValueError):
        return None


def read_address(ready: Path) -> str | None:
    """The `HOST:PORT` in an agent's ready file, None when it has none (yet)."""
    try:
        return ready.read_text().strip() or None
    except FileNotFoundError:
        return None


def read_port(path: Path) -> int | None:
    """The port number in `path` (the store's, `backend.STORE_PORT_FILE`), None without one."""
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def alive(pid: int, started: int) -> bool:
    """Whether the process started at `started` with id `pid` still runs (not a zombie)."""
    found = stat(pid)
    return found is not None and found.started == started and found.state not in _GONE


def running(folder: Path) -> dict[plan.WorkerId, tuple[int, int]]:
    """{worker: (pid, start time)} of every `worker-W.pid` in `folder` whose process runs."""
    found = {}
    for path in sorted(folder.glob(f"worker-*{SUFFIX}")):
        worker = path.name.removeprefix("worker-").removesuffix(SUFFIX)
        entry = read(path)
        if worker.isdigit() and entry is not None and alive(*entry):
            found[plan.WorkerId(int(worker))] = entry
    return found


class AdoptedProcess:
    """A running process another process started, watched and signalled through its pidfd;
    shaped like the part of `asyncio.subprocess.Process` the backend uses (module docstring)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None  # never known: the exit status is not ours
        self._pidfd: int | None = pidfd
        self._exited = asyncio.Event()
        asyncio.get_running_loop().add_reader(pidfd, self._on_exit)

    @classmethod
    def open(cls, pid: int, started: int) -> AdoptedProcess | None:
        """The process `pid` started at `started`, or None when it no longer runs. Call in the
        event loop that is to watch it."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        if not alive(pid, started):  # checked after the open: the pidfd names this process
            os.close(pidfd)
            return None
        return cls(pid, pidfd)

    def send_signal(self, signum: int) -> None:
        """Signal the process; ProcessLookupError once it exited (as a child's would)."""
        if self._pidfd is None:
            raise ProcessLookupError(f"process {self.pid} exited")
        signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int | None:
        """Return once the process exited: None, its exit status went to its parent."""
        await self._exited.wait()
        return None

    def _on_exit(self) -> None:
        if self._pidfd is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop may be closing
            asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        self._exited.set()
