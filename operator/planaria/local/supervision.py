"""The agent process of every worker of a local job: launched, watched, restarted, stopped.

`Supervisor` is the process half of `planaria.local.backend.LocalBackend`, which adds the
rendezvous store, the job's credentials and the `ports.Backend` door; nothing here knows the
store or issues credentials, and nothing here imports torch.

Each agent is started as `planaria.local.launching` says (its command line, listen address,
prefix and environment; its ready file, written once it serves, and its log
`<run_dir>/workers/worker-W.log`, appended across restarts); its pid and start time go to
`<run_dir>/workers/worker-W.pid` (`planaria.local.adoption`). A task per process waits for its
exit, queues DIED with the exit code or signal and appends how the process ended to its log (the
only trace of a process killed from outside); a restarted worker is queued JOINED once it
answers. Agents are started in their own session (a Ctrl-C of the terminal reaches the
controller only, which stops them in order). No code runs between fork and exec (that is unsafe
in a process with gRPC threads), so an agent does outlive a controller killed with SIGKILL;
every other exit stops them.

A process that exits on its own (not exit 0, not `kill`ed here, not after `close`) is restarted,
as a kubelet restarts a container (`planaria.local.restarts`: back-off doubling to a cap, a
bounded number of restarts per worker); once a worker's restarts are spent, `gave_up` answers
with a one-line cause. Stopping a worker is the Stop RPC, then SIGTERM, then SIGKILL, each after
the grace; it is always reaped.

Errors: `LocalBackendError` (a restart of a live worker, or one that exits or stays silent before
it serves; `start` logs such a worker and leaves it to the restart policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from planaria.contract import plan
from planaria.control import ports
from planaria.local import adoption, launching, restarts
from planaria.rpc import client, tls

# The console shows a record's logger name (`planaria run: planaria.local.backend: worker 1: ...`,
# docs/running.md): these lines keep the name users know them by.
LOG = logging.getLogger("planaria.local.backend")
READY_TIMEOUT_S = 60.0  # an agent imports torch and grpc before it serves: seconds on 2 cores
STOP_GRACE_S = 5.0
_POLL_S = 0.02


class LocalBackendError(RuntimeError):
    """A local worker could not be started or restarted; the message says why and where the
    worker's log is."""


class _Process(Protocol):
    """What the supervisor uses of a worker's process: our child (`asyncio.subprocess.Process`)
    or one adopted from a previous controller (`adoption.AdoptedProcess`)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def send_signal(self, signum: int) -> None: ...

    def kill(self) -> None: ...

    async def wait(self) -> int | None: ...


@dataclass(slots=True, kw_only=True)
class _Worker:
    """One worker's current process (replaced on restart)."""

    process: _Process
    address: str | None = None
    generation: int = 0
    watcher: asyncio.Task[None] | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    on_purpose: bool = False  # killed by `Supervisor.kill`: its exit is not restarted
    # the event loop's clock when this backend launched (or adopted) the process
    started_at: float = field(default_factory=lambda: asyncio.get_running_loop().time())


