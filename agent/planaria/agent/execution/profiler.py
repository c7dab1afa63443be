"""The measuring profiler: per-layer costs of the real model on this machine, for the planner.

`measure_profile` builds the model's planner layers (`planaria.agent.training.model`) and, for one
micro-batch of random tokens, times each layer in place, the way a pipeline stage runs it:

- passes through the whole model: the forward layer by layer with autograd recording and every
  earlier layer's activations still held (the head includes the loss, `model.micro_batch_loss`,
  as the last stage computes it); the backward layer by layer from the loss, each from the
  gradient the next layer sent back (a stage boundary may fall between any two layers), into
  gradients the previous pass left (as every micro-batch of a step but the first accumulates);
  then each layer's own AdamW step. Each time is the median of `repeats` passes after `warmup`
  untimed ones; on CUDA the device is synchronised around each. Timing a layer alone in a loop
  instead comes out faster than in a stage (on CPU it reuses the memory it just freed: blocks
  late in the model measured 40% faster alone), and the estimator came out short.
- bytes, from tensor sizes: parameters and gradients (numel * element size), AdamW's two moments
  (2 x parameter bytes), activations (the distinct storages autograd saves for backward during
  the forward, found with `torch.autograd.graph.saved_tensors_hooks`, parameters excluded) and
  the output sent downstream (the head sends nothing).

Everything runs in the job's precision, as the executor runs it (`precision`): the forward (loss
included) under bfloat16 autocast for bf16, CUDA matmuls on TF32 for tf32. So a bf16 profile's
activations are what autocast saves: mostly bfloat16, the residual stream and LayerNorm
statistics float32, and the bfloat16 copies of the matmul weights (saved per micro-batch, so
they count as activations); its parameters, gradients and moments are float32 as in fp32.

One device is one "GPU": every layer has timings for one GPU per stage only. The links are
measured, not assumed: two gloo process groups in this process, joined through an in-memory
store, send tensors to each other over the loopback interface; the one-way time of a tiny
message is the latency and the extra time of a 16 MiB message gives the bandwidth. The two
also all-reduce a tiny and a 16 MiB tensor, which gives the ring all-reduce's own per-step
latency and bandwidth (`measure_loopback_link`; gloo's all-reduce is about 3x slower than sends
of the same bytes, so point-to-point figures would make all-reduces look cheap). The same
link stands for intra- and inter-node traffic (all workers of a local run share this machine),
and the accelerator is named accordingly, e.g. "cpu-gloo-loopback". `memory_bytes` is the
machine's RAM on CPU, the device's memory on CUDA.

Errors:

    ProfilerError
    └── ProfilerInputError (ValueError)   sizes out of range, an unusable device
"""

from __future__ import annotations

import datetime
import os
import statistics
import threading
import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from planaria.agent.training import model, precision
from planaria.contract import profile, shapes
from planaria.wire import messages

PROFILE_SEED = 0  # parameter values do not change costs; any fixed seed will do
SMALL_MESSAGE_BYTES = 4
LARGE_MESSAGE_BYTES = 16 * 2**20
LINK_REPEATS = 5
LINK_TIMEOUT = datetime.timedelta(seconds=30)


class ProfilerError(Exception):
    """Base of the errors this module raises on purpose."""


class ProfilerInputError(ProfilerError, ValueError):
    """A measurement request that cannot be carried out as given; the message says what to fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerMeasurement:
    """Median seconds and the activation bytes of one layer for one micro-batch."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    activation_bytes: int
    output_bytes: int


def measure_profile(
    shape: shapes.ModelShape,
    micro_batch_size: int,
    *,
    warmup: int,
    repeats: int,
    device: str = "cpu",
    arithmetic: messages.Precision = messages.Precision.FP32,
) -> profile.Profile:
    """A measured (synthetic=False) profile of `shape` for micro-batches of `micro_batch_size`,
    computed in `arithmetic` (the job's precision).

    Raises ProfilerInputError when micro_batch_size or repeats is < 1, warmup < 0, the
    device does not exist here, or it cannot compute in `arithmetic` (bf16 before Ampere).
    """
    _check_counts(micro_batch_size, warmup, repeats)
    target = _device(device)
    try:
        precision.check_supported(arithmetic, target)
    except precision.PrecisionError as exc:
        raise ProfilerInputError(str(exc)) from exc
    link = measure_loopback_link()
    with precision.matmul_precision(arithmetic, target):
        layers = _measure_layers(shape, micro_batch_size, target, arithmetic, (warmup, repeats))
    return profile.Profile(
        model=shape.name,
        accelerator=f"{_accelerator_name(target)}-gloo-loopback",
        micro_batch_size=micro_batch_size,
        memory_bytes=_memory_bytes(target),
        layers=tuple(layers),
        intra_node=link,
        inter_node=link,
        synthetic=False,
        precision=arithmetic,
    )


