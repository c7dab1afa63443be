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
such as `ip netns exec`, extra environment: `launching.Placement`); the store is then advertised
at `store_host`, an address every worker can reach.

The agent processes themselves are `planaria.local.supervision`'s: how each is launched, where
its log and ready file go, its DIED and JOINED events, the restart of one that exits on its own
(as a kubelet restarts a container, `planaria.local.restarts`) and the stop sequence. This
module composes them with the store and the credentials behind `ports.Backend`; once a worker's
restarts are spent, `gave_up` answers with a one-line cause, for the caller to fail the job with
(`planaria run` does).

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

Errors: `LocalBackendError` (`supervision.LocalBackendError`, part of this door: a restart of a
live worker, or one that exits or stays silent before it serves; `start` logs such a worker and
leaves it to the restart policy); `ports.AgentUnreachable` from `connect` when the worker does
not run; `tls.TlsError` (a ValueError) at construction for a job name that cannot name a
certificate.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

# the store classes, as planaria.agent.execution.groups
from torch._C import _distributed_c10d as c10d

from planaria.contract import plan, rendezvous
from planaria.control import ports
from planaria.local import adoption, launching, restarts, supervision
from planaria.rpc import client, tls

STORE_TIMEOUT_S = 300.0
STORE_PORT_FILE = "store.port"  # in the run directory: the port an adopting backend avoids
# What a caller of this door catches (module docstring); raised by the supervisor.
LocalBackendError = supervision.LocalBackendError


class LocalBackend:
    """Agents as local processes, the store in this process (module docstring)."""

    def __init__(
        self,
        *,
        job: str,
        run_dir: Path,
        snapshot_base: Path = launching.DEFAULT_SNAPSHOT_BASE,
        keep_snapshots: bool = False,
        ready_timeout_s: float = supervision.READY_TIMEOUT_S,
        stop_grace_s: float = supervision.STOP_GRACE_S,
        agent_args: Sequence[str] = (),
        store_host: str = launching.LOOPBACK,
        placement: Callable[[plan.WorkerId], launching.Placement] | None = None,
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
        self._adopting = adopt
        self._tls = (
            tls.read_controller_dir(run_dir / "tls" / "controller")
            if adopt
            else _issue_tls(job, run_dir / "tls")
        )
        self._events: asyncio.Queue[ports.WorkerEvent | None] = asyncio.Queue()
        launch = launching.AgentLaunch(
            job=job,
            run_dir=run_dir,
            snapshot_base=snapshot_base,
            agent_args=tuple(agent_args),
            placement=placement or (lambda worker: launching.Placement()),
        )
        self._processes = supervision.Supervisor(
            launch=launch,
            events=self._events,
            credentials=self._tls,
            ready_timeout_s=ready_timeout_s,
            stop_grace_s=stop_grace_s,
            restart=restart,
        )
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
        await self._processes.start(workers)

    async def connect(self, worker: plan.WorkerId, timeout_s: float) -> ports.Agent:
        address = self._processes.address(worker)
        if address is None:
            raise ports.AgentUnreachable(worker, "no running local agent process")
        return await client.AgentClient.connect(worker, address, timeout_s=timeout_s, tls=self._tls)

    def events(self) -> AsyncIterator[ports.WorkerEvent]:
        return ports.until_closed(self._events)

    async def shutdown(self) -> None:
        """Stop and reap every agent, release the store, remove the job's stores; idempotent.
        The work is one task that a cancelled caller does not cancel: every later call awaits
        the same task, so an interrupt during a shutdown never leaves an agent or a store."""
        if self._shutdown is None:
            self._processes.close()
            self._shutdown = asyncio.ensure_future(self._shut_down())
        await asyncio.shield(self._shutdown)

    async def _shut_down(self) -> None:
        await self._processes.stop_all()
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
        return self._processes.adopt()

    # -- failure injection and returning workers --------------------------------------------

    def running(self, worker: plan.WorkerId) -> bool:
        """Whether `worker`'s current process has not exited."""
        return self._processes.running(worker)

    def alive(self) -> tuple[plan.WorkerId, ...]:
        """The workers whose process runs, sorted."""
        return self._processes.alive()

    @property
    def pids(self) -> dict[plan.WorkerId, int]:
        """The process id of every worker's current (or last) process."""
        return self._processes.pids

    def kill(self, worker: plan.WorkerId, signum: int = signal.SIGKILL) -> None:
        """Send `signum` to `worker`'s process (a DIED event follows when it exits). An exit
        this causes is on purpose: not restarted by the policy (`restart` brings it back)."""
        self._processes.kill(worker, signum)

    def kill_all(self) -> None:
        """SIGKILL every running agent now, without the Stop RPC and the graces (a second
        interrupt of `planaria run`); DIED events follow, and `shutdown` still reaps them and
        removes the stores."""
        self._processes.kill_all()

    async def restart(self, worker: plan.WorkerId) -> None:
        """Start `worker` again (same id, same snapshot store); JOINED once it serves."""
        await self._processes.restart(worker)

    @property
    def restarts(self) -> dict[plan.WorkerId, int]:
        """How many times the policy restarted each worker (only those it restarted)."""
        return self._processes.restarts

    async def gave_up(self) -> str:
        """Wait until the backend gives up restarting a worker (`planaria.local.restarts`);
        returns the one-line cause. `planaria run` ends the job Failed with it."""
        return await self._processes.gave_up()

    async def wait_exited(self, worker: plan.WorkerId, timeout_s: float) -> None:
        """Wait until `worker`'s process has exited and its DIED event is queued."""
        await self._processes.wait_exited(worker, timeout_s)


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
    store = c10d.TCPStore(launching.LOOPBACK, 0, None, True, timeout, False)
    if store.port == avoid:  # the first holds that port while the second picks another
        store = c10d.TCPStore(launching.LOOPBACK, 0, None, True, timeout, False)
    return store
