"""Synthetic profiles: a model's per-layer costs computed from its shape and an accelerator spec.

Used when no measurement on the target hardware exists (planning for a cluster we are not on,
simulations, tests at paper scale). The model, stated once here and in docs/profile-format.md,
and copied into every synthetic profile's `assumptions` text:

- Work per layer and micro-batch (b sequences of s tokens, width d, FFN width f, vocab V):
  a block does 2 * (4d^2 + 2df) * b*s matmul FLOPs plus 4*b*s^2*d for attention scores and
  their weighted sum; the head 2*d*V*b*s; backward twice the forward FLOPs. The embedding is a
  lookup: memory-bound, costed by the bytes it moves, 2*(2bsd + sd) forward and 2bsd + 2(V+s)d
  backward (reading the gradient, writing the dense embedding gradient).
- Time = FLOPs / (peak * compute_efficiency) + bytes / (memory bandwidth * memory_efficiency),
  with the peak of the job's precision (`Accelerator.flops`: bf16 tensor cores, TF32 tensor
  cores or plain float32).
- k GPUs of one node sharing a stage (k = 1..gpus_per_node) run Megatron-style tensor
  parallelism (Shoeybi et al. 2019, §3): the layer's time divides by k, plus ring all-reduces
  over the intra-node link of b*s*d matmul outputs (2 bytes each in bf16, 4 otherwise; the
  embedding's are float32), 2 forward and 2 backward per block, 1 forward for
  the vocab-parallel embedding, 1 backward for the head (and 3 of b*s*4 bytes forward for its
  vocab-parallel cross entropy).
- Memory per parameter, as Planaria trains (docs/numerics.md "Precision"): 4 bytes float32
  parameter + 4 bytes float32 gradient + 8 bytes AdamW moments = 16 bytes in every precision.
  bf16 is autocast over float32 master parameters, so unlike ZeRO's mixed precision
  (Rajbhandari et al. 2020, §3.1: 2 + 2 + 12, also 16) no 16-bit parameter or gradient is kept;
  Odyssey eq. 14's m_p = m_g = 4 bytes and m_o = 8 bytes per parameter.
- Activations stashed per micro-batch (Odyssey eq. 14's m_a), no recomputation: the tensors
  autograd saves in Planaria's own layers (`planaria.agent.training.model`), counted tensor by
  tensor as Korthikanti et al. 2022 §4.1 count theirs. With n = b*s tokens, a heads:
  fp32 and tf32, 4 bytes each: a block saves its two LayerNorm inputs, their outputs (the qkv and
  fc inputs), the q/k/v projections (3nd), the attention output, the fc output and the GELU
  output (2nf), the LayerNorm mean and rstd (4n) and the fused attention's log-sum-exp (a*n):
  4(8nd + 2nf + 4n + an). No n*s attention scores: scaled_dot_product_attention is fused, and
  the model has no dropout (Korthikanti's 34 + 5as/d assumes both). bf16 (autocast): the
  LayerNorm inputs, statistics and the log-sum-exp stay float32, 4(2nd + 4n + an); the matmul
  inputs and outputs are bfloat16, 2(6nd + 2nf); and autograd saves each micro-batch's
  bfloat16 copies of the matmul weights, 2(4d^2 + 2df). The embedding saves its int64 token
  ids (8n); the head its LayerNorm input and statistics, its projection input, the float32
  log-softmax of the logits (4nV, float32 in bf16 too: autocast runs cross-entropy in float32),
  the int64 targets and one float32 scalar; in bf16 its projection input and weight copy are
  bfloat16. tests/agent/test_profiler.py checks these counts against the profiler's measurement.
- Output sent to the next stage: b*s*d*4 bytes, the float32 residual stream (in bf16 too:
  autocast leaves the residual additions in float32); the head sends nothing.
- Optimizer step: AdamW reads gradient, parameter and moments and writes parameter and
  moments, 28 bytes per parameter, at effective memory bandwidth.

Pure: no I/O. Measured profiles come from the agent's profiler; the file format is in
`planaria.spec.profile_file`.
"""

from __future__ import annotations

from dataclasses import dataclass

from planaria.contract import errors, precision, profile, shapes
from planaria.planner import accelerators

Precision = precision.Precision
# Float32 master state in every precision (module docstring): Odyssey eq. 14's m_p, m_g, m_o.
PARAMETER_BYTES = 4
GRADIENT_BYTES = 4
OPTIMIZER_STATE_BYTES = 8  # AdamW's exp_avg and exp_avg_sq
# AdamW step traffic per parameter: read gradient, parameter, m, v (16); write parameter, m, v.
OPTIMIZER_TRAFFIC_BYTES = 28
FLOAT_BYTES = 4  # float32: the residual stream, LayerNorm statistics, log-sum-exp, log-softmax
LOW_BYTES = 2  # bfloat16: what autocast saves of matmuls


def element_bytes(arithmetic: Precision) -> int:
    """Bytes of one matmul output element: what a tensor-parallel all-reduce moves."""
    return LOW_BYTES if arithmetic is Precision.BF16 else FLOAT_BYTES


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


