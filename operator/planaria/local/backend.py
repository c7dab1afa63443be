"""`LocalBackend`: a job's workers as agent processes on this machine (`ports.Backend`).

    backend = LocalBackend(job="tiny", run_dir=Path("runs/tiny"))
    await backend.start([0, 1, 2])          # `python -m planaria agent ...` per worker
    agent = await backend.connect(0, timeout_s=10)
    backend.kill(1)                         # SIGKILL: a DIED event follows
    await backend.restart(1)                # a JOINED event once it serves again
    cause = await backend.gave_up()         # a worker that kept exiting on its own
    await backend.shutdown()                # Stop RPC, SIGTERM, SIGKILL; stores removed
    backend.kill_all()                      # SIGKILL every agent now (a forced stop)

The rendezvous store of every epoch (a torch c10d TCPStore on 127.0.0.1, a free port) lives in this
process, as the harness of the executor hosts it: never in a worker, so a worker's death never takes
the store with it. `placement` may put a worker elsewhere (another listen address, a command prefix
such as `ip netns exec`, extra environment: `Placement`); the store is then advertised at
`store_host`, an address every worker can reach. Each agent is started with `--listen 127.0.0.1:0`
(its placement's host) and a ready file it writes once it serves; its stderr and stdout go to
`<run_dir>/workers/worker-W.log` (appended across restarts). A task per process waits for its exit,
reports DIED with the exit code or signal and appends how the process ended to its log (the only
trace of a process killed from outside); a restarted worker is reported JOINED once it answers.
Agents are started in their own session (a Ctrl-C of the terminal reaches the controller only,
which stops them in order). No code runs between fork and exec (that is unsafe in a process
with gRPC threads), so an agent does outlive a controller killed with SIGKILL; every other exit
stops them.

A process that exits on its own (not exit 0, not `kill`ed here, not at shutdown) is restarted by
the backend, as a kubelet restarts a container (`planaria.local.restarts`: back-off doubling to
a cap, a bounded number of restarts per worker); once a worker's restarts are spent, `gave_up`
answers with a one-line cause, for the caller to fail the job with (`planaria run` does).

The channel to the agents is mutual TLS (issue #10): the backend issues the job's credentials
once, at construction (`planaria.rpc.tls`, a few milliseconds), into `<run_dir>/tls/agent`
(each agent's `--tls-dir`) and `<run_dir>/tls/controller`, both 0700 with 0600 files, and
connects with the controller's. There is no plaintext switch: other users of the machine can
reach loopback ports too.

Shutdown stops every agent (Stop RPC, then SIGTERM, then SIGKILL after the grace), reaps them,
releases the store and removes the job's host-memory snapshot stores
(`<snapshot_base>/<job>/`) unless `keep_snapshots`; it runs as one task that cancelling its
caller does not stop (a later call awaits the same task). `kill_all` SIGKILLs every agent at
once, for a shutdown that must not wait for the graces.

Adoption (a controller killed and started again, docs/local-mode.md): each agent's pid and start
time go to `<run_dir>/workers/worker-W.pid` (`planaria.local.adoption`), the store's port to
`<run_dir>/store.port`. A backend built with
`adopt=True` reuses the run directory's credentials (the running agents trust that CA only) and
`adopt()` takes over every agent a previous backend of the run directory left running: its
address from its ready file, its liveness from a pidfd (not our child: no waitpid, no exit
status), so its death is a DIED event, and `kill`, `restart` and `shutdown` work on it as on our
own. The store is this process's, new, on another port than the old one's: the next epoch's
Configure carries its address.

Errors: `LocalBackendError` (a restart of a live worker, or one that exits or stays silent
before it serves; `start` logs such a worker and leaves it to the restart policy);
`ports.AgentUnreachable` from `connect` when the worker does not run; `tls.TlsError` (a
ValueError) at construction for a job name that cannot name a certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# the store classes, as planaria.agent.execution.groups
from torch._C import _distributed_c10d as c10d

from planaria.contract import plan, rendezvous
from planaria.control import ports
from planaria.local import adoption, restarts
from planaria.rpc import client, tls

LOG = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"
DEFAULT_SNAPSHOT_BASE = Path("/dev/shm/planaria")
READY_TIMEOUT_S = 60.0  # an agent imports torch and grpc before it serves: seconds on 2 cores
STOP_GRACE_S = 5.0
STORE_TIMEOUT_S = 300.0
STORE_PORT_FILE = "store.port"  # in the run directory: the port an adopting backend avoids
_POLL_S = 0.02


class LocalBackendError(RuntimeError):
    """A local worker could not be started or restarted; the message says why and where the
    worker's log is."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where one worker's agent process runs: the address it listens on (and its peers reach
    it at), a command prefix it is started under (e.g. `ip netns exec NAME`, for a worker in
    its own network namespace) and environment added to this process's (e.g.
    `GLOO_SOCKET_IFNAME`). The default: loopback, no prefix, this process's environment."""

    host: str = LOOPBACK
    prefix: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


