"""The measuring profiler (planaria.agent.execution.profiler).

Covers: a measured profile of the tiny model has its num_layers + 2 layers named as the planner
names them, one positive time per GPU count (one device = one GPU), parameter, gradient and
AdamW bytes equal to what the shape predicts for fp32, output bytes of one fp32 hidden state
(none from the head), the embedding's saved token ids, activations that scale with
the micro-batch, a gloo loopback link with positive latency and bandwidth for sends and for
all-reduces, every phase of every layer timed in whole-model passes, the machine's RAM,
synthetic=False; it survives the profile file format; bad requests are refused with one-line
errors. Per precision: the synthetic model's activation bytes (planaria.planner.synthetic) equal
the measured ones byte for byte for drawn shapes in fp32, tf32 and bf16; a bf16 profile is
measured in bf16 (its precision recorded, float32 state and outputs, other activations).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.agent.execution import profiler
from planaria.agent.training import model, precision
from planaria.contract import profile, shapes
from planaria.planner import accelerators, synthetic
from planaria.spec import profile_file
from planaria.wire import messages
from tests import strategies

TINY = shapes.named("tiny")
FP32 = 4


@pytest.fixture(scope="module")
def measured() -> profile.Profile:
    return profiler.measure_profile(TINY, 2, warmup=1, repeats=2)


def test_the_profile_has_the_planners_layers(measured: profile.Profile) -> None:
    names = [layer.name for layer in measured.layers]
    assert names == [model.layer_name(TINY, i) for i in range(TINY.num_planner_layers)]
    assert measured.model == "tiny" and measured.micro_batch_size == 2
    assert measured.synthetic is False


def test_every_layer_has_one_positive_time_per_phase(measured: profile.Profile) -> None:
    assert measured.max_gpus_per_stage == 1
    for layer in measured.layers:
        assert layer.forward_s[0] > 0 and layer.backward_s[0] > 0 and layer.optimizer_s > 0


def test_state_bytes_are_what_the_shape_predicts(measured: profile.Profile) -> None:
    for layer, count in zip(measured.layers, TINY.layer_parameters(), strict=True):
        assert layer.parameter_bytes == count * FP32
        assert layer.gradient_bytes == count * FP32
        assert layer.optimizer_bytes == 2 * count * FP32


def test_each_layer_but_the_head_sends_one_hidden_state(measured: profile.Profile) -> None:
    hidden = 2 * TINY.seq_len * TINY.d_model * FP32
    assert [layer.output_bytes for layer in measured.layers] == [hidden] * 5 + [0]


def test_activation_bytes_are_the_tensors_saved_for_backward(measured: profile.Profile) -> None:
    embedding, *blocks, head = measured.layers
    # The embedding saves its int64 token ids for the table's gradient, nothing else.
    assert embedding.activation_bytes == 2 * TINY.seq_len * 8
    # A block saves at least its input, and far more than its output alone.
    assert all(block.activation_bytes > 4 * block.output_bytes for block in blocks)
    # The head keeps at least the fp32 logits for the loss.
    assert head.activation_bytes >= 2 * TINY.seq_len * TINY.vocab_size * FP32


def test_block_activations_scale_with_the_micro_batch() -> None:
    block = model.build_layer(TINY, 0, 1)
    sizes = []
    for b in (1, 3):
        x = torch.randn(b, TINY.seq_len, TINY.d_model)
        sizes.append(profiler.measure_layer(TINY, block, x, warmup=0, repeats=1).activation_bytes)
    assert sizes[1] == 3 * sizes[0]


def test_the_link_is_measured_over_gloo_loopback(measured: profile.Profile) -> None:
    assert measured.accelerator == "cpu-gloo-loopback"
    assert measured.intra_node == measured.inter_node
    assert 0 < measured.intra_node.latency_s < 1.0
    # Loopback moves at least 10 MB/s even on a busy machine.
    assert measured.intra_node.bandwidth_bytes_per_s > 1e7


def test_the_links_all_reduce_is_measured_too(measured: profile.Profile) -> None:
    """The all-reduce figures are measured, not copied from the point-to-point ones (a ring
    of 2 costs 2 latency + b / bandwidth, and the all-reduce of 16 MiB does real work)."""
    link = measured.intra_node
    assert link.allreduce_latency_s is not None and link.allreduce_latency_s > 0
    assert link.allreduce_bandwidth_bytes_per_s is not None
    assert link.allreduce_bandwidth_bytes_per_s > 1e6
    assert link.allreduce_s(16 * 2**20, 2) > link.allreduce_s(4, 2) > 0


def test_every_phase_is_timed_in_place(measured: profile.Profile) -> None:
    """Whole-model passes time every layer, the head's loss and AdamW steps included."""
    assert all(layer.optimizer_s > 0 for layer in measured.layers)
    assert all(min(layer.forward_s + layer.backward_s) > 0 for layer in measured.layers)


