"""The schedule executor: one worker's instruction stream, run with real torch.distributed.

Given a compiled schedule (`planaria.contract.schedule`), this worker's id, the job (training
configuration and data), the epoch's process groups and the layers the worker holds,
`Executor.run_step(step)` interprets the worker's instructions literally, in order (the
instruction set is `planaria.contract.instructions`):

    Forward(g, [a, b))      held layers a..b-1 on micro-batch g, under bfloat16 autocast when
                            the job's precision is bf16 (`precision`); a == 0 loads g's tokens
                            (samples [g*B, (g+1)*B) of the step's global batch); b == L adds
                            `model.micro_batch_loss` to the worker's share of the step's loss
    Backward(g, [a, b))     from the loss (b == L) or from the received gradient (outside
                            autocast in bf16: `precision`); parameter
                            gradients accumulate, summed over micro-batches as in the reference
                            (in float32, or in float64 in exact mode: `reduction`)
    Send*(to, g, tag)       isend of g's output activation / input gradient; awaited before
                            the optimizer step (or at the end of the step)
    Recv*(from, g, tag)     irecv into a fresh [B, T, d_model] buffer, awaited at once
    AllReduce(layers, grp)  the layers' gradients as one flat bucket (zeros where this worker
                            computed none), SUM over the group's subgroup (Oobleck §6.1); in
                            exact mode the float64 sums, rounded once afterwards
    OptimizerStep(layers)   each layer's own AdamW steps, then its gradients are cleared (exact
                            mode rounds the sums no AllReduce took first, before the hook);
                            before that, a holder of a tied embedding matrix's copy (layer 0
                            or the head of a tied Hugging Face model) exchanges the two uses'
                            gradient totals and sums them (`tied_embeddings`, `tying`)
    Snapshot(layers)        a marker, reported in the StepResult for the snapshot writer

The commit barrier: right before the first OptimizerStep of a step (after the hook's call for
it), every worker all-reduces one element over the epoch's world group: its share of the step's
loss. No worker updates a parameter of step t before every worker has finished step t's
forward, backward and all-reduce work, so when a worker dies, every survivor's step fails (a
peer lost, or a timeout for a hung peer) with all of them at the same last committed step. Only
a death inside the barrier itself can leave some survivors one step ahead (they passed it, the
others did not); the runtime's roll-back covers that. The barrier's sum is the step's loss (the
global batch's mean token loss), reported as `StepResult.step_loss` on every worker.

No division happens at the optimizer step: `model.micro_batch_loss` already divides by
B_global * T, so gradients summed over whoever computed them are the gradient of the global
batch's mean loss, exactly as in the reference trainer (`planaria.agent.training.reference`). A
rerouted micro-batch (ReCycle, Odyssey §II-C, eq. 12-13) needs nothing special: it appears in the
peer's stream as a Forward/Backward of the same layer range with sends and receives to the other
pipeline's neighbours, and its gradients land in the peer's accumulated gradients, hence in the
same per-layer sum.

Messages are hidden states [B, T, d_model] in the layers' dtype: stage boundaries lie between
planner layers and nothing follows the head. In bf16 too: the residual stream stays float32
under autocast, and parameters, their gradients and AdamW's state are float32 (the master
state snapshots and checkpoints carry). Tags are the schedule's (matching by tag, as gloo
does, and by order, as NCCL does, agree). On device cuda the tensors live on the device and the
epoch must use NCCL; gloo is the CPU backend.

Failures: every blocking wait waits at most the epoch's timeout, and an executor given
`abandoned` gives up its collectives once another worker flagged a failed step (`failures`).
A torch.distributed failure aborts the step with a `failures.StepError` naming the step, the
instruction and the peer when one is known, and the error is latched: every later `run_step`
raises it again; the worker waits for its next epoch (a new Executor). An aborted step never
reaches the optimizer step, so the layers keep the last committed step's parameters and AdamW
state; the next executor clears the aborted step's gradients.

Not here: forming groups (`groups`), bounded waits and the error tree (`failures`), processes
(`planaria.agent.harness`), snapshots and layer transfers.

Errors: `failures.ExecutorInputError` (ValueError) when schedule, configuration, layers and
epoch do not fit; `failures.StepError` (PeerLostError, StepTimeoutError) when a step aborts.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from planaria.agent.execution import failures, groups, held_layers, tied_embeddings
from planaria.agent.training import model, precision, reduction, semantics
from planaria.contract import errors, instructions, plan, schedule
from planaria.wire import messages

Op = instructions.Op
# Called before each instruction with (step, index in the stream, instruction); failure
# injection and tracing hook in here.
Hook = Callable[[int, int, instructions.Instruction], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One committed step as this worker saw it.

    `loss` is this worker's share of the step's loss: the sum of the losses of the micro-batches
    whose last stage it ran (`num_losses` of them; 0.0 when none). The step's loss, the global
    batch's mean token loss, is the sum of every worker's share. `seconds` is the wall time spent
    per kind of instruction (receives and collectives include their waiting), `send_wait_s` the
    time spent awaiting posted sends. `snapshot_layers` are the layers the Snapshot marker named.
    `step_loss` is the step's loss summed over every worker by the commit barrier (None for a
    stream without an optimizer step, which has no barrier). `barrier_flags` is the sum over
    every worker of what its `barrier_flag` said right before the barrier (the snapshot writer's
    "still busy", so that all workers decide alike whether to snapshot the step).
    """

    step: int
    loss: float
    num_losses: int
    step_s: float
    seconds: Mapping[instructions.Op, float]
    send_wait_s: float
    snapshot_layers: tuple[int, ...]
    step_loss: float | None = None
    barrier_flags: float = 0.0


