"""The comparator of trained states against the reference (planaria.agent.training.comparison).

Covers: exact comparison is bitwise (-0.0 is not 0.0, a NaN is reported, step counts count)
and reports the count and the location of differing elements and missing layers; a bug injected
into the last of 5 steps (a micro-batch dropped, a mean over two replicas instead of a sum, a
stale copy of one layer) is caught in exact mode and, within the bound derived from the
reference's own sensitivity to summation order, in fast mode too, while the reference with its
micro-batches reordered passes that bound; states of another model are refused.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from planaria.agent.training import comparison, data, model, reduction, reference, semantics
from planaria.contract import shapes
from planaria.wire import messages

MICRO = shapes.ModelShape(
    name="micro", num_layers=3, d_model=32, num_heads=4, seq_len=16, vocab_size=256
)
STEPS = 5
BUGS = ["dropped micro-batch", "mean instead of sum", "stale layer"]
States = dict[int, model.LayerState]


@pytest.fixture(scope="module")
def tokens() -> data.Tokens:
    return data.load_default_corpus(max_bytes=200_000)


def _config(reduction_: messages.Reduction) -> semantics.TrainingConfig:
    return semantics.TrainingConfig(
        shape=MICRO,
        seed=11,
        global_batch_size=8,
        micro_batch_size=2,  # 4 micro-batches: reversing them changes the float32 sums
        optimizer=model.OptimizerConfig(lr=3e-3, eps=1e-6),
        reduction=reduction_,
    )


def _states(trainer: reference.ReferenceTrainer) -> States:
    return {i: trainer.layer_state(i) for i in range(MICRO.num_planner_layers)}


def _trained(
    config: semantics.TrainingConfig, tokens: data.Tokens, *, reverse: bool = False
) -> States:
    trainer = reference.ReferenceTrainer(config, tokens, reverse_micro_batches=reverse)
    for step in range(STEPS):
        trainer.step(step)
    return _states(trainer)


def _buggy_step(trainer: reference.ReferenceTrainer, step: int, bug: str) -> None:
    """The reference's step with `bug` in it (the reference's own recipe otherwise)."""
    config = trainer.config
    (micro_batches,) = trainer.sampler.split(
        step, config.micro_batch_size, [config.num_micro_batches]
    )
    sums = reduction.GradientSums(config.reduction)
    params = [p for layer in trainer.layers for p in layer.parameters()]
    with reduction.compute_threads(config.reduction):
        for g, samples in enumerate(micro_batches):
            if bug == "dropped micro-batch" and g == 1:
                continue
            inputs, targets = trainer.dataset.batch(samples)
            logits = model.run_layers(trainer.layers, inputs)
            loss = model.micro_batch_loss(logits, targets, config.global_batch_size)
            torch.autograd.backward(loss)
            sums.absorb(params)
        sums.settle(params)
        for p in params:
            if bug == "mean instead of sum" and p.grad is not None:
                p.grad /= 2
        for optimizer in trainer.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def _with_bug(config: semantics.TrainingConfig, tokens: data.Tokens, bug: str) -> States:
    trainer = reference.ReferenceTrainer(config, tokens)
    for step in range(STEPS - 1):
        trainer.step(step)
    stale = trainer.layer_state(2)
    if bug == "stale layer":
        trainer.step(STEPS - 1)
        return _states(trainer) | {2: stale}
    _buggy_step(trainer, STEPS - 1, bug)
    return _states(trainer)


@pytest.mark.parametrize("bug", BUGS)
def test_an_injected_bug_is_caught_in_exact_mode(tokens: data.Tokens, bug: str) -> None:
    config = _config(messages.Reduction.EXACT)
    want = _trained(config, tokens)
    assert comparison.compare(_trained(config, tokens, reverse=True), want).equal
    result = comparison.compare(_with_bug(config, tokens, bug), want)
    assert not result.equal and result.num_differing > 0


@pytest.mark.parametrize("bug", BUGS)
def test_an_injected_bug_is_caught_in_fast_mode_beyond_the_sensitivity_bound(
    tokens: data.Tokens, bug: str
) -> None:
    config = _config(messages.Reduction.FAST)
    want = _trained(config, tokens)
    reordered = _trained(config, tokens, reverse=True)
    assert not comparison.compare(reordered, want).equal  # the bound is not vacuous
    bounds = comparison.SensitivityBounds.measure(want, reordered)
    assert comparison.compare(reordered, want, bounds).equal
    result = comparison.compare(_with_bug(config, tokens, bug), want, bounds)
    assert not result.equal, f"{bug} went unnoticed"


@pytest.fixture
def states() -> Iterator[States]:
    layer = model.build_layer(MICRO, seed=1, index=1)
    optimizer = model.make_optimizer(layer, model.OptimizerConfig())
    yield {1: model.extract_layer_state(1, layer, optimizer)}


def _changed(
    states: States, kind: str, position: int, index: tuple[int, ...], value: float
) -> States:
    state = states[1]
    tensors = [t.clone() for t in getattr(state, kind)]
    tensors[position][index] = value
    groups: dict[str, tuple[torch.Tensor, ...]] = {k: getattr(state, k) for k in comparison.KINDS}
    groups[kind] = tuple(tensors)
    return {
        1: model.LayerState(
            index=state.index,
            names=state.names,
            parameters=groups["parameters"],
            exp_avg=groups["exp_avg"],
            exp_avg_sq=groups["exp_avg_sq"],
            steps=groups["steps"],
        )
    }


def test_a_difference_is_reported_with_its_count_and_location(states: States) -> None:
    position = states[1].names.index("qkv.weight")
    got = _changed(states, "parameters", position, (3, 7), 1.5)
    result = comparison.compare(got, states)
    assert (result.equal, result.num_differing) == (False, 1)
    (difference,) = result.differences
    assert (difference.layer, difference.kind, difference.name) == (1, "parameters", "qkv.weight")
    assert (difference.first, difference.got) == ((3, 7), 1.5)
    assert "layer 1 parameters qkv.weight: 1 of 3072 elements differ, first at [3, 7]" in (
        result.describe()
    )


@pytest.mark.parametrize(
    ("kind", "value"),
    [("exp_avg", -0.0), ("exp_avg_sq", float("nan")), ("steps", 1.0)],
    ids=["negative zero for zero", "a NaN", "another step count"],
)
def test_exact_comparison_is_bitwise(states: States, kind: str, value: float) -> None:
    index: tuple[int, ...] = () if kind == "steps" else (0,)
    result = comparison.compare(_changed(states, kind, 0, index, value), states)
    assert result.num_differing == 1 and result.differences[0].kind == kind


def test_missing_layers_are_reported_and_another_model_is_refused(states: States) -> None:
    result = comparison.compare({}, states)
    assert result.missing == (1,) and "layers missing [1]" in result.describe()
    other = model.build_layer(MICRO, seed=1, index=0)
    state = model.extract_layer_state(
        1, other, model.make_optimizer(other, model.OptimizerConfig())
    )
    with pytest.raises(ValueError, match="compare states of the same model"):
        comparison.compare({1: state}, states)
