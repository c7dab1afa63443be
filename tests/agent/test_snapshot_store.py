"""The two-slot snapshot store on disk (planaria.agent.state.snapshot_store).

Covers: a child process SIGKILLed in the middle of writing a snapshot leaves the previous
complete snapshot loadable and verified (and the interrupted slot untrusted, then reused);
double buffering keeps the newest two snapshots and a resumed run drops snapshots of its future;
a flipped bit, a truncated or over-long file and a missing file are SnapshotCorrupt, and the
loader then rebuilds the member from its peers' redundancy (the next tier); a damaged manifest
makes its slot untrusted; files opened for reading keep their bytes while newer snapshots
overwrite the slot; files are 0600 and directories 0700, including the job and base directories
it creates, under umask 0, 022 or 277; cleanup leaves nothing behind; job names that are not a
plain directory name and unknown checksums are refused; xxh3, crc32 and blake2b all verify.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from planaria.agent.state import parity, snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import model
from planaria.contract import plan
from planaria.wire import messages

Mode = messages.RedundancyMode
GROUP = (plan.WorkerId(0), plan.WorkerId(1), plan.WorkerId(2))

# A child that writes step 1, says "ready", then snapshots steps 2, 3, ... until it is killed.
CHILD = r"""
import sys, pathlib, torch
from planaria.agent.state import snapshot_store, snapshot_writer
from planaria.agent.training import model
from planaria.wire import messages

def state(index, step, numel):
    t = torch.arange(numel, dtype=torch.float32) + step
    return model.LayerState(index=index, names=("w",), parameters=(t,), exp_avg=(t * 2,),
                            exp_avg_sq=(t * 3,), steps=(torch.tensor(float(step)),))

store = snapshot_store.SnapshotStore(pathlib.Path(sys.argv[1]))
config = snapshot_writer.WriterConfig(job="job", worker=0, redundancy=messages.RedundancyMode.COPY)
writer = snapshot_writer.SnapshotWriter(store, config)
groups = {i: (0, 1) for i in range(4)}
writer.begin(step=1, epoch=1, states=[state(i, 1, 1000) for i in range(4)], groups=groups)
writer.wait(30)
print("ready", flush=True)
step = 2
while True:
    states = [state(i, step, 400_000) for i in range(4)]
    writer.begin(step=step, epoch=1, states=states, groups=groups)
    writer.wait(60)
    step += 1
"""


def _child_state(index: int, step: int, numel: int) -> model.LayerState:
    t = torch.arange(numel, dtype=torch.float32) + step
    return model.LayerState(
        index=index,
        names=("w",),
        parameters=(t,),
        exp_avg=(t * 2,),
        exp_avg_sq=(t * 3,),
        steps=(torch.tensor(float(step)),),
    )


def _mid_write(root: Path) -> str | None:
    """The slot holding data files but no manifest: a snapshot being written."""
    for slot in snapshot_store.SLOTS:
        names = {p.name for p in (root / slot).iterdir()}
        if names and snapshot_store.MANIFEST not in names:
            return slot
    return None


def _kill_mid_write(process: subprocess.Popen[bytes], root: Path) -> str:
    """Stop the child while a slot is half written, confirm it, SIGKILL it; the slot's name."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _mid_write(root) is None:
            continue
        os.kill(process.pid, signal.SIGSTOP)
        slot = _mid_write(root)  # frozen now: still half written?
        if slot is not None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
            return slot
        os.kill(process.pid, signal.SIGCONT)
    raise AssertionError("the child never was caught in the middle of a snapshot")


def test_a_snapshot_killed_mid_write_leaves_the_previous_one_loadable(tmp_path: Path) -> None:
    root = tmp_path / "store"
    command = [sys.executable, "-c", CHILD, str(root)]
    with subprocess.Popen(command, stdout=subprocess.PIPE) as process:
        try:
            assert process.stdout is not None and process.stdout.readline() == b"ready\n"
            interrupted = _kill_mid_write(process, root)
        finally:
            process.kill()
    store = snapshot_store.SnapshotStore(root)
    latest = store.latest()
    assert interrupted not in {p.parent.name for p in root.glob("*/manifest.json")}
    numel = 1000 if latest.step == 1 else 400_000
    for layer in range(4):
        member = snapshots.read_member(store, latest.step, layer)  # checksums verified
        flat = snapshots.flat_bytes(_child_state(layer, latest.step, numel))
        span = parity.shard_range(flat.nbytes, 2, 0)
        assert member.shard.tobytes() == flat.copy(span.start, span.stop).tobytes()
    _next_snapshot_reuses_the_interrupted_slot(store, latest.step + 1, interrupted)


