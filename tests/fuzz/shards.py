"""Campaign 4: damaged snapshot shards, manifests and checkpoint parts are caught, never loaded.

`Snapshotted` writes one layer's host-memory snapshots at step `STEP` for a sharding group of
three workers (each member's shard plus its copy or parity) and copies them into a persistent
checkpoint, in a directory of its own. The judges damage one file of worker 1 (a flipped bit,
a cut, bytes appended), read, and put the file back:

- `judge_store`: worker 1's own read (`snapshots.read_member`) must raise a SnapshotError or
  return exactly what was written (a manifest damaged into one that parses to the same body);
  the recovery tier (`snapshots.load_layer` over the three stores) must rebuild the layer
  bit-identically from the peers' redundancy.
- `judge_checkpoint`: `checkpoints.load_checkpoint` must return every layer bit-identically
  (the other parts' redundancy stands in for the damaged one) or raise a SnapshotError.
- `judge_forged`: a manifest body with fields mutated and a *valid* checksum (what a writer
  bug, not a flipped bit, would leave): decoding raises only ManifestError, and reading through
  it raises a SnapshotError or gives the original layer, never other tensors.

Wrong bytes, another exception type, or a recovery that fails where the redundancy covers the
loss, are crashes. The verdict is ACCEPTED when the damage was harmless (same data read) and
REJECTED when it was detected.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import torch

from planaria.agent.state import checkpoints, manifests, snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import model
from planaria.contract import plan
from planaria.wire import messages
from tests.fuzz import verdicts

STEP, LAYER = 2, 0
GROUP = (plan.WorkerId(0), plan.WorkerId(1), plan.WorkerId(2))
DAMAGED_WORKER = 1
Damage = Callable[[bytes], bytes]


def layer_state() -> model.LayerState:
    """A small layer (two tensors, 200 flat bytes) with distinct values everywhere."""
    w, b = torch.arange(12, dtype=torch.float32).reshape(3, 4), torch.linspace(-1, 1, 4)
    return model.LayerState(
        index=LAYER,
        names=("w", "b"),
        parameters=(w, b),
        exp_avg=(w * 0.5, b * 0.5),
        exp_avg_sq=(w * w, b * b),
        steps=(torch.tensor(float(STEP)), torch.tensor(float(STEP))),
    )


def _flat(state: model.LayerState) -> list[bytes]:
    return [snapshots.host_bytes(t).tobytes() for t in state.tensors()]


class Snapshotted:
    """Three workers' snapshots of one layer at STEP and their checkpoint, in a temp dir."""

    def __init__(self, mode: messages.RedundancyMode = messages.RedundancyMode.XOR) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="planaria-fuzz-")
        base = Path(self._dir.name)
        self.expected = _flat(layer_state())
        self.checkpoint_root = base / "checkpoints"
        self.stores = [
            snapshot_store.SnapshotStore(snapshot_store.store_root("job", w, base / "shm"))
            for w in GROUP
        ]
        for worker, store in zip(GROUP, self.stores, strict=True):
            _snapshot_and_checkpoint(store, worker, mode, self.checkpoint_root)
        self.store_dir = self.stores[DAMAGED_WORKER].root / _slot_of(
            self.stores[DAMAGED_WORKER], STEP
        )
        self.part_dir = self.checkpoint_root / f"step-{STEP}" / f"worker-{DAMAGED_WORKER}"
        # Worker 1's member snapshot as written, read before any damage.
        self.pristine = snapshots.read_member(self.stores[DAMAGED_WORKER], STEP, LAYER)

    def __enter__(self) -> Snapshotted:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._dir.cleanup()

    def store_files(self) -> list[Path]:
        """Worker 1's files of the snapshot: its data files, then its manifest."""
        return _files(self.store_dir)

    def part_files(self) -> list[Path]:
        """Worker 1's part of the checkpoint: its data files, then its manifest."""
        return _files(self.part_dir)


def _files(directory: Path) -> list[Path]:
    data = sorted(p for p in directory.iterdir() if p.name != snapshot_store.MANIFEST)
    return [*data, directory / snapshot_store.MANIFEST]


def _snapshot_and_checkpoint(
    store: snapshot_store.SnapshotStore,
    worker: plan.WorkerId,
    mode: messages.RedundancyMode,
    root: Path,
) -> None:
    config = snapshot_writer.WriterConfig(job="job", worker=worker, redundancy=mode)
    writer = snapshot_writer.SnapshotWriter(store, config)
    writer.begin(step=STEP, epoch=1, states=[layer_state()], groups={LAYER: GROUP})
    writer.wait(30)
    writer.close()
    copier = checkpoints.CheckpointWriter(
        checkpoints.CheckpointConfig(root=root, worker=worker, interval_steps=STEP)
    )
    copier.begin(store, STEP)
    copier.wait(30)
    copier.close()


