"""Synthetic profiles: a model's per-layer costs computed from its shape and an accelerator spec.

Used when no measurement on the target hardware exists (planning for a cluster we are not on,
simulations, tests at paper scale). The model, stated once here and in docs/profile-format.md,
and copied into every synthetic profile's `assumptions` text:

- Work per layer and micro-batch (b sequences of s tokens, width d, FFN width f, vocab V):
  a block does 2 * (4d^2 + 2df) * b*s matmul FLOPs plus 4*b*s^2*d for attention scores and
  their weighted sum; the head 2*d*V*b*s; backward twice the forward FLOPs. The embedding is a
  lookup: memory-bound, costed by the bytes it moves, 2*(2bsd + sd) forward and 2bsd + 2(V+s)d
  backward (reading the gradient, writing the dense embedding gradient).
- Time = FLOPs / (peak * compute_efficiency) + bytes / (memory bandwidth * memory_efficiency).
- k GPUs of one node sharing a stage (k = 1..gpus_per_node) run Megatron-style tensor
  parallelism (Shoeybi et al. 2019, §3): the layer's time divides by k, plus ring all-reduces
  over the intra-node link of b*s*d*2 bytes, 2 forward and 2 backward per block, 1 forward for
  the vocab-parallel embedding, 1 backward for the head (and 3 of b*s*4 bytes forward for its
  vocab-parallel cross entropy).
- Memory per parameter: mixed-precision Adam, 2 bytes fp16/bf16 parameter + 2 bytes gradient
  + 12 bytes optimizer state (fp32 master copy and two moments) = 16 bytes (ZeRO, Rajbhandari
  et al. 2020, §3.1).
- Activations stashed per micro-batch, no recomputation: a block s*b*d*(34 + 5*a*s/d) bytes
  (Korthikanti et al. 2022, §4.1, a = heads); the embedding its dropout mask and token ids,
  b*s*(d + 8); the head its layer-norm and projection inputs and the fp32 logits, 4bsd + 4bsV.
- Output sent to the next stage: b*s*d*2 bytes (fp16/bf16 hidden states); the head sends
  nothing.
- Optimizer step: Adam reads gradient, master copy and moments and writes them back plus the
  low-precision parameter, 28 bytes per parameter, at effective memory bandwidth.

Pure: no I/O. Measured profiles come from the agent's profiler; the file format is in
`planaria.spec.profile_file`.
"""

from __future__ import annotations

from dataclasses import dataclass

from planaria.contract import errors, profile, shapes
from planaria.planner import accelerators

# ZeRO §3.1: mixed-precision Adam keeps 2 + 2 + 12 = 16 bytes per parameter.
PARAMETER_BYTES = 2
GRADIENT_BYTES = 2
OPTIMIZER_STATE_BYTES = 12
# Adam step traffic per parameter: read grad (2) + master/m/v (12), write master/m/v (12) and
# the low-precision parameter (2).
OPTIMIZER_TRAFFIC_BYTES = 28
HIDDEN_BYTES = 2  # one fp16/bf16 activation element
LOSS_BYTES = 4  # one fp32 value per token in the vocab-parallel cross entropy
TOKEN_ID_BYTES = 8  # int64 token ids


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWork:
    """What one planner layer does for one micro-batch, independent of the hardware.

    FLOPs are matmul work; memory bytes are traffic of memory-bound kernels (the embedding
    lookup); all-reduce bytes list the tensor-parallel all-reduces run when k > 1 GPUs share
    the stage. Activation and output bytes are per micro-batch on one GPU.
    """

    name: str
    num_parameters: int
    forward_flops: float
    backward_flops: float
    forward_memory_bytes: float
    backward_memory_bytes: float
    forward_allreduce_bytes: tuple[float, ...]
    backward_allreduce_bytes: tuple[float, ...]
    activation_bytes: int
    output_bytes: int