def test_memory_is_the_machines_ram(measured: profile.Profile) -> None:
    assert measured.memory_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_the_measured_profile_survives_the_file_format(measured: profile.Profile) -> None:
    text = profile_file.render_profile(measured, assumptions="measured in a test")
    assert profile_file.parse_profile(text) == measured


@pytest.mark.parametrize(
    ("micro_batch", "warmup", "repeats", "device", "message"),
    [
        (0, 0, 1, "cpu", "micro-batch size must be >= 1"),
        (1, 0, 0, "cpu", "repeats must be >= 1"),
        (1, -1, 1, "cpu", "warmup must be >= 0"),
        (1, 0, 1, "nonsense", "'nonsense' is not a torch device; use cpu or cuda"),
        (1, 0, 1, "meta", "'meta' is not supported; use cpu or cuda"),
    ],
    ids=["an empty micro-batch", "no timed runs", "negative warm-up", "an unknown device"]
    + ["a device that computes nothing"],
)
def test_a_measurement_is_refused_for(
    micro_batch: int, warmup: int, repeats: int, device: str, message: str
) -> None:
    with pytest.raises(profiler.ProfilerInputError, match=message):
        profiler.measure_profile(TINY, micro_batch, warmup=warmup, repeats=repeats, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_is_refused_without_a_cuda_device() -> None:
    with pytest.raises(profiler.ProfilerInputError, match="no CUDA device; use cpu"):
        profiler.measure_profile(TINY, 1, warmup=0, repeats=1, device="cuda")


def _measured_activations(
    shape: shapes.ModelShape, b: int, arithmetic: messages.Precision
) -> list[int]:
    """Each layer's measured activation bytes in `arithmetic`, each fed what the one before
    sends (one untimed-warm-up-free run per layer)."""
    x = torch.randint(0, shape.vocab_size, (b, shape.seq_len))
    sizes = []
    for index in range(shape.num_planner_layers):
        layer = model.build_layer(shape, 0, index)
        measured = profiler.measure_layer(
            shape, layer, x, warmup=0, repeats=1, arithmetic=arithmetic
        )
        sizes.append(measured.activation_bytes)
        with torch.no_grad(), precision.forward(arithmetic, x.device):
            x = layer(x)
    return sizes


@settings(max_examples=12, deadline=None)
@given(
    strategies.small_shapes(max_layers=2),
    st.integers(min_value=1, max_value=3),
    st.sampled_from(messages.Precision),
)
def test_the_synthetic_activation_model_is_what_the_profiler_measures(
    shape: shapes.ModelShape, b: int, arithmetic: messages.Precision
) -> None:
    # The estimator's m_a (Odyssey eq. 14) from the synthetic model equals, byte for byte, the
    # storages autograd saves in the real layers, in each precision.
    predicted = synthetic.synthesize(shape, accelerators.named("h100-80gb"), b, 1, arithmetic)
    assert _measured_activations(shape, b, arithmetic) == [
        layer.activation_bytes for layer in predicted.layers
    ]


def test_a_bf16_profile_is_measured_in_bf16() -> None:
    fp32 = profiler.measure_profile(TINY, 1, warmup=0, repeats=1)
    bf16 = profiler.measure_profile(
        TINY, 1, warmup=0, repeats=1, arithmetic=messages.Precision.BF16
    )
    assert (fp32.precision, bf16.precision) == (messages.Precision.FP32, messages.Precision.BF16)
    for layer32, layer16 in zip(fp32.layers[1:-1], bf16.layers[1:-1], strict=True):
        assert layer16.state_bytes == layer32.state_bytes  # float32 master state
        assert layer16.output_bytes == layer32.output_bytes  # float32 residual stream
        assert layer16.activation_bytes != layer32.activation_bytes