@dataclass(slots=True, kw_only=True)
class _StepState:
    """What one step keeps between instructions, by global micro-batch index."""

    batch: tuple[int, ...]
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)  # received activation leaves
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)  # activations or losses
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # gradients of the outputs
    sends: list[tuple[plan.WorkerId, dist.Work, torch.Tensor]] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)  # in the order computed
    send_wait_s: float = 0.0
    snapshot: tuple[int, ...] = ()
    step_loss: float | None = None  # set by the commit barrier
    barrier_flags: float = 0.0  # likewise


class Executor:
    """Runs `worker`'s stream of `sched` step after step within one epoch.

    Raises failures.ExecutorInputError when the schedule's model or batch differ from the
    job's, the epoch's rank or size differ from `groups.worker_ranks`, the layers lack one the
    stream computes, or device and backend do not match; planner errors for a stage of several
    workers (`schedule.require_one_worker_per_stage`).
    """

    def __init__(
        self,
        *,
        job: semantics.Job,
        sched: schedule.Schedule,
        worker: plan.WorkerId,
        epoch: groups.Epoch,
        layers: held_layers.HeldLayers,
        abandoned: Callable[[], bool] | None = None,
        barrier_flag: Callable[[], float] | None = None,
    ) -> None:
        schedule.require_one_worker_per_stage(sched)
        self.barrier_flag = barrier_flag
        self.job, self.epoch, self.layers = job, epoch, layers
        self.waits = failures.Waits(epoch, abandoned)
        self.stream = _stream_of(sched, worker)
        self.ranks = groups.worker_ranks(sched)
        self.num_layers = sched.num_layers
        _check_fit(job, sched, self.stream, epoch, layers)
        config = job.config
        self.message_shape = (config.micro_batch_size, config.shape.seq_len, config.shape.d_model)
        self.latched: failures.StepError | None = None
        self.sums = reduction.GradientSums(config.reduction)
        self.tie = tied_embeddings.TieExchange.of(config.shape, sched, worker, layers)
        if self.tie is not None:
            self.sums.defer(self.tie.copies.values())  # summed with the other use first
        layers.clear_grads()  # an aborted step of an earlier epoch may have left some

    def run_step(self, step: int, before: Hook | None = None) -> StepResult:
        """Run every instruction of the stream for step `step`; raises the latched StepError
        when an earlier step aborted, or a new one when this step does."""
        if self.latched is not None:
            raise self.latched
        config, device = self.job.config, self.layers.device
        with (
            reduction.compute_threads(config.reduction),
            precision.matmul_precision(config.precision, device),
        ):
            return self._run_step(step, before)

    def _run_step(self, step: int, before: Hook | None) -> StepResult:
        state = _StepState(batch=self.job.sampler.global_batch(step))
        seconds = dict.fromkeys(Op, 0.0)
        started = time.perf_counter()
        for index, op in enumerate(self.stream.instructions):
            if isinstance(op, instructions.OptimizerStep):  # the hook sees the step's gradients
                seconds[Op.ALL_REDUCE] += self._tie(step, index, op)
                self.sums.settle(self.layers.parameters(op.layers))
            if before is not None:
                before(step, index, op)
            t0 = time.perf_counter()
            with self._latching(step, index, op):
                if isinstance(op, instructions.OptimizerStep) and state.step_loss is None:
                    self._commit_barrier(state)
                self._execute(state, op)
            seconds[op.op] += time.perf_counter() - t0
            if state.sends and index == len(self.stream.instructions) - 1:
                with self._latching(step, index, op):  # a stream without an optimizer step
                    self._await(state)
        return StepResult(
            step=step,
            loss=sum((loss.item() for loss in state.losses), 0.0),
            num_losses=len(state.losses),
            step_s=time.perf_counter() - started,
            seconds=seconds,
            send_wait_s=state.send_wait_s,
            snapshot_layers=state.snapshot,
            step_loss=state.step_loss,
            barrier_flags=state.barrier_flags,
        )

    @contextlib.contextmanager
    def _latching(self, step: int, index: int, op: instructions.Instruction) -> Iterator[None]:
        """A communication failure inside becomes the latched StepError of this position."""
        try:
            yield
        except failures.CommFailure as failure:
            self.latched = failures.step_error(
                failure, step=step, index=index, op=op, timeout_s=self.epoch.timeout_s
            )
            raise self.latched from failure.cause

    def _execute(self, state: _StepState, op: instructions.Instruction) -> None:
        match op:
            case instructions.Forward():
                self._forward(state, op)
            case instructions.Backward():
                self._backward(state, op)
            case instructions.SendActivation():
                output = _get(state.outputs, op.micro_batch, "forward output", op)
                self._send(state, op.destination, op.tag, output.detach())
            case instructions.SendGrad():
                self._send(state, op.destination, op.tag, _input_grad(state, op.micro_batch))
            case instructions.RecvActivation():
                received = self._receive(op.source, op.tag)
                state.inputs[op.micro_batch] = received.requires_grad_(True)
            case instructions.RecvGrad():
                state.grads[op.micro_batch] = self._receive(op.source, op.tag)
            case instructions.AllReduce():
                self._all_reduce(op)
            case instructions.OptimizerStep():
                self._await(state)
                self.layers.step(op.layers)
            case instructions.Snapshot():
                state.snapshot = op.layers

    # --- compute ----------------------------------------------------------------------------

    def _forward(self, state: _StepState, op: instructions.Forward) -> None:
        g = op.micro_batch
        if op.layer_start == 0:
            x = self._micro_batch(state, g)[0]
        else:
            x = _get(state.inputs, g, "activation", op)
        with precision.forward(self.job.config.precision, self.layers.device):
            out = self.layers.run(op.layer_start, op.layer_stop, x)
            if op.layer_stop < self.num_layers:
                state.outputs[g] = out
                return
            targets = self._micro_batch(state, g)[1]
            loss = model.micro_batch_loss(out, targets, self.job.config.global_batch_size)
        state.outputs[g] = loss
        state.losses.append(loss.detach())  # read once at the end: .item() syncs a device

    def _backward(self, state: _StepState, op: instructions.Backward) -> None:
        g = op.micro_batch
        out = _take(state.outputs, g, "forward output", op)
        if op.layer_stop == self.num_layers:
            torch.autograd.backward(out)
        else:
            torch.autograd.backward(out, _take(state.grads, g, "gradient", op))
        self.sums.absorb(self.layers.parameters(range(op.layer_start, op.layer_stop)))

    def _micro_batch(self, state: _StepState, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and targets of global micro-batch g, on the layers' device."""
        b = self.job.config.micro_batch_size
        tokens, targets = self.job.dataset.batch(state.batch[g * b : (g + 1) * b])
        device = self.layers.device
        return tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)

    # --- communication ----------------------------------------------------------------------

    def _send(
        self, state: _StepState, destination: plan.WorkerId, tag: int, tensor: torch.Tensor
    ) -> None:
        payload = tensor.contiguous()
        work = self.waits.post(
            destination, lambda: dist.isend(payload, self.ranks[destination], tag=tag)
        )
        state.sends.append((destination, work, payload))  # the payload must live until sent

    def _receive(self, source: plan.WorkerId, tag: int) -> torch.Tensor:
        buffer = torch.empty(self.message_shape, dtype=self.layers.dtype, device=self.layers.device)
        work = self.waits.post(source, lambda: dist.irecv(buffer, self.ranks[source], tag=tag))
        self.waits.wait(work, source)
        return buffer

    def _all_reduce(self, op: instructions.AllReduce) -> None:
        params = self.layers.parameters(op.layers)
        flat = self.sums.bucket(params)
        group = self.epoch.group(groups.ranks_of(op.group, self.ranks))
        reduce = dist.ReduceOp.SUM  # summed, never averaged: see the module docstring
        work = self.waits.post(None, lambda: dist.all_reduce(flat, reduce, group, async_op=True))
        self.waits.wait(work, None, collective=True)
        self.sums.unpack(params, flat)

    def _tie(self, step: int, index: int, op: instructions.OptimizerStep) -> float:
        """A tied matrix's copies held here take the sum of both uses (`tied_embeddings`);
        the seconds it took (gradient communication, counted with the all-reduces)."""
        if self.tie is None:
            return 0.0
        started = time.perf_counter()
        with self._latching(step, index, op):
            self.tie.exchange(self.sums, self.waits)
        return time.perf_counter() - started

    def _commit_barrier(self, state: _StepState) -> None:
        """Every worker of the epoch reaches this step's first optimizer step, or none passes
        (see the module docstring); the sum of the loss shares is the step's loss. Posted
        sends are awaited first, so nothing after the barrier can fail on a peer."""
        self._await(state)
        share = sum((loss.item() for loss in state.losses), 0.0)
        flag = 0.0 if self.barrier_flag is None else self.barrier_flag()
        total = torch.tensor([share, flag], dtype=torch.float64, device=self.layers.device)
        reduce = dist.ReduceOp.SUM
        work = self.waits.post(
            None, lambda: dist.all_reduce(total, reduce, self.epoch.world, async_op=True)
        )
        self.waits.wait(work, None, collective=True)
        state.step_loss, state.barrier_flags = float(total[0]), float(total[1])

    def _await(self, state: _StepState) -> None:
        """Wait for every posted send of the step to complete."""
        started = time.perf_counter()
        while state.sends:
            destination, work, _ = state.sends.pop(0)
            self.waits.wait(work, destination)
        state.send_wait_s += time.perf_counter() - started