def block_work(shape: shapes.ModelShape, micro_batch_size: int, index: int) -> LayerWork:
    """One transformer block: attention and MLP matmuls, Korthikanti activations, 4 all-reduces."""
    b, s, d, f = micro_batch_size, shape.seq_len, shape.d_model, shape.ffn_dim
    tokens = b * s
    # qkv (3d^2) + attention projection (d^2) + MLP (2df) weights, 2 FLOPs per multiply-add;
    # QK^T and attention @ V add 2*b*s^2*d each.
    forward = 2 * (4 * d * d + 2 * d * f) * tokens + 4 * b * s * s * d
    hidden = tokens * d * HIDDEN_BYTES
    return LayerWork(
        name=f"block.{index}",
        num_parameters=shape.block_parameters(),
        forward_flops=forward,
        backward_flops=2 * forward,
        forward_memory_bytes=0.0,
        backward_memory_bytes=0.0,
        forward_allreduce_bytes=(hidden, hidden),
        backward_allreduce_bytes=(hidden, hidden),
        # Korthikanti et al. 2022 §4.1: sbh(34 + 5as/h) bytes without recomputation.
        activation_bytes=34 * s * b * d + 5 * shape.num_heads * s * s * b,
        output_bytes=hidden,
    )


def embedding_work(shape: shapes.ModelShape, micro_batch_size: int) -> LayerWork:
    """Token + position lookup: memory-bound, one forward all-reduce when vocab-parallel."""
    b, s, d, v = micro_batch_size, shape.seq_len, shape.d_model, shape.vocab_size
    hidden = b * s * d * HIDDEN_BYTES
    return LayerWork(
        name="embedding",
        num_parameters=shape.embedding_parameters(),
        forward_flops=0.0,
        backward_flops=0.0,
        # Read b*s token rows and s position rows, write the b*s*d sum.
        forward_memory_bytes=2 * hidden + s * d * HIDDEN_BYTES,
        # Read the incoming gradient, write the dense token and position gradients.
        backward_memory_bytes=hidden + (v + s) * d * HIDDEN_BYTES,
        forward_allreduce_bytes=(hidden,),
        backward_allreduce_bytes=(),
        activation_bytes=b * s * (d + TOKEN_ID_BYTES),
        output_bytes=hidden,
    )


def head_work(shape: shapes.ModelShape, micro_batch_size: int) -> LayerWork:
    """Final norm + output projection + loss; sends nothing downstream."""
    b, s, d, v = micro_batch_size, shape.seq_len, shape.d_model, shape.vocab_size
    tokens = b * s
    forward = 2 * d * v * tokens
    return LayerWork(
        name="head",
        num_parameters=shape.head_parameters(),
        forward_flops=forward,
        backward_flops=2 * forward,
        forward_memory_bytes=0.0,
        backward_memory_bytes=0.0,
        # Megatron's vocab-parallel cross entropy all-reduces max, target logit and sum of exps.
        forward_allreduce_bytes=(tokens * LOSS_BYTES,) * 3,
        backward_allreduce_bytes=(tokens * d * HIDDEN_BYTES,),
        activation_bytes=2 * tokens * d * HIDDEN_BYTES + tokens * v * LOSS_BYTES,
        output_bytes=0,
    )


def model_work(shape: shapes.ModelShape, micro_batch_size: int) -> tuple[LayerWork, ...]:
    """Work of every planner layer of `shape`, in order: embedding, blocks, head."""
    if micro_batch_size < 1:
        raise errors.PlanInputError(f"micro_batch_size must be >= 1 (got {micro_batch_size})")
    blocks = tuple(block_work(shape, micro_batch_size, i) for i in range(shape.num_layers))
    return (embedding_work(shape, micro_batch_size), *blocks, head_work(shape, micro_batch_size))


def compute_s(
    flops: float, memory_bytes: float, accelerator: accelerators.Accelerator, num_gpus: int
) -> float:
    """Seconds of computation when `num_gpus` share the work evenly (tensor parallelism)."""
    one_gpu = flops / accelerator.effective_flops
    one_gpu += memory_bytes / accelerator.effective_memory_bandwidth
    return one_gpu / num_gpus


def allreduce_s(
    sizes: tuple[float, ...], accelerator: accelerators.Accelerator, num_gpus: int
) -> float:
    """Seconds of the tensor-parallel all-reduces of `sizes` bytes among `num_gpus` of a node."""
    return sum(accelerator.intra_node.allreduce_s(size, num_gpus) for size in sizes)