def block_activation_bytes(
    shape: shapes.ModelShape, micro_batch_size: int, arithmetic: Precision
) -> int:
    """Bytes one block saves for backward per micro-batch (module docstring, Odyssey's m_a)."""
    n, d, f, a = micro_batch_size * shape.seq_len, shape.d_model, shape.ffn_dim, shape.num_heads
    if arithmetic is not Precision.BF16:
        return FLOAT_BYTES * (8 * n * d + 2 * n * f + 4 * n + a * n)
    kept_float = FLOAT_BYTES * (2 * n * d + 4 * n + a * n)
    matmul_io = LOW_BYTES * (6 * n * d + 2 * n * f)
    weight_copies = LOW_BYTES * (4 * d * d + 2 * d * f)
    return kept_float + matmul_io + weight_copies


def head_activation_bytes(
    shape: shapes.ModelShape, micro_batch_size: int, arithmetic: Precision
) -> int:
    """Bytes the head saves for backward per micro-batch, its loss included."""
    n, d, v = micro_batch_size * shape.seq_len, shape.d_model, shape.vocab_size
    loss = FLOAT_BYTES * n * v + TOKEN_ID_BYTES * n + FLOAT_BYTES  # log-softmax, targets, scalar
    norm = FLOAT_BYTES * (n * d + 2 * n)  # LayerNorm input, mean and rstd
    if arithmetic is not Precision.BF16:
        return norm + FLOAT_BYTES * n * d + loss
    return norm + LOW_BYTES * (n * d + d * v) + loss  # bfloat16 projection input and weight


def block_work(
    shape: shapes.ModelShape,
    micro_batch_size: int,
    index: int,
    arithmetic: Precision = Precision.BF16,
) -> LayerWork:
    """One transformer block: attention and MLP matmuls, saved activations, 4 all-reduces."""
    b, s, d, f = micro_batch_size, shape.seq_len, shape.d_model, shape.ffn_dim
    tokens = b * s
    # qkv (3d^2) + attention projection (d^2) + MLP (2df) weights, 2 FLOPs per multiply-add;
    # QK^T and attention @ V add 2*b*s^2*d each.
    forward = 2 * (4 * d * d + 2 * d * f) * tokens + 4 * b * s * s * d
    hidden = tokens * d * element_bytes(arithmetic)
    return LayerWork(
        name=f"block.{index}",
        num_parameters=shape.block_parameters(),
        forward_flops=forward,
        backward_flops=2 * forward,
        forward_memory_bytes=0.0,
        backward_memory_bytes=0.0,
        forward_allreduce_bytes=(hidden, hidden),
        backward_allreduce_bytes=(hidden, hidden),
        activation_bytes=block_activation_bytes(shape, micro_batch_size, arithmetic),
        output_bytes=tokens * d * FLOAT_BYTES,
    )


def embedding_work(shape: shapes.ModelShape, micro_batch_size: int) -> LayerWork:
    """Token + position lookup: memory-bound, one forward all-reduce when vocab-parallel.
    The same in every precision: autocast leaves embeddings in float32."""
    b, s, d, v = micro_batch_size, shape.seq_len, shape.d_model, shape.vocab_size
    hidden = b * s * d * FLOAT_BYTES
    return LayerWork(
        name="embedding",
        num_parameters=shape.embedding_parameters(),
        forward_flops=0.0,
        backward_flops=0.0,
        # Read b*s token rows and s position rows, write the b*s*d sum.
        forward_memory_bytes=2 * hidden + s * d * FLOAT_BYTES,
        # Read the incoming gradient, write the dense token and position gradients.
        backward_memory_bytes=hidden + (v + s) * d * FLOAT_BYTES,
        forward_allreduce_bytes=(hidden,),
        backward_allreduce_bytes=(),
        activation_bytes=b * s * TOKEN_ID_BYTES,  # F.embedding saves only the ids
        output_bytes=hidden,
    )


def head_work(
    shape: shapes.ModelShape, micro_batch_size: int, arithmetic: Precision = Precision.BF16
) -> LayerWork:
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
        backward_allreduce_bytes=(tokens * d * element_bytes(arithmetic),),
        activation_bytes=head_activation_bytes(shape, micro_batch_size, arithmetic),
        output_bytes=0,
    )


def model_work(
    shape: shapes.ModelShape, micro_batch_size: int, arithmetic: Precision = Precision.BF16
) -> tuple[LayerWork, ...]:
    """Work of every planner layer of `shape` in `arithmetic`, in order: embedding, blocks,
    head."""
    if micro_batch_size < 1:
        raise errors.PlanInputError(f"micro_batch_size must be >= 1 (got {micro_batch_size})")
    b = micro_batch_size
    blocks = tuple(block_work(shape, b, i, arithmetic) for i in range(shape.num_layers))
    return (embedding_work(shape, b), *blocks, head_work(shape, b, arithmetic))


