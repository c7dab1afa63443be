"""Hugging Face causal LMs as planner layers (planaria.agent.training.hf_models via `model`).

Covers, with tiny 2-block configs (Llama with grouped-query attention, GPT-2): the layers a
worker builds are bit-identical whichever subset it builds and however often; the layers run in
order give bit for bit the logits of transformers' own `LlamaForCausalLM` / `GPT2LMHeadModel`
holding the same parameters (so the wrappers' position ids, rotary embeddings and causal mask
are transformers'); GPT-2's head copy starts equal to `wte`; the planner's parameter counts
(`shapes`) equal the built layers'; per-layer state extract/load round trips bit-exactly, and so
does a layer copy's byte layout for every trained layer; the profiler measures an HF model's
layers; and, across real processes (gloo), one plan that holds
a 2-stage pipeline beside a 1-stage replica (pipeline, data parallel and heterogeneous at once)
trains each family bit for bit like the single-process reference in exact mode: per-step
losses, parameters and AdamW moments (GPT-2 tied: tests/agent/test_tied_embeddings.py covers
the tie over more plans).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from planaria.agent.execution import profiler
from planaria.agent.harness import local_cluster
from planaria.agent.recovery import layer_transfer
from planaria.agent.training import comparison, data, model, reference, semantics
from planaria.agent.training import hf_models as hf_layers
from planaria.contract import plan, shapes
from planaria.wire import messages
from tests import hf_models

pytest.importorskip("transformers")

SEED, VOCAB, FAMILIES = hf_models.SEED, hf_models.VOCAB, hf_models.FAMILIES
STEPS = 3
_shape = hf_models.shape


@pytest.fixture(scope="module")
def tokens() -> data.Tokens:
    return data.load_default_corpus(max_bytes=50_000)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_layers_equal_whichever_subset_is_built(family: str) -> None:
    shape = _shape(family)
    whole = model.build_layers(shape, SEED)
    for index in (2, 0, 3):
        alone = model.build_layer(shape, SEED, index)
        pairs = zip(alone.parameters(), whole[index].parameters(), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)
    other = model.build_layer(shape, SEED + 1, 1)
    pairs = zip(other.parameters(), whole[1].parameters(), strict=True)
    matrices = [(a, b) for a, b in pairs if a.dim() > 1]
    assert not any(torch.equal(a, b) for a, b in matrices)
    # (GPT-2's wpe has n_positions rows, the count seq_len: equal here, seqLen left at 0.)
    counts = [sum(p.numel() for p in layer.parameters()) for layer in whole]
    assert counts == list(shape.layer_parameters())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_layers_in_order_give_transformers_logits_bit_for_bit(family: str) -> None:
    shape = _shape(family)
    layers = model.build_layers(shape, SEED)
    reference_lm = hf_layers.causal_lm(shape)
    weights: dict[str, torch.Tensor] = {}
    for index, layer in enumerate(layers):
        names, params = zip(*layer.named_parameters(), strict=True)
        weights.update(zip(hf_layers.export_names(shape, index, names), params, strict=True))
    reference_lm.load_state_dict(weights, strict=True)
    ids = torch.randint(0, VOCAB, (2, shape.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.run_layers(layers, ids), reference_lm(ids).logits)
    if family == "gpt2":  # tied by default: the head's copy starts equal
        assert torch.equal(
            hf_models.parameter(layers[0], "wte.weight"),
            hf_models.parameter(layers[-1], "lm_head.weight"),
        )


def test_a_tied_llama_starts_its_head_equal_to_its_embeddings() -> None:
    tied = shapes.resolve(
        shapes.hf_reference("llama", {**hf_models.LLAMA, "tie_word_embeddings": True})
    )
    first, last = model.build_layer(tied, SEED, 0), model.build_layer(tied, SEED, 3)
    want = hf_models.parameter(first, "embed_tokens.weight")
    assert torch.equal(hf_models.parameter(last, "lm_head.weight"), want)
    untied = model.build_layer(_shape("llama"), SEED, 3)
    assert not torch.equal(hf_models.parameter(untied, "lm_head.weight"), want)


def test_layer_state_round_trips_and_the_profiler_measures_every_layer() -> None:
    shape = _shape("llama")
    config = model.OptimizerConfig()
    layer = model.build_layer(shape, SEED, 1)
    optimizer = model.make_optimizer(layer, config)
    torch.autograd.backward(layer(torch.randn(1, 8, 32)).sum())
    optimizer.step()
    state = model.extract_layer_state(1, layer, optimizer)
    fresh = model.build_layer(shape, SEED + 9, 1)
    fresh_optimizer = model.make_optimizer(fresh, config)
    model.load_layer_state(1, fresh, fresh_optimizer, state)
    again = model.extract_layer_state(1, fresh, fresh_optimizer)
    assert comparison.compare({1: again}, {1: state}).equal
    measured = profiler.measure_profile(shape, 1, warmup=0, repeats=1, device="cpu")
    assert [layer.name for layer in measured.layers] == ["embedding", "block.0", "block.1", "head"]
    assert measured.layers[1].parameter_bytes == 4 * shape.block_parameters()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_layer_copy_of_every_trained_layer_is_bit_exact(family: str) -> None:
    """The byte layout of layer transfers (flatten on the source, fill the receiver's template
    built from another seed) carries every HF layer's parameters and AdamW state exactly."""
    shape = _shape(family)
    _, states = hf_models.trained(shape)
    for index, sent in states.items():
        template = model.initial_state(shape, SEED + 1, index, model.OptimizerConfig())
        got = layer_transfer.fill(template, layer_transfer.flatten(sent))
        assert got.names == sent.names and all(map(torch.equal, got.tensors(), sent.tensors()))