def _get(
    table: dict[int, torch.Tensor], g: int, what: str, op: instructions.Instruction
) -> torch.Tensor:
    """Micro-batch g's tensor; a missing one means the schedule breaks its contract."""
    if g not in table:
        raise errors.ScheduleError(
            f"{op} needs the {what} of micro-batch {g}, which no earlier instruction produced"
        )
    return table[g]


def _take(
    table: dict[int, torch.Tensor], g: int, what: str, op: instructions.Instruction
) -> torch.Tensor:
    """Remove and return micro-batch g's tensor (see `_get`)."""
    tensor = _get(table, g, what, op)
    del table[g]
    return tensor


def _input_grad(state: _StepState, g: int) -> torch.Tensor:
    """The gradient w.r.t. micro-batch g's received activation (its backward has run)."""
    received = state.inputs.pop(g)
    assert received.grad is not None, "SendGrad follows the Backward that computes it"
    return received.grad


def _stream_of(sched: schedule.Schedule, worker: plan.WorkerId) -> schedule.WorkerStream:
    try:
        return sched.stream(worker)
    except KeyError:
        workers = [s.worker for s in sched.streams]
        raise failures.ExecutorInputError(
            f"worker {worker} has no stream in this schedule (its workers are {workers}); "
            "start an executor only on a worker of the plan"
        ) from None