def forward_s(work: LayerWork, accelerator: accelerators.Accelerator, num_gpus: int) -> float:
    """Forward seconds of one micro-batch on `num_gpus` GPUs of one node."""
    compute = compute_s(work.forward_flops, work.forward_memory_bytes, accelerator, num_gpus)
    return compute + allreduce_s(work.forward_allreduce_bytes, accelerator, num_gpus)


def backward_s(work: LayerWork, accelerator: accelerators.Accelerator, num_gpus: int) -> float:
    """Backward seconds of one micro-batch on `num_gpus` GPUs of one node."""
    compute = compute_s(work.backward_flops, work.backward_memory_bytes, accelerator, num_gpus)
    return compute + allreduce_s(work.backward_allreduce_bytes, accelerator, num_gpus)


def layer_profile(
    work: LayerWork, accelerator: accelerators.Accelerator, gpus_per_node: int
) -> profile.LayerProfile:
    """The planner's view of `work` on `accelerator`, timed for 1..gpus_per_node GPUs."""
    widths = range(1, gpus_per_node + 1)
    n = work.num_parameters
    return profile.LayerProfile(
        name=work.name,
        forward_s=tuple(forward_s(work, accelerator, k) for k in widths),
        backward_s=tuple(backward_s(work, accelerator, k) for k in widths),
        parameter_bytes=n * PARAMETER_BYTES,
        gradient_bytes=n * GRADIENT_BYTES,
        optimizer_bytes=n * OPTIMIZER_STATE_BYTES,
        activation_bytes=work.activation_bytes,
        output_bytes=work.output_bytes,
        optimizer_s=n * OPTIMIZER_TRAFFIC_BYTES / accelerator.effective_memory_bandwidth,
    )


def synthesize(
    shape: shapes.ModelShape,
    accelerator: accelerators.Accelerator,
    micro_batch_size: int,
    gpus_per_node: int,
) -> profile.Profile:
    """An analytic profile of `shape` on `accelerator` (the model in this module's docstring).

    Raises PlanInputError when micro_batch_size or gpus_per_node is < 1.
    """
    if gpus_per_node < 1:
        raise errors.PlanInputError(f"gpus_per_node must be >= 1 (got {gpus_per_node})")
    layers = tuple(
        layer_profile(work, accelerator, gpus_per_node)
        for work in model_work(shape, micro_batch_size)
    )
    return profile.Profile(
        model=shape.name,
        accelerator=accelerator.name,
        micro_batch_size=micro_batch_size,
        memory_bytes=accelerator.memory_bytes,
        layers=layers,
        intra_node=accelerator.intra_node,
        inter_node=accelerator.inter_node,
        synthetic=True,
    )


def assumptions(accelerator: accelerators.Accelerator, gpus_per_node: int) -> str:
    """The free-text `assumptions` a synthetic profile file carries: the model and its numbers."""
    return (
        f"Analytic profile (planaria.planner.synthetic), not measured. Accelerator "
        f"{accelerator.name}: {accelerator.peak_flops / 1e12:g} TFLOP/s peak at "
        f"{accelerator.compute_efficiency:g} efficiency, "
        f"{accelerator.memory_bandwidth_bytes_per_s / 1e9:g} GB/s memory at "
        f"{accelerator.memory_efficiency:g} efficiency ({accelerator.source}); "
        f"{gpus_per_node} GPU(s) per node. Block forward FLOPs 2*(4d^2+2df)*b*s + 4*b*s^2*d, "
        "head 2*d*V*b*s, backward 2x forward; embedding memory-bound (bytes moved / bandwidth). "
        "k GPUs per stage: time/k plus Megatron tensor-parallel ring all-reduces of b*s*d*2 "
        "bytes over the intra-node link (2 forward + 2 backward per block). Memory 16 bytes per "
        "parameter (2 param + 2 grad + 12 Adam state, ZeRO §3.1); block activations "
        "s*b*d*(34+5*a*s/d) bytes (Korthikanti et al. 2022, no recomputation); outputs b*s*d*2 "
        "bytes; optimizer step 28 bytes per parameter at memory bandwidth. Link latencies are "
        "assumptions, not datasheet numbers."
    )