# --- across processes -------------------------------------------------------------------------

# A 2-stage pipeline (workers 0, 1) beside a 1-stage replica of all 4 layers (worker 2).
MIXED = plan.Plan(
    pipelines=(
        plan.Pipeline(
            stages=(
                plan.Stage(layer_start=0, layer_stop=2, workers=(plan.WorkerId(0),)),
                plan.Stage(layer_start=2, layer_stop=4, workers=(plan.WorkerId(1),)),
            ),
            num_micro_batches=2,
        ),
        plan.Pipeline(
            stages=(plan.Stage(layer_start=0, layer_stop=4, workers=(plan.WorkerId(2),)),),
            num_micro_batches=1,
        ),
    ),
    micro_batch_size=2,
)


@pytest.fixture(scope="module")
def cluster(tokens: data.Tokens) -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.LocalCluster(workers=range(3), tokens=tokens, timeout_s=60.0) as pool:
        yield pool


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_pipeline_beside_a_replica_trains_exactly_like_the_reference(
    cluster: local_cluster.LocalCluster, tokens: data.Tokens, family: str
) -> None:
    config = semantics.TrainingConfig(
        shape=_shape(family),
        seed=SEED,
        global_batch_size=MIXED.global_batch_size,
        micro_batch_size=MIXED.micro_batch_size,
        optimizer=model.OptimizerConfig(lr=3e-3, eps=1e-6),
        reduction=messages.Reduction.EXACT,
    )
    run = cluster.run(config, MIXED, range(STEPS))
    assert run.ok, (run.errors, run.lost)
    trainer = reference.ReferenceTrainer(config, tokens)
    losses = [trainer.step(step) for step in range(STEPS)]
    assert list(run.losses) == losses
    for index in range(4):
        want = {index: trainer.layer_state(index)}
        for worker, states in run.states.items():
            if index in states:
                found = comparison.compare({index: states[index]}, want)
                assert found.equal, f"worker {worker}, layer {index}: {found.describe()}"


@pytest.mark.parametrize("family", sorted(hf_models.FAMILIES))
def test_an_hf_layer_built_without_init_keeps_its_buffers(family: str) -> None:
    # Rotary tables are buffers, not state: a restored layer must compute them all the same.
    shape = hf_models.shape(family)
    for index in range(shape.num_planner_layers):
        built = model.build_layer(shape, hf_models.SEED, index)
        empty = model.build_layer(shape, hf_models.SEED, index, initialise=False)
        buffers = dict(built.named_buffers())
        assert buffers.keys() == dict(empty.named_buffers()).keys()
        for name, value in empty.named_buffers():
            assert torch.equal(value, buffers[name]), name
