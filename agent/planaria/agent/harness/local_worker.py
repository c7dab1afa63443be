"""The worker process of the local harness (`planaria.agent.harness.local_cluster`): what it serves
and sends.

A worker process holds one worker id. It reports ready once torch is warm, then serves run
commands from its pipe until told to stop or until the pipe closes (the parent died): each
command is one epoch (compile the schedule, form the epoch's groups, run the steps with the
executor, leave the epoch), reported step by step (`StepDone`) and then as a whole
(`RunEnded`, with the layer states saved as plain tensors for `torch.load(weights_only=True)`).
The worker keeps its layers between runs unless a command asks for fresh ones.

Errors never escape a run: a StepError is reported as the executor latched it; our input
errors (ValueError) as an invalid configuration; a failed rendezvous as a timeout; anything else
as internal, with where it was raised. A `Fault` makes the worker signal itself right before an
instruction, for failure tests.

Not here: the parent side, the cluster and its results (`planaria.agent.harness.local_cluster`).
"""

from __future__ import annotations

import datetime
import os
import signal
import traceback
from dataclasses import dataclass
from multiprocessing import connection
from pathlib import Path

import torch
from torch._C import _distributed_c10d as c10d  # the store classes (see groups.py)

from planaria.agent.execution import executor, failures, groups, held_layers
from planaria.agent.training import data, semantics
from planaria.contract import instructions, plan, schedule
from planaria.wire import messages

LOOPBACK = "127.0.0.1"
STORE_TIMEOUT_S = 60.0  # the store client's own timeout; epochs use the run's timeout_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """Send `signal` to the worker itself right before instruction `index` of step `step`."""

    step: int
    index: int
    signal: int = signal.SIGKILL


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCommand:
    """Parent to worker: run `steps` of `plan` as epoch `epoch` (None instead: stop)."""

    epoch: int
    config: semantics.TrainingConfig
    plan: plan.Plan
    steps: tuple[int, ...]
    fresh: bool
    fault: Fault | None
    timeout_s: float
    states_file: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    """Worker to parent: started, torch warm, connected to the store."""

    worker: plan.WorkerId


@dataclass(frozen=True, slots=True, kw_only=True)
class StepDone:
    """Worker to parent: `step` committed; this worker's loss share and step time."""

    step: int
    loss: float
    step_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnded:
    """Worker to parent: the run is over (failed when `error` is set); where the states are."""

    error: messages.LatchedError | None
    states_file: str | None


def worker_main(
    worker: plan.WorkerId,
    store_port: int,
    tokens: data.Tokens,
    commands: connection.Connection,
    reports: connection.Connection,
) -> None:
    """A worker process: serve run commands until told to stop or the parent goes away."""
    torch.set_num_threads(1)
    # torch.optim's constructors import torch._dynamo on first use, seconds of CPU: pay that
    # before reporting ready, not while peers wait for this worker at an epoch's rendezvous.
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    timeout = datetime.timedelta(seconds=STORE_TIMEOUT_S)
    store = c10d.TCPStore(LOOPBACK, store_port, None, False, timeout)
    runner = _Runner(worker=worker, store=store, tokens=tokens, reports=reports)
    reports.send(Ready(worker=worker))
    while True:
        try:
            command = commands.recv()
        except EOFError:  # the parent is gone
            break
        if command is None:
            break
        runner.run(command)
    # Everything this worker owes the parent has been written to its pipe; skip the interpreter's
    # teardown of torch (most of a second per process) as multiprocessing's own fork path does.
    os._exit(0)


class _Runner:
    """One worker's state between runs: the layers it holds."""

    def __init__(
        self,
        *,
        worker: plan.WorkerId,
        store: c10d.Store,
        tokens: data.Tokens,
        reports: connection.Connection,
    ) -> None:
        self.worker, self.store, self.tokens, self.reports = worker, store, tokens, reports
        self.held: held_layers.HeldLayers | None = None

    def run(self, command: RunCommand) -> None:
        """Run the command's steps; report each step, then the outcome and the layer states."""
        error = None
        try:
            self._run(command)
        except failures.StepError as exc:
            error = exc.latched()
        except ValueError as exc:  # our input errors: a plan or state that cannot run here
            error = _latched(messages.ErrorKind.INVALID_CONFIG, exc, command)
        except groups.EpochFormationError as exc:
            error = _latched(messages.ErrorKind.TIMEOUT, exc, command)
        except Exception as exc:  # a process boundary: report anything else, keep serving
            error = _latched(messages.ErrorKind.INTERNAL, exc, command)
        states_file = self._save(command.states_file)
        self.reports.send(RunEnded(error=error, states_file=states_file))

    def _run(self, command: RunCommand) -> None:
        sched = schedule.compile_schedule(command.plan)
        ranks = groups.worker_ranks(sched)
        layers = self._layers(command, sched)
        epoch = groups.form_epoch(
            self.store,
            command.epoch,
            ranks[self.worker],
            len(ranks),
            messages.Backend.GLOO,
            command.timeout_s,
            subgroups=groups.subgroup_ranks(sched),
        )
        try:
            job = semantics.Job.from_tokens(command.config, self.tokens)
            runner = executor.Executor(
                job=job, sched=sched, worker=self.worker, epoch=epoch, layers=layers
            )
            hook = _fault_hook(command.fault)
            for step in command.steps:
                result = runner.run_step(step, before=hook)
                self.reports.send(StepDone(step=step, loss=result.loss, step_s=result.step_s))
        except failures.StepError:
            # as the runtime does: end every peer's wait on this worker at once, so a peer
            # whose idle connection to the dead one gloo never failed learns of it from us
            epoch.release()
            raise
        finally:
            groups.leave_epoch(epoch)

    def _layers(self, command: RunCommand, sched: schedule.Schedule) -> held_layers.HeldLayers:
        if command.fresh or self.held is None:
            self.held = None  # free the old layers before building new ones
            self.held = held_layers.HeldLayers.build(
                command.config, sched.stream(self.worker).layers
            )
        return self.held

    def _save(self, path: str) -> str | None:
        if self.held is None:
            return None
        torch.save(
            {
                index: {
                    "names": list(state.names),
                    "parameters": list(state.parameters),
                    "exp_avg": list(state.exp_avg),
                    "exp_avg_sq": list(state.exp_avg_sq),
                    "steps": list(state.steps),
                }
                for index, state in self.held.states().items()
            },
            path,
        )
        return path


def _latched(
    kind: messages.ErrorKind, exc: BaseException, command: RunCommand
) -> messages.LatchedError:
    """An error that is not a StepError, with where it was raised (internal errors are bugs)."""
    first = command.steps[0] if command.steps else 0
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    message = f"{type(exc).__name__}: {exc}{where}"
    return messages.LatchedError(kind=kind, message=message, step=first)


def _fault_hook(fault: Fault | None) -> executor.Hook | None:
    if fault is None:
        return None

    def before(step: int, index: int, _: instructions.Instruction) -> None:
        if (step, index) == (fault.step, fault.index):
            os.kill(os.getpid(), fault.signal)

    return before