def _measure_layers(
    shape: shapes.ModelShape,
    micro_batch_size: int,
    target: torch.device,
    arithmetic: messages.Precision,
    runs: tuple[int, int],
) -> list[profile.LayerProfile]:
    """Every planner layer's bytes (`measure_layer`, one untimed run each) and its times from
    `runs` = (warmup, repeats) passes of the whole model in sequence (`_time_in_sequence`)."""
    modules = [
        model.build_layer(shape, PROFILE_SEED, i, target) for i in range(shape.num_planner_layers)
    ]
    hidden = _token_ids(shape, micro_batch_size, target)
    sizes = []
    for layer in modules:
        sizes.append(
            measure_layer(shape, layer, hidden, warmup=0, repeats=1, arithmetic=arithmetic)
        )
        with torch.no_grad(), precision.forward(arithmetic, target):
            hidden = layer(hidden)  # the next layer's input, as the stage before would send it
    times = _time_in_sequence(shape, modules, micro_batch_size, arithmetic, runs)
    timed = [
        replace(
            size, forward_s=t["forward_s"], backward_s=t["backward_s"], optimizer_s=t["optimizer_s"]
        )
        for size, t in zip(sizes, times, strict=True)
    ]
    return [
        _layer_profile(model.layer_name(shape, i), layer, measured)
        for i, (layer, measured) in enumerate(zip(modules, timed, strict=True))
    ]


def _time_in_sequence(
    shape: shapes.ModelShape,
    modules: Sequence[nn.Module],
    micro_batch_size: int,
    arithmetic: messages.Precision,
    runs: tuple[int, int],
) -> list[dict[str, float]]:
    """Per layer, the median forward, backward and AdamW seconds over `repeats` passes after
    `warmup` untimed ones. A pass runs a micro-batch through every layer in order, keeping each
    layer's activations until the backward (as a stage does), then the backward from the loss
    layer by layer, each from the gradient the next one sent (a stage boundary may fall between
    any two layers), then each layer's optimizer step. Gradients are not cleared between passes,
    so a timed backward accumulates into existing gradients, as every micro-batch of a step but
    its first does in the executor. Timing the layers in place rather than one at a time in a
    loop matters on CPU: a layer timed alone reuses the memory it just freed, while in a stage
    its outputs land in fresh pages (measured: blocks late in the model 40% slower)."""
    warmup, repeats = runs
    device = next(modules[0].parameters()).device
    ids = _token_ids(shape, micro_batch_size, device)
    targets = torch.randint(0, shape.vocab_size, ids.shape, device=device)
    optimizers = [model.make_optimizer(layer, model.OptimizerConfig()) for layer in modules]
    timed = [_pass(modules, optimizers, ids, targets, arithmetic) for _ in range(warmup + repeats)]
    return [
        {
            phase: statistics.median(run[i][phase] for run in timed[warmup:])
            for phase in ("forward_s", "backward_s", "optimizer_s")
        }
        for i in range(len(modules))
    ]


def _pass(
    modules: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    ids: torch.Tensor,
    targets: torch.Tensor,
    arithmetic: messages.Precision,
) -> list[dict[str, float]]:
    """One timed pass (`_time_in_sequence`): seconds per layer and phase."""
    times: list[dict[str, float]] = [{} for _ in modules]
    inputs, outputs = [], []
    x = ids
    with precision.forward(arithmetic, ids.device):
        for i, layer in enumerate(modules):
            leaf = x if i == 0 else x.detach().requires_grad_(True)
            start = _now(ids.device)
            x = _forward(layer, leaf, targets if i == len(modules) - 1 else None)
            times[i]["forward_s"] = _now(ids.device) - start
            inputs.append(leaf)
            outputs.append(x)
    gradient = None
    for i in reversed(range(len(modules))):
        start = _now(ids.device)
        torch.autograd.backward(outputs.pop(), gradient)
        times[i]["backward_s"] = _now(ids.device) - start
        gradient = inputs.pop().grad
    for i, optimizer in enumerate(optimizers):
        start = _now(ids.device)
        optimizer.step()
        times[i]["optimizer_s"] = _now(ids.device) - start
    return times


