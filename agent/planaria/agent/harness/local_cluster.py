"""A local cluster: worker processes on loopback that run the executor, driven by the parent.

    with harness.LocalCluster(workers=range(4), tokens=tokens) as cluster:
        run = cluster.run(config, plan, steps=range(5))
        run.losses            # per committed step: the sum of every worker's share
        run.layer_state(3)    # layer 3's parameters and AdamW state (its first holder's copy)

One process per worker id, started once (one torch thread each) and reused for any number of
runs. Workers start from multiprocessing's forkserver by default: like spawn, every worker is a
fresh single-threaded interpreter (no inherited threads or locks), but the server imports this
module, torch and torch._dynamo once (AdamW's constructor imports the latter: seconds of CPU),
so a worker starts in milliseconds instead of 5-10 CPU-seconds; `start_method="spawn"` is
there for platforms without a forkserver.

The rendezvous store (a TCPStore) lives in the parent, as the controller hosts it in a
deployment, never in a worker that may die. Each `run` is a new epoch: every worker of the plan
compiles the schedule, forms the epoch's groups under `epoch-N`, runs the steps with the
executor, leaves the epoch and reports; workers outside the plan stay idle.

Layers across runs: `fresh=True` builds each worker's layers from the seed; `fresh=False` keeps
what each worker holds from its last run (parameters and AdamW state), as a recovery that keeps
the layout does (rerouting). A worker lacking a layer then reports an invalid configuration:
layer transfers are not part of this harness.

Failures: `faults={worker: Fault(step=s, index=i)}` makes a worker send itself a signal right
before instruction i of step s (SIGKILL, the default: a crash; SIGSTOP: a hang). Survivors latch
their errors and report them in `run_results.RunResult.errors`; a worker whose process died or
hung is in `RunResult.lost`. Once a worker has failed, the others get `timeout_s` plus a margin
to report; silent ones are then killed, as a controller gives up on an agent that misses its
heartbeats. `run_deadline_s` bounds a whole run: past it every child is killed and
HarnessTimeoutError raised.

Results: a message per committed step as it commits; the final layer states travel as
torch.save files of plain tensors in a private temporary directory, loaded with
weights_only=True, then deleted.

Cleanup: `close()` (also on leaving the `with` block, and on any error inside `run` or the
start) stops the workers, kills any still alive after a grace period and reaps them all; a
worker also exits when the parent dies (its command pipe closes). No orphans are left.

CPU and gloo only: a local GPU backend would pin worker w to a device and use NCCL.

Errors:

    HarnessError
    ├── HarnessInputError (ValueError)   a plan naming workers the cluster lacks or has lost
    └── HarnessTimeoutError              the start or a run outlived its deadline (all killed)
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import tempfile
import time
import typing
from collections.abc import Iterable, Mapping
from multiprocessing import connection
from pathlib import Path
from types import TracebackType

from torch._C import _distributed_c10d as c10d  # the store classes (see groups.py)

from planaria.agent.harness import local_worker, run_results
from planaria.agent.training import data, semantics
from planaria.contract import plan, schedule

POLL_S = 0.2  # how often the parent looks at the clock while it waits for reports
STOP_GRACE_S = 5.0  # how long close() waits for a worker to exit before killing it
FAILURE_MARGIN_S = 3.0  # beyond timeout_s, how long survivors of a failure get to report


class HarnessError(Exception):
    """Base of the errors this module raises on purpose."""


class HarnessInputError(HarnessError, ValueError):
    """A request the cluster cannot carry out as given; the message says what to change."""


class HarnessTimeoutError(HarnessError):
    """The cluster's start or a run outlived its deadline; every child has been killed."""


# Part of this module's API; defined with the worker, which acts on it.
Fault = local_worker.Fault


# --- the parent side --------------------------------------------------------------------------


