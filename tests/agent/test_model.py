"""The GPT as planner layers (planaria.agent.training.model).

Covers: parameter counts equal the shape's per-layer counts; a layer built alone is bit-identical
to the same layer built with the whole model, on any shape, and building draws nothing from
torch's global RNG; seeds and layer indices give different parameters; layer input and output
shapes; attention is causal; micro-batch losses add up to the global batch's mean token loss
and their gradients to its gradient; AdamW hyper-parameters and weight-decay groups; per-layer
state extract -> load round-trips bit-exactly (parameters and AdamW moments and steps, before
and after steps) and later steps continue identically; mismatched states are refused.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planaria.agent.training import model
from planaria.contract import shapes
from tests import strategies

TINY = shapes.named("tiny")
MICRO = shapes.ModelShape(
    name="micro", num_layers=2, d_model=16, num_heads=2, seq_len=8, vocab_size=32
)
BUILD_SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _params(layer: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in layer.parameters()]


def _identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _random_ids(shape: shapes.ModelShape, batch: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, shape.vocab_size, (batch, shape.seq_len), generator=generator)


# --- building -----------------------------------------------------------------------------------


@BUILD_SETTINGS
@given(shape=strategies.small_shapes(max_layers=3))
def test_parameter_counts_equal_the_shapes_layer_counts(shape: shapes.ModelShape) -> None:
    layers = model.build_layers(shape, seed=1)
    counts = tuple(sum(p.numel() for p in layer.parameters()) for layer in layers)
    assert counts == shape.layer_parameters()


@BUILD_SETTINGS
@given(shape=strategies.small_shapes(max_layers=3), seed=st.integers(0, 2**40), data=st.data())
def test_a_layer_built_alone_equals_it_built_in_the_full_model(
    shape: shapes.ModelShape, seed: int, data: st.DataObject
) -> None:
    full = model.build_layers(shape, seed)
    index = data.draw(st.integers(0, shape.num_planner_layers - 1), label="index")
    alone = model.build_layer(shape, seed, index)
    assert _identical(_params(alone), _params(full[index]))


def test_a_stage_built_from_a_range_equals_the_full_models_layers() -> None:
    full = model.build_layers(TINY, seed=5)
    stage = model.build_layers(TINY, seed=5, indices=range(2, 5))
    for layer, index in zip(stage, range(2, 5), strict=True):
        assert _identical(_params(layer), _params(full[index]))


def test_building_draws_nothing_from_torchs_global_rng() -> None:
    before = torch.random.get_rng_state()
    model.build_layers(TINY, seed=3)
    assert torch.equal(before, torch.random.get_rng_state())


def test_seeds_and_layer_indices_give_different_parameters() -> None:
    a, b = model.build_layers(TINY, seed=0), model.build_layers(TINY, seed=1)
    assert not torch.equal(_params(a[1])[2], _params(b[1])[2])  # qkv weights
    assert not torch.equal(_params(a[1])[2], _params(a[2])[2])


def test_initialisation_follows_gpt2() -> None:
    block = model.build_layer(TINY, 0, 1)
    assert isinstance(block, model.Block)
    assert torch.equal(block.ln_1.weight, torch.ones(TINY.d_model))
    assert torch.equal(block.qkv.bias, torch.zeros(3 * TINY.d_model))
    assert block.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    residual = 0.02 / (2 * TINY.num_layers) ** 0.5
    assert block.mlp_proj.weight.std().item() == pytest.approx(residual, rel=0.05)


def test_layer_names_match_the_planners() -> None:
    names = [model.layer_name(TINY, i) for i in range(TINY.num_planner_layers)]
    assert names == ["embedding", "block.0", "block.1", "block.2", "block.3", "head"]


@pytest.mark.parametrize("index", [-1, TINY.num_planner_layers], ids=["below 0", "past the head"])
def test_a_layer_index_outside_the_model_is_refused(index: int) -> None:
    with pytest.raises(IndexError, match="outside 0..5"):
        model.build_layer(TINY, 0, index)


# --- forward ------------------------------------------------------------------------------------


def test_layers_map_ids_to_hidden_to_logits() -> None:
    layers = model.build_layers(TINY, seed=0)
    ids = _random_ids(TINY, batch=3)
    hidden = model.run_layers(layers[:1], ids)
    assert hidden.shape == (3, TINY.seq_len, TINY.d_model)
    hidden = model.run_layers(layers[1:-1], hidden)
    assert hidden.shape == (3, TINY.seq_len, TINY.d_model)
    assert model.run_layers(layers[-1:], hidden).shape == (3, TINY.seq_len, TINY.vocab_size)


def test_attention_is_causal() -> None:
    layers = model.build_layers(MICRO, seed=0)
    ids = _random_ids(MICRO, batch=1)
    changed = ids.clone()
    changed[0, 5] = (changed[0, 5] + 1) % MICRO.vocab_size
    with torch.no_grad():
        before, after = model.run_layers(layers, ids), model.run_layers(layers, changed)
    assert torch.equal(before[0, :5], after[0, :5])
    assert not torch.allclose(before[0, 5:], after[0, 5:])


def test_initial_loss_is_near_uniform() -> None:
    layers = model.build_layers(TINY, seed=0)
    ids = _random_ids(TINY, batch=2)
    with torch.no_grad():
        loss = model.micro_batch_loss(model.run_layers(layers, ids), ids, 2)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(256.0)).item(), rel=0.02)


# --- loss semantics -----------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 6), data=st.data())
def test_micro_batch_losses_add_up_to_the_mean_token_loss(batch: int, data: st.DataObject) -> None:
    generator = torch.Generator().manual_seed(batch)
    # float64: the bound stays orders above rounding on any CPU, and far below a mis-scaled loss
    logits = torch.randn(batch, 7, 11, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 11, (batch, 7), generator=generator)
    cuts = sorted(data.draw(st.sets(st.integers(1, batch - 1))) if batch > 1 else set())
    bounds = [0, *cuts, batch]
    total = sum(
        model.micro_batch_loss(logits[a:b], targets[a:b], batch).item()
        for a, b in zip(bounds, bounds[1:], strict=False)
    )
    expected = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)).item()
    assert total == pytest.approx(expected, rel=1e-12)


def test_micro_batch_gradients_add_up_to_the_global_batch_gradient() -> None:
    # float64: the splits run other matrix shapes, whose rounding differs by CPU; in float64 it
    # stays orders below the bound, while a mis-scaled micro-batch loss is off by 1e-2 or more
    layers = [layer.double() for layer in model.build_layers(MICRO, seed=0)]
    ids = _random_ids(MICRO, batch=4)
    whole = model.micro_batch_loss(model.run_layers(layers, ids), ids, 4)
    expected = torch.autograd.grad(whole, list(layers[1].parameters()))
    for part in (ids[:1], ids[1:]):
        loss = model.micro_batch_loss(model.run_layers(layers, part), part, 4)
        torch.autograd.backward(loss)
    for grad, want in zip((p.grad for p in layers[1].parameters()), expected, strict=True):
        assert grad is not None
        assert grad.dtype == torch.float64
        torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-14)


# --- optimizer ----------------------------------------------------------------------------------


def test_weight_decay_applies_to_matrices_only() -> None:
    block = model.build_layer(TINY, 0, 1)
    optimizer = model.make_optimizer(block, model.OptimizerConfig(weight_decay=0.3))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.3 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"])
    assert all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(block.parameters()))


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", 0.0), ("lr", float("nan")), ("beta1", 1.0), ("beta2", -0.1), ("eps", 0.0)]
    + [("weight_decay", -1.0)],
    ids=["lr zero", "lr nan", "beta1 one", "beta2 negative", "eps zero", "negative decay"],
)
def test_optimizer_config_rejects(field: str, value: float) -> None:
    with pytest.raises(model.OptimizerConfigError, match=field):
        model.OptimizerConfig(**{field: value})


# --- per-layer state ----------------------------------------------------------------------------


def _trained(seed: int, steps: int) -> tuple[list[torch.nn.Module], list[torch.optim.AdamW]]:
    """MICRO trained `steps` steps on random batches (batch k drawn from seed k)."""
    layers = model.build_layers(MICRO, seed)
    optimizers = [model.make_optimizer(layer, model.OptimizerConfig()) for layer in layers]
    for k in range(steps):
        _train_step(layers, optimizers, _random_ids(MICRO, batch=2, seed=k))
    return layers, optimizers


def _train_step(
    layers: list[torch.nn.Module], optimizers: list[torch.optim.AdamW], ids: torch.Tensor
) -> None:
    torch.autograd.backward(model.micro_batch_loss(model.run_layers(layers, ids), ids, 2))
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("steps", [0, 3], ids=["before any step", "after three steps"])
def test_state_round_trips_bit_exactly(steps: int) -> None:
    layers, optimizers = _trained(seed=0, steps=steps)
    fresh_layers, fresh_optimizers = _trained(seed=9, steps=1)
    for i, (layer, optimizer) in enumerate(zip(layers, optimizers, strict=True)):
        state = model.extract_layer_state(i, layer, optimizer)
        assert state.names == tuple(name for name, _ in layer.named_parameters())
        assert all(step.item() == steps for step in state.steps)
        model.load_layer_state(i, fresh_layers[i], fresh_optimizers[i], state)
        again = model.extract_layer_state(i, fresh_layers[i], fresh_optimizers[i])
        assert _identical(list(again.tensors()), list(state.tensors()))
    # Both copies now take the same step and stay bit-identical.
    ids = _random_ids(MICRO, batch=2, seed=100)
    _train_step(layers, optimizers, ids)
    _train_step(fresh_layers, fresh_optimizers, ids)
    for layer, fresh in zip(layers, fresh_layers, strict=True):
        assert _identical(_params(layer), _params(fresh))


def test_state_is_a_copy_detached_from_the_layer() -> None:
    layers, optimizers = _trained(seed=0, steps=1)
    state = model.extract_layer_state(1, layers[1], optimizers[1])
    kept = [t.clone() for t in state.tensors()]
    _train_step(layers, optimizers, _random_ids(MICRO, batch=2, seed=5))
    assert _identical(list(state.tensors()), kept)
    assert state.nbytes == sum(t.numel() * t.element_size() for t in kept)


def test_state_of_another_layer_is_refused() -> None:
    layers, optimizers = _trained(seed=0, steps=1)
    block = model.extract_layer_state(1, layers[1], optimizers[1])
    with pytest.raises(
        model.LayerStateError, match="state of layer 1 cannot be loaded into layer 2"
    ):
        model.load_layer_state(2, layers[2], optimizers[2], block)
    relabelled = model.LayerState(
        index=0,
        names=block.names,
        parameters=block.parameters,
        exp_avg=block.exp_avg,
        exp_avg_sq=block.exp_avg_sq,
        steps=block.steps,
    )
    with pytest.raises(model.LayerStateError, match="layer 0 has parameters"):
        model.load_layer_state(0, layers[0], optimizers[0], relabelled)


def test_state_with_a_wrong_shape_is_refused() -> None:
    small = model.build_layer(MICRO, 0, 1)
    wider = shapes.ModelShape(
        name="wider", num_layers=2, d_model=32, num_heads=2, seq_len=8, vocab_size=32
    )
    other = model.build_layer(wider, 0, 1)
    state = model.extract_layer_state(
        1, other, model.make_optimizer(other, model.OptimizerConfig())
    )
    optimizer = model.make_optimizer(small, model.OptimizerConfig())
    with pytest.raises(model.LayerStateError, match="parameter ln_1.weight: shape"):
        model.load_layer_state(1, small, optimizer, state)


def test_state_with_uneven_tensor_groups_is_refused() -> None:
    with pytest.raises(model.LayerStateError, match="2 names"):
        model.LayerState(
            index=0,
            names=("a", "b"),
            parameters=(torch.zeros(1),),
            exp_avg=(torch.zeros(1),) * 2,
            exp_avg_sq=(torch.zeros(1),) * 2,
            steps=(torch.tensor(0.0),) * 2,
        )


def test_a_layer_built_without_init_then_loaded_equals_the_initialised_one() -> None:
    # What a restore does (`epoch_setup`): no random init for a layer whose state is loaded.
    layers, optimizers = _trained(seed=0, steps=2)
    for i, (layer, optimizer) in enumerate(zip(layers, optimizers, strict=True)):
        state = model.extract_layer_state(i, layer, optimizer)
        empty = model.build_layer(MICRO, 7, i, initialise=False)
        blank = model.make_optimizer(empty, model.OptimizerConfig())
        model.load_layer_state(i, empty, blank, state)
        again = model.extract_layer_state(i, empty, blank)
        assert _identical(list(again.tensors()), list(state.tensors()))
        assert [p.device.type for p in empty.parameters()] == ["cpu"] * len(_params(empty))
