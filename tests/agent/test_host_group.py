"""The epoch's host group (`groups.Epoch.host`): the gloo side group an NCCL epoch forms for
host-memory bytes, run on CPUs through `form_epoch(side_group=True)` (issue #20).

Covers: a gloo epoch carries host bytes on its world group (no second group) unless asked for a
side group, which is then a distinct gloo group over every rank, carries the offers' all_gather,
and is gone with the epoch (the next epoch forms); an NCCL epoch without a side group refuses to
name a host group. Across two processes, every epoch formed with a side group: a snapshot's
members are mirrored over the side group, and after one worker's store is lost (its node is
gone) the peer exchange over the side group brings its layers back from their mirror, bit for
bit equal to the state snapshotted. Releasing an epoch ends a side-group wait blocked on a peer
that never sends, at once, here and at the peer (whose wait on this process fails too): as a
gloo epoch (its transport shut) and as an NCCL epoch (the side group's transport shut, then the
communicators aborted; leaving it aborts every group, and the next epoch forms). With CUDA
only: a world-size-1 NCCL epoch forms its gloo side group, runs an NCCL all_reduce on the
device beside it, and a snapshot's files make the round trip through the side group.
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from planaria.agent.execution import groups
from planaria.agent.recovery import snapshot_exchange, snapshot_mirrors
from planaria.agent.state import manifests, mirroring, snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import model, semantics
from planaria.contract import plan, shapes
from planaria.wire import messages
from tests import plans

GLOO, NCCL = messages.Backend.GLOO, messages.Backend.NCCL
XOR = messages.RedundancyMode.XOR
W = plan.WorkerId
JOB, STEP = "job", 3
TIMEOUT_S = 120.0  # the epochs' timeout: a wait that only a release can end would last this
JOIN_S = 30.0  # generous bound for what a release ends at once (never reached when right)
CONFIG = semantics.TrainingConfig(
    shape=shapes.named("tiny"), seed=4, global_batch_size=2, micro_batch_size=1
)
# Two stages on two nodes (one worker each): each worker mirrors the other's layers.
PLAN = plans.staged(([(0, 3, (0,)), (3, 6, (1,))], 2), micro=1)


@pytest.fixture
def server() -> Iterator[c10d.TCPStore]:
    yield c10d.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30), False)


def _client(port: int) -> c10d.Store:
    return c10d.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30))


def layer_state(layer: int) -> model.LayerState:
    """A layer's state after one AdamW step (moments and step counts not zero)."""
    module = model.build_layer(CONFIG.shape, CONFIG.seed, layer)
    optimizer = model.make_optimizer(module, CONFIG.optimizer)
    for i, p in enumerate(module.parameters()):
        p.grad = torch.full_like(p, 0.25 * (i + 1) * (layer + 1))
    optimizer.step()
    return model.extract_layer_state(layer, module, optimizer)


def _store(base: Path, worker: int) -> snapshot_store.SnapshotStore:
    return snapshot_store.SnapshotStore(snapshot_store.store_root(JOB, worker, base))


# --- in this process: one rank ------------------------------------------------------------


def test_a_gloo_epoch_carries_host_bytes_on_its_world_unless_asked_for_a_side_group(
    server: c10d.TCPStore,
) -> None:
    plain = groups.form_epoch(server, 1, 0, 1, GLOO, 5.0)
    try:
        assert plain.side is None and plain.host is plain.world
    finally:
        groups.leave_epoch(plain)
    sided = groups.form_epoch(server, 2, 0, 1, GLOO, 5.0, side_group=True)
    try:
        assert sided.side is not None and sided.host is sided.side
        assert sided.host is not sided.world and dist.get_backend(sided.host) == "gloo"
        assert snapshot_exchange.gather(sided, b"offer") == [b"offer"]
    finally:
        groups.leave_epoch(sided)
    again = groups.form_epoch(server, 3, 0, 1, GLOO, 5.0, side_group=True)  # nothing left over
    groups.leave_epoch(again)


def test_an_nccl_epoch_without_a_side_group_names_no_host_group() -> None:
    epoch = groups.Epoch(
        number=4,
        rank=0,
        world_size=2,
        backend=NCCL,
        timeout_s=1.0,
        world=None,  # type: ignore[arg-type]
        subgroups={},
    )
    with pytest.raises(groups.GroupsError, match="epoch 4 is nccl and has no gloo side group"):
        epoch.host  # noqa: B018


# --- across processes: every epoch with a side group --------------------------------------


def _sided(port: str, number: int, rank: int) -> groups.Epoch:
    return groups.form_epoch(_client(int(port)), number, rank, 2, GLOO, TIMEOUT_S, side_group=True)