class Supervisor:
    """The agent process of every worker (module docstring). Worker events go to `events`."""

    def __init__(
        self,
        *,
        launch: launching.AgentLaunch,
        events: asyncio.Queue[ports.WorkerEvent | None],
        credentials: tls.ControllerTls,
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
        restart: restarts.RestartPolicy = restarts.DEFAULT,
    ) -> None:
        self._launch_as = launch
        self._events = events
        self._tls = credentials  # the controller's, for the Stop RPC
        self._ready_timeout_s = ready_timeout_s
        self._stop_grace_s = stop_grace_s
        self._policy = restart
        self._workers: dict[plan.WorkerId, _Worker] = {}
        self._restarts: dict[plan.WorkerId, int] = {}  # automatic restarts made, per worker
        self._pending: dict[plan.WorkerId, asyncio.Task[None]] = {}  # restarts waiting
        self._cause: str | None = None  # why the supervisor gave up on a worker
        self._given_up = asyncio.Event()
        self._closed = False

    async def start(self, workers: Sequence[plan.WorkerId]) -> None:
        """`LocalBackend.start`."""
        fresh = [w for w in dict.fromkeys(workers) if not self.running(w)]
        launched = await asyncio.gather(*(self._launch(w) for w in fresh), return_exceptions=True)
        for worker, result in zip(fresh, launched, strict=True):
            if isinstance(result, LocalBackendError):
                LOG.warning("worker %d did not start: %s", worker, result)
            elif isinstance(result, BaseException):
                raise result

    def address(self, worker: plan.WorkerId) -> str | None:
        """The address `worker`'s running agent serves at; None when it does not run or serve."""
        record = self._workers.get(worker)
        if record is None or record.ended.is_set():
            return None
        return record.address

    def adopt(self) -> tuple[plan.WorkerId, ...]:
        """`LocalBackend.adopt`, once the backend allowed it."""
        taken = []
        for worker, (pid, started) in adoption.running(self._launch_as.run_dir / "workers").items():
            process = adoption.AdoptedProcess.open(pid, started)
            if process is None or self.running(worker):
                continue
            ready, _ = self._launch_as.paths(worker)
            if not ready.exists():
                LOG.warning("worker %d: process %d never served; killed", worker, pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            record = _Worker(process=process, address=adoption.read_address(ready))
            self._workers[worker] = record
            record.watcher = asyncio.ensure_future(self._watch(worker, record))
            if record.address is not None:
                taken.append(worker)
        return tuple(sorted(taken))

    def running(self, worker: plan.WorkerId) -> bool:
        """Whether `worker`'s current process has not exited."""
        record = self._workers.get(worker)
        return record is not None and not record.ended.is_set()

    def alive(self) -> tuple[plan.WorkerId, ...]:
        """The workers whose process runs, sorted."""
        return tuple(sorted(w for w in self._workers if self.running(w)))

    @property
    def pids(self) -> dict[plan.WorkerId, int]:
        """The process id of every worker's current (or last) process."""
        return {w: r.process.pid for w, r in self._workers.items()}

    def kill(self, worker: plan.WorkerId, signum: int = signal.SIGKILL) -> None:
        """`LocalBackend.kill`."""
        if not self.running(worker):
            raise LocalBackendError(f"worker {worker} does not run; kill a running worker")
        record = self._workers[worker]
        if signum not in (signal.SIGSTOP, signal.SIGCONT):  # these do not end it
            record.on_purpose = True
        record.process.send_signal(signum)

    def kill_all(self) -> None:
        """`LocalBackend.kill_all`."""
        for record in self._workers.values():
            if not record.ended.is_set():
                record.on_purpose = True
                with contextlib.suppress(ProcessLookupError):
                    record.process.kill()

    async def restart(self, worker: plan.WorkerId) -> None:
        """`LocalBackend.restart`."""
        if self._closed:
            raise LocalBackendError("the backend is shut down; restart before shutdown")
        if self.running(worker):
            raise LocalBackendError(f"worker {worker} still runs; kill it before a restart")
        waiting = self._pending.pop(worker, None)
        if waiting is not None:  # still in its back-off (a launched one runs): this replaces it
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        await self._launch(worker)
        self._events.put_nowait(ports.WorkerEvent(kind=ports.EventKind.JOINED, worker=worker))

    @property
    def restarts(self) -> dict[plan.WorkerId, int]:
        """How many times the policy restarted each worker (only those it restarted)."""
        return dict(self._restarts)

    async def gave_up(self) -> str:
        """`LocalBackend.gave_up`."""
        await self._given_up.wait()
        assert self._cause is not None, "the cause is set before the event"
        return self._cause

    async def wait_exited(self, worker: plan.WorkerId, timeout_s: float) -> None:
        """Wait until `worker`'s process has exited and its DIED event is queued."""
        await asyncio.wait_for(self._workers[worker].ended.wait(), timeout_s)

    def close(self) -> None:
        """From now on no exit is restarted and `restart` refuses: the job is ending."""
        self._closed = True

    async def stop_all(self) -> None:
        """End every waiting or running restart, then stop and reap every agent (after
        `close`)."""
        # A restart waiting or under way ends first: its process, if any, is then stopped too.
        pending = list(self._pending.values())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*(self._stop(w, r) for w, r in self._workers.items()))

    # -- processes -----------------------------------------------------------------------------

    async def _launch(self, worker: plan.WorkerId) -> None:
        ready, log_path = self._launch_as.paths(worker)
        ready.unlink(missing_ok=True)
        where = self._launch_as.placement(worker)
        with open(log_path, "ab") as log:
            process = await asyncio.create_subprocess_exec(
                *self._launch_as.command(worker, where, ready),
                env={**os.environ, **where.env} if where.env else None,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        adoption.write(self._launch_as.pid_file(worker), process.pid)  # for a successor
        old = self._workers.get(worker)
        record = _Worker(process=process, generation=old.generation + 1 if old else 0)
        self._workers[worker] = record
        record.watcher = asyncio.ensure_future(self._watch(worker, record))
        record.address = await self._await_ready(worker, record, ready, log_path)

    async def _await_ready(
        self, worker: plan.WorkerId, record: _Worker, ready: Path, log_path: Path
    ) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._ready_timeout_s
        while not ready.exists():
            if record.ended.is_set():
                raise LocalBackendError(
                    f"worker {worker} exited with {_describe(record.process.returncode)} "
                    f"before serving; see {log_path}"
                )
            if loop.time() > deadline:
                record.process.kill()
                raise LocalBackendError(
                    f"worker {worker} did not serve within {self._ready_timeout_s:g} s "
                    f"(killed); see {log_path}"
                )
            await asyncio.sleep(_POLL_S)
        return ready.read_text().strip()

    async def _watch(self, worker: plan.WorkerId, record: _Worker) -> None:
        code = await record.process.wait()
        record.ended.set()
        detail = (
            f"process {record.process.pid} exited with {_describe(code)}"
            if code is not None
            else f"adopted process {record.process.pid} exited (its status is its parent's)"
        )
        if self._closed:
            self._note(worker, f"{detail} (stopped at the end of the run)")
            return
        self._events.put_nowait(
            ports.WorkerEvent(kind=ports.EventKind.DIED, worker=worker, detail=detail)
        )
        if not restarts.unexpected(code, on_purpose=record.on_purpose):
            LOG.info("worker %d: %s", worker, detail)
            self._note(worker, f"{detail}{' (killed on purpose)' if record.on_purpose else ''}")
            return
        ran_s = asyncio.get_running_loop().time() - record.started_at
        done = self._restarts.get(worker, 0)
        if done and not self._policy.counted(done, ran_s):
            self._note(worker, f"it ran {ran_s:.0f} s: its {done} earlier restart(s) are forgiven")
        self._restarts[worker] = self._policy.counted(done, ran_s)
        self._restart_later(worker, detail)

    def _restart_later(self, worker: plan.WorkerId, detail: str) -> None:
        """Schedule the policy's restart of `worker`, whose process `detail` on its own; or give
        up on it when its restarts are spent."""
        done = self._restarts.get(worker, 0)
        delay_s = self._policy.backoff_s(done)
        if delay_s is None:
            self._give_up(worker, done, detail)
            return
        self._restarts[worker] = done + 1
        said = (
            f"worker {worker}: {detail}; restarting it in {delay_s:g} s "
            f"(restart {done + 1} of {self._policy.max_restarts})"
        )
        LOG.warning("%s", said)
        self._note(worker, said)
        self._pending[worker] = asyncio.ensure_future(self._restart_after(worker, delay_s))

    async def _restart_after(self, worker: plan.WorkerId, delay_s: float) -> None:
        try:
            await asyncio.sleep(delay_s)
            if self._closed or self.running(worker):
                return
            try:
                await self._launch(worker)
            except LocalBackendError as exc:  # its watcher restarts it again or gives up
                LOG.warning("worker %d: the restart did not serve: %s", worker, exc)
                return
            LOG.warning("worker %d: restarted (process %d)", worker, self.pids[worker])
            self._events.put_nowait(
                ports.WorkerEvent(kind=ports.EventKind.JOINED, worker=worker, detail="restarted")
            )
        finally:
            if self._pending.get(worker) is asyncio.current_task():
                del self._pending[worker]

    def _give_up(self, worker: plan.WorkerId, done: int, detail: str) -> None:
        _, log_path = self._launch_as.paths(worker)
        said = restarts.cause(worker, done, detail, log_path)
        LOG.error("%s", said)
        self._note(worker, said)
        if self._cause is None:  # the first worker given up on is the job's cause
            self._cause = said
            self._given_up.set()

    def _note(self, worker: plan.WorkerId, text: str) -> None:
        """Append `text` to `worker`'s log, after what its processes wrote: how each ended."""
        _, log_path = self._launch_as.paths(worker)
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"[planaria run {stamp}] {text}\n")

    async def _stop(self, worker: plan.WorkerId, record: _Worker) -> None:
        """Stop RPC, then SIGTERM, then SIGKILL, each after the grace; always reaped."""
        if not record.ended.is_set() and record.address is not None:
            # The process may already be on its way out (the controller's own Stop came first):
            # its exit ends the wait at once, not a connect retrying until the grace is over.
            rpc = asyncio.ensure_future(self._stop_rpc(worker, record.address))
            ended = asyncio.ensure_future(record.ended.wait())
            await asyncio.wait(
                {rpc, ended}, timeout=self._stop_grace_s, return_when="FIRST_COMPLETED"
            )
            for task in (rpc, ended):
                task.cancel()
            # a process boundary: whatever the RPC raised, the signals below follow anyway
            await asyncio.gather(rpc, ended, return_exceptions=True)
        for signum in (signal.SIGTERM, signal.SIGKILL):
            if record.ended.is_set():
                break
            with contextlib.suppress(ProcessLookupError):
                record.process.send_signal(signum)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(record.ended.wait(), self._stop_grace_s)
        if record.watcher is not None:
            await record.watcher

    async def _stop_rpc(self, worker: plan.WorkerId, address: str) -> None:
        agent = await client.AgentClient.connect(
            worker, address, timeout_s=self._stop_grace_s, tls=self._tls
        )
        try:
            await agent.stop(self._stop_grace_s)
            await asyncio.wait_for(self._workers[worker].ended.wait(), self._stop_grace_s)
        finally:
            await agent.close()


def _describe(code: int | None) -> str:
    """An exit status in words: 'exit code 3' or 'signal SIGKILL'."""
    if code is None:
        return "no exit status yet"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
