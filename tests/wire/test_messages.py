"""The contract's dataclasses (planaria.wire.messages) refuse values that break the contract.

Covers: each dataclass's checks, with a ValueError that names the field (rendezvous ports, ranks
and timeouts; AdamW hyper-parameters; corpus paths and byte caps; settings; worker configs whose
transfers do not involve the worker, go to non-holders, repeat, or whose plan makes another
global batch; timings; snapshot state; latched errors; heartbeats; acknowledgements; profile
orders; snapshot loads), and that a worker outside the plan may still be a transfer source.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.wire import messages
from tests import strategies

W = plans.WorkerId


def _rendezvous(**change: object) -> messages.Rendezvous:
    fields: dict[str, object] = dict(
        store_host="controller",
        store_port=29500,
        key_prefix="epoch-1",
        rank=1,
        world_size=2,
        backend=messages.Backend.GLOO,
        timeout_s=10.0,
    )
    return messages.Rendezvous(**{**fields, **change})  # type: ignore[arg-type]


def _settings(**change: object) -> messages.TrainingSettings:
    fields: dict[str, object] = dict(
        model="tiny",
        seed=0,
        optimizer=messages.OptimizerSettings(lr=1e-3),
        global_batch_size=8,
        data=messages.DataSettings(corpus_paths=("a.txt",)),
        device=messages.Device.CPU,
        snapshot_interval_steps=0,
        redundancy=messages.RedundancyMode.XOR,
    )
    return messages.TrainingSettings(**{**fields, **change})  # type: ignore[arg-type]


def _plan() -> plans.Plan:
    """Two single-stage pipelines over 3 layers, workers 0 and 1, 2 micro-batches of 2 each."""
    pipelines = tuple(
        plans.Pipeline(
            stages=(plans.Stage(layer_start=0, layer_stop=3, workers=(W(w),)),),
            num_micro_batches=2,
        )
        for w in (0, 1)
    )
    return plans.Plan(pipelines=pipelines, micro_batch_size=2)


def _config(worker: int, *transfers: plans.LayerTransfer) -> messages.WorkerConfig:
    return messages.WorkerConfig(
        epoch=1,
        worker=W(worker),
        plan=_plan(),
        resume_step=0,
        rendezvous=_rendezvous(),
        transfers=transfers,
        settings=_settings(),
    )


def _transfer(layer: int, destination: int, *sources: int) -> plans.LayerTransfer:
    return plans.LayerTransfer(
        layer=layer, destination=W(destination), sources=tuple(W(s) for s in sources)
    )


CASES: list[tuple[str, Callable[[], object], str]] = [
    ("an empty store host", lambda: _rendezvous(store_host=""), "store_host"),
    ("port 0", lambda: _rendezvous(store_port=0), "store_port"),
    ("port 65536", lambda: _rendezvous(store_port=65536), "store_port"),
    ("an empty key prefix", lambda: _rendezvous(key_prefix=""), "key_prefix"),
    ("a rank outside the world", lambda: _rendezvous(rank=2), "rank"),
    ("an empty world", lambda: _rendezvous(world_size=0, rank=0), "world_size"),
    ("a zero timeout", lambda: _rendezvous(timeout_s=0.0), "timeout_s"),
    ("a NaN timeout", lambda: _rendezvous(timeout_s=math.nan), "timeout_s"),
    ("a zero learning rate", lambda: messages.OptimizerSettings(lr=0.0), "lr"),
    ("beta1 of 1", lambda: messages.OptimizerSettings(lr=1.0, beta1=1.0), "beta1"),
    ("a negative beta2", lambda: messages.OptimizerSettings(lr=1.0, beta2=-0.1), "beta2"),
    ("a zero eps", lambda: messages.OptimizerSettings(lr=1.0, eps=0.0), "eps"),
    ("negative decay", lambda: messages.OptimizerSettings(lr=1.0, weight_decay=-1), "weight_decay"),
    ("no corpus", lambda: messages.DataSettings(corpus_paths=()), "corpus_paths"),
    ("an empty path", lambda: messages.DataSettings(corpus_paths=("",)), "corpus_paths"),
    ("a zero byte cap", lambda: messages.DataSettings(corpus_paths=("a",), max_bytes=0), "max_"),
    ("no text field", lambda: messages.DataSettings(corpus_paths=("a",), text_field=""), "text_"),
    ("no model", lambda: _settings(model=""), "model"),
    ("a negative seed", lambda: _settings(seed=-1), "seed"),
    ("an empty global batch", lambda: _settings(global_batch_size=0), "global_batch_size"),
    ("a negative interval", lambda: _settings(snapshot_interval_steps=-1), "snapshot_interval"),
    ("epoch 0", lambda: dataclasses.replace(_config(0), epoch=0), "epoch"),
    ("a negative resume step", lambda: dataclasses.replace(_config(0), resume_step=-1), "resume"),
    (
        "a plan with another global batch",
        lambda: dataclasses.replace(_config(0), settings=_settings(global_batch_size=9)),
        "global batch",
    ),
    ("a transfer that is not the worker's", lambda: _config(0, _transfer(0, 1, 2)), "involve"),
    ("a transfer to a non-holder", lambda: _config(2, _transfer(0, 3, 2)), "does not hold"),
    ("a layer beyond the plan", lambda: _config(0, _transfer(5, 0, 1)), "plan has 3 layers"),
    (
        "the same layer sent twice",
        lambda: _config(0, _transfer(0, 0, 1), _transfer(0, 0, 2)),
        "twice",
    ),
    ("negative seconds", lambda: messages.Timings(step_s=-1.0), "step_s"),
    ("infinite seconds", lambda: messages.Timings(forward_s=math.inf), "forward_s"),
    ("snapshot step 0", lambda: messages.SnapshotState(latest_step=0), "latest_step"),
    ("bytes without a snapshot", lambda: messages.SnapshotState(held_bytes=5), "held_bytes"),
    (
        "a negative achieved interval",
        lambda: messages.SnapshotState(achieved_interval_steps=-1.0),
        "achieved_interval_steps",
    ),
    (
        "an error without a message",
        lambda: messages.LatchedError(kind=messages.ErrorKind.TIMEOUT, message="", step=1),
        "message",
    ),
    (
        "a negative peer",
        lambda: messages.LatchedError(
            kind=messages.ErrorKind.PEER_LOST, message="gone", step=1, peer_worker=W(-1)
        ),
        "peer_worker",
    ),
    (
        "a loss before any step",
        lambda: messages.Heartbeat(
            worker=W(0),
            epoch=0,
            state=messages.AgentState.IDLE,
            last_committed_step=0,
            loss=1.0,
            samples_processed=0,
            timings=messages.Timings(),
            snapshot=messages.SnapshotState(),
        ),
        "loss",
    ),
    (
        "a failure without an error",
        lambda: messages.Heartbeat(
            worker=W(0),
            epoch=1,
            state=messages.AgentState.FAILED,
            last_committed_step=3,
            loss=None,
            samples_processed=0,
            timings=messages.Timings(),
            snapshot=messages.SnapshotState(),
        ),
        "failed",
    ),
    ("a refusal without reason", lambda: messages.Acknowledgement(accepted=False), "reason"),
    (
        "a profile of no repeats",
        lambda: messages.ProfileOrder(model="tiny", micro_batch_size=1, repeats=0),
        "repeats",
    ),
    ("a load of step 0", lambda: messages.SnapshotLoad(epoch=1, step=0), "step"),
    (
        "checkpoints not a multiple of snapshots",
        lambda: _settings(
            snapshot_interval_steps=4, checkpoint_dir="/ckpt", checkpoint_interval_steps=6
        ),
        "checkpoint_interval_steps",
    ),
    (
        "checkpoints without snapshots",
        lambda: _settings(checkpoint_dir="/ckpt", checkpoint_interval_steps=6),
        "multiple",
    ),
    (
        "a stop before the resume step",
        lambda: dataclasses.replace(_config(0), resume_step=5, stop_step=4),
        "stop_step",
    ),
    (
        "an epoch setup of epoch 0",
        lambda: messages.EpochSetup(epoch=0, tier=messages.RecoveryTier.KEPT),
        "epoch",
    ),
    (
        "an epoch setup taking negative seconds",
        lambda: messages.EpochSetup(epoch=1, tier=messages.RecoveryTier.KEPT, load_s=-1.0),
        "load_s",
    ),
]


@pytest.mark.parametrize(("build", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_with_a_message_naming_the_field(build: Callable[[], object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build()


def test_a_worker_outside_the_plan_may_send_a_layer_it_held() -> None:
    config = _config(7, _transfer(2, 1, 7, 0))
    assert config.worker not in config.plan.workers


def test_a_worker_may_receive_and_send_in_one_epoch() -> None:
    config = _config(0, _transfer(0, 0, 5), _transfer(1, 1, 0))
    assert len(config.transfers) == 2


@given(st.lists(strategies.plans(), min_size=1, max_size=3))
def test_a_plans_holders_are_those_of_its_stages_whichever_plan_was_indexed_last(
    drawn: list[plans.Plan],
) -> None:
    """`_holders` indexes the last plan it was asked about (the controller builds all of an
    epoch's Configures from one plan): for each plan in turn, and the first again, every
    layer's holders are those of the stages that hold it (the walk it replaced)."""
    for p in [*drawn, drawn[0]]:
        for layer in range(p.num_layers + 1):
            stages = (s for q in p.pipelines for s in q.stages if layer in s.layers)
            assert messages._holders(p, layer) == {w for s in stages for w in s.workers}