def _next_snapshot_reuses_the_interrupted_slot(
    store: snapshot_store.SnapshotStore, step: int, slot: str
) -> None:
    config = snapshot_writer.WriterConfig(job="job", worker=plan.WorkerId(0))
    writer = snapshot_writer.SnapshotWriter(store, config)
    writer.begin(step=step, epoch=2, states=[_child_state(0, step, 10)], groups={0: GROUP})
    writer.wait(30)
    assert (store.root / slot / snapshot_store.MANIFEST).exists()
    assert store.latest().step == step


# --- slots ----------------------------------------------------------------------------------


def _write_steps(
    stores: Sequence[snapshot_store.SnapshotStore], steps: Sequence[int], mode: Mode = Mode.XOR
) -> None:
    writers = [
        snapshot_writer.SnapshotWriter(
            store,
            snapshot_writer.WriterConfig(job="job", worker=plan.WorkerId(w), redundancy=mode),
        )
        for w, store in enumerate(stores)
    ]
    for step in steps:
        for writer in writers:
            writer.begin(step=step, epoch=1, states=[_child_state(0, step, 301)], groups={0: GROUP})
        for writer in writers:
            writer.wait(30)
    for writer in writers:
        writer.close()


def _stores(base: Path) -> list[snapshot_store.SnapshotStore]:
    return [snapshot_store.SnapshotStore(snapshot_store.store_root("job", w, base)) for w in GROUP]


def test_two_slots_keep_the_newest_two_snapshots(tmp_path: Path) -> None:
    stores = _stores(tmp_path)
    _write_steps(stores, [1, 2, 3])
    assert [m.step for m in stores[0].complete_manifests()] == [3, 2]
    _write_steps(stores, [2])  # a run resumed from step 1 overwrites its future
    assert [m.step for m in stores[0].complete_manifests()] == [2]


def test_the_heartbeat_lists_every_held_snapshot_with_a_digest_of_its_checksums(
    tmp_path: Path,
) -> None:
    stores = _stores(tmp_path)
    _write_steps(stores, [1, 2, 3])
    state = stores[0].state(at_most=2)  # the latest step is the confirmed one ...
    assert state.latest_step == 2
    assert [h.step for h in state.held] == [3, 2]  # ... `held` is what the store can serve
    digests = {h.step: h.digest for h in state.held}
    assert digests[3] == snapshot_store.digest(stores[0].manifest(3)) != digests[2]
    assert digests[3] != snapshot_store.digest(stores[1].manifest(3))  # another member's files
    _write_steps(stores, [3])  # the same step written again from the same state: same bytes
    again = stores[0].state().held[0]
    assert (again.step, again.digest) == (3, digests[3])
    members = {(m.layer, m.member): m.digest for m in again.members}
    entries = stores[0].manifest(3).layers
    assert members == {(e.layer, e.member): snapshot_store.member_digest(e) for e in entries}
    others = {(m.layer, m.member): m.digest for m in stores[1].state().held[0].members}
    assert not set(members.items()) & set(others.items())  # other members: other files


def test_an_empty_store_has_no_snapshot(tmp_path: Path) -> None:
    store = snapshot_store.SnapshotStore(tmp_path / "empty")
    assert store.state() == messages.SnapshotState()
    with pytest.raises(snapshot_store.SnapshotMissing, match="no complete snapshot"):
        store.latest()
    with pytest.raises(snapshot_store.SnapshotMissing, match="no snapshot of step 4"):
        store.manifest(4)


def test_open_files_keep_their_bytes_while_the_slot_is_rewritten(tmp_path: Path) -> None:
    stores = _stores(tmp_path)
    _write_steps(stores, [1])
    with stores[0].open_snapshot(1) as snapshot:
        _write_steps(stores, [2, 3])  # step 3 reuses step 1's slot
        entry = snapshot.manifest.layer(0)
        shard = snapshot.read(entry.files[0])
    flat = snapshots.flat_bytes(_child_state(0, 1, 301))
    assert shard.tobytes() == flat.copy(0, len(parity.shard_range(flat.nbytes, 3, 0))).tobytes()
    assert [m.step for m in stores[0].complete_manifests()] == [3, 2]


