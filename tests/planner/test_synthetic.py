"""Synthetic profiles (planaria.planner.synthetic) and accelerator specs (planner.accelerators).

Covers: numbers checked by hand for gpt3-6.7b on an A100 (block parameters * 16 bytes of float32
master state, forward time = FLOPs / (peak * efficiency), the activations autocast saves, the
optimizer step); per precision: 16 bytes of state per parameter in each, bf16's activations
differ from fp32's by exactly the bfloat16 matmul tensors and weight copies, tf32's equal
fp32's, outputs float32 in each, each precision timed at its datasheet peak; block and head
FLOPs against two oracles (a brute-force tally of every matmul, and torch's FLOP counter on a
real block); monotonicity (more GPUs never give a slower compute share, a bigger micro-batch is
never faster nor smaller); the profile's shape (layer count, widths, 16 bytes per parameter);
tensor-parallel all-reduces; bad inputs; the named accelerators' consistency.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import errors, shapes
from planaria.planner import accelerators, synthetic
from tests import strategies

A100 = accelerators.named("a100-80gb")
GPT3_6_7B = shapes.named("gpt3-6.7b")
ALL_ACCELERATORS = st.sampled_from(sorted(accelerators.NAMED_ACCELERATORS)).map(accelerators.named)


def test_a_gpt3_6_7b_block_holds_16_bytes_per_parameter() -> None:
    # d = 4096: 12 d^2 weights + 13 d biases and norms = 201,379,840 parameters.
    layer = synthetic.synthesize(GPT3_6_7B, A100, 1, 8).layers[1]
    assert GPT3_6_7B.block_parameters() == 201_379_840
    assert layer.parameter_bytes == 4 * 201_379_840  # float32 master parameters
    assert layer.gradient_bytes == 4 * 201_379_840
    assert layer.optimizer_bytes == 8 * 201_379_840  # AdamW's two float32 moments
    assert layer.state_bytes == 3_222_077_440


@given(strategies.small_shapes(), st.integers(min_value=1, max_value=8))
def test_state_is_16_bytes_per_parameter_in_every_precision(
    shape: shapes.ModelShape, b: int
) -> None:
    # Odyssey eq. 14's static memory: bf16 autocast keeps float32 parameters, gradients and
    # moments, so m_p + m_g + m_o does not depend on the precision.
    profiles = [synthetic.synthesize(shape, A100, b, 1, p) for p in synthetic.Precision]
    for layers in zip(*(p.layers for p in profiles), strict=True):
        assert len({layer.state_bytes for layer in layers}) == 1
    assert [p.precision for p in profiles] == list(synthetic.Precision)


@given(strategies.small_shapes(), st.integers(min_value=1, max_value=8))
def test_bf16_saves_exactly_the_autocast_tensors_and_sends_float32(
    shape: shapes.ModelShape, b: int
) -> None:
    fp32, tf32, bf16 = (synthetic.synthesize(shape, A100, b, 1, p) for p in synthetic.Precision)
    n, d, f, v = b * shape.seq_len, shape.d_model, shape.ffn_dim, shape.vocab_size
    for layer32, layer_tf, layer16 in zip(fp32.layers, tf32.layers, bf16.layers, strict=True):
        assert layer32.activation_bytes == layer_tf.activation_bytes  # TF32 tensors are float32
        assert layer32.output_bytes == layer16.output_bytes  # the residual stream is float32
    # a block: 6nd + 2nf matmul elements go from 4 to 2 bytes; the matmul weights' bfloat16
    # copies (4d^2 + 2df of them) are saved besides
    block32, block16 = fp32.layers[1].activation_bytes, bf16.layers[1].activation_bytes
    assert block32 - block16 == 2 * (6 * n * d + 2 * n * f) - 2 * (4 * d * d + 2 * d * f)
    head32, head16 = fp32.layers[-1].activation_bytes, bf16.layers[-1].activation_bytes
    assert head32 - head16 == 2 * n * d - 2 * d * v
    assert fp32.layers[0].activation_bytes == bf16.layers[0].activation_bytes == 8 * n


def test_each_precision_computes_at_its_own_datasheet_peak() -> None:
    h100 = accelerators.named("h100-80gb")
    work = synthetic.block_work(GPT3_6_7B, 1, 0)
    peaks = {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12}
    for p in synthetic.Precision:
        expected = work.forward_flops / (peaks[p] * 0.45)
        assert synthetic.compute_s(work.forward_flops, 0.0, h100, 1, p) == pytest.approx(
            expected, rel=1e-12
        )
    # the V100 has no TF32 cores: TF32 computes at its float32 rate
    v100 = accelerators.named("v100-16gb")
    assert v100.flops(synthetic.Precision.TF32) == v100.flops(synthetic.Precision.FP32)


def test_a_gpt3_6_7b_block_forward_takes_its_flops_over_effective_peak() -> None:
    d, f, s, b = 4096, 16384, 2048, 1
    flops = 2 * (4 * d * d + 2 * d * f) * b * s + 4 * b * s * s * d
    layer = synthetic.synthesize(GPT3_6_7B, A100, b, 8).layers[1]
    assert flops == 824_633_720_832 + 68_719_476_736  # matmuls with weights + attention
    assert layer.forward_s[0] == pytest.approx(flops / (312e12 * 0.45), rel=1e-12)
    assert layer.backward_s[0] == pytest.approx(2 * layer.forward_s[0], rel=1e-12)


def test_a_gpt3_6_7b_block_stashes_the_tensors_autocast_saves() -> None:
    # n = 2048 tokens, d = 4096, f = 16384, a = 32: float32 LayerNorm inputs, statistics and
    # log-sum-exp 4(2nd + 4n + an), bfloat16 matmul inputs and outputs 2(6nd + 2nf), bfloat16
    # weight copies 2(4d^2 + 2df): 64.3 + 224 + 384 MiB = 672.3 MiB at b = 1 (Korthikanti's
    # 912 MiB counts dropout masks and the s^2 attention scores this model does not save).
    n, d, f, a = 2048, 4096, 16384, 32
    layer = synthetic.synthesize(GPT3_6_7B, A100, 1, 8).layers[1]
    kept = 4 * (2 * n * d + 4 * n + a * n) + 2 * (6 * n * d + 2 * n * f)
    assert layer.activation_bytes == kept + 2 * (4 * d * d + 2 * d * f) == 704_937_984
    assert layer.output_bytes == n * d * 4  # float32 hidden states between stages
    fp32 = synthetic.synthesize(GPT3_6_7B, A100, 1, 8, synthetic.Precision.FP32).layers[1]
    assert fp32.activation_bytes == 4 * (8 * n * d + 2 * n * f + 4 * n + a * n)


def test_the_optimizer_step_is_memory_bound() -> None:
    layer = synthetic.synthesize(GPT3_6_7B, A100, 1, 8).layers[1]
    expected = 201_379_840 * 28 / (2039e9 * 0.8)
    assert layer.optimizer_s == pytest.approx(expected, rel=1e-12)


def test_eight_gpus_split_a_block_and_pay_four_ring_all_reduces() -> None:
    layer = synthetic.synthesize(GPT3_6_7B, A100, 1, 8).layers[1]
    hidden = 2048 * 4096 * 2
    ring = 2 * 7 * (5e-6 + hidden / 8 / 300e9)  # Megatron: 2 all-reduces each way
    assert layer.forward_s[7] == pytest.approx(layer.forward_s[0] / 8 + 2 * ring, rel=1e-12)
    assert layer.backward_s[7] == pytest.approx(layer.backward_s[0] / 8 + 2 * ring, rel=1e-12)


def _matmuls_of_block(shape: shapes.ModelShape, b: int) -> list[tuple[int, int, int]]:
    """Every (m, n, k) matmul of one block's forward pass, written out one by one."""
    s, d, f, a = shape.seq_len, shape.d_model, shape.ffn_dim, shape.num_heads
    products = [(b * s, 3 * d, d), (b * s, d, d), (b * s, f, d), (b * s, d, f)]
    for _ in range(b * a):
        products.append((s, s, d // a))  # scores: Q K^T of one head
        products.append((s, d // a, s))  # weighted sum: softmax(scores) V of one head
    return products


@given(strategies.small_shapes(), st.integers(min_value=1, max_value=4))
def test_block_flops_match_a_tally_of_every_matmul(shape: shapes.ModelShape, b: int) -> None:
    work = synthetic.block_work(shape, b, 0)
    assert work.forward_flops == sum(2 * m * n * k for m, n, k in _matmuls_of_block(shape, b))
    assert work.backward_flops == 2 * work.forward_flops


@pytest.mark.parametrize(
    ("b", "s", "d", "heads", "vocab"),
    [(2, 16, 32, 4, 50), (1, 8, 48, 3, 17)],
    ids=["two sequences of 16 tokens", "one sequence of 8 tokens with 3 heads"],
)
def test_block_and_head_flops_agree_with_torch_flop_counter_for(
    b: int, s: int, d: int, heads: int, vocab: int
) -> None:
    import torch
    from torch.utils import flop_counter

    shape = shapes.ModelShape(
        name="t", num_layers=1, d_model=d, num_heads=heads, seq_len=s, vocab_size=vocab
    )
    qkv, proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
    fc1, fc2, head = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d), torch.nn.Linear(d, vocab)

    def block(x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(b, s, heads, d // heads).transpose(1, 2) for t in qkv(x).split(d, -1))
        mixed = ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        y = x + proj(mixed)
        out: torch.Tensor = y + fc2(torch.nn.functional.gelu(fc1(y)))
        return out

    x = torch.randn(b, s, d, requires_grad=True)
    with flop_counter.FlopCounterMode(display=False) as forward:
        out = block(x)
    with flop_counter.FlopCounterMode(display=False) as backward:
        weights = [p for layer in (qkv, proj, fc1, fc2) for p in layer.parameters()]
        torch.autograd.grad(out.sum(), [x, *weights])
    work = synthetic.block_work(shape, b, 0)
    assert (work.forward_flops, work.backward_flops) == (
        forward.get_total_flops(),
        backward.get_total_flops(),
    )
    with flop_counter.FlopCounterMode(display=False) as head_forward:
        head(x)
    assert synthetic.head_work(shape, b).forward_flops == head_forward.get_total_flops()


@given(
    strategies.small_shapes(),
    ALL_ACCELERATORS,
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=7),
)
def test_more_gpus_never_give_a_slower_compute_share(
    shape: shapes.ModelShape, accelerator: accelerators.Accelerator, b: int, k: int
) -> None:
    for work in synthetic.model_work(shape, b):
        for flops, traffic in (
            (work.forward_flops, work.forward_memory_bytes),
            (work.backward_flops, work.backward_memory_bytes),
        ):
            fewer = synthetic.compute_s(flops, traffic, accelerator, k)
            assert synthetic.compute_s(flops, traffic, accelerator, k + 1) <= fewer


@given(
    strategies.small_shapes(),
    ALL_ACCELERATORS,
    st.integers(min_value=1, max_value=16),
    st.integers(min_value=1, max_value=4),
)
def test_a_bigger_micro_batch_is_never_faster_nor_smaller(
    shape: shapes.ModelShape, accelerator: accelerators.Accelerator, b: int, gpus: int
) -> None:
    smaller = synthetic.synthesize(shape, accelerator, b, gpus)
    bigger = synthetic.synthesize(shape, accelerator, b + 1, gpus)
    for small, big in zip(smaller.layers, bigger.layers, strict=True):
        assert all(x <= y for x, y in zip(small.forward_s, big.forward_s, strict=True))
        assert all(x <= y for x, y in zip(small.backward_s, big.backward_s, strict=True))
        assert small.activation_bytes <= big.activation_bytes
        assert small.output_bytes <= big.output_bytes
        assert small.state_bytes == big.state_bytes


@given(strategies.small_shapes(), ALL_ACCELERATORS, st.integers(min_value=1, max_value=8))
def test_a_synthetic_profile_covers_every_planner_layer(
    shape: shapes.ModelShape, accelerator: accelerators.Accelerator, gpus: int
) -> None:
    result = synthetic.synthesize(shape, accelerator, 2, gpus)
    assert result.num_layers == shape.num_planner_layers
    assert result.max_gpus_per_stage == gpus
    assert result.synthetic and result.accelerator == accelerator.name
    assert [layer.name for layer in result.layers][:: shape.num_layers + 1] == [
        "embedding",
        "head",
    ]
    assert result.layers[-1].output_bytes == 0
    counts = shape.layer_parameters()
    for layer, count in zip(result.layers, counts, strict=True):
        assert layer.state_bytes == 16 * count
        assert all(math.isfinite(t) and t >= 0 for t in layer.forward_s + layer.backward_s)


def test_one_gpu_pays_no_all_reduce() -> None:
    work = synthetic.block_work(GPT3_6_7B, 1, 0)
    assert synthetic.allreduce_s(work.forward_allreduce_bytes, A100, 1) == 0.0
    assert synthetic.forward_s(work, A100, 1) == synthetic.compute_s(
        work.forward_flops, 0.0, A100, 1
    )


def test_the_embedding_is_costed_by_bytes_moved() -> None:
    b, s, d, v = 1, 2048, 4096, 50257
    layer = synthetic.synthesize(GPT3_6_7B, A100, b, 8).layers[0]
    moved = 4 * (2 * b * s * d + s * d)  # float32 tables and sums in every precision
    assert layer.forward_s[0] == pytest.approx(moved / (2039e9 * 0.8), rel=1e-12)
    assert layer.backward_s[0] == pytest.approx(
        (4 * b * s * d + 4 * (v + s) * d) / (2039e9 * 0.8), rel=1e-12
    )


@pytest.mark.parametrize(
    ("micro_batch", "gpus", "field"),
    [(0, 8, "micro_batch_size"), (1, 0, "gpus_per_node")],
    ids=["a zero micro-batch", "zero GPUs per node"],
)
def test_synthesize_rejects(micro_batch: int, gpus: int, field: str) -> None:
    with pytest.raises(errors.PlanInputError, match=f"{field} must be >= 1"):
        synthetic.synthesize(GPT3_6_7B, A100, micro_batch, gpus)


def test_an_unknown_accelerator_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown accelerator 'tpu'; choose one of: a100-40gb"):
        accelerators.named("tpu")


@pytest.mark.parametrize(
    ("field", "value"),
    [("compute_efficiency", 1.5), ("memory_efficiency", 0.0), ("peak_flops", -1.0)],
    ids=["efficiency above one", "zero memory efficiency", "negative peak"],
)
def test_an_accelerator_spec_rejects(field: str, value: float) -> None:
    spec = {
        "name": "x",
        "peak_flops": 1e12,
        "fp32_flops": 1e11,
        "memory_bytes": 1,
        "memory_bandwidth_bytes_per_s": 1e9,
        "intra_node": A100.intra_node,
        "inter_node": A100.inter_node,
        "default_gpus_per_node": 1,
        field: value,
    }
    with pytest.raises(errors.PlanInputError, match=field):
        accelerators.Accelerator(**spec)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(accelerators.NAMED_ACCELERATORS))
def test_the_named_accelerator_has_the_memory_its_name_says(name: str) -> None:
    accelerator = accelerators.named(name)
    gigabytes = int(name.rsplit("-", 1)[1].removesuffix("gb"))
    assert accelerator.memory_bytes == gigabytes * 2**30
    assert (
        accelerator.intra_node.bandwidth_bytes_per_s >= accelerator.inter_node.bandwidth_bytes_per_s
    )
    assert accelerator.source


def test_the_assumptions_text_names_the_accelerator_and_the_model() -> None:
    text = synthetic.assumptions(A100, 8)
    assert "a100-80gb" in text and "312 TFLOP/s" in text and "Korthikanti" in text
    assert "\n" not in text
