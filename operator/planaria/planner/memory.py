"""Memory estimator: each worker's peak memory in one step of a schedule (Odyssey eq. 14).

Odyssey eq. 14 splits stage i's peak into static memory, N_l (m_p + m_o + m_g), and the peak of
the stashed activations, (N_pp - i) N_l m_a: in 1F1B stage i holds at most N_pp - i micro-batches
between their forward and backward. We read that count off the worker's own stream instead of
assuming it, which also covers heterogeneous pipelines, fewer micro-batches than stages, and
peers that run rerouted micro-batches. Per worker:

    peak = state + max_in_flight * stash + buffers
    state  = sum over its layers of parameter + gradient + optimizer bytes
    stash  = sum over its layers of activation_bytes, plus the output_bytes of its last layer
             when it sends activations on (the stage output stays referenced until the gradient
             for it arrives and backward runs)
    max_in_flight = the largest number of micro-batches forwarded and not yet backwarded at any
             point of the stream
    buffers = one gradient receive buffer (output_bytes of its last layer) when it receives
             gradients; a received activation is the first layer's input, already in the stash

A stage of k workers splits its state, stash and buffers evenly over them (tensor parallelism),
so a member needs 1/k of each, rounded up.

Precision: the estimate is exactly as good as the profile's bytes, so the profile must be of the
precision the job trains in (`Profile.precision`; the controller's planner refuses another). In
eq. 14's terms, as Planaria trains (docs/numerics.md "Precision"): m_p = 4, m_g = m_p = 4 and
m_o = 8 bytes per parameter in fp32, tf32 and bf16 alike, because bf16 is autocast over float32
master parameters (no 16-bit copy is kept between steps, unlike ZeRO's 2 + 2 + 12); m_a is what
autograd saves per micro-batch: float32 tensors in fp32 and tf32; in bf16 the matmul inputs
and outputs in bfloat16, the residual stream, LayerNorm statistics and log-softmax in float32,
plus the bfloat16 copies of the matmul weights (2 bytes per matmul parameter), which each
micro-batch's forward makes and autograd keeps until its backward, so they count once per
micro-batch in flight. Outputs and gradient buffers are float32 hidden states in every
precision. Measured profiles (`planaria profile --precision`) save these bytes by
construction; synthetic ones model them tensor by tensor (`synthetic`), and
tests/agent/test_profiler.py checks the two agree byte for byte.

`check_memory` is the one verdict: it returns the estimate when every worker fits and raises
`errors.InfeasibleError` naming the worst worker, its peak and the limit otherwise.

Not here: time (`estimator`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planaria.contract import errors, instructions, plan, profile, schedule

_GIB = 2**30


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerMemory:
    """Peak bytes of one worker (a member of a k-worker stage needs the same), by component."""

    worker: plan.WorkerId
    state_bytes: int
    stash_bytes: int
    max_in_flight: int
    buffer_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.state_bytes + self.max_in_flight * self.stash_bytes + self.buffer_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Per-worker peaks, in stream order (by worker id)."""

    workers: tuple[WorkerMemory, ...]

    @property
    def peak_bytes(self) -> int:
        """The largest peak of any worker (0 for an empty schedule)."""
        return max((w.peak_bytes for w in self.workers), default=0)


def max_in_flight(stream: schedule.WorkerStream) -> int:
    """Most micro-batches forwarded and not yet backwarded at once in the stream."""
    live, most = 0, 0
    for op in stream.instructions:
        if isinstance(op, instructions.Forward):
            live += 1
            most = max(most, live)
        elif isinstance(op, instructions.Backward):
            live -= 1
    return most


def _per_member(num_bytes: int, width: int) -> int:
    return -(-num_bytes // width)


def _worker_memory(stream: schedule.WorkerStream, prof: profile.Profile) -> WorkerMemory:
    return stage_memory(
        stream.worker,
        prof.layers[stream.layer_start : stream.layer_stop],
        stream.width,
        max_in_flight=max_in_flight(stream),
        sends_on=any(isinstance(op, instructions.SendActivation) for op in stream.instructions),
        receives_grads=any(isinstance(op, instructions.RecvGrad) for op in stream.instructions),
    )


def stage_memory(
    worker: plan.WorkerId,
    layers: Sequence[profile.LayerProfile],
    width: int,
    *,
    max_in_flight: int,
    sends_on: bool,
    receives_grads: bool,
) -> WorkerMemory:
    """The peak of a worker of a `width`-worker stage of `layers` whose stream has at most
    `max_in_flight` micro-batches in flight, sends activations on (`sends_on`) and receives
    gradients (`receives_grads`): the module docstring's formula."""
    last = layers[-1]
    stash = sum(layer.activation_bytes for layer in layers) + (last.output_bytes if sends_on else 0)
    return WorkerMemory(
        worker=worker,
        state_bytes=_per_member(sum(layer.state_bytes for layer in layers), width),
        stash_bytes=_per_member(stash, width),
        max_in_flight=max_in_flight,
        buffer_bytes=_per_member(last.output_bytes if receives_grads else 0, width),
    )


def estimate_memory(sched: schedule.Schedule, prof: profile.Profile) -> MemoryEstimate:
    """Every worker's peak; PlanInputError when the profile has a different layer count."""
    if prof.num_layers != sched.num_layers:
        raise errors.PlanInputError(
            f"the profile has {prof.num_layers} layers but the plan {sched.num_layers}; "
            "profile the model the plan is for"
        )
    return MemoryEstimate(workers=tuple(_worker_memory(s, prof) for s in sched.streams))


def check_memory(
    sched: schedule.Schedule, prof: profile.Profile, memory_bytes: int
) -> MemoryEstimate:
    """The estimate when every worker's peak is at most `memory_bytes`; else InfeasibleError
    naming the worker with the highest peak, its components and the limit."""
    if memory_bytes < 1:
        raise errors.PlanInputError(f"memory_bytes is {memory_bytes}; give the GPU memory, >= 1")
    estimate = estimate_memory(sched, prof)
    over = [w for w in estimate.workers if w.peak_bytes > memory_bytes]
    if over:
        worst = max(over, key=lambda w: (w.peak_bytes, -w.worker))
        stream = sched.stream(worst.worker)
        raise errors.InfeasibleError(
            f"worker {worst.worker} (pipeline {stream.pipeline} stage {stream.stage}, layers "
            f"[{stream.layer_start}, {stream.layer_stop})) needs {worst.peak_bytes / _GIB:.2f} "
            f"GiB at peak (state {worst.state_bytes / _GIB:.2f} GiB + {worst.max_in_flight} "
            f"micro-batches in flight x {worst.stash_bytes / _GIB:.2f} GiB + buffers "
            f"{worst.buffer_bytes / _GIB:.2f} GiB) but has {memory_bytes / _GIB:.2f} GiB"
            f"{f'; {len(over)} workers are over' if len(over) > 1 else ''}: use more stages, "
            "fewer layers on this stage or fewer micro-batches in flight"
        )
    return estimate