def _as_nccl(epoch: groups.Epoch) -> groups.Epoch:
    """The epoch as the NCCL path sees it: its world cannot carry host bytes (here it is not
    there at all, so any use of it fails), only the side group can; leaving it aborts. And,
    in this worker process, every point-to-point message and all_gather must name the side
    group (torch's default group is the gloo world here, which would carry them silently)."""
    side = epoch.side
    for name in ("isend", "irecv", "all_gather"):
        setattr(dist, name, _on_side_only(getattr(dist, name), side, name))
    return dataclasses.replace(epoch, backend=NCCL, world=None)  # type: ignore[arg-type]


def _on_side_only(call: Any, side: dist.ProcessGroup | None, name: str) -> Any:
    def checked(*args: Any, **kwargs: Any) -> Any:
        assert side is not None and kwargs.get("group") is side, f"{name} off the side group"
        return call(*args, **kwargs)

    return checked


# A peer that returned leaves with os._exit (`_PEER`): its exit status says what the test asks,
# the interpreter's teardown is not tested (torch's C++ threads once aborted a process there,
# "terminate called without an active exception", after it had done its part).
_PEER = (
    "import os, sys; from tests.agent import test_host_group as t; t.{}(*sys.argv[1:]); "
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)"
)


def _run_peers(script: str, *args: str) -> None:
    """Run `script` (a function of this module) as ranks 0 and 1 in two processes."""
    code = _PEER.format(script)
    peers = [subprocess.Popen([sys.executable, "-c", code, str(r), *args]) for r in (0, 1)]
    codes = [p.wait(300) for p in peers]
    assert codes == [0, 0], f"{script} exited with {codes}"


def snapshot_with_mirrors(rank: str, port: str, base: str) -> None:
    """Rank `rank` of epoch 1 snapshots its stage's layers at STEP with XOR redundancy, its
    members mirrored to the other rank over the side group."""
    r = int(rank)
    epoch = _as_nccl(_sided(port, 1, r))
    try:
        link = snapshot_mirrors.link_for(epoch, PLAN, W(r), JOB, XOR)
        assert link is not None
        config = snapshot_writer.WriterConfig(job=JOB, worker=W(r), redundancy=XOR)
        writer = snapshot_writer.SnapshotWriter(_store(Path(base), r), config, mirrors=link)
        mine = [layer_state(i) for i in PLAN.pipelines[0].stages[r].layers]
        groups_of = snapshots.sharding_groups(PLAN)
        writer.begin(step=STEP, epoch=1, states=mine, groups=groups_of)
        manifest = writer.wait()
        writer.close()
        assert manifest is not None
        mirrored = [e.layer for e in manifest.layers if mirroring.is_mirrored(manifest, e)]
        assert mirrored == list(PLAN.pipelines[0].stages[1 - r].layers), manifest
    finally:
        groups.leave_epoch(epoch)


def restore_from_peers(rank: str, port: str, base: str) -> None:
    """Rank `rank` of epoch 2: rank 1 (an empty store) asks its peer for its stage's layers
    over the side group and saves what it rebuilds from them; rank 0 serves its mirrors."""
    r = int(rank)
    epoch = _as_nccl(_sided(port, 2, r))
    try:
        wanted = list(PLAN.pipelines[0].stages[1].layers) if r == 1 else []
        received = snapshot_exchange.exchange(
            epoch=epoch, step=STEP, wanted=wanted, own=_store(Path(base), r), workers=[W(0), W(1)]
        )
        assert not received.problems, received.problems
        if r == 1:
            assert received.received_bytes > 0 and sorted(received.members) == wanted
            rebuilt = {i: snapshots.rebuild_layer(received.members[i]) for i in wanted}
            torch.save({i: dataclasses.asdict(s) for i, s in rebuilt.items()}, f"{base}/out.pt")
    finally:
        groups.leave_epoch(epoch)


def test_mirrors_and_the_peer_exchange_over_the_side_group_restore_a_lost_store_bit_for_bit(
    server: c10d.TCPStore, tmp_path: Path
) -> None:
    base = str(tmp_path / "shm")
    _run_peers("snapshot_with_mirrors", str(server.port), base)
    shutil.rmtree(snapshot_store.store_root(JOB, 1, Path(base)))  # worker 1's node is gone
    _run_peers("restore_from_peers", str(server.port), base)
    rebuilt = torch.load(f"{base}/out.pt")
    for layer in PLAN.pipelines[0].stages[1].layers:
        want, got = layer_state(layer), model.LayerState(**rebuilt[layer])
        assert got.names == want.names
        assert all(
            a.dtype == b.dtype and torch.equal(a, b)
            for a, b in zip(got.tensors(), want.tensors(), strict=True)
        )


# --- releasing a blocked side-group wait ------------------------------------------------


