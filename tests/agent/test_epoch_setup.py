"""Finding a layer's state at a step through the recovery tiers (planaria.agent.recovery
.epoch_setup.Locator), without processes.

Covers, for a layer whose sharding group is workers 0 and 1 with COPY redundancy: held at the
step -> KEPT (no copy); held at another step -> this worker's own store rebuilds it
(LOCAL_SNAPSHOT: its shard plus its copy of the peer's), bit-exactly; its own shard corrupted
(one flipped byte, caught by the checksum) -> the layer is wanted from the peers, nothing that
did not arrive is read (no filesystem path to a peer's store), and the peer's member as the
exchange delivers it rebuilds it (PEER_SNAPSHOT), bit-exactly; both corrupted and no
checkpoint -> SnapshotUnavailableError naming the layer, the step and what each tier said;
step 0 with nothing held -> INITIAL; the setup report's tier is the costliest tier used. A
store that is gone (its controller died) fails the connection within about twice the
rendezvous's timeout, not the store client's minute; a live one connects.
"""

from __future__ import annotations

import datetime
import socket
import time
from pathlib import Path

import pytest
import torch
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import held_layers
from planaria.agent.recovery import epoch_setup
from planaria.agent.runtime import training_thread
from planaria.agent.state import manifests, snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import data, model, semantics
from planaria.contract import plan, shapes
from planaria.wire import messages

Tier = messages.RecoveryTier
LAYER, STEP = 2, 3
CONFIG = semantics.TrainingConfig(
    shape=shapes.named("tiny"), seed=4, global_batch_size=2, micro_batch_size=1
)


@pytest.fixture(scope="module")
def job() -> semantics.Job:
    return semantics.Job.from_tokens(CONFIG, data.load_default_corpus(max_bytes=20_000))


def _state() -> model.LayerState:
    module = model.build_layer(CONFIG.shape, CONFIG.seed, LAYER)
    optimizer = model.make_optimizer(module, CONFIG.optimizer)
    for p in module.parameters():
        p.grad = torch.full_like(p, 0.5)
    optimizer.step()
    return model.extract_layer_state(LAYER, module, optimizer)


def _stores(base: Path, state: model.LayerState) -> dict[int, snapshot_store.SnapshotStore]:
    """Workers 0 and 1 both snapshot `state` at STEP (each holds the whole layer)."""
    stores = {}
    for worker in (0, 1):
        store = snapshot_store.SnapshotStore(snapshot_store.store_root("job", worker, base))
        config = snapshot_writer.WriterConfig(
            job="job", worker=plan.WorkerId(worker), redundancy=messages.RedundancyMode.COPY
        )
        writer = snapshot_writer.SnapshotWriter(store, config)
        group = (plan.WorkerId(0), plan.WorkerId(1))
        writer.begin(step=STEP, epoch=1, states=[state], groups={LAYER: group})
        writer.wait()
        writer.close()
        stores[worker] = store
    return stores


def _locator(
    job: semantics.Job,
    own: snapshot_store.SnapshotStore,
    holding: epoch_setup.Holding,
    peer: snapshot_store.SnapshotStore | None = None,
) -> epoch_setup.Locator:
    """A locator of worker 0; `peer`'s member of the layer stands for what the exchange round
    brought over the network (tests/agent/test_runtime.py runs the round itself)."""
    stores = epoch_setup.Stores(own=own, checkpoint_dir="")
    locator = epoch_setup.Locator(job=job, holding=holding, stores=stores, step=STEP)
    if peer is not None:
        try:
            members = [snapshots.read_member(peer, STEP, LAYER)]
        except snapshot_store.SnapshotCorrupt as exc:  # as the receiver's check would say
            locator.peers.problems[LAYER] = [str(exc)]
        else:
            locator.peers.members[LAYER] = members
    return locator


def _corrupt(store: snapshot_store.SnapshotStore) -> None:
    entry = store.manifest(STEP).layer(LAYER)
    stored = entry.file(manifests.FileKind.SHARD)
    assert stored is not None
    for slot in store.root.glob("slot-*"):
        path = slot / stored.file
        if path.exists() and snapshot_store.read_manifest(slot).step == STEP:
            raw = bytearray(path.read_bytes())
            raw[0] ^= 0x01
            path.write_bytes(bytes(raw))


def _same(a: model.LayerState | None, b: model.LayerState) -> bool:
    assert a is not None
    return a.names == b.names and all(map(torch.equal, a.tensors(), b.tensors()))


