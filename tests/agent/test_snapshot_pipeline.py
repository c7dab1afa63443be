"""The snapshot pipeline that never stalls training (planaria.agent.state.snapshot_writer,
staging, snapshot_store; planaria.agent.runtime.epoch_writers).

Covers: `release` waits for the staging copy and nothing else (a copy held back keeps it
waiting; store writes held back do not); a snapshot is not complete (no manifest from
`poll`, no latest step in the store) before its bytes and checksums are written, and once it
is, it holds the state as it was at `begin`, bit for bit, though the live tensors changed
right after `release` (hypothesis over states, groups and redundancy modes); a failed copy
releases training and surfaces as a write error; while the writer is held back, due
snapshots are skipped, owed and taken at the first step the writer is free, the next due steps
keep the interval's phase, and the achieved interval says how far they stretched; a busy writer
anywhere (the commit barrier's sum) makes every worker skip, and a snapshot counts as complete
everywhere (what the heartbeat reports) only after a barrier with no writer busy; a snapshot
whose step a persistent checkpoint is due at waits instead of skipping; store files are
rewritten in place (the same inode, pre-faulted pages) unless a reader holds the slot open;
snapshots checksummed with crc32 (older stores) stay readable next to xxh3 ones; periodic
snapshots are swapped with the mirrors, a TakeSnapshot is not; a mirror swap that meets a stopped
peer fails its snapshot, which closing the writers does not complete: the store keeps the
newest complete snapshot before it (a worker one step ahead after a death inside the commit
barrier may hold no snapshot of the step before its own, and its heartbeat's `held` says so).
Layer files written by several threads make the same snapshot, byte for byte and checksum for
checksum, as one thread's (every redundancy mode, several layers and members); a closed
writer's staging buffers serve the next writer on the same copier (the next epoch), and a writer
reserves them in the background before its first snapshot. No test here reads a clock: the
writer is held back by events.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.agent.execution import held_layers
from planaria.agent.runtime import epoch_writers, training_thread
from planaria.agent.state import mirroring, snapshot_store, snapshot_writer, snapshots, staging
from planaria.agent.training import model
from planaria.contract import plan
from planaria.wire import messages

Mode = messages.RedundancyMode
W = plan.WorkerId
PATIENCE_S = 60.0  # only ever reached when the code under test is broken


class GatedStore(snapshot_store.SnapshotStore):
    """A real store whose data-file writes wait until `gate` is set: a writer that cannot keep
    up, held back deterministically."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.gate = threading.Event()
        self.gate.set()

    def write_file(self, directory: Path, name: str, chunks: Iterable[Any]) -> str:
        assert self.gate.wait(PATIENCE_S), "the test never opened the gate"
        return super().write_file(directory, name, chunks)


class _HeldTicket:
    host_waits = True

    def __init__(self, inner: staging.Ticket, gate: threading.Event, fail: bool) -> None:
        self.inner, self.gate, self.fail = inner, gate, fail

    def complete(self) -> None:
        assert self.gate.wait(PATIENCE_S), "the test never opened the gate"
        if self.fail:
            raise RuntimeError("device lost")
        self.inner.complete()

    def release(self) -> None:
        self.inner.release()


class HeldCopier:
    """The CPU copier behind a gate (a fake of the `staging.Copier` interface): the copy does
    not start until `gate` is set, and raises when `fail`."""

    def __init__(self, *, fail: bool = False) -> None:
        self.inner = staging.CpuCopier()
        self.gate = threading.Event()
        self.fail = fail

    def buffer(self, nbytes: int) -> torch.Tensor:
        return self.inner.buffer(nbytes)

    def recycle(self, buffer: torch.Tensor) -> None:
        self.inner.recycle(buffer)

    def trim(self) -> None:
        self.inner.trim()

    def launch(self, copies: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]]) -> Any:
        return _HeldTicket(self.inner.launch(copies), self.gate, self.fail)