def compute_s(
    flops: float,
    memory_bytes: float,
    accelerator: accelerators.Accelerator,
    num_gpus: int,
    arithmetic: Precision = Precision.BF16,
) -> float:
    """Seconds of computation in `arithmetic` when `num_gpus` share the work evenly (tensor
    parallelism)."""
    one_gpu = flops / (accelerator.flops(arithmetic) * accelerator.compute_efficiency)
    one_gpu += memory_bytes / accelerator.effective_memory_bandwidth
    return one_gpu / num_gpus


def allreduce_s(
    sizes: tuple[float, ...], accelerator: accelerators.Accelerator, num_gpus: int
) -> float:
    """Seconds of the tensor-parallel all-reduces of `sizes` bytes among `num_gpus` of a node."""
    return sum(accelerator.intra_node.allreduce_s(size, num_gpus) for size in sizes)


def forward_s(
    work: LayerWork,
    accelerator: accelerators.Accelerator,
    num_gpus: int,
    arithmetic: Precision = Precision.BF16,
) -> float:
    """Forward seconds of one micro-batch on `num_gpus` GPUs of one node."""
    compute = compute_s(
        work.forward_flops, work.forward_memory_bytes, accelerator, num_gpus, arithmetic
    )
    return compute + allreduce_s(work.forward_allreduce_bytes, accelerator, num_gpus)


def backward_s(
    work: LayerWork,
    accelerator: accelerators.Accelerator,
    num_gpus: int,
    arithmetic: Precision = Precision.BF16,
) -> float:
    """Backward seconds of one micro-batch on `num_gpus` GPUs of one node."""
    compute = compute_s(
        work.backward_flops, work.backward_memory_bytes, accelerator, num_gpus, arithmetic
    )
    return compute + allreduce_s(work.backward_allreduce_bytes, accelerator, num_gpus)


def layer_profile(
    work: LayerWork,
    accelerator: accelerators.Accelerator,
    gpus_per_node: int,
    arithmetic: Precision = Precision.BF16,
) -> profile.LayerProfile:
    """The planner's view of `work` on `accelerator` in `arithmetic`, timed for
    1..gpus_per_node GPUs."""
    widths = range(1, gpus_per_node + 1)
    n = work.num_parameters
    return profile.LayerProfile(
        name=work.name,
        forward_s=tuple(forward_s(work, accelerator, k, arithmetic) for k in widths),
        backward_s=tuple(backward_s(work, accelerator, k, arithmetic) for k in widths),
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
    arithmetic: Precision = Precision.BF16,
) -> profile.Profile:
    """An analytic profile of `shape` on `accelerator` for a job training in `arithmetic` (the
    model in this module's docstring). The default, bf16, is what GPU clusters train in; a job
    plans with the profile of its own precision.

    Raises PlanInputError when micro_batch_size or gpus_per_node is < 1.
    """
    if gpus_per_node < 1:
        raise errors.PlanInputError(f"gpus_per_node must be >= 1 (got {gpus_per_node})")
    layers = tuple(
        layer_profile(work, accelerator, gpus_per_node, arithmetic)
        for work in model_work(shape, micro_batch_size, arithmetic)
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
        precision=arithmetic,
    )


def assumptions(
    accelerator: accelerators.Accelerator,
    gpus_per_node: int,
    arithmetic: Precision = Precision.BF16,
) -> str:
    """The free-text `assumptions` a synthetic profile file carries: the model and its numbers."""
    return (
        f"Analytic profile (planaria.planner.synthetic), not measured, for {arithmetic} "
        f"training. Accelerator {accelerator.name}: {accelerator.flops(arithmetic) / 1e12:g} "
        "TFLOP/s peak at "
        f"{accelerator.compute_efficiency:g} efficiency, "
        f"{accelerator.memory_bandwidth_bytes_per_s / 1e9:g} GB/s memory at "
        f"{accelerator.memory_efficiency:g} efficiency ({accelerator.source}); "
        f"{gpus_per_node} GPU(s) per node. Block forward FLOPs 2*(4d^2+2df)*b*s + 4*b*s^2*d, "
        "head 2*d*V*b*s, backward 2x forward; embedding memory-bound (bytes moved / bandwidth). "
        "k GPUs per stage: time/k plus Megatron tensor-parallel ring all-reduces of b*s*d "
        "bytes over the intra-node link (2 forward + 2 backward per block). Memory 16 bytes per "
        "parameter (float32 param 4 + grad 4 + AdamW moments 8, in every precision); "
        "activations: the tensors Planaria's layers save for backward, counted per tensor as "
        "Korthikanti et al. 2022 §4.1 do, without their dropout masks and attention scores "
        "(n = b*s): a block 4(8nd+2nf+4n+an) bytes in fp32/tf32, 4(2nd+4n+an) + 2(6nd+2nf) + "
        "2(4d^2+2df) in bf16 (autocast, with the bfloat16 weight copies); outputs b*s*d*4 "
        "bytes (float32); optimizer step 28 bytes per parameter at memory bandwidth. Link "
        "latencies are assumptions, not datasheet numbers."
    )
