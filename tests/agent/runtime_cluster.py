"""A test helper: `planaria.agent.runtime.runtime.Runtime`s in worker processes, driven over pipes.

Each worker process (multiprocessing's forkserver, torch preloaded) holds one Runtime and
answers (command, argument) messages: configure, heartbeat, stop. The rendezvous store (a
TCPStore) lives in the test process, as the controller hosts it. A worker may be given a
`Kill` (SIGKILL itself right before an instruction) to inject a failure at an exact place, and
a killed worker can be started again with the same id (a restarted agent process).
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import connection
from pathlib import Path
from typing import Any

import torch
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import executor
from planaria.agent.runtime import runtime
from planaria.contract import instructions, plan
from planaria.wire import messages

State = messages.AgentState
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill:
    """SIGKILL the worker right before instruction `index` of committed step `step` (the
    executor's step `step - 1`), or before its first optimizer step when `index` is None."""

    step: int
    index: int | None = None


def _hook(kill: Kill | None) -> executor.Hook | None:
    if kill is None:
        return None

    def before(step: int, index: int, op: instructions.Instruction) -> None:
        at_update = kill.index is None and isinstance(op, instructions.OptimizerStep)
        if step == kill.step - 1 and (index == kill.index or at_update):
            os.kill(os.getpid(), signal.SIGKILL)

    return before


def _serve(
    worker: int, job: str, base: str, kill: Kill | None, conn: connection.Connection
) -> None:
    torch.set_num_threads(1)
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])  # warm torch before peers wait
    agent = runtime.Runtime(
        worker=plan.WorkerId(worker), job=job, snapshot_base=Path(base), hook=_hook(kill)
    )
    agent.start()
    conn.send("ready")
    while True:
        try:
            command, argument = conn.recv()
        except EOFError:
            break
        if command == "configure":
            conn.send(agent.configure(argument))
        elif command == "heartbeat":
            conn.send(agent.heartbeat())
        else:
            agent.close()
            conn.send(agent.heartbeat())
            break
    os._exit(0)


class RuntimeCluster:
    """Worker processes with Runtimes; the rendezvous store is here."""

    def __init__(self, *, job: str, base: Path) -> None:
        self.job, self.base = job, base
        self.store = c10d.TCPStore(LOOPBACK, 0, None, True, datetime.timedelta(seconds=60))
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["torch", "planaria.agent.runtime.runtime"])
        self._processes: dict[int, Any] = {}
        self._conns: dict[int, connection.Connection] = {}

    def start(self, workers: Iterable[int], kills: dict[int, Kill] | None = None) -> None:
        """Start the workers' processes and wait until each is ready."""
        started = list(workers)
        for w in started:
            mine, theirs = self._context.Pipe()
            kill = (kills or {}).get(w)
            args = (w, self.job, str(self.base), kill, theirs)
            process = self._context.Process(target=_serve, args=args, daemon=True)
            process.start()
            theirs.close()
            self._processes[w], self._conns[w] = process, mine
        for w in started:
            if not self._conns[w].poll(60):
                raise TimeoutError(f"worker {w} did not start")
            assert self._conns[w].recv() == "ready"

    def rendezvous(self, p: plan.Plan, worker: int, epoch: int) -> messages.Rendezvous:
        workers = sorted(p.workers)
        return messages.Rendezvous(
            store_host=LOOPBACK,
            store_port=self.store.port,
            key_prefix=f"epoch-{epoch}",
            rank=workers.index(plan.WorkerId(worker)),
            world_size=len(workers),
            backend=messages.Backend.GLOO,
            timeout_s=6.0,  # bounds a survivor's wait for a dead peer
        )

    def ask(self, worker: int, command: str, argument: object = None) -> Any:
        conn = self._conns[worker]
        conn.send((command, argument))
        if not conn.poll(60):
            raise TimeoutError(f"worker {worker} did not answer {command}")
        return conn.recv()

    def configure(self, worker: int, config: messages.WorkerConfig) -> messages.Acknowledgement:
        ack: messages.Acknowledgement = self.ask(worker, "configure", config)
        return ack

    def heartbeat(self, worker: int) -> messages.Heartbeat:
        beat: messages.Heartbeat = self.ask(worker, "heartbeat")
        return beat

    def wait(
        self,
        workers: Iterable[int],
        done: Callable[[messages.Heartbeat], bool],
        timeout_s: float = 60.0,
    ) -> dict[int, messages.Heartbeat]:
        """Poll until every worker's heartbeat satisfies `done`; their last heartbeats."""
        deadline = time.monotonic() + timeout_s
        pending, beats = set(workers), {}
        while pending:
            for w in sorted(pending):
                beats[w] = self.heartbeat(w)
                if done(beats[w]):
                    pending.discard(w)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(pending)} never got there: {beats}")
            time.sleep(0.05)
        return beats

    def wait_dead(self, worker: int, timeout_s: float = 30.0) -> None:
        self._processes[worker].join(timeout_s)
        assert not self._processes[worker].is_alive()
        self._conns.pop(worker).close()

    def close(self) -> None:
        for w in list(self._conns):
            with contextlib.suppress(OSError, EOFError, TimeoutError):
                self.ask(w, "stop")
        for process in self._processes.values():
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