def _check_fit(
    job: semantics.Job,
    sched: schedule.Schedule,
    stream: schedule.WorkerStream,
    epoch: groups.Epoch,
    layers: held_layers.HeldLayers,
) -> None:
    config = job.config
    if sched.num_layers != config.shape.num_planner_layers:
        raise failures.ExecutorInputError(
            f"the schedule has {sched.num_layers} layers but model {config.shape.name!r} has "
            f"{config.shape.num_planner_layers} planner layers; plan for this model"
        )
    samples = sched.num_micro_batches * config.micro_batch_size
    if samples != config.global_batch_size:
        raise failures.ExecutorInputError(
            f"the schedule runs {sched.num_micro_batches} micro-batches of "
            f"{config.micro_batch_size} = {samples} samples but the global batch is "
            f"{config.global_batch_size}; plan for the configured batch sizes"
        )
    _check_epoch(sched, stream, epoch)
    _check_layers(stream, layers)
    _check_device(layers.device, epoch.backend)
    try:
        precision.check_supported(config.precision, layers.device)
    except precision.PrecisionError as exc:
        raise failures.ExecutorInputError(str(exc)) from exc


def _check_epoch(
    sched: schedule.Schedule, stream: schedule.WorkerStream, epoch: groups.Epoch
) -> None:
    rank = groups.worker_ranks(sched)[stream.worker]
    if (epoch.rank, epoch.world_size) != (rank, len(sched.streams)):
        raise failures.ExecutorInputError(
            f"worker {stream.worker} is rank {rank} of {len(sched.streams)} in this schedule "
            f"but joined epoch {epoch.number} as rank {epoch.rank} of {epoch.world_size}; "
            "form the epoch with groups.worker_ranks"
        )


def _check_layers(stream: schedule.WorkerStream, layers: held_layers.HeldLayers) -> None:
    needed = set(stream.layers)
    for op in stream.instructions:
        if isinstance(op, instructions.Forward | instructions.Backward):
            needed.update(range(op.layer_start, op.layer_stop))
    missing = sorted(needed - set(layers.indices))
    if missing:
        raise failures.ExecutorInputError(
            f"worker {stream.worker} computes layers {sorted(needed)} but holds "
            f"{list(layers.indices)}; transfer or build layers {missing} first"
        )


def _check_device(device: torch.device, backend: messages.Backend) -> None:
    wanted = messages.Backend.NCCL if device.type == "cuda" else messages.Backend.GLOO
    if backend is not wanted:
        raise failures.ExecutorInputError(
            f"layers on {device.type} need the {wanted} backend but the epoch uses {backend}; "
            f"form the epoch with {wanted}"
        )
