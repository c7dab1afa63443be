"""Sharded snapshots of layer state and their rebuild (planaria.agent.state.snapshots,
snapshot_writer).

Covers: sharding groups of a plan are the workers holding each layer (hypothesis over plans),
tensor-parallel stages are refused; a layer's state of float32/float16/bfloat16/int64 tensors
(random bit patterns, NaNs included), snapshotted by a group of 2..6 real stores, is rebuilt
bit-exactly with any one member lost, by copy or XOR parity (hypothesis); with no redundancy,
or a group of one, the manifest says nothing is protected and a lost member is SnapshotMissing
naming the next tier; a restarted agent reads its own store again; live states are references
that cost no copy; the reference trainer, restored from a snapshot rebuilt with one member
lost and replayed, ends bit-identical to an uninterrupted run; the writer's contract: interval,
no second begin before wait, timeout, write failures, a worker outside its group, settings;
snapshots follow state updated in place and state replaced (the cached views stay correct).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from planaria.agent.state import manifests, snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import model, reference, semantics
from planaria.contract import plan, shapes
from planaria.wire import messages
from tests import strategies

Mode = messages.RedundancyMode
MICRO = shapes.ModelShape(
    name="micro", num_layers=2, d_model=16, num_heads=2, seq_len=8, vocab_size=256
)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)


def _random_tensor(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A tensor of random bit patterns (NaNs and infinities included)."""
    out = torch.empty(shape, dtype=dtype)
    raw = rng.integers(0, 256, size=out.numel() * out.element_size(), dtype=np.uint8)
    out.reshape(-1).view(torch.uint8).copy_(torch.from_numpy(raw))
    return out


