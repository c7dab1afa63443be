"""Layer copies' byte layout (planaria.agent.recovery.layer_transfer), without processes.

Covers: a trained layer's state (parameters, AdamW moments and step) flattened on a source and
poured into a destination's template of the same layer, built from another seed, comes back
bit-exactly, for every layer of the tiny model (hypothesis over layers, seeds, steps); the
sources' shards of a transfer tile the flattened bytes exactly once; a buffer of the wrong size
is refused. The copies across processes are in test_runtime.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.agent.recovery import layer_transfer
from planaria.agent.training import model, semantics
from planaria.contract import plan, shapes

TINY = shapes.named("tiny")


def _config(seed: int) -> semantics.TrainingConfig:
    return semantics.TrainingConfig(shape=TINY, seed=seed, global_batch_size=2, micro_batch_size=1)


def _trained(config: semantics.TrainingConfig, layer: int, steps: int) -> model.LayerState:
    """Layer `layer` after `steps` AdamW steps on random gradients."""
    module = model.build_layer(config.shape, config.seed, layer)
    optimizer = model.make_optimizer(module, config.optimizer)
    generator = torch.Generator().manual_seed(layer * 31 + steps)
    for _ in range(steps):
        for p in module.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    return model.extract_layer_state(layer, module, optimizer)


def _template(config: semantics.TrainingConfig, layer: int) -> model.LayerState:
    return model.initial_state(config.shape, config.seed, layer, config.optimizer)


@settings(max_examples=12, deadline=None)
@given(
    layer=st.integers(0, TINY.num_planner_layers - 1),
    seed=st.integers(0, 1000),
    steps=st.integers(0, 2),
)
def test_a_flattened_state_poured_into_a_template_is_bit_exact(
    layer: int, seed: int, steps: int
) -> None:
    sent = _trained(_config(seed), layer, steps)
    template = _template(_config(seed + 1), layer)
    got = layer_transfer.fill(template, layer_transfer.flatten(sent))
    assert got.names == sent.names and got.index == layer
    assert all(map(torch.equal, got.tensors(), sent.tensors()))
    assert all(
        a.dtype == b.dtype and a.shape == b.shape
        for a, b in zip(got.tensors(), sent.tensors(), strict=True)
    )


@given(n=st.integers(0, 10_000), k=st.integers(1, 8))
def test_the_sources_shards_tile_the_state_once(n: int, k: int) -> None:
    transfer = plan.LayerTransfer(
        layer=0, destination=plan.WorkerId(99), sources=tuple(plan.WorkerId(i) for i in range(k))
    )
    covered = [i for s in transfer.sources for i in transfer.shard(s, n)]
    assert covered == list(range(n))


def test_a_buffer_of_the_wrong_size_is_refused() -> None:
    template = _template(_config(0), 1)
    with pytest.raises(layer_transfer.TransferError, match="layer 1: received 3 bytes"):
        layer_transfer.fill(template, torch.zeros(3, dtype=torch.uint8))