def test_each_tier_is_used_when_the_cheaper_ones_cannot_serve(
    job: semantics.Job, tmp_path: Path
) -> None:
    state = _state()
    stores = _stores(tmp_path, state)
    held = held_layers.HeldLayers.build(CONFIG, [LAYER])
    at_step = epoch_setup.Holding(layers=held, step=STEP)
    assert _locator(job, stores[0], at_step).find(LAYER) == (Tier.KEPT, None)
    later = epoch_setup.Holding(layers=held, step=STEP + 1)  # a roll-back
    assert _locator(job, stores[0], later).wanted([LAYER]) == []
    tier, found = _locator(job, stores[0], later).find(LAYER)
    assert tier is Tier.LOCAL_SNAPSHOT and _same(found, state)
    _corrupt(stores[0])
    assert _locator(job, stores[0], later).wanted([LAYER]) == [LAYER]  # asked of the peers
    with pytest.raises(epoch_setup.SnapshotUnavailableError, match="no peer sent a piece"):
        _locator(job, stores[0], later).find(LAYER)  # nothing arrived: no filesystem shortcut
    tier, found = _locator(job, stores[0], later, peer=stores[1]).find(LAYER)
    assert tier is Tier.PEER_SNAPSHOT and _same(found, state)
    _corrupt(stores[1])
    with pytest.raises(epoch_setup.SnapshotUnavailableError) as caught:
        _locator(job, stores[0], later, peer=stores[1]).find(LAYER)
    message = str(caught.value)
    assert f"layer {LAYER} at step {STEP}" in message
    assert "local_snapshot:" in message and "peer_snapshot:" in message
    assert "checksum mismatch" in message.split("peer_snapshot:")[1]


def test_nothing_held_at_step_zero_is_built_from_the_seed(
    job: semantics.Job, tmp_path: Path
) -> None:
    own = snapshot_store.SnapshotStore(snapshot_store.store_root("job", 0, tmp_path))
    stores = epoch_setup.Stores(own=own, checkpoint_dir="")
    nothing = epoch_setup.Holding(layers=None, step=0)
    locator = epoch_setup.Locator(job=job, holding=nothing, stores=stores, step=0)
    assert locator.find(LAYER) == (Tier.INITIAL, None)


def test_the_report_names_the_costliest_tier() -> None:
    assert epoch_setup.costliest([Tier.KEPT, Tier.PEER_SNAPSHOT, Tier.LIVE_REPLICA]) is (
        Tier.PEER_SNAPSHOT
    )
    assert epoch_setup.costliest([]) is Tier.KEPT
    assert epoch_setup.costliest([Tier.INITIAL, Tier.CHECKPOINT]) is Tier.INITIAL


def _rendezvous(port: int, timeout_s: float) -> messages.Rendezvous:
    return messages.Rendezvous(
        store_host="127.0.0.1",
        store_port=port,
        key_prefix="epoch-1",
        rank=0,
        world_size=1,
        backend=messages.Backend.GLOO,
        timeout_s=timeout_s,
    )


def test_a_store_that_is_gone_fails_the_connection_within_the_rendezvous_timeout() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(RuntimeError):  # torch's DistNetworkError
        epoch_setup.connect_store(_rendezvous(port, 0.5))
    assert time.monotonic() - started < 5.0  # not 2 x STORE_TIMEOUT_S


def test_a_store_the_agent_cannot_reach_at_set_up_is_a_regroup_timeout(tmp_path: Path) -> None:
    # Not INTERNAL (the worker's own fault: one retry, then the job fails): a late or dead
    # store is the regroup's problem, as a peer that does not come.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    training = training_thread.Training(
        worker=plan.WorkerId(0), job="job", snapshot_base=tmp_path, device="cpu"
    )
    with pytest.raises(epoch_setup.RegroupError) as refused:
        training._store_client(_rendezvous(port, 0.5))
    assert refused.value.kind is messages.ErrorKind.TIMEOUT
    message = str(refused.value)
    assert f"the rendezvous store at 127.0.0.1:{port} did not answer within 0.5 s" in message
    assert "\n" not in message


def test_a_live_store_connects() -> None:
    server = c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=5), False)
    client = epoch_setup.connect_store(_rendezvous(server.port, 0.5))
    client.set("k", "v")
    assert server.get("k") == b"v"