def _state(index: int, numel: int, seed: int) -> model.LayerState:
    rng = np.random.default_rng(seed)

    def tensor() -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(numel).astype(np.float32))

    return model.LayerState(
        index=index,
        names=("w",),
        parameters=(tensor(),),
        exp_avg=(tensor(),),
        exp_avg_sq=(tensor(),),
        steps=(torch.tensor(3.0),),
    )


def _bytes(state: model.LayerState) -> bytes:
    return b"".join(t.contiguous().numpy().tobytes() for t in state.tensors())


def _writer(
    store: snapshot_store.SnapshotStore,
    worker: int = 0,
    mode: Mode = Mode.XOR,
    copier: staging.Copier | None = None,
) -> snapshot_writer.SnapshotWriter:
    config = snapshot_writer.WriterConfig(job="job", worker=W(worker), redundancy=mode)
    return snapshot_writer.SnapshotWriter(store, config, copier)


# --- release and completion ---------------------------------------------------------------


def test_release_waits_for_the_copy_and_not_for_the_writes(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "s")
    store.gate.clear()
    copier = HeldCopier()
    writer = _writer(store, copier=copier)
    writer.begin(step=1, epoch=1, states=[_state(0, 1000, 1)], groups={0: (W(0),)})
    with pytest.raises(snapshot_store.SnapshotTimeout, match="not staged"):
        writer.release(timeout_s=0)  # the copy has not run: the live state is still read
    copier.gate.set()
    writer.release(timeout_s=PATIENCE_S)  # returns though no byte is written yet
    assert writer.poll() is None and writer.in_progress
    store.gate.set()
    assert writer.wait(PATIENCE_S) is not None
    writer.close()