def _slot_of(store: snapshot_store.SnapshotStore, step: int) -> str:
    for slot in snapshot_store.SLOTS:
        if snapshot_store.read_manifest(store.root / slot).step == step:
            return slot
    raise AssertionError(f"no snapshot of step {step} in {store.root}")


# --- damage -----------------------------------------------------------------------------------


def flip(bit: int) -> Damage:
    return lambda raw: bytes(
        b ^ (1 << (bit % 8)) if i == bit // 8 else b for i, b in enumerate(raw)
    )


def cut(length: int) -> Damage:
    return lambda raw: raw[:length]


def extend(extra: bytes) -> Damage:
    return lambda raw: raw + extra


@contextlib.contextmanager
def damaged(path: Path, damage: Damage) -> Iterator[None]:
    """`path` damaged for the duration, then restored byte for byte."""
    original = path.read_bytes()
    path.write_bytes(damage(original))
    try:
        yield
    finally:
        path.write_bytes(original)


def all_damages(path: Path) -> Iterator[Damage]:
    """Every single-bit flip, every cut and a few extensions of the file at `path`."""
    size = path.stat().st_size
    yield from (flip(bit) for bit in range(size * 8))
    yield from (cut(length) for length in range(size))
    yield from (extend(extra) for extra in (b"\0", b"\xff" * 7, b"x" * 4096))


# --- judges -----------------------------------------------------------------------------------


def judge_store(snapped: Snapshotted, path: Path, damage: Damage) -> verdicts.Verdict:
    """Damage one of worker 1's snapshot files; read it back and recover the layer."""
    with damaged(path, damage):
        own = _read_own(snapped)
        recovered = _recover(snapped)
    if recovered.outcome is not verdicts.Outcome.ACCEPTED:
        return recovered if recovered.outcome is verdicts.Outcome.CRASHED else _unrecovered()
    return own


def _read_own(snapped: Snapshotted) -> verdicts.Verdict:
    store = snapped.stores[DAMAGED_WORKER]
    try:
        member = snapshots.read_member(store, STEP, LAYER)
    except snapshot_store.SnapshotError as exc:
        return verdicts.rejected(f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return verdicts.crashed("read_member", exc)
    fresh = snapped.pristine
    same = member.entry == fresh.entry and member.shard.tobytes() == fresh.shard.tobytes()
    redundant = [None if m.redundant is None else m.redundant.tobytes() for m in (member, fresh)]
    if not same or redundant[0] != redundant[1]:
        return verdicts.crashed("read_member returned bytes other than those written")
    return verdicts.ACCEPTED


def _recover(snapped: Snapshotted) -> verdicts.Verdict:
    try:
        state = snapshots.load_layer(snapped.stores, STEP, LAYER)
    except snapshot_store.SnapshotError as exc:
        return verdicts.rejected(f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return verdicts.crashed("load_layer", exc)
    if _flat(state) != snapped.expected:
        return verdicts.crashed("load_layer rebuilt other tensors than those snapshotted")
    return verdicts.ACCEPTED


def _unrecovered() -> verdicts.Verdict:
    # Safe, but the redundancy covers one damaged member: failing to recover is a bug.
    return verdicts.crashed("load_layer failed although the peers' redundancy covers one member")


def judge_checkpoint(snapped: Snapshotted, path: Path, damage: Damage) -> verdicts.Verdict:
    """Damage one file of worker 1's checkpoint part; load the checkpoint."""
    with damaged(path, damage):
        try:
            loaded = checkpoints.load_checkpoint(snapped.checkpoint_root, STEP)
        except snapshot_store.SnapshotError as exc:
            return verdicts.crashed(f"the other parts did not stand in: {exc}")
        except Exception as exc:
            return verdicts.crashed("load_checkpoint", exc)
    if sorted(loaded) != [LAYER] or _flat(loaded[LAYER]) != snapped.expected:
        return verdicts.crashed("load_checkpoint returned other tensors than those written")
    return verdicts.ACCEPTED


def pristine_body(snapped: Snapshotted) -> dict[str, object]:
    """Worker 1's manifest body as written (the seed of forged manifests)."""
    raw = (snapped.store_dir / snapshot_store.MANIFEST).read_bytes()
    body: dict[str, object] = json.loads(raw)["body"]
    return body


def forged(body: object) -> bytes:
    """A manifest holding `body` with a checksum that matches it."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    checksum = f"crc32:{zlib.crc32(canonical):08x}".encode()
    return b'{"body":' + canonical + b',"checksum":"' + checksum + b'"}\n'


def judge_forged(snapped: Snapshotted, body: object) -> verdicts.Verdict:
    """A forged manifest (valid checksum, mutated body) for worker 1's snapshot."""
    raw = forged(body)
    try:
        manifests.decode(raw)
    except manifests.ManifestError as exc:
        return verdicts.rejected(f"ManifestError: {exc}")
    except Exception as exc:
        return verdicts.crashed("manifests.decode", exc)
    path = snapped.store_dir / snapshot_store.MANIFEST
    with damaged(path, lambda _: raw):
        recovered = _recover(snapped)
    return recovered
