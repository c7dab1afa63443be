"""The profile: what the planner knows about a model on some hardware.

One `LayerProfile` per planner layer (embedding, blocks, head) with forward/backward seconds of
one micro-batch for every number of GPUs that may share a stage (1..M, intra-stage tensor
parallelism), the layer's memory, and the bytes it sends downstream; `LinkProfile`s model the
intra- and inter-node networks (bandwidth + latency), from which activation sends and gradient
all-reduces are costed.

This module holds the validated in-memory form only. Reading and writing the versioned file
format (JSON, documented in docs/profile-format.md) happens in `planaria.spec`; measuring and
synthesising profiles happen in the agent's profiler and `planaria.planner.synthetic`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planaria.contract import errors
from planaria.contract import precision as arithmetic


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProfile:
    """Costs of one planner layer for one micro-batch.

    `forward_s[k - 1]` / `backward_s[k - 1]` are seconds when k GPUs of one node share the stage.
    Bytes are per worker holding the layer (k = 1): parameters, their gradients, optimizer state
    (AdamW: two fp32 moments), activations stashed per in-flight micro-batch for the backward pass,
    and the output activation sent to the next stage per micro-batch. `optimizer_s` is the
    optimizer step of the layer on one GPU.
    """

    name: str
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    output_bytes: int
    optimizer_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.forward_s:
            raise errors.PlanInputError(f"layer {self.name!r}: forward_s is empty")
        if len(self.forward_s) != len(self.backward_s):
            raise errors.PlanInputError(
                f"layer {self.name!r}: forward_s has {len(self.forward_s)} entries but "
                f"backward_s has {len(self.backward_s)}; give one time per GPU count 1..M in both"
            )
        for field in ("forward_s", "backward_s"):
            for k, value in enumerate(getattr(self, field), start=1):
                if not (math.isfinite(value) and value >= 0):
                    raise errors.PlanInputError(
                        f"layer {self.name!r}: {field} for {k} GPU(s) is {value}; "
                        "times must be finite and >= 0"
                    )
        for field in (
            "parameter_bytes",
            "gradient_bytes",
            "optimizer_bytes",
            "activation_bytes",
            "output_bytes",
        ):
            if getattr(self, field) < 0:
                raise errors.PlanInputError(f"layer {self.name!r}: {field} must be >= 0")
        if not (math.isfinite(self.optimizer_s) and self.optimizer_s >= 0):
            raise errors.PlanInputError(f"layer {self.name!r}: optimizer_s must be finite, >= 0")

    @property
    def max_gpus(self) -> int:
        """The largest number of GPUs sharing a stage that this layer has timings for."""
        return len(self.forward_s)

    @property
    def state_bytes(self) -> int:
        """Memory the layer's state occupies on a worker holding it: params, grads, optimizer."""
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkProfile:
    """A network link: time to move b bytes point to point is latency_s + b / bandwidth.

    A ring all-reduce runs 2(p-1) steps of b/p bytes; its per-step latency and bandwidth are
    `allreduce_latency_s` and `allreduce_bandwidth_bytes_per_s` when the profile measured a
    collective (a library's all-reduce pays for synchronisation, the reduction's arithmetic and
    its own chunking, so it is slower than point-to-point sends of the same bytes: gloo on
    loopback about 3x), else the point-to-point figures (analytic profiles, older files).
    """

    bandwidth_bytes_per_s: float
    latency_s: float
    allreduce_bandwidth_bytes_per_s: float | None = None
    allreduce_latency_s: float | None = None

    def __post_init__(self) -> None:
        for bandwidth in (self.bandwidth_bytes_per_s, self.allreduce_bandwidth_bytes_per_s):
            if bandwidth is not None and not (math.isfinite(bandwidth) and bandwidth > 0):
                raise errors.PlanInputError("link bandwidths must be finite and > 0")
        for latency in (self.latency_s, self.allreduce_latency_s):
            if latency is not None and not (math.isfinite(latency) and latency >= 0):
                raise errors.PlanInputError("link latencies must be finite and >= 0")

    def transfer_s(self, num_bytes: float) -> float:
        """Seconds to send `num_bytes` point to point over this link."""
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s

    def allreduce_s(self, num_bytes: float, num_participants: int) -> float:
        """Ring all-reduce of `num_bytes` over `num_participants`: 2(p-1) steps of b/p bytes,
        each costing the collective's per-step latency plus b/p over its bandwidth."""
        if num_participants <= 1:
            return 0.0
        p = num_participants
        latency = self.latency_s if self.allreduce_latency_s is None else self.allreduce_latency_s
        bandwidth = self.allreduce_bandwidth_bytes_per_s or self.bandwidth_bytes_per_s
        return 2 * (p - 1) * (latency + num_bytes / p / bandwidth)


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A model's per-layer costs on one kind of accelerator, for one micro-batch size.

    `memory_bytes` is the memory of one accelerator the profile was made for (the planner's
    default memory limit). `synthetic` marks analytic profiles (not measured). `precision` is
    the arithmetic the costs are for: a job plans with a profile of the precision it trains in.
    """

    model: str
    accelerator: str
    micro_batch_size: int
    memory_bytes: int
    layers: tuple[LayerProfile, ...]
    intra_node: LinkProfile
    inter_node: LinkProfile
    synthetic: bool = False
    precision: arithmetic.Precision = arithmetic.Precision.FP32

    def __post_init__(self) -> None:
        if not self.layers:
            raise errors.PlanInputError("profile has no layers")
        if self.micro_batch_size < 1:
            raise errors.PlanInputError("profile micro_batch_size must be >= 1")
        if self.memory_bytes < 1:
            raise errors.PlanInputError("profile memory_bytes must be >= 1")
        widths = {layer.max_gpus for layer in self.layers}
        if len(widths) != 1:
            raise errors.PlanInputError(
                f"profile layers disagree on the GPU counts they have timings for "
                f"({sorted(widths)}); every layer needs times for 1..M GPUs with the same M"
            )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def max_gpus_per_stage(self) -> int:
        """M: the stage widths (GPUs of one node sharing a stage) this profile can cost."""
        return self.layers[0].max_gpus