def blocked_peer(rank: str, port: str) -> None:
    """Rank 1: waits for a byte from rank 0 on the side group, which never comes; its wait
    must fail once rank 0 releases the epoch (exit 0 only then)."""
    store = _client(int(port))
    epoch = groups.form_epoch(store, 1, int(rank), 2, GLOO, TIMEOUT_S, side_group=True)
    try:
        work = dist.irecv(torch.empty(1, dtype=torch.uint8), 0, group=epoch.host, tag=7)
        assert work is not None
        store.set("posted", "1")  # rank 0 releases only once this wait is posted
        try:
            work.wait(epoch.timeout)
        except RuntimeError:
            return
        raise AssertionError("the wait ended without an error")
    finally:
        groups.leave_epoch(epoch)


@pytest.mark.parametrize(
    "backend",
    [GLOO, NCCL],
    ids=[
        "a gloo epoch's release shuts every group's sockets, the side group's included",
        "an nccl epoch's release shuts the side group's sockets and aborts the communicators",
    ],
)
def test_releasing_the_epoch_ends_a_blocked_side_group_wait_here_and_at_the_peer(
    server: c10d.TCPStore, backend: messages.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _PEER.format("blocked_peer")
    peer = subprocess.Popen([sys.executable, "-c", code, "1", str(server.port)])
    epoch = groups.form_epoch(server, 1, 0, 2, GLOO, TIMEOUT_S, side_group=True)
    aborted: list[bool] = []
    abort = dist.distributed_c10d._abort_process_group

    def recorded_abort() -> None:
        aborted.append(True)
        abort()

    if backend is NCCL:  # the release path of an NCCL epoch, over these gloo groups
        epoch = dataclasses.replace(epoch, backend=NCCL)
        monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", recorded_abort)
    errors: list[str] = []
    work = dist.irecv(torch.empty(1, dtype=torch.uint8), 1, group=epoch.host, tag=9)
    assert work is not None

    def wait() -> None:
        try:
            work.wait(epoch.timeout)
        except RuntimeError as exc:
            errors.append(str(exc))

    blocked = threading.Thread(target=wait)
    try:
        blocked.start()
        server.wait(["posted"])
        epoch.release()
        blocked.join(JOIN_S)
        assert not blocked.is_alive() and errors  # ended by the release, not the timeout
        assert peer.wait(JOIN_S) == 0  # the peer's wait on this process failed too
        assert aborted == ([True] if backend is NCCL else [])
    finally:
        groups.leave_epoch(epoch)  # NCCL: aborts whatever is left (here: nothing)
        if peer.poll() is None:
            peer.kill()
    groups.leave_epoch(groups.form_epoch(server, 2, 0, 1, GLOO, 5.0, side_group=True))


# --- on a GPU only --------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and NCCL")
def test_an_nccl_epoch_moves_snapshot_bytes_on_its_gloo_side_group(
    server: c10d.TCPStore, tmp_path: Path
) -> None:
    """World size 1 on one GPU: the NCCL world reduces a device tensor; beside it the side
    group carries the offers' all_gather and a snapshot file there and back (point to point
    to oneself is refused, so the round trip is an all_gather of the file's bytes), which
    still verifies against its checksum and rebuilds the layer bit for bit."""
    torch.cuda.set_device(0)
    epoch = groups.form_epoch(server, 1, 0, 1, NCCL, 60.0)
    try:
        assert epoch.side is not None and dist.get_backend(epoch.host) == "gloo"
        assert dist.get_backend(epoch.world) == "nccl"
        ones = torch.ones(4, device="cuda")
        dist.all_reduce(ones, group=epoch.world)
        assert torch.equal(ones.cpu(), torch.ones(4))
        assert snapshot_mirrors.link_for(epoch, PLAN, W(0), JOB, XOR) is None  # one worker
        store = _store(tmp_path, 0)
        one = plans.staged(([(0, 2, (0,))], 1), micro=1)
        config = snapshot_writer.WriterConfig(job=JOB, worker=W(0), redundancy=XOR)
        writer = snapshot_writer.SnapshotWriter(store, config)
        writer.begin(
            step=STEP, epoch=1, states=[layer_state(1)], groups=snapshots.sharding_groups(one)
        )
        writer.wait()
        writer.close()
        member = snapshots.read_member(store, STEP, 1)
        (back,) = snapshot_exchange.gather(epoch, member.shard.tobytes())
        shard = member.entry.file(manifests.FileKind.SHARD)
        assert shard is not None
        verified = snapshot_store.verify(
            torch.frombuffer(bytearray(back), dtype=torch.uint8).numpy(), shard, "round trip"
        )
        got = snapshots.rebuild_layer([dataclasses.replace(member, shard=verified)])
        want = layer_state(1)
        assert all(map(torch.equal, got.tensors(), want.tensors()))
        received = snapshot_exchange.exchange(
            epoch=epoch, step=STEP, wanted=[], own=store, workers=[W(0)]
        )
        assert received.members == {} and received.received_bytes == 0
    finally:
        groups.leave_epoch(epoch)