def measure_layer(
    shape: shapes.ModelShape,
    layer: nn.Module,
    x: torch.Tensor,
    *,
    warmup: int,
    repeats: int,
    arithmetic: messages.Precision = messages.Precision.FP32,
) -> LayerMeasurement:
    """Time forward, backward and AdamW step of `layer` on input `x` (one micro-batch) with the
    forward in `arithmetic`: the medians of `repeats` runs after `warmup` untimed ones."""
    # Random targets for the head's loss: the values do not change its cost.
    is_head = model.is_head(layer)
    targets = torch.randint(0, shape.vocab_size, x.shape[:2], device=x.device) if is_head else None
    optimizer = model.make_optimizer(layer, model.OptimizerConfig())
    runs = [_run_once(layer, optimizer, x, targets, arithmetic) for _ in range(warmup + repeats)][
        warmup:
    ]
    return LayerMeasurement(
        forward_s=statistics.median(run.forward_s for run in runs),
        backward_s=statistics.median(run.backward_s for run in runs),
        optimizer_s=statistics.median(run.optimizer_s for run in runs),
        activation_bytes=runs[-1].activation_bytes,
        output_bytes=runs[-1].output_bytes,
    )


def _run_once(
    layer: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    targets: torch.Tensor | None,
    arithmetic: messages.Precision,
) -> LayerMeasurement:
    """One forward, backward and optimizer step, each timed; x is a fresh leaf every run."""
    inputs = x if x.dtype == torch.int64 else x.detach().requires_grad_(True)
    with _SavedBytes(layer) as saved, precision.forward(arithmetic, x.device):
        start = _now(x.device)
        output = _forward(layer, inputs, targets)
        forward_s = _now(x.device) - start
    gradient = None if targets is not None else torch.randn_like(output)
    start = _now(x.device)
    torch.autograd.backward(output, gradient)
    backward_s = _now(x.device) - start
    start = _now(x.device)
    optimizer.step()
    optimizer_s = _now(x.device) - start
    optimizer.zero_grad(set_to_none=True)
    return LayerMeasurement(
        forward_s=forward_s,
        backward_s=backward_s,
        optimizer_s=optimizer_s,
        activation_bytes=saved.nbytes,
        output_bytes=0 if targets is not None else output.numel() * output.element_size(),
    )