# --- corruption -----------------------------------------------------------------------------


def _shard_path(store: snapshot_store.SnapshotStore, step: int) -> Path:
    for slot in snapshot_store.SLOTS:
        path = store.root / slot
        if snapshot_store.read_manifest(path).step == step:
            return path / "layer-0.shard"
    raise AssertionError(f"no snapshot of step {step} in {store.root}")


def _flip_bit(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


def _extend(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_flip_bit, "checksum mismatch"),
        (_truncate, "bytes but the manifest says"),
        (_extend, "bytes but the manifest says"),
        (Path.unlink, "a file named by the manifest is gone"),
    ],
    ids=["a flipped bit", "a truncated file", "an over-long file", "a missing file"],
)
def test_a_damaged_shard_is_detected_and_rebuilt_from_the_peers(
    tmp_path: Path, damage: object, message: str
) -> None:
    stores = _stores(tmp_path)
    _write_steps(stores, [1])
    damage(_shard_path(stores[1], 1))  # type: ignore[operator]
    with pytest.raises(snapshot_store.SnapshotCorrupt, match=message):
        snapshots.read_member(stores[1], 1, 0)
    rebuilt = snapshots.load_layer(stores, 1, 0)  # member 1 counts as lost; parity covers it
    expected = _child_state(0, 1, 301)
    assert [snapshots.host_bytes(t).tobytes() for t in rebuilt.tensors()] == [
        snapshots.host_bytes(t).tobytes() for t in expected.tensors()
    ]


def test_a_damaged_manifest_makes_its_slot_untrusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stores = _stores(tmp_path)
    _write_steps(stores, [1, 2])
    manifest = _shard_path(stores[0], 2).parent / snapshot_store.MANIFEST
    manifest.write_bytes(manifest.read_bytes().replace(b'"step":2', b'"step":7'))
    with caplog.at_level(logging.WARNING):
        assert stores[0].latest().step == 1
    assert "checksum: does not match the body" in caplog.text


# --- files, names, cleanup ------------------------------------------------------------------


def test_files_are_private_to_the_owner(tmp_path: Path) -> None:
    stores = _stores(tmp_path)
    _write_steps(stores, [1])
    root = stores[0].root
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277], ids=["umask 0", "umask 022", "umask 277"])
def test_stores_are_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    previous = os.umask(umask)
    try:
        stores = _stores(tmp_path / "base")
        _write_steps(stores, [1])
    finally:
        os.umask(previous)
    created = [tmp_path / "base", *(tmp_path / "base").rglob("*")]
    assert {stat.S_IMODE(p.stat().st_mode) for p in created if p.is_dir()} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in created if p.is_file()} == {0o600}
    assert len([p for p in created if p.is_file()]) > len(GROUP)  # data files and manifests


def test_cleanup_leaves_nothing_behind(tmp_path: Path) -> None:
    stores = _stores(tmp_path)
    _write_steps(stores, [1, 2])
    stores[0].remove()
    assert not stores[0].root.exists()
    snapshot_store.remove_job("job", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("job", ["", "..", ".hidden", "a/b", "x" * 129])
def test_a_job_name_must_be_a_plain_directory_name(job: str) -> None:
    with pytest.raises(snapshot_store.SnapshotConfigError, match="cannot name a directory"):
        snapshot_store.store_root(job, 0)


def test_an_unknown_checksum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(snapshot_store.SnapshotConfigError, match="use one of"):
        snapshot_store.SnapshotStore(tmp_path, checksum="md5")


@pytest.mark.parametrize("algorithm", ["xxh3", "crc32", "blake2b"])
def test_either_checksum_verifies_what_it_wrote(tmp_path: Path, algorithm: str) -> None:
    store = snapshot_store.SnapshotStore(tmp_path / algorithm, checksum=algorithm)
    _write_steps([store], [1], Mode.NONE)
    member = snapshots.read_member(store, 1, 0)
    assert member.entry.files[0].checksum.startswith(f"{algorithm}:")
