"""Memory estimator (planaria.planner.memory) against Odyssey eq. 14 and the stream it reads.

Covers:
- eq. 14 exactly: in symmetric 1F1B with N_m >= N_pp, stage i peaks at
  N_l (m_p + m_o + m_g) + (N_pp - i) N_l m_a (no output or receive buffers in the profile);
- the in-flight count comes from the stream: min(N_m, N_pp - i) in 1F1B, the same bound for a
  peer that runs a failed stage's micro-batches, any count for hand-written streams;
- sent outputs count in the stash, a gradient receive buffer when gradients arrive; a
  tensor-parallel member needs 1/k (rounded up);
- per precision, over synthetic profiles of drawn shapes and stage cuts: 16 bytes of state per
  parameter in fp32 and bf16 alike, and bf16's stash differing from fp32's by exactly the
  bfloat16 matmul tensors and weight copies autocast saves;
- check_memory returns the estimate at exactly the limit and otherwise raises InfeasibleError
  naming the worst worker, its stage, peak and the limit; bad limits and profiles are input
  errors.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, instructions, plan, profile, schedule, shapes
from planaria.planner import accelerators, memory, synthetic
from tests import strategies

W = plan.WorkerId
LINK = profile.LinkProfile(bandwidth_bytes_per_s=1.0, latency_s=0.0)


def byte_profile(
    num_layers: int, *, params: int, activations: int, output: int = 0, max_gpus: int = 1
) -> profile.Profile:
    """Uniform layers with m_p = m_g = params, m_o = 2 params (AdamW), m_a = activations."""
    layer = profile.LayerProfile(
        name="block",
        forward_s=(1.0,) * max_gpus,
        backward_s=(1.0,) * max_gpus,
        parameter_bytes=params,
        gradient_bytes=params,
        optimizer_bytes=2 * params,
        activation_bytes=activations,
        output_bytes=output,
    )
    return profile.Profile(
        model="test",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=(layer,) * num_layers,
        intra_node=LINK,
        inter_node=LINK,
    )


def pipelines(num_pipelines: int, layers_per_stage: list[int], num_micro_batches: int) -> plan.Plan:
    cuts = [sum(layers_per_stage[:i]) for i in range(len(layers_per_stage) + 1)]
    depth = len(layers_per_stage)
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(
                    plan.Stage(layer_start=a, layer_stop=b, workers=(W(p * depth + i),))
                    for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False))
                ),
                num_micro_batches=num_micro_batches,
            )
            for p in range(num_pipelines)
        ),
        micro_batch_size=1,
    )


@settings(max_examples=40, deadline=None)
@given(
    layers_per_stage=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=5),
    extra_micro_batches=st.integers(min_value=0, max_value=4),
    params=st.integers(min_value=0, max_value=10**9),
    activations=st.integers(min_value=0, max_value=10**9),
)
def test_symmetric_1f1b_peaks_at_eq_14(
    layers_per_stage: list[int], extra_micro_batches: int, params: int, activations: int
) -> None:
    depth = len(layers_per_stage)
    p = pipelines(2, layers_per_stage, depth + extra_micro_batches)
    prof = byte_profile(sum(layers_per_stage), params=params, activations=activations)
    estimate = memory.estimate_memory(schedule.compile_schedule(p), prof)
    for worker in estimate.workers:
        i = worker.worker % depth
        layers = layers_per_stage[i]
        eq_14 = layers * (params + 2 * params + params) + (depth - i) * layers * activations
        assert worker.peak_bytes == eq_14


@pytest.mark.parametrize("num_micro_batches", [1, 2, 3, 6])
def test_in_flight_is_read_off_the_stream(num_micro_batches: int) -> None:
    sched = schedule.compile_schedule(pipelines(1, [1, 1, 1, 1], num_micro_batches))
    assert [memory.max_in_flight(s) for s in sched.streams] == [
        min(num_micro_batches, 4 - i) for i in range(4)
    ]
    gpipe = dataclasses.replace(
        sched.streams[0],
        instructions=tuple(
            [instructions.Forward(micro_batch=g, layer_start=0, layer_stop=1) for g in range(5)]
            + [instructions.Backward(micro_batch=g, layer_start=0, layer_stop=1) for g in range(5)]
        ),
    )
    assert memory.max_in_flight(gpipe) == 5


def test_a_peer_running_a_failed_stage_keeps_the_eq_14_peak() -> None:
    """Pipeline 0 lost stage 1 (of 3); pipeline 1's stage 1 runs all 12 micro-batches in one
    1F1B, so it still holds at most N_pp - 1 = 2 at once (ReCycle would hold more)."""
    base = pipelines(2, [1, 1, 1], 6)
    first = base.pipelines[0]
    hole = plan.Stage(layer_start=1, layer_stop=2, workers=())
    failed = plan.Plan(
        pipelines=(
            plan.Pipeline(stages=(first.stages[0], hole, first.stages[2]), num_micro_batches=6),
            base.pipelines[1],
        ),
        micro_batch_size=1,
        reroutes=(
            plan.Reroute(pipeline=0, stage=1, peer_pipeline=1, micro_batches=tuple(range(6))),
        ),
    )
    prof = byte_profile(3, params=10, activations=7)
    estimate = memory.estimate_memory(schedule.compile_schedule(failed), prof)
    peer = next(w for w in estimate.workers if w.worker == W(4))
    assert peer.max_in_flight == 2
    assert peer.peak_bytes == 40 + 2 * 7


def test_sent_outputs_and_gradient_buffers_count() -> None:
    sched = schedule.compile_schedule(pipelines(1, [1, 1], 4))
    prof = byte_profile(2, params=0, activations=100, output=10)
    first, last = memory.estimate_memory(sched, prof).workers
    # stage 0 keeps its sent output until the gradient comes back, and receives gradients
    assert (first.stash_bytes, first.max_in_flight, first.buffer_bytes) == (110, 2, 10)
    # the last stage sends no activation and receives no gradient
    assert (last.stash_bytes, last.max_in_flight, last.buffer_bytes) == (100, 1, 0)


def test_a_tensor_parallel_member_needs_its_share_rounded_up() -> None:
    stage = plan.Stage(layer_start=0, layer_stop=1, workers=(W(0), W(1)))
    p = plan.Plan(
        pipelines=(plan.Pipeline(stages=(stage,), num_micro_batches=3),),
        micro_batch_size=1,
        gpus_per_node=2,
    )
    prof = byte_profile(1, params=5, activations=9, max_gpus=2)
    (worker,) = memory.estimate_memory(schedule.compile_schedule(p), prof).workers
    assert (worker.state_bytes, worker.stash_bytes, worker.max_in_flight) == (10, 5, 1)


def test_check_memory_accepts_exactly_the_limit_and_names_the_worst_worker_over_it() -> None:
    sched = schedule.compile_schedule(pipelines(2, [2, 1], 4))
    prof = byte_profile(3, params=2**28, activations=2**28)
    # stage 0: two layers of 1 GiB state, two micro-batches of 2 x 0.25 GiB in flight
    estimate = memory.check_memory(sched, prof, 12 * 2**28)
    assert estimate.peak_bytes == 12 * 2**28
    with pytest.raises(errors.InfeasibleError) as caught:
        memory.check_memory(sched, prof, estimate.peak_bytes - 1)
    text = str(caught.value)
    assert text.startswith("worker 0 (pipeline 0 stage 0, layers [0, 2)) needs 3.00 GiB")
    assert "2 micro-batches in flight x 0.50 GiB" in text
    assert "but has 3.00 GiB; 2 workers are over" in text


@pytest.mark.parametrize("limit", [0, -5])
def test_a_limit_below_one_byte_is_an_input_error(limit: int) -> None:
    sched = schedule.compile_schedule(pipelines(1, [1], 1))
    with pytest.raises(errors.PlanInputError, match="memory_bytes is"):
        memory.check_memory(sched, byte_profile(1, params=1, activations=1), limit)


def test_a_profile_for_another_model_is_an_input_error() -> None:
    sched = schedule.compile_schedule(pipelines(1, [1, 1], 1))
    with pytest.raises(errors.PlanInputError, match="profile has 3 layers but the plan 2"):
        memory.estimate_memory(sched, byte_profile(3, params=1, activations=1))


@settings(max_examples=40, deadline=None)
@given(
    strategies.small_shapes(max_layers=4),
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=1, max_value=3),
    st.data(),
)
def test_each_precision_is_estimated_as_the_agent_trains_it(
    shape: shapes.ModelShape, b: int, num_stages: int, data: st.DataObject
) -> None:
    # One pipeline of drawn stages over a synthetic profile in each precision: eq. 14's static
    # memory is 16 bytes per parameter in all of them (float32 master state), and bf16's stash
    # per micro-batch in flight differs from fp32's by exactly what autocast changes: bfloat16
    # matmul inputs and outputs (2 bytes less each) and the saved bfloat16 weight copies.
    layers = shape.num_planner_layers
    num_stages = min(num_stages, layers)
    cuts = sorted(
        data.draw(
            st.sets(st.integers(1, layers - 1), min_size=num_stages - 1, max_size=num_stages - 1)
        )
    )
    bounds = [0, *cuts, layers]
    stages = tuple(
        plan.Stage(layer_start=a, layer_stop=z, workers=(W(i),))
        for i, (a, z) in enumerate(itertools.pairwise(bounds))
    )
    sched = schedule.compile_schedule(
        plan.Plan(
            pipelines=(plan.Pipeline(stages=stages, num_micro_batches=num_stages + 1),),
            micro_batch_size=b,
        )
    )
    gpu = accelerators.named("a100-80gb")
    fp32, bf16 = (
        memory.estimate_memory(sched, synthetic.synthesize(shape, gpu, b, 1, p))
        for p in (synthetic.Precision.FP32, synthetic.Precision.BF16)
    )
    n, d, f, v = b * shape.seq_len, shape.d_model, shape.ffn_dim, shape.vocab_size
    counts = shape.layer_parameters()
    for stage, w32, w16 in zip(stages, fp32.workers, bf16.workers, strict=True):
        held = range(stage.layer_start, stage.layer_stop)
        assert w32.state_bytes == w16.state_bytes == 16 * sum(counts[i] for i in held)
        assert w32.max_in_flight == w16.max_in_flight
        change = 0
        for i in held:
            if i == layers - 1:  # the head: bfloat16 projection input, its weight's copy
                change += 2 * d * v - 2 * n * d
            elif i > 0:  # a block
                change += 2 * (4 * d * d + 2 * d * f) - 2 * (6 * n * d + 2 * n * f)
        assert w16.stash_bytes - w32.stash_bytes == change
        assert w16.buffer_bytes == w32.buffer_bytes  # float32 gradients between stages