def _forward(layer: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """The layer's output; for the head (given targets), the micro-batch loss."""
    output: torch.Tensor = layer(inputs)
    if targets is None:
        return output
    return model.micro_batch_loss(output, targets, inputs.shape[0])


class _SavedBytes:
    """Context manager summing the distinct storages autograd saves for backward.

    Storages are told apart by data pointer, so a tensor saved by several operations (or views
    of one buffer) counts once; the layer's parameters are saved too but are not activations.
    """

    def __init__(self, layer: nn.Module) -> None:
        self._parameters = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        self._storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @property
    def nbytes(self) -> int:
        return sum(self._storages.values())

    def __enter__(self) -> _SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hooks.__exit__(*exc_info)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._parameters:
            self._storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def _layer_profile(name: str, layer: nn.Module, measured: LayerMeasurement) -> profile.LayerProfile:
    parameter_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
    return profile.LayerProfile(
        name=name,
        forward_s=(measured.forward_s,),
        backward_s=(measured.backward_s,),
        parameter_bytes=parameter_bytes,
        gradient_bytes=parameter_bytes,
        optimizer_bytes=2 * parameter_bytes,  # AdamW: exp_avg and exp_avg_sq, same dtype
        activation_bytes=measured.activation_bytes,
        output_bytes=measured.output_bytes,
        optimizer_s=measured.optimizer_s,
    )


# --- links --------------------------------------------------------------------------------------


def measure_loopback_link(repeats: int = LINK_REPEATS) -> profile.LinkProfile:
    """Latency and bandwidth of gloo point-to-point sends and all-reduces over this machine's
    loopback.

    Two gloo process groups (ranks 0 and 1) live in this process. Point to point: rank 0 sends
    to rank 1, the median one-way time is taken for a 4-byte and a 16 MiB tensor; latency = the
    small time, bandwidth = (large - small bytes) / (large - small time). All-reduce: both ranks
    reduce a 4-byte and a 16 MiB tensor; a ring of p = 2 takes 2 latency + b / bandwidth
    (`LinkProfile.allreduce_s`), so the per-step latency is half the small time and the
    bandwidth (large - small bytes) / (large - small time).
    """
    groups = _loopback_groups()
    small = _one_way_s(groups, SMALL_MESSAGE_BYTES, repeats)
    large = _one_way_s(groups, LARGE_MESSAGE_BYTES, repeats)
    small_reduce = _allreduce_s(groups, SMALL_MESSAGE_BYTES, repeats)
    large_reduce = _allreduce_s(groups, LARGE_MESSAGE_BYTES, repeats)
    extra_bytes = LARGE_MESSAGE_BYTES - SMALL_MESSAGE_BYTES
    # Guard against a large message timed no slower than a small one (timer noise).
    return profile.LinkProfile(
        bandwidth_bytes_per_s=extra_bytes / max(large - small, 1e-9),
        latency_s=small,
        allreduce_bandwidth_bytes_per_s=extra_bytes / max(large_reduce - small_reduce, 1e-9),
        allreduce_latency_s=small_reduce / 2,
    )


def _loopback_groups() -> tuple[dist.ProcessGroupGloo, dist.ProcessGroupGloo]:
    """Ranks 0 and 1 of one gloo group, both in this process (each joins from its own thread,
    because creating a rank blocks until its peer connects)."""
    # HashStore is public torch API, but torch's stubs do not re-export it.
    store = dist.HashStore()  # type: ignore[attr-defined]
    made: dict[int, dist.ProcessGroupGloo] = {}

    def join(rank: int) -> None:
        made[rank] = dist.ProcessGroupGloo(store, rank, 2, LINK_TIMEOUT)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(made) != 2:
        raise ProfilerError("could not connect two gloo ranks over loopback")
    return made[0], made[1]


class _PointToPoint(typing.Protocol):
    """The send / recv / allreduce a gloo backend has at run time (torch's stubs leave them
    out)."""

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work: ...
    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work: ...
    def allreduce(self, tensors: list[torch.Tensor]) -> dist.Work: ...


def _one_way_s(
    groups: tuple[dist.ProcessGroupGloo, dist.ProcessGroupGloo], num_bytes: int, repeats: int
) -> float:
    """Median seconds from posting a send of `num_bytes` until the receiver has it all."""
    sender, receiver = (typing.cast(_PointToPoint, group) for group in groups)
    source = torch.zeros(max(num_bytes // 4, 1), dtype=torch.float32)
    sink = torch.empty_like(source)
    times = []
    for _ in range(repeats + 1):  # the first send also sets up the connection: not timed
        start = time.perf_counter()
        received = receiver.recv([sink], 0, 0)
        sender.send([source], 1, 0).wait()
        received.wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _allreduce_s(
    groups: tuple[dist.ProcessGroupGloo, dist.ProcessGroupGloo], num_bytes: int, repeats: int
) -> float:
    """Median seconds of a SUM all-reduce of `num_bytes` over both ranks (each rank's work is
    posted from this thread; gloo runs it on its own threads)."""
    tensors = [torch.zeros(max(num_bytes // 4, 1), dtype=torch.float32) for _ in groups]
    times = []
    for _ in range(repeats + 1):  # the first also sets up the algorithm's buffers: not timed
        start = time.perf_counter()
        works = [
            typing.cast(_PointToPoint, group).allreduce([t])
            for group, t in zip(groups, tensors, strict=True)
        ]
        for work in works:
            work.wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


# --- machine ------------------------------------------------------------------------------------


def _check_counts(micro_batch_size: int, warmup: int, repeats: int) -> None:
    if micro_batch_size < 1:
        raise ProfilerInputError(f"micro-batch size must be >= 1 (got {micro_batch_size})")
    if repeats < 1:
        raise ProfilerInputError(f"repeats must be >= 1 (got {repeats})")
    if warmup < 0:
        raise ProfilerInputError(f"warmup must be >= 0 (got {warmup})")


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ProfilerInputError(
            f"device {name!r} is not a torch device; use cpu or cuda[:N]"
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProfilerInputError(f"device {name!r}: this machine has no CUDA device; use cpu")
    if device.type not in ("cpu", "cuda"):
        raise ProfilerInputError(f"device {name!r} is not supported; use cpu or cuda[:N]")
    return device


def _token_ids(
    shape: shapes.ModelShape, micro_batch_size: int, device: torch.device
) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(PROFILE_SEED)
    ids = torch.randint(0, shape.vocab_size, (micro_batch_size, shape.seq_len), generator=generator)
    return ids.to(device)


def _now(device: torch.device) -> float:
    """A wall-clock reading after all queued work on `device` has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _accelerator_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).lower().replace(" ", "-")
    return "cpu"


def _memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
