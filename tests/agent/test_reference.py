"""The reference trainer (planaria.agent.training.reference), the oracle distributed runs are held
to.

Covers: the tiny model's loss falls by at least 30% within 200 steps on the standard library
corpus; different micro-batch splits of the same global batch give the same parameters in
float64 (where their rounding stays 6 orders below the bound on any CPU); the step runs the
documented recipe (a hand-written two-stage pipeline with detached stage boundaries, as the
executor will run it, matches bit-exactly); restoring every layer's state from a snapshot and
replaying the following steps reproduces the run bit-exactly; training configurations are
validated.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planaria.agent.training import data, model, reference, semantics
from planaria.contract import shapes

TINY = shapes.named("tiny")
FLOAT64_BOUND = 1e-9  # see test_micro_batch_splits_agree_in_float64
MICRO = shapes.ModelShape(
    name="micro", num_layers=3, d_model=32, num_heads=4, seq_len=16, vocab_size=256
)


@pytest.fixture(scope="module")
def stdlib_tokens() -> data.Tokens:
    return data.load_default_corpus(max_bytes=1_000_000)


def _trainer(
    tokens: data.Tokens,
    *,
    micro_batch: int,
    global_batch: int = 8,
    lr: float = 1e-3,
    dtype: torch.dtype = torch.float32,
) -> reference.ReferenceTrainer:
    config = semantics.TrainingConfig(
        shape=MICRO,
        seed=3,
        global_batch_size=global_batch,
        micro_batch_size=micro_batch,
        optimizer=model.OptimizerConfig(lr=lr),
    )
    trainer = reference.ReferenceTrainer(config, tokens)
    for layer in trainer.layers:
        layer.to(dtype)  # in place: the optimizers keep referring to the same parameters
    return trainer


def _parameters(trainer: reference.ReferenceTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for layer in trainer.layers for p in layer.parameters()]


def test_the_tiny_model_learns_the_standard_library(stdlib_tokens: data.Tokens) -> None:
    config = semantics.TrainingConfig(
        shape=TINY,
        seed=0,
        global_batch_size=8,
        micro_batch_size=4,
        optimizer=model.OptimizerConfig(lr=3e-3),
    )
    trainer = reference.ReferenceTrainer(config, stdlib_tokens)
    losses = [trainer.step(step) for step in range(200)]
    assert losses[0] == pytest.approx(np.log(256), rel=0.02)
    assert np.mean(losses[-10:]) <= 0.7 * losses[0], losses[::20]


@pytest.mark.parametrize(
    "micro_batch", [1, 2, 8], ids=["8 micro-batches", "4 micro-batches", "1 micro-batch"]
)
def test_micro_batch_splits_agree_in_float64(stdlib_tokens: data.Tokens, micro_batch: int) -> None:
    # Micro-batches of another size run other kernels (other matrix shapes), not only another
    # summation order, so no mode makes splits bitwise equal. In float64 their rounding leaves
    # differences of about 1e-15 after 3 steps (measured: at most 1.4e-15 absolute), 6 orders
    # below the bound; a loss scaled by the micro-batch instead of the global batch, or a lost
    # micro-batch, moves parameters by 1e-4 or more. So the check depends on no CPU's float32.
    baseline, split = (
        _trainer(stdlib_tokens, micro_batch=4, dtype=torch.float64),
        _trainer(stdlib_tokens, micro_batch=micro_batch, dtype=torch.float64),
    )
    for step in range(3):
        assert split.step(step) == pytest.approx(baseline.step(step), rel=FLOAT64_BOUND)
    for got, want in zip(_parameters(split), _parameters(baseline), strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=FLOAT64_BOUND, atol=FLOAT64_BOUND)


def _two_stage_step(
    stages: list[list[torch.nn.Module]],
    optimizers: list[torch.optim.AdamW],
    trainer: reference.ReferenceTrainer,
    step: int,
) -> None:
    """One step as a two-stage pipeline runs it: stage 1 receives a detached activation and
    sends the gradient of its input back, which stage 0 backpropagates."""
    config = trainer.config
    (micro_batches,) = trainer.sampler.split(
        step, config.micro_batch_size, [config.num_micro_batches]
    )
    for samples in micro_batches:
        inputs, targets = trainer.dataset.batch(samples)
        sent = model.run_layers(stages[0], inputs)
        received = sent.detach().requires_grad_(True)
        logits = model.run_layers(stages[1], received)
        loss = model.micro_batch_loss(logits, targets, config.global_batch_size)
        torch.autograd.backward(loss)
        torch.autograd.backward(sent, received.grad)
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_a_two_stage_pipeline_reproduces_the_reference_bit_exactly(
    stdlib_tokens: data.Tokens,
) -> None:
    trainer = _trainer(stdlib_tokens, micro_batch=2)
    cut = 2
    stages = [
        model.build_layers(MICRO, seed=3, indices=range(cut)),
        model.build_layers(MICRO, seed=3, indices=range(cut, MICRO.num_planner_layers)),
    ]
    layers = stages[0] + stages[1]
    optimizers = [model.make_optimizer(layer, trainer.config.optimizer) for layer in layers]
    for step in range(3):
        trainer.step(step)
        _two_stage_step(stages, optimizers, trainer, step)
    for mine, theirs in zip(layers, trainer.layers, strict=True):
        for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(p, q)


def test_restoring_a_snapshot_replays_the_run_bit_exactly(stdlib_tokens: data.Tokens) -> None:
    trainer = _trainer(stdlib_tokens, micro_batch=4)
    for step in range(2):
        trainer.step(step)
    snapshot = [trainer.layer_state(i) for i in range(MICRO.num_planner_layers)]
    later = [trainer.step(step) for step in (2, 3)]
    restored = _trainer(stdlib_tokens, micro_batch=4)
    for state in snapshot:
        restored.load_layer_state(state)
    assert [restored.step(step) for step in (2, 3)] == later
    for got, want in zip(_parameters(restored), _parameters(trainer), strict=True):
        assert torch.equal(got, want)


def test_evaluation_changes_nothing(stdlib_tokens: data.Tokens) -> None:
    trainer = _trainer(stdlib_tokens, micro_batch=4)
    before = _parameters(trainer)
    loss = trainer.evaluate((0, 1, 2))
    assert loss == pytest.approx(np.log(256), rel=0.05)
    assert all(torch.equal(a, b) for a, b in zip(before, _parameters(trainer), strict=True))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"global_batch_size": 6, "micro_batch_size": 4}, r"global_batch_size \(6\) must be a"),
        ({"micro_batch_size": 0}, "micro_batch_size must be >= 1"),
        ({"global_batch_size": 0}, "global_batch_size must be >= 1"),
        ({"seed": -1}, "seed must be >= 0"),
    ],
    ids=["a batch the micro-batch does not divide", "empty micro-batches", "an empty batch"]
    + ["a negative seed"],
)
def test_a_training_config_is_refused_with(fields: dict[str, int], message: str) -> None:
    arguments = {"seed": 0, "global_batch_size": 8, "micro_batch_size": 4} | fields
    with pytest.raises(semantics.TrainingConfigError, match=message):
        semantics.TrainingConfig(
            shape=MICRO,
            seed=arguments["seed"],
            global_batch_size=arguments["global_batch_size"],
            micro_batch_size=arguments["micro_batch_size"],
        )