@settings(max_examples=10, deadline=None)
@given(
    numel=st.integers(0, 5000),
    m=st.integers(1, 4),
    mode=st.sampled_from(list(Mode)),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_snapshot_is_complete_only_with_its_bytes_and_holds_the_state_at_begin(
    tmp_path_factory: pytest.TempPathFactory, numel: int, m: int, mode: Mode, seed: int
) -> None:
    if mode is Mode.RECOMPUTE:
        mode = Mode.COPY  # RECOMPUTE needs gradients (test_recompute covers its writer)
    base = tmp_path_factory.mktemp("stores")
    group = tuple(W(w) for w in range(m))
    stores = [GatedStore(snapshot_store.store_root("job", w, base)) for w in range(m)]
    states = [_state(0, numel, seed) for _ in range(m)]  # every member holds the whole layer
    before = _bytes(states[0])
    writers = [_writer(s, w, mode) for w, s in enumerate(stores)]
    for store in stores:
        store.gate.clear()
    for writer, state in zip(writers, states, strict=True):
        writer.begin(step=1, epoch=1, states=[state], groups={0: group})
        writer.release(timeout_s=PATIENCE_S)
    for state in states:  # the next optimizer step, right after release
        for t in state.tensors():
            t.add_(1)
    for writer, store in zip(writers, stores, strict=True):
        assert writer.poll() is None
        assert store.state().latest_step is None  # not complete: nothing is written yet
        store.gate.set()
        manifest = writer.wait(PATIENCE_S)
        assert manifest is not None and manifest.step == 1
        assert store.state().latest_step == 1
        writer.close()
    rebuilt = snapshots.load_layer(stores, 1, 0)  # every file's length and checksum verified
    assert _bytes(rebuilt) == before
    if m > 1 and mode is not Mode.NONE:  # and with one member lost, from the redundancy
        assert _bytes(snapshots.load_layer(stores[1:], 1, 0)) == before


def test_a_failed_copy_releases_training_and_is_reported(tmp_path: Path) -> None:
    copier = HeldCopier(fail=True)
    copier.gate.set()
    writer = _writer(snapshot_store.SnapshotStore(tmp_path / "s"), copier=copier)
    writer.begin(step=1, epoch=1, states=[_state(0, 10, 1)], groups={0: (W(0),)})
    writer.release(timeout_s=PATIENCE_S)
    with pytest.raises(snapshot_store.SnapshotWriteError, match="device lost"):
        writer.wait(PATIENCE_S)
    assert writer.store.state().latest_step is None
    writer.close()


# --- stretching the interval --------------------------------------------------------------


def _writers(
    store: snapshot_store.SnapshotStore,
    interval: int,
    tmp_path: Path,
    checkpoint: int = 0,
    mirrors: mirroring.Mirroring | None = None,
) -> tuple[epoch_writers.EpochWriters, held_layers.HeldLayers]:
    settings_ = messages.TrainingSettings(
        model="tiny",
        seed=1,
        optimizer=messages.OptimizerSettings(lr=1e-3),
        device=messages.Device.CPU,
        global_batch_size=4,
        data=messages.DataSettings(corpus_paths=(str(tmp_path / "corpus.txt"),)),
        snapshot_interval_steps=interval,
        checkpoint_dir=str(tmp_path / "ckpt") if checkpoint else "",
        checkpoint_interval_steps=checkpoint,
        redundancy=Mode.NONE,
    )
    p = plan.Plan(
        pipelines=(
            plan.Pipeline(
                stages=(plan.Stage(layer_start=0, layer_stop=2, workers=(W(0),)),),
                num_micro_batches=4,
            ),
        ),
        micro_batch_size=1,
    )
    rendezvous = messages.Rendezvous(
        store_host="127.0.0.1",
        store_port=1,
        key_prefix="epoch-1",
        rank=0,
        world_size=1,
        backend=messages.Backend.GLOO,
        timeout_s=5.0,
    )
    config = messages.WorkerConfig(
        epoch=1,
        worker=W(0),
        plan=p,
        resume_step=0,
        rendezvous=rendezvous,
        transfers=(),
        settings=settings_,
    )
    writers = epoch_writers.EpochWriters(
        store=store,
        worker=W(0),
        config=config,
        writer=snapshot_writer.WriterConfig(job="job", worker=W(0), redundancy=Mode.NONE),
        checkpoint_step=None,
        mirrors=mirrors,
    )
    training = training_thread.training_config(settings_, 1)
    return writers, held_layers.HeldLayers.build(training, [0, 1])


def _after_step(
    writers: epoch_writers.EpochWriters, t: int, layers: Any, others_busy: float = 0.0
) -> bool:
    """What the training thread does around committed step t: release before the update, the
    commit barrier (summing this worker's busy flag and `others_busy`, the other workers'),
    then begin when due. Whether a snapshot of t was begun."""
    writers.release()
    writers.barrier(t, writers.busy_flag() + others_busy)
    return writers.due(t) and writers.begin(t, layers)


def test_a_busy_writer_stretches_the_interval_instead_of_blocking(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "s")
    writers, layers = _writers(store, 2, tmp_path)
    assert _after_step(writers, 2, layers)
    writers.finish_snapshot()
    store.gate.clear()  # the writer falls behind from here
    assert _after_step(writers, 4, layers)
    assert not _after_step(writers, 6, layers)  # due, writer busy: skipped, not waited for
    assert not _after_step(writers, 7, layers)  # owed, still busy
    assert writers.skipped == 1
    store.gate.set()
    writers.finish_snapshot()  # the writer caught up (the test waits so no clock is read)
    assert writers.due(8) and _after_step(writers, 8, layers)  # the owed one, at phase
    assert not writers.due(9) and writers.due(10)
    assert writers.achieved_interval_steps == 3.0  # steps 2, 4, 8
    writers.close()
    assert store.latest().step == 8


def test_every_worker_skips_when_any_writer_is_busy_and_confirms_only_when_none_is(
    tmp_path: Path,
) -> None:
    store = snapshot_store.SnapshotStore(tmp_path / "s")
    writers, layers = _writers(store, 1, tmp_path)
    assert writers.confirmed == 0  # nothing yet
    assert _after_step(writers, 1, layers)
    writers.finish_snapshot()  # this worker is done with step 1 ...
    assert not _after_step(writers, 2, layers, others_busy=1.0)  # ... another one is not
    assert writers.confirmed == 0  # so step 1 may still be incomplete elsewhere
    assert store.state(at_most=writers.confirmed).latest_step is None
    assert _after_step(writers, 3, layers)  # all free at barrier 3: the owed one, and ...
    assert writers.confirmed == 1  # ... step 1 is complete everywhere
    writers.finish_snapshot()
    assert store.state(at_most=writers.confirmed).latest_step == 1  # what the heartbeat says
    assert store.state().latest_step == 3  # what this worker alone holds
    writers.close()


class _Swaps:
    """A `mirroring.Mirroring` with no peers: records the steps it swapped, returns nothing."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def swap(
        self, *, step: int, epoch: int, mine: Sequence[mirroring.MemberFiles]
    ) -> list[mirroring.MemberFiles]:
        assert mine, "a swap carries this worker's members"
        self.steps.append(step)
        return []


def test_periodic_snapshots_are_mirrored_and_a_take_snapshot_is_not(tmp_path: Path) -> None:
    """Mirrors swap point to point, so every worker must swap the same step: the barrier gives
    the periodic snapshots that, a TakeSnapshot (each worker at its own step) has no such point
    (docs/resilience.md, "TakeSnapshot and the mirrors")."""
    swaps = _Swaps()
    store = snapshot_store.SnapshotStore(tmp_path / "s")
    writers, layers = _writers(store, 1, tmp_path, mirrors=swaps)
    assert _after_step(writers, 1, layers)
    writers.finish_snapshot()
    assert writers.begin(2, layers, forced=True)  # TakeSnapshot
    writers.finish_snapshot()
    assert _after_step(writers, 3, layers)
    writers.close()
    assert swaps.steps == [1, 3]
    assert store.state().latest_step == 3


class _StoppedPeer:
    """A `mirroring.Mirroring` whose peer stops at the swap of `stops_at` (SIGSTOP): that swap
    waits until the epoch is released (`release`), then fails as the transport does."""

    def __init__(self, stops_at: int) -> None:
        self.stops_at = stops_at
        self.released = threading.Event()

    def swap(
        self, *, step: int, epoch: int, mine: Sequence[mirroring.MemberFiles]
    ) -> list[mirroring.MemberFiles]:
        if step >= self.stops_at:
            self.released.wait()
            raise mirroring.MirrorError(f"mirror transfer with worker 2 in epoch {epoch} failed")
        return []


def _held(store: snapshot_store.SnapshotStore) -> list[int]:
    """The steps the heartbeat lists as held complete (`SnapshotState.held`)."""
    return [h.step for h in store.state().held]


def test_a_worker_ahead_after_a_death_in_the_barrier_may_hold_no_snapshot_of_the_step_before(
    tmp_path: Path,
) -> None:
    """The e2e flake's agent side (tests/control/test_recovery_rollback.py the controller's):
    a peer stops during snapshot 2's mirror swap, this worker passes barrier 3 (its writer
    busy: snapshot 3 is skipped by every worker), then the epoch is given up. Closing the
    writers completes nothing: snapshot 2 failed, and its slot, the one that held the older
    snapshot 0 (none here), has no manifest. This worker committed 3 and holds only 1, and its
    heartbeat says so: the roll-back must not resume at 2."""
    peer = _StoppedPeer(stops_at=2)
    store = snapshot_store.SnapshotStore(tmp_path / "s")
    writers, layers = _writers(store, 1, tmp_path, mirrors=peer)
    assert _after_step(writers, 1, layers)
    writers.finish_snapshot()
    assert _after_step(writers, 2, layers)  # its swap waits on the stopped peer
    assert not _after_step(writers, 3, layers)  # busy at barrier 3: skipped everywhere
    peer.released.set()  # the epoch is given up: its release ends the swap
    writers.close()  # logs "snapshot failed", completes nothing
    assert _held(store) == [1] and store.state().latest_step == 1
    with pytest.raises(snapshot_store.SnapshotMissing):
        store.manifest(2)


def test_a_failed_snapshot_leaves_the_newest_complete_one_and_drops_the_older(
    tmp_path: Path,
) -> None:
    """Two slots: snapshot 3 is written over the slot of 1 (the older), so its failure (a mirror
    swap that met a stopped peer) leaves 2, the newest complete, and nothing else."""
    peer = _StoppedPeer(stops_at=3)
    store = snapshot_store.SnapshotStore(tmp_path / "s")
    writers, layers = _writers(store, 1, tmp_path, mirrors=peer)
    for t in (1, 2):
        assert _after_step(writers, t, layers)
        writers.finish_snapshot()
    assert _held(store) == [2, 1]
    assert _after_step(writers, 3, layers)
    peer.released.set()
    writers.close()
    assert _held(store) == [2]


def test_a_snapshot_feeding_a_due_checkpoint_waits_for_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = GatedStore(tmp_path / "s")
    writers, layers = _writers(store, 2, tmp_path, checkpoint=4)
    store.gate.clear()
    assert _after_step(writers, 2, layers)
    waited = writers.writer.wait

    def wait(timeout_s: float | None = None) -> Any:
        store.gate.set()  # the writer catches up only once someone waits for it
        return waited(timeout_s)

    monkeypatch.setattr(writers.writer, "wait", wait)
    assert writers.writer.busy
    assert _after_step(writers, 4, layers)  # waited (a skip would leave the gate shut)
    assert writers.skipped == 0
    writers.close()
    assert writers.checkpoint_step == 4


# --- the store: pre-faulted files, checksums ----------------------------------------------


def _slot_files(store: snapshot_store.SnapshotStore, step: int) -> dict[str, int]:
    for slot in snapshot_store.SLOTS:
        path = store.root / slot
        if snapshot_store.read_manifest(path).step == step:
            return {p.name: p.stat().st_ino for p in path.iterdir() if p.suffix != ".json"}
    raise AssertionError(f"no snapshot of step {step}")


def _snapshot(writer: snapshot_writer.SnapshotWriter, step: int, numel: int = 300) -> None:
    writer.begin(step=step, epoch=1, states=[_state(0, numel, step)], groups={0: (W(0),)})
    writer.wait(PATIENCE_S)


def test_store_files_are_rewritten_in_place_unless_a_reader_holds_them(tmp_path: Path) -> None:
    store = snapshot_store.SnapshotStore(tmp_path / "s")
    writer = _writer(store, mode=Mode.NONE)
    _snapshot(writer, 1)
    _snapshot(writer, 2)
    first = _slot_files(store, 1)
    _snapshot(writer, 3, numel=200)  # into step 1's slot, shorter: cut to length
    assert _slot_files(store, 3) == first  # the same files: their pages stay faulted in
    with store.open_snapshot(2) as reading:
        held = _slot_files(store, 2)
        _snapshot(writer, 4)  # into the slot being read: created afresh
        assert _slot_files(store, 4).keys() == held.keys()
        assert _slot_files(store, 4) != held
        assert reading.read(reading.manifest.layers[0].files[0]).size > 0  # still verifies
    assert _bytes(snapshots.load_layer([store], 3, 0)) == _bytes(_state(0, 200, 3))
    writer.close()


def test_crc32_snapshots_stay_readable_beside_xxh3_ones(tmp_path: Path) -> None:
    old = snapshot_store.SnapshotStore(tmp_path / "s", checksum="crc32")
    _snapshot(_writer(old, mode=Mode.NONE), 1)
    new = snapshot_store.SnapshotStore(tmp_path / "s")  # the default now
    _snapshot(_writer(new, mode=Mode.NONE), 2)
    checksums = {m.step: m.layers[0].files[0].checksum for m in new.complete_manifests()}
    assert checksums[1].startswith("crc32:") and checksums[2].startswith("xxh3:")
    assert _bytes(snapshots.load_layer([new], 1, 0)) == _bytes(_state(0, 300, 1))
    assert _bytes(snapshots.load_layer([new], 2, 0)) == _bytes(_state(0, 300, 2))


@settings(max_examples=10, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=5),
    m=st.integers(1, 3),
    mode=st.sampled_from([Mode.NONE, Mode.COPY, Mode.XOR]),
)
def test_files_written_side_by_side_make_the_same_snapshot_as_one_thread(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], m: int, mode: Mode
) -> None:
    group = tuple(W(w) for w in range(m))
    states = [_state(i, n, seed=i) for i, n in enumerate(sizes)]
    manifests_, contents = [], []
    for threads in (1, 3):
        base = tmp_path_factory.mktemp(f"threads{threads}")
        stores = [snapshot_store.SnapshotStore(base / f"w{w}") for w in range(m)]
        for w, store in enumerate(stores):
            config = snapshot_writer.WriterConfig(
                job="job", worker=W(w), redundancy=mode, file_threads=threads
            )
            writer = snapshot_writer.SnapshotWriter(store, config)
            writer.begin(
                step=1, epoch=1, states=states, groups=dict.fromkeys(range(len(states)), group)
            )
            manifest = writer.wait(PATIENCE_S)
            writer.close()
            assert manifest is not None
            manifests_.append((threads, w, manifest.layers))
        contents.append([_bytes(snapshots.load_layer(stores, 1, s.index)) for s in states])
    one = [layers for threads, _, layers in manifests_ if threads == 1]
    three = [layers for threads, _, layers in manifests_ if threads == 3]
    assert one == three  # same files, ranges and checksums, in the same order
    assert contents[0] == contents[1] == [_bytes(s) for s in states]


def test_a_closed_writers_buffers_serve_the_next_writer_on_the_same_copier(tmp_path: Path) -> None:
    copier = staging.CpuCopier()
    state = _state(0, 5000, 1)
    buffers = []
    for epoch in (1, 2):
        writer = _writer(snapshot_store.SnapshotStore(tmp_path / "s"), copier=copier)
        writer.begin(step=epoch, epoch=epoch, states=[state], groups={0: (W(0),)})
        assert writer.wait(PATIENCE_S) is not None
        buffers.append(writer._staging._layers[0].buffer)
        writer.close()
    assert buffers[0] is buffers[1]


class CountingCopier(staging.CpuCopier):
    """The CPU copier, counting the buffers it allocates (not the ones it hands back out)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()
        self.allocated = 0

    def buffer(self, nbytes: int) -> torch.Tensor:
        buffer = super().buffer(nbytes)
        if id(buffer) not in self.seen:
            self.seen.add(id(buffer))
            self.allocated += 1
        return buffer