@st.composite
def layer_states(draw: st.DrawFn, index: int = 0) -> model.LayerState:
    """A LayerState of 1..3 parameters of any of DTYPES and shapes of up to 3 dims."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    n = draw(st.integers(min_value=1, max_value=3))
    shapes_ = [tuple(draw(st.lists(st.integers(0, 9), max_size=3))) for _ in range(n)]
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(n)]

    def group() -> tuple[torch.Tensor, ...]:
        return tuple(_random_tensor(rng, s, d) for s, d in zip(shapes_, dtypes, strict=True))

    return model.LayerState(
        index=index,
        names=tuple(f"p{i}" for i in range(n)),
        parameters=group(),
        exp_avg=group(),
        exp_avg_sq=group(),
        steps=tuple(_random_tensor(rng, (), torch.float32) for _ in range(n)),
    )


def _fixed_state(seed: int = 0) -> model.LayerState:
    """Parameters of each of DTYPES (shapes (3, 5), (7,), (2, 2, 2), ()), random bit patterns."""
    rng = np.random.default_rng(seed)
    shapes_ = [(3, 5), (7,), (2, 2, 2), ()]

    def group() -> tuple[torch.Tensor, ...]:
        return tuple(_random_tensor(rng, s, d) for s, d in zip(shapes_, DTYPES, strict=True))

    return model.LayerState(
        index=0,
        names=("a", "b", "c", "d"),
        parameters=group(),
        exp_avg=group(),
        exp_avg_sq=group(),
        steps=tuple(_random_tensor(rng, (), torch.float32) for _ in DTYPES),
    )


def _bytes(state: model.LayerState) -> list[bytes]:
    return [snapshots.host_bytes(t).tobytes() for t in state.tensors()]


def _assert_identical(a: model.LayerState, b: model.LayerState) -> None:
    assert (a.index, a.names) == (b.index, b.names)
    assert [(t.dtype, t.shape) for t in a.tensors()] == [(t.dtype, t.shape) for t in b.tensors()]
    assert _bytes(a) == _bytes(b)


def _stores(base: Path, m: int) -> list[snapshot_store.SnapshotStore]:
    return [
        snapshot_store.SnapshotStore(snapshot_store.store_root("job", w, base)) for w in range(m)
    ]


def _writers(
    stores: Sequence[snapshot_store.SnapshotStore], mode: Mode, interval: int = 1
) -> list[snapshot_writer.SnapshotWriter]:
    return [
        snapshot_writer.SnapshotWriter(
            store,
            snapshot_writer.WriterConfig(
                job="job", worker=plan.WorkerId(w), redundancy=mode, interval_steps=interval
            ),
        )
        for w, store in enumerate(stores)
    ]


def _snapshot(
    writers: Sequence[snapshot_writer.SnapshotWriter], step: int, states: Sequence[model.LayerState]
) -> None:
    """Every member snapshots the same states (each holds the whole layer)."""
    m = len(writers)
    groups = {s.index: tuple(plan.WorkerId(w) for w in range(m)) for s in states}
    for writer in writers:
        writer.begin(step=step, epoch=1, states=states, groups=groups)
    for writer in writers:
        writer.wait(30)


# --- groups ---------------------------------------------------------------------------------


@given(p=strategies.plans(max_gpus_per_node=1))
def test_sharding_groups_are_the_workers_holding_each_layer(p: plan.Plan) -> None:
    groups = snapshots.sharding_groups(p)
    for layer in range(p.num_layers):
        holders = [
            w for pipe in p.pipelines for s in pipe.stages if layer in s.layers for w in s.workers
        ]
        assert groups.get(layer, ()) == tuple(sorted(holders))


def test_a_tensor_parallel_stage_is_refused() -> None:
    stage = plan.Stage(layer_start=0, layer_stop=2, workers=(plan.WorkerId(0), plan.WorkerId(1)))
    p = plan.Plan(
        pipelines=(plan.Pipeline(stages=(stage,), num_micro_batches=1),),
        micro_batch_size=1,
        gpus_per_node=2,
    )
    with pytest.raises(snapshot_store.SnapshotConfigError, match="one worker per stage"):
        snapshots.sharding_groups(p)


# --- rebuild --------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    state=layer_states(),
    m=st.integers(min_value=2, max_value=6),
    lost=st.integers(min_value=0, max_value=5),
    mode=st.sampled_from([Mode.COPY, Mode.XOR]),
)
def test_any_single_lost_member_is_rebuilt_bit_exactly(
    state: model.LayerState, m: int, lost: int, mode: Mode
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        stores = _stores(Path(directory), m)
        writers = _writers(stores, mode)
        _snapshot(writers, 1, [state])
        survivors = [s for w, s in enumerate(stores) if w != lost % m]
        _assert_identical(snapshots.load_layer(survivors, 1, 0), state)
        _assert_identical(snapshots.load_layer(stores, 1, 0), state)
        for writer in writers:
            writer.close()


@pytest.mark.parametrize("m", [1, 3], ids=["a group of one", "a group of three"])
def test_without_redundancy_a_lost_member_sends_recovery_to_the_next_tier(
    tmp_path: Path, m: int
) -> None:
    state = _fixed_state()
    mode = Mode.NONE if m == 3 else Mode.XOR
    stores = _stores(tmp_path, m)
    _snapshot(_writers(stores, mode), 1, [state])
    manifest = stores[0].latest()
    assert manifest.layers[0].tolerated_losses == 0
    assert manifest.note == "layers [0] survive no lost member"
    _assert_identical(snapshots.load_layer(stores, 1, 0), state)
    with pytest.raises(snapshot_store.SnapshotMissing, match="load the persistent checkpoint"):
        snapshots.load_layer(stores[1:], 1, 0)


def test_two_lost_members_are_more_than_parity_covers(tmp_path: Path) -> None:
    state = _fixed_state()
    stores = _stores(tmp_path, 4)
    _snapshot(_writers(stores, Mode.XOR), 1, [state])
    with pytest.raises(snapshot_store.SnapshotMissing, match=r"members \[0, 2\] .* tolerates 1"):
        snapshots.load_layer([stores[1], stores[3]], 1, 0)


def test_a_restarted_agent_reads_its_own_store_again(tmp_path: Path) -> None:
    state = _fixed_state()
    stores = _stores(tmp_path, 1)
    _snapshot(_writers(stores, Mode.NONE), 3, [state])
    reopened = snapshot_store.SnapshotStore(stores[0].root)  # a new process sees the same files
    member = snapshots.read_member(reopened, reopened.latest().step, 0)
    _assert_identical(snapshots.rebuild_layer([member]), state)


def test_members_that_disagree_are_corrupt(tmp_path: Path) -> None:
    state = _fixed_state()
    stores = _stores(tmp_path / "a", 2)
    _snapshot(_writers(stores, Mode.COPY), 1, [state])
    other = _stores(tmp_path / "b", 2)
    _snapshot(_writers(other, Mode.COPY), 2, [state])
    members = [snapshots.read_member(stores[0], 1, 0), snapshots.read_member(other[1], 2, 0)]
    with pytest.raises(snapshot_store.SnapshotCorrupt, match="disagree"):
        snapshots.rebuild_layer(members)


def test_a_members_mirror_counts_once_and_two_copies_that_differ_are_corrupt(
    tmp_path: Path,
) -> None:
    """A member's holder and its mirror keep the same files (`mirroring`): the loader takes
    either, and rejects two copies of one member whose checksums differ."""
    state, other_state = _fixed_state(0), _fixed_state(1)
    stores = _stores(tmp_path / "a", 2)
    _snapshot(_writers(stores, Mode.XOR), 1, [state])
    other = _stores(tmp_path / "b", 2)
    _snapshot(_writers(other, Mode.XOR), 1, [other_state])
    first = snapshots.read_member(stores[0], 1, 0)
    second = snapshots.read_member(stores[1], 1, 0)
    _assert_identical(snapshots.rebuild_layer([first, first, second]), state)
    _assert_identical(snapshots.rebuild_layer([first, first]), state)  # XOR, m = 2: one suffices
    differing = snapshots.read_member(other[0], 1, 0)
    with pytest.raises(snapshot_store.SnapshotCorrupt, match="two copies of member 0 disagree"):
        snapshots.rebuild_layer([first, differing, second])


# --- live state and the reference trainer ---------------------------------------------------


def _trainer() -> reference.ReferenceTrainer:
    config = semantics.TrainingConfig(shape=MICRO, seed=5, global_batch_size=4, micro_batch_size=2)
    tokens = np.random.default_rng(0).integers(0, 256, size=20_000, dtype=np.uint8)
    return reference.ReferenceTrainer(config, tokens)


def _live(trainer: reference.ReferenceTrainer) -> list[model.LayerState]:
    pairs = zip(trainer.layers, trainer.optimizers, strict=True)
    return [snapshots.live_layer_state(i, layer, opt) for i, (layer, opt) in enumerate(pairs)]


def test_live_states_are_references_not_copies() -> None:
    trainer = _trainer()
    trainer.step(0)
    live = _live(trainer)[1]
    params = list(trainer.layers[1].parameters())
    assert live.parameters[0].data_ptr() == params[0].data_ptr()
    assert live.exp_avg[0] is trainer.optimizers[1].state[params[0]]["exp_avg"]
    _assert_identical(live, trainer.layer_state(1))


def test_restore_with_a_member_lost_then_replay_is_bit_identical(tmp_path: Path) -> None:
    uninterrupted = _trainer()
    for i in range(6):
        uninterrupted.step(i)
    run = _trainer()
    stores = _stores(tmp_path, 3)
    writers = _writers(stores, Mode.XOR, interval=2)
    groups = {i: (plan.WorkerId(0), plan.WorkerId(1), plan.WorkerId(2)) for i in range(4)}
    for i in range(5):  # snapshots after committed steps 2 and 4; step 5 is lost in the crash
        run.step(i)
        for writer in writers:
            writer.begin(step=i + 1, epoch=1, states=_live(run), groups=groups)
        for writer in writers:
            writer.wait(30)
    assert [m.step for m in stores[1].complete_manifests()] == [4, 2]
    restored = _trainer()
    for layer in range(MICRO.num_planner_layers):
        restored.load_layer_state(snapshots.load_layer([stores[0], stores[2]], 4, layer))
    for i in range(4, 6):
        restored.step(i)
    for layer in range(MICRO.num_planner_layers):
        _assert_identical(restored.layer_state(layer), uninterrupted.layer_state(layer))


# --- the writer's contract ------------------------------------------------------------------


def _one_writer(tmp_path: Path, **config: object) -> snapshot_writer.SnapshotWriter:
    store = snapshot_store.SnapshotStore(tmp_path / "store")
    settings_ = snapshot_writer.WriterConfig(job="job", worker=plan.WorkerId(0), **config)  # type: ignore[arg-type]
    return snapshot_writer.SnapshotWriter(store, settings_)


GROUPS = {0: (plan.WorkerId(0), plan.WorkerId(1))}


def test_only_steps_on_the_interval_are_snapshotted(tmp_path: Path) -> None:
    writer = _one_writer(tmp_path, interval_steps=3)
    state = _fixed_state()
    assert not writer.begin(step=2, epoch=1, states=[state], groups=GROUPS)
    assert writer.wait(1) is None
    assert writer.begin(step=3, epoch=1, states=[state], groups=GROUPS)
    manifest = writer.wait(30)
    assert manifest is not None and manifest.step == 3
    held = (
        messages.HeldSnapshot(
            step=3,
            digest=snapshot_store.digest(manifest),
            members=snapshot_store.member_digests(manifest),
        ),
    )
    assert writer.state() == messages.SnapshotState(
        latest_step=3, held_bytes=manifest.held_bytes, held=held
    )


def test_begin_before_wait_breaks_the_contract(tmp_path: Path) -> None:
    writer = _one_writer(tmp_path)
    state = _fixed_state()
    writer.begin(step=1, epoch=1, states=[state], groups=GROUPS)
    with pytest.raises(snapshot_store.SnapshotConfigError, match="still pending"):
        writer.begin(step=2, epoch=1, states=[state], groups=GROUPS)
    writer.wait(30)


def test_a_slow_snapshot_times_out_and_can_be_waited_for_again(tmp_path: Path) -> None:
    writer = _one_writer(tmp_path)
    # Holding the store's lock stalls the background thread deterministically in begin().
    with writer.store._lock:
        writer.begin(step=1, epoch=1, states=[_fixed_state()], groups=GROUPS)
        assert writer.state().in_progress
        with pytest.raises(snapshot_store.SnapshotTimeout):
            writer.wait(0.05)
    assert writer.wait(30) is not None


def test_a_failed_write_is_reported_by_wait(tmp_path: Path) -> None:
    writer = _one_writer(tmp_path)
    writer.store.remove()
    writer.begin(step=1, epoch=1, states=[_fixed_state()], groups=GROUPS)
    with pytest.raises(snapshot_store.SnapshotWriteError, match="writing the snapshot failed"):
        writer.wait(30)


def test_a_worker_outside_the_group_is_refused(tmp_path: Path) -> None:
    writer = _one_writer(tmp_path)
    with pytest.raises(snapshot_store.SnapshotConfigError, match="not in its sharding group"):
        writer.begin(step=1, epoch=1, states=[_fixed_state()], groups={0: (plan.WorkerId(4),)})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"job": "job", "interval_steps": 0}, "interval_steps is 0; give a whole number >= 1"),
        ({"job": "../up"}, "job '../up' cannot name a directory"),
    ],
    ids=["a zero interval", "a job name that escapes the directory"],
)
def test_bad_writer_settings_say_what_to_change(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        snapshot_writer.WriterConfig(worker=plan.WorkerId(0), **config)  # type: ignore[arg-type]


def test_manifests_name_every_tensor_and_file(tmp_path: Path) -> None:
    state = _fixed_state()
    stores = _stores(tmp_path, 3)
    _snapshot(_writers(stores, Mode.XOR), 1, [state])
    entry = stores[2].latest().layers[0]
    assert entry.group == (0, 1, 2) and entry.member == 2
    assert [t.role for t in entry.tensors][: len(state.names)] == [manifests.Role.PARAMETERS] * len(
        state.names
    )
    assert {f.kind for f in entry.files} == {manifests.FileKind.SHARD, manifests.FileKind.PARITY}


def test_snapshots_follow_state_updated_in_place_and_state_replaced(tmp_path: Path) -> None:
    trainer, other = _trainer(), _trainer()
    other.step(0)
    stores = _stores(tmp_path, 2)
    writers = _writers(stores, Mode.COPY)
    groups = {i: (plan.WorkerId(0), plan.WorkerId(1)) for i in range(4)}

    def snapshot_and_check(step: int) -> None:
        for writer in writers:
            writer.begin(step=step, epoch=1, states=_live(trainer), groups=groups)
        for writer in writers:
            writer.wait(30)
        for layer in range(MICRO.num_planner_layers):
            _assert_identical(snapshots.load_layer(stores, step, layer), trainer.layer_state(layer))

    snapshot_and_check(1)  # zeros for the optimizer state: no step taken yet
    trainer.step(0)  # parameters updated in place, optimizer state created
    snapshot_and_check(2)
    trainer.step(1)  # updated in place again (the cached views must show it)
    snapshot_and_check(3)
    for layer in range(MICRO.num_planner_layers):  # new optimizer state tensors
        trainer.load_layer_state(other.layer_state(layer))
    snapshot_and_check(4)


@settings(max_examples=25, deadline=None)
@given(
    shapes_=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64, torch.int8]),
    offset=st.integers(0, 7),
)
@example(shapes_=[[], []], dtype=torch.int8, offset=2)  # an aligned address at offset 6
def test_unflatten_gives_views_of_its_buffer_where_aligned_and_equal_bytes_always(
    shapes_: list[list[int]], dtype: torch.dtype, offset: int
) -> None:
    # Restoring copies a layer's bytes once (the read), not three times: the tensors are views
    # of the read buffer when their dtype's alignment allows, copies otherwise (an odd offset).
    rng = np.random.default_rng(len(shapes_) + offset)

    def tensor(shape: list[int]) -> torch.Tensor:
        n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        if not n:
            return torch.empty(shape, dtype=dtype)
        raw = torch.from_numpy(rng.integers(0, 256, n).astype(np.uint8))
        return raw.view(dtype).reshape(shape)

    def raw(t: torch.Tensor) -> bytes:
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

    names = tuple(f"p{i}" for i in range(len(shapes_)))
    state = model.LayerState(
        index=0,
        names=names,
        parameters=tuple(tensor(s) for s in shapes_),
        exp_avg=tuple(tensor(s) for s in shapes_),
        exp_avg_sq=tuple(tensor(s) for s in shapes_),
        steps=tuple(torch.tensor(float(i)) for i in range(len(shapes_))),
    )
    flat = b"".join(raw(t) for t in state.tensors())
    buffer = np.zeros(len(flat) + offset, dtype=np.uint8)
    buffer[offset:] = np.frombuffer(flat, dtype=np.uint8)
    entry = manifests.LayerEntry(
        layer=0,
        names=names,
        group=(0,),
        member=0,
        total_bytes=len(flat),
        tensors=snapshots.tensor_layout(state),
        files=(),
        tolerated_losses=0,
    )
    data = buffer[offset:]
    rebuilt = snapshots.unflatten(entry, data)
    for got, want, layout in zip(rebuilt.tensors(), state.tensors(), entry.tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert raw(got) == raw(want)
        if got.numel():
            at = data.ctypes.data + layout.offset  # where its bytes sit in the buffer
            size = got.element_size()  # torch's rule: address and offset both multiples
            assert (got.data_ptr() == at) == (at % size == 0 and layout.offset % size == 0)
