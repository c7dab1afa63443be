"""Optimizer recomputing (REFT AOR) for AdamW (planaria.agent.state.recompute, snapshot_writer).

Covers: the host replica of a peer's optimizer moments, updated only from gradients, stays
bit-identical to the live AdamW moments over several steps with weight decay, for every member
of a group of 3, and a member lost is rebuilt from it bit-exactly; the bytes really come from the
replica (a replica fed wrong gradients diverges); a snapshot without the step's recompute and a
skipped step are refused with a message that says what to call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from planaria.agent.state import parity, snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import model, reference, semantics
from planaria.contract import plan, shapes
from planaria.wire import messages

MICRO = shapes.ModelShape(
    name="micro", num_layers=2, d_model=16, num_heads=2, seq_len=8, vocab_size=256
)
M = 3
GROUPS = {i: tuple(plan.WorkerId(w) for w in range(M)) for i in range(4)}


def _trainer() -> reference.ReferenceTrainer:
    config = semantics.TrainingConfig(
        shape=MICRO,
        seed=7,
        global_batch_size=4,
        micro_batch_size=2,
        optimizer=model.OptimizerConfig(lr=1e-2, weight_decay=0.1),
    )
    tokens = np.random.default_rng(1).integers(0, 256, size=20_000, dtype=np.uint8)
    return reference.ReferenceTrainer(config, tokens)


def _live(trainer: reference.ReferenceTrainer) -> list[model.LayerState]:
    pairs = zip(trainer.layers, trainer.optimizers, strict=True)
    return [snapshots.live_layer_state(i, layer, opt) for i, (layer, opt) in enumerate(pairs)]


def _backward(trainer: reference.ReferenceTrainer, step: int) -> None:
    """Forward and backward of step `step` (the reference recipe up to the optimizer step)."""
    config = trainer.config
    (micro_batches,) = trainer.sampler.split(
        step, config.micro_batch_size, [config.num_micro_batches]
    )
    for samples in micro_batches:
        inputs, targets = trainer.dataset.batch(samples)
        logits = model.run_layers(trainer.layers, inputs)
        torch.autograd.backward(model.micro_batch_loss(logits, targets, config.global_batch_size))


def _optimizer_step(trainer: reference.ReferenceTrainer) -> None:
    for optimizer in trainer.optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _gradients(
    trainer: reference.ReferenceTrainer, scale: float = 1.0
) -> list[list[torch.Tensor | None]]:
    return [
        [None if p.grad is None else p.grad * scale for p in layer.parameters()]
        for layer in trainer.layers
    ]


def _writers(base: Path) -> list[snapshot_writer.SnapshotWriter]:
    return [
        snapshot_writer.SnapshotWriter(
            snapshot_store.SnapshotStore(snapshot_store.store_root("job", w, base)),
            snapshot_writer.WriterConfig(
                job="job",
                worker=plan.WorkerId(w),
                redundancy=messages.RedundancyMode.RECOMPUTE,
                optimizer=model.OptimizerConfig(lr=1e-2, weight_decay=0.1),
            ),
        )
        for w in range(M)
    ]


def _train_with_recompute(
    trainer: reference.ReferenceTrainer,
    writers: list[snapshot_writer.SnapshotWriter],
    steps: range,
    grad_scale: float = 1.0,
) -> None:
    for step in steps:
        _backward(trainer, step)
        grads = _gradients(trainer, grad_scale)
        for writer in writers:
            writer.recompute_step(step + 1, _live(trainer), grads, GROUPS)
        _optimizer_step(trainer)
        for writer in writers:
            writer.begin(step=step + 1, epoch=1, states=_live(trainer), groups=GROUPS)
        for writer in writers:
            writer.wait(30)


def _peer_copy_is_live(
    trainer: reference.ReferenceTrainer, writers: list[snapshot_writer.SnapshotWriter], step: int
) -> bool:
    """Every member's stored copy of its peer's shard equals the live state's bytes."""
    for w, writer in enumerate(writers):
        for state in _live(trainer):
            member = snapshots.read_member(writer.store, step, state.index)
            flat = snapshots.flat_bytes(state)
            span = parity.shard_range(flat.nbytes, M, (w + 1) % M)
            assert member.redundant is not None
            if member.redundant.tobytes() != flat.copy(span.start, span.stop).tobytes():
                return False
    return True


def test_the_replica_tracks_adamw_bit_exactly_and_rebuilds_a_lost_member(tmp_path: Path) -> None:
    trainer, writers = _trainer(), _writers(tmp_path)
    for step in range(4):
        _train_with_recompute(trainer, writers, range(step, step + 1))
        assert _peer_copy_is_live(trainer, writers, step + 1), f"step {step + 1}"
    for lost in range(M):
        survivors = [w.store for i, w in enumerate(writers) if i != lost]
        for state in _live(trainer):
            rebuilt = snapshots.load_layer(survivors, 4, state.index)
            expected = [snapshots.host_bytes(t).tobytes() for t in state.tensors()]
            assert [snapshots.host_bytes(t).tobytes() for t in rebuilt.tensors()] == expected


def test_the_copy_comes_from_the_replica(tmp_path: Path) -> None:
    trainer, writers = _trainer(), _writers(tmp_path)
    _train_with_recompute(trainer, writers, range(1))
    trainer_b, writers_b = _trainer(), _writers(tmp_path / "b")
    _train_with_recompute(trainer_b, writers_b, range(1), grad_scale=1.5)  # replica misled
    assert _peer_copy_is_live(trainer, writers, 1)
    assert not _peer_copy_is_live(trainer_b, writers_b, 1)


def test_a_snapshot_without_its_recompute_step_is_refused(tmp_path: Path) -> None:
    trainer, writers = _trainer(), _writers(tmp_path)
    _train_with_recompute(trainer, writers, range(1))
    _backward(trainer, 1)
    _optimizer_step(trainer)
    with pytest.raises(snapshot_store.SnapshotConfigError, match="call recompute_step"):
        writers[0].begin(step=2, epoch=1, states=_live(trainer), groups=GROUPS)


def test_a_skipped_step_is_refused(tmp_path: Path) -> None:
    trainer, writers = _trainer(), _writers(tmp_path)
    _train_with_recompute(trainer, writers, range(1))
    _backward(trainer, 1)
    grads = _gradients(trainer)
    with pytest.raises(snapshot_store.SnapshotConfigError, match="cannot apply step 3"):
        writers[0].recompute_step(3, _live(trainer), grads, GROUPS)