def test_reserved_buffers_are_allocated_before_the_first_begin_and_once_per_layer(
    tmp_path: Path,
) -> None:
    copier = CountingCopier()
    states = [_state(i, 1000, seed=i) for i in range(3)]  # three layers of the same size
    groups = dict.fromkeys(range(3), (W(0), W(1)))
    config = snapshot_writer.WriterConfig(job="job", worker=W(0), redundancy=Mode.COPY)
    writer = snapshot_writer.SnapshotWriter(
        snapshot_store.SnapshotStore(tmp_path / "s"), config, copier
    )
    writer.reserve(states, groups)
    reserving = writer._reserving
    assert reserving is not None
    reserving.result(PATIENCE_S)
    assert copier.allocated == 3  # one each, on the writer's thread, before any begin
    writer.begin(step=1, epoch=1, states=states, groups=groups)
    assert copier.allocated == 3  # begin took the reserved ones
    assert writer.wait(PATIENCE_S) is not None
    writer.close()
    again = snapshot_writer.SnapshotWriter(
        snapshot_store.SnapshotStore(tmp_path / "t"), config, copier
    )
    again.reserve(states, groups)  # the next epoch: the pool already holds them
    again.begin(step=2, epoch=2, states=states, groups=groups)
    assert again.wait(PATIENCE_S) is not None
    again.close()
    assert copier.allocated == 3