class _Process(Protocol):
    """What the backend uses of a worker's process: our child (`asyncio.subprocess.Process`)
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
    on_purpose: bool = False  # killed by `LocalBackend.kill`: its exit is not restarted
    # the event loop's clock when this backend launched (or adopted) the process
    started_at: float = field(default_factory=lambda: asyncio.get_running_loop().time())


class LocalBackend:
    """Agents as local processes, the store in this process (module docstring)."""

    def __init__(
        self,
        *,
        job: str,
        run_dir: Path,
        snapshot_base: Path = DEFAULT_SNAPSHOT_BASE,
        keep_snapshots: bool = False,
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
        agent_args: Sequence[str] = (),
        store_host: str = LOOPBACK,
        placement: Callable[[plan.WorkerId], Placement] | None = None,
        adopt: bool = False,
        restart: restarts.RestartPolicy = restarts.DEFAULT,
    ) -> None:
        """`adopt`: reuse the run directory's credentials, for `adopt()` (module docstring);
        tls.TlsError when the run directory has none. `restart`: how agents that exit on their
        own are restarted (`planaria.local.restarts`; `restarts.NEVER`: not at all)."""
        if not job or "/" in job:
            raise ValueError(f"local backend: job name {job!r} is not usable; give one without '/'")
        self.job = job
        self.run_dir = run_dir
        self.snapshot_base = snapshot_base
        self._keep_snapshots = keep_snapshots
        self._ready_timeout_s = ready_timeout_s
        self._stop_grace_s = stop_grace_s
        self._agent_args = tuple(agent_args)
        self._placement = placement or (lambda worker: Placement())
        self._adopting = adopt
        self._tls = (
            tls.read_controller_dir(run_dir / "tls" / "controller")
            if adopt
            else _issue_tls(job, run_dir / "tls")
        )
        self._workers: dict[plan.WorkerId, _Worker] = {}
        self._policy = restart
        self._restarts: dict[plan.WorkerId, int] = {}  # automatic restarts made, per worker
        self._pending: dict[plan.WorkerId, asyncio.Task[None]] = {}  # restarts waiting
        self._cause: str | None = None  # why the backend gave up on a worker
        self._given_up = asyncio.Event()
        self._events: asyncio.Queue[ports.WorkerEvent | None] = asyncio.Queue()
        self._closed = False
        self._shutdown: asyncio.Task[None] | None = None
        port_file = run_dir / STORE_PORT_FILE
        self._store: c10d.TCPStore | None = _open_store(
            avoid=adoption.read_port(port_file) if adopt else None
        )
        self._address = ports.StoreAddress(host=store_host, port=self._store.port)
        run_dir.mkdir(parents=True, exist_ok=True)
        port_file.write_text(f"{self._store.port}\n")

    # -- ports.Backend -----------------------------------------------------------------------

    @property
    def store(self) -> ports.StoreAddress:
        return self._address

    def fail_epoch(self, key_prefix: str, world_size: int) -> None:
        if self._store is not None:
            store = c10d.PrefixStore(key_prefix, self._store)
            rendezvous.flag_failed(store, world_size, "controller")

    async def start(self, workers: Sequence[plan.WorkerId]) -> None:
        """Launch an agent per worker not already running; returns once each of them serves or
        has exited. One that exited is reported DIED and restarted by the policy like any
        other (a JOINED event once it serves), or given up on (`gave_up`)."""
        fresh = [w for w in dict.fromkeys(workers) if not self.running(w)]
        launched = await asyncio.gather(*(self._launch(w) for w in fresh), return_exceptions=True)
        for worker, result in zip(fresh, launched, strict=True):
            if isinstance(result, LocalBackendError):
                LOG.warning("worker %d did not start: %s", worker, result)
            elif isinstance(result, BaseException):
                raise result

    async def connect(self, worker: plan.WorkerId, timeout_s: float) -> ports.Agent:
        record = self._workers.get(worker)
        if record is None or record.ended.is_set() or record.address is None:
            raise ports.AgentUnreachable(worker, "no running local agent process")
        return await client.AgentClient.connect(
            worker, record.address, timeout_s=timeout_s, tls=self._tls
        )

    def events(self) -> AsyncIterator[ports.WorkerEvent]:
        return ports.until_closed(self._events)

    async def shutdown(self) -> None:
        """Stop and reap every agent, release the store, remove the job's stores; idempotent.
        The work is one task that a cancelled caller does not cancel: every later call awaits
        the same task, so an interrupt during a shutdown never leaves an agent or a store."""
        if self._shutdown is None:
            self._closed = True
            self._shutdown = asyncio.ensure_future(self._shut_down())
        await asyncio.shield(self._shutdown)

    async def _shut_down(self) -> None:
        # A restart waiting or under way ends first: its process, if any, is then stopped too.
        pending = list(self._pending.values())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*(self._stop(w, r) for w, r in self._workers.items()))
        self._events.put_nowait(None)
        self._store = None  # the TCPStore's server ends with its last reference
        if not self._keep_snapshots:
            shutil.rmtree(self.snapshot_base / self.job, ignore_errors=True)

    # -- adoption -----------------------------------------------------------------------------

    def adopt(self) -> tuple[plan.WorkerId, ...]:
        """Take over the agents a previous backend of this run directory left running (module
        docstring); returns their workers, sorted. One that never wrote its ready file cannot be
        reached and is killed. Call in the event loop that runs the job."""
        if not self._adopting:
            raise LocalBackendError("adopt() needs a backend built with adopt=True")
        taken = []
        for worker, (pid, started) in adoption.running(self.run_dir / "workers").items():
            process = adoption.AdoptedProcess.open(pid, started)
            if process is None or self.running(worker):
                continue
            ready, _ = self._paths(worker)
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

    # -- failure injection and returning workers --------------------------------------------

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
        """Send `signum` to `worker`'s process (a DIED event follows when it exits). An exit
        this causes is on purpose: not restarted by the policy (`restart` brings it back)."""
        if not self.running(worker):
            raise LocalBackendError(f"worker {worker} does not run; kill a running worker")
        record = self._workers[worker]
        if signum not in (signal.SIGSTOP, signal.SIGCONT):  # these do not end it
            record.on_purpose = True
        record.process.send_signal(signum)

    def kill_all(self) -> None:
        """SIGKILL every running agent now, without the Stop RPC and the graces (a second
        interrupt of `planaria run`); DIED events follow, and `shutdown` still reaps them and
        removes the stores."""
        for record in self._workers.values():
            if not record.ended.is_set():
                record.on_purpose = True
                with contextlib.suppress(ProcessLookupError):
                    record.process.kill()

    async def restart(self, worker: plan.WorkerId) -> None:
        """Start `worker` again (same id, same snapshot store); JOINED once it serves."""
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
        """Wait until the backend gives up restarting a worker (`planaria.local.restarts`);
        returns the one-line cause. `planaria run` ends the job Failed with it."""
        await self._given_up.wait()
        assert self._cause is not None, "the cause is set before the event"
        return self._cause

    async def wait_exited(self, worker: plan.WorkerId, timeout_s: float) -> None:
        """Wait until `worker`'s process has exited and its DIED event is queued."""
        await asyncio.wait_for(self._workers[worker].ended.wait(), timeout_s)

    # -- processes -----------------------------------------------------------------------------

    def _paths(self, worker: plan.WorkerId) -> tuple[Path, Path]:
        folder = self.run_dir / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"worker-{worker}.ready", folder / f"worker-{worker}.log"

    def _pid_file(self, worker: plan.WorkerId) -> Path:
        return self.run_dir / "workers" / f"worker-{worker}{adoption.SUFFIX}"

    def _command(self, worker: plan.WorkerId, where: Placement, ready: Path) -> list[str]:
        return [
            *where.prefix,
            *(sys.executable, "-m", "planaria", "agent"),
            *("--worker", str(worker), "--job", self.job),
            *("--listen", f"{where.host}:0", "--ready-file", str(ready)),
            *("--snapshot-base", str(self.snapshot_base)),
            *("--tls-dir", str(self.run_dir / "tls" / "agent")),
            *self._agent_args,
        ]

    async def _launch(self, worker: plan.WorkerId) -> None:
        ready, log_path = self._paths(worker)
        ready.unlink(missing_ok=True)
        where = self._placement(worker)
        with open(log_path, "ab") as log:
            process = await asyncio.create_subprocess_exec(
                *self._command(worker, where, ready),
                env={**os.environ, **where.env} if where.env else None,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        adoption.write(self._pid_file(worker), process.pid)  # for a successor (docstring)
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
        _, log_path = self._paths(worker)
        said = restarts.cause(worker, done, detail, log_path)
        LOG.error("%s", said)
        self._note(worker, said)
        if self._cause is None:  # the first worker given up on is the job's cause
            self._cause = said
            self._given_up.set()

    def _note(self, worker: plan.WorkerId, text: str) -> None:
        """Append `text` to `worker`'s log, after what its processes wrote: how each ended."""
        _, log_path = self._paths(worker)
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


def _issue_tls(job: str, folder: Path) -> tls.ControllerTls:
    """Fresh credentials for `job`: the agents' files in `folder/agent`, the controller's in
    `folder/controller` (replacing a previous run's); returns the controller's."""
    credentials = tls.issue(job)
    tls.write_dir(tls.agent_files(credentials), folder / "agent")
    tls.write_dir(tls.controller_files(credentials), folder / "controller")
    os.chmod(folder, tls.DIR_MODE)
    return tls.controller_tls(credentials)


def _open_store(avoid: int | None) -> c10d.TCPStore:
    """The rendezvous store, on a free loopback port other than `avoid`: the killed controller's
    port, since an agent keeps one store client per address and would reuse its client of the
    dead store if the new one listened there."""
    timeout = datetime.timedelta(seconds=STORE_TIMEOUT_S)
    store = c10d.TCPStore(LOOPBACK, 0, None, True, timeout, False)
    if store.port == avoid:  # the first holds that port while the second picks another
        store = c10d.TCPStore(LOOPBACK, 0, None, True, timeout, False)
    return store


def _describe(code: int | None) -> str:
    """An exit status in words: 'exit code 3' or 'signal SIGKILL'."""
    if code is None:
        return "no exit status yet"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