class LocalCluster:
    """Worker processes `workers` (ids), started at once and ready when the constructor returns.

    `timeout_s` is every blocking wait's timeout inside the workers (process groups, receives,
    collectives); `run_deadline_s` bounds a whole run, `start_timeout_s` the start;
    `start_method` is multiprocessing's (see the module docstring).
    """

    def __init__(
        self,
        *,
        workers: Iterable[int],
        tokens: data.Tokens,
        timeout_s: float = 10.0,
        run_deadline_s: float = 600.0,
        start_timeout_s: float = 120.0,
        start_method: typing.Literal["forkserver", "spawn"] = "forkserver",
    ) -> None:
        ids = sorted({plan.WorkerId(w) for w in workers})
        if not ids or ids[0] < 0:
            raise HarnessInputError(f"give one or more worker ids >= 0 (got {ids})")
        self.timeout_s, self.run_deadline_s = timeout_s, run_deadline_s
        self._context = _context(start_method)
        self._epoch = 0
        self._dead: set[plan.WorkerId] = set()
        self._files = tempfile.TemporaryDirectory(prefix="planaria-harness-")
        self._store = c10d.TCPStore(
            local_worker.LOOPBACK, 0, None, True, datetime.timedelta(seconds=timeout_s), False
        )
        self._processes: dict[plan.WorkerId, multiprocessing.process.BaseProcess] = {}
        self._commands: dict[plan.WorkerId, connection.Connection] = {}
        self._reports: dict[plan.WorkerId, connection.Connection] = {}
        try:
            for worker in ids:
                self._spawn(worker, tokens)
            self._await_ready(start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> dict[plan.WorkerId, int]:
        """Process id of every worker started (alive or not)."""
        return {w: p.pid for w, p in self._processes.items() if p.pid is not None}

    @property
    def alive(self) -> tuple[plan.WorkerId, ...]:
        """Workers whose process runs (not lost in a run, not exited or killed otherwise)."""
        return tuple(
            w
            for w in sorted(self._processes)
            if w not in self._dead and self._processes[w].is_alive()
        )

    def run(
        self,
        config: semantics.TrainingConfig,
        plan_: plan.Plan,
        steps: Iterable[int],
        *,
        fresh: bool = True,
        faults: Mapping[int, local_worker.Fault] | None = None,
        deadline_s: float | None = None,
    ) -> run_results.RunResult:
        """Run `steps` of `plan_` as the next epoch on the plan's workers (see the module
        docstring). Raises HarnessInputError when the plan names a worker that is not alive
        here, HarnessTimeoutError (after killing every child) past `deadline_s` (default: the
        cluster's run_deadline_s)."""
        workers = self._plan_workers(plan_)
        self._epoch += 1
        todo = tuple(steps)
        try:
            for worker in workers:
                command = self._command(config, plan_, todo, fresh, faults, worker)
                self._commands[worker].send(command)
            collected = self._collect(workers, deadline_s or self.run_deadline_s)
        except BaseException:
            self._shutdown(grace_s=0.0)  # workers are mid-run: kill them now
            raise
        return run_results.run_result(self._epoch, workers, todo, collected)

    def close(self) -> None:
        """Stop every worker; kill those that do not exit in time; reap them all."""
        self._shutdown(grace_s=STOP_GRACE_S)

    def _shutdown(self, *, grace_s: float) -> None:
        for worker, commands in self._commands.items():
            if worker not in self._dead:
                with contextlib.suppress(OSError):  # its process may be gone already
                    commands.send(None)
        deadline = time.monotonic() + grace_s
        for process in self._processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for conn in (*self._commands.values(), *self._reports.values()):
            conn.close()
        self._dead.update(self._processes)
        self._files.cleanup()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------------

    def _spawn(self, worker: plan.WorkerId, tokens: data.Tokens) -> None:
        commands_in, commands_out = self._context.Pipe(duplex=False)
        reports_in, reports_out = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=local_worker.worker_main,
            args=(worker, self._store.port, tokens, commands_in, reports_out),
            name=f"planaria-worker-{worker}",
            daemon=True,
        )
        process.start()
        # Close our copies of the child's ends, so that either side sees EOF when the other dies.
        commands_in.close()
        reports_out.close()
        self._processes[worker] = process
        self._commands[worker] = commands_out
        self._reports[worker] = reports_in

    def _await_ready(self, timeout_s: float) -> None:
        waiting = set(self._processes)
        deadline = time.monotonic() + timeout_s
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessTimeoutError(
                    f"workers {sorted(waiting)} were not ready within {timeout_s} s"
                )
            for worker in self._ready_readers(waiting, remaining):
                message = self._receive(worker)
                if not isinstance(message, local_worker.Ready):
                    raise HarnessError(f"worker {worker} died or misbehaved while starting")
                waiting.discard(worker)

    def _plan_workers(self, plan_: plan.Plan) -> tuple[plan.WorkerId, ...]:
        workers = tuple(s.worker for s in schedule.compile_schedule(plan_).streams)
        missing = sorted(set(workers) - set(self.alive))
        if missing:
            raise HarnessInputError(
                f"the plan runs on workers {list(workers)} but {missing} are not alive in this "
                f"cluster (alive: {list(self.alive)}); plan with live workers only"
            )
        return workers

    def _command(
        self,
        config: semantics.TrainingConfig,
        plan_: plan.Plan,
        steps: tuple[int, ...],
        fresh: bool,
        faults: Mapping[int, local_worker.Fault] | None,
        worker: plan.WorkerId,
    ) -> local_worker.RunCommand:
        states_file = Path(self._files.name) / f"worker-{worker}-epoch-{self._epoch}.pt"
        return local_worker.RunCommand(
            epoch=self._epoch,
            config=config,
            plan=plan_,
            steps=steps,
            fresh=fresh,
            fault=(faults or {}).get(worker),
            timeout_s=self.timeout_s,
            states_file=str(states_file),
        )

    def _collect(
        self, workers: tuple[plan.WorkerId, ...], deadline_s: float
    ) -> run_results.Collected:
        """Read reports until every worker ended, died, or was given up on."""
        collected = run_results.Collected(steps={w: [] for w in workers})
        pending = set(workers)
        deadline = time.monotonic() + deadline_s
        give_up_at: float | None = None
        while pending:
            now = time.monotonic()
            if now >= deadline:
                raise HarnessTimeoutError(
                    f"epoch {self._epoch}: workers {sorted(pending)} did not finish within "
                    f"{deadline_s} s; every worker was killed"
                )
            if give_up_at is not None and now >= give_up_at:
                self._kill_silent(pending, collected)
                break
            for worker in self._ready_readers(pending, min(POLL_S, deadline - now)):
                self._take_report(worker, pending, collected)
            if collected.failed and give_up_at is None:
                give_up_at = time.monotonic() + self.timeout_s + FAILURE_MARGIN_S
        return collected

    def _take_report(
        self, worker: plan.WorkerId, pending: set[plan.WorkerId], collected: run_results.Collected
    ) -> None:
        message = self._receive(worker)
        if isinstance(message, local_worker.StepDone):
            collected.steps[worker].append(message)
            return
        pending.discard(worker)
        if isinstance(message, local_worker.RunEnded):
            collected.ended[worker] = message
        else:  # EOF: the process died
            self._reap(worker)
            collected.lost.add(worker)

    def _kill_silent(self, pending: set[plan.WorkerId], collected: run_results.Collected) -> None:
        """Kill the workers that stayed silent after a failure (hung, e.g. stopped)."""
        for worker in sorted(pending):
            self._processes[worker].kill()
            self._reap(worker)
            collected.lost.add(worker)

    def _reap(self, worker: plan.WorkerId) -> None:
        self._processes[worker].join(STOP_GRACE_S)
        self._dead.add(worker)

    def _ready_readers(self, workers: set[plan.WorkerId], timeout_s: float) -> list[plan.WorkerId]:
        by_reader = {self._reports[w]: w for w in workers}
        ready = connection.wait(list(by_reader), timeout=max(0.0, timeout_s))
        return [by_reader[reader] for reader in ready if isinstance(reader, connection.Connection)]

    def _receive(self, worker: plan.WorkerId) -> object:
        """The next message from `worker`, or None when its pipe closed (it died)."""
        try:
            message: object = self._reports[worker].recv()
        except EOFError:
            return None
        return message


def _context(
    start_method: typing.Literal["forkserver", "spawn"],
) -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    if start_method == "spawn":
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Takes effect when the server starts (once per parent process); harmless afterwards.
    context.set_forkserver_preload([__name__, "torch._dynamo"])
    return context
