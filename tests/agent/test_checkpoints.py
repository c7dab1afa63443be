"""Persistent checkpoints copied from complete snapshots (planaria.agent.state.checkpoints).

Covers: three workers checkpoint every 2 steps in the background from their host-memory
snapshots; the checkpoint loads (weights only: JSON and raw bytes) bit-identical to the state
snapshotted, also with one worker's part missing or damaged (the redundancy stands in), but not
with two missing; each worker keeps its parts of the last 2 steps and of every step from the
newest one its whole plan completed, which is what it reports (a member that stopped writing
holds the others' older parts back until the plan leaves it out); a part left half written
(.tmp) by a crash is ignored by the loader and removed by the next write; a snapshot that is no
longer in the store is reported by wait(); files are 0600; settings are validated.
"""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from planaria.agent.state import checkpoints, snapshot_store, snapshot_writer, snapshots
from planaria.agent.training import model
from planaria.contract import plan
from planaria.wire import messages

M = 3
GROUPS = {i: tuple(plan.WorkerId(w) for w in range(M)) for i in range(2)}


def _states(step: int) -> list[model.LayerState]:
    rng = np.random.default_rng(step)

    def tensor(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))

    return [
        model.LayerState(
            index=i,
            names=("w", "b"),
            parameters=(tensor(5, 7), tensor(7)),
            exp_avg=(tensor(5, 7), tensor(7)),
            exp_avg_sq=(tensor(5, 7), tensor(7)),
            steps=(torch.tensor(float(step)), torch.tensor(float(step))),
        )
        for i in range(2)
    ]


class _Job:
    """Three workers, each with a snapshot store, a snapshot writer and a checkpoint writer."""

    def __init__(self, base: Path, mode: messages.RedundancyMode = messages.RedundancyMode.XOR):
        self.root = base / "checkpoints"
        self.stores = [
            snapshot_store.SnapshotStore(snapshot_store.store_root("job", w, base / "shm"))
            for w in range(M)
        ]
        self.writers = [
            snapshot_writer.SnapshotWriter(
                store,
                snapshot_writer.WriterConfig(job="job", worker=plan.WorkerId(w), redundancy=mode),
            )
            for w, store in enumerate(self.stores)
        ]
        self.checkpointers = [
            checkpoints.CheckpointWriter(
                checkpoints.CheckpointConfig(root=self.root, worker=w, interval_steps=2)
            )
            for w in range(M)
        ]

    def step(
        self, step: int, writing: range = range(M), members: tuple[int, ...] = (), since: int = 0
    ) -> None:
        """Snapshot `step`, then (when due) the `writing` workers checkpoint the complete
        snapshot, counting `members` (default: all) as the plan of an epoch that resumed after
        `since`; each keeps what it reported last until the epoch completes a step."""
        for writer in self.writers:
            writer.begin(step=step, epoch=1, states=_states(step), groups=GROUPS)
        for w, (writer, checkpointer) in enumerate(
            zip(self.writers, self.checkpointers, strict=True)
        ):
            manifest = writer.wait(30)
            assert manifest is not None
            if w in writing:  # one after the other, so what each finds complete is known
                reported = checkpointer.complete_step
                checkpointer.begin(
                    writer.store,
                    manifest.step,
                    members or tuple(range(M)),
                    since=since,
                    keep_from=reported,
                )
                checkpointer.wait(30)


def _assert_states(loaded: dict[int, model.LayerState], step: int) -> None:
    expected = _states(step)
    assert sorted(loaded) == [0, 1]
    for state in expected:
        got = loaded[state.index]
        assert [snapshots.host_bytes(t).tobytes() for t in got.tensors()] == [
            snapshots.host_bytes(t).tobytes() for t in state.tensors()
        ]


def test_checkpoints_load_what_was_snapshotted_and_keep_the_last_two(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    for step in range(1, 7):
        job.step(step)
    assert checkpoints.checkpoint_steps(job.root) == (4, 6)
    assert sorted(p.name for p in (job.root / "step-6").iterdir()) == [
        "worker-0",
        "worker-1",
        "worker-2",
    ]
    _assert_states(checkpoints.load_checkpoint(job.root), 6)
    _assert_states(checkpoints.load_checkpoint(job.root, 4), 4)


def test_a_member_that_stops_holds_its_complete_step_until_the_plan_leaves_it_out(
    tmp_path: Path,
) -> None:
    job = _Job(tmp_path)
    for step in (1, 2):
        job.step(step)
    # Each reports what was complete when it finished (they write in worker order).
    assert [c.complete_step for c in job.checkpointers] == [None, None, 2]
    for step in range(3, 9):  # worker 2 is gone: its last part is step 2's
        job.step(step, writing=range(2))
    assert [c.complete_step for c in job.checkpointers[:2]] == [2, 2]
    assert checkpoints.checkpoint_steps(job.root) == (2, 4, 6, 8)
    _assert_states(checkpoints.load_checkpoint(job.root, 2), 2)
    # The next epoch's plan is workers 0 and 1, resumed after step 8. Step 8 has their parts
    # but was written by the old plan (worker 2's part is missing): it does not count.
    for step in (9, 10):
        job.step(step, writing=range(2), members=(0, 1), since=8)
    assert [c.complete_step for c in job.checkpointers[:2]] == [None, 10]
    _assert_states(checkpoints.load_checkpoint(job.root, 2), 2)  # worker 0 keeps its part
    for step in (11, 12):
        job.step(step, writing=range(2), members=(0, 1), since=8)
    assert [c.complete_step for c in job.checkpointers[:2]] == [10, 12]
    assert checkpoints.checkpoint_steps(job.root) == (2, 10, 12)  # step 2: worker 2's part only


def test_one_missing_or_damaged_part_is_covered_by_redundancy(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    job.step(2)
    (job.root / "step-2" / "worker-0" / "layer-1.shard").write_bytes(b"garbage")
    _assert_states(checkpoints.load_checkpoint(job.root, 2), 2)
    for path in (job.root / "step-2" / "worker-0").iterdir():
        path.unlink()
    (job.root / "step-2" / "worker-0").rmdir()
    _assert_states(checkpoints.load_checkpoint(job.root, 2), 2)
    for path in (job.root / "step-2" / "worker-1").iterdir():
        path.unlink()
    with pytest.raises(snapshot_store.SnapshotMissing, match="no loadable checkpoint"):
        checkpoints.load_checkpoint(job.root)


def test_a_half_written_part_is_ignored_and_removed(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    job.step(2)
    leftover = job.root / "step-3" / "worker-1.tmp"  # step 3 is never checkpointed
    leftover.mkdir(parents=True)
    (leftover / "layer-0.shard").write_bytes(b"half")
    assert checkpoints.checkpoint_steps(job.root) == (2,)
    with pytest.raises(snapshot_store.SnapshotMissing, match="holds no complete worker part"):
        checkpoints.load_checkpoint(job.root, 3)
    job.step(3)
    job.step(4)
    assert not leftover.parent.exists()
    _assert_states(checkpoints.load_checkpoint(job.root), 4)


def test_checkpoint_files_are_private(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    job.step(2)
    part = job.root / "step-2" / "worker-2"
    assert stat.S_IMODE(part.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in part.iterdir()} == {0o600}


def test_a_snapshot_no_longer_held_is_reported(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    job.step(1)
    checkpointer = job.checkpointers[0]
    assert checkpointer.begin(job.stores[0], 2)  # due, but step 2 was never snapshotted
    with pytest.raises(snapshot_store.SnapshotMissing, match="no complete snapshot of step 2"):
        checkpointer.wait(30)
    assert not checkpointer.begin(job.stores[0], 3)  # not due


def test_an_empty_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert checkpoints.checkpoint_steps(tmp_path / "none") == ()
    with pytest.raises(snapshot_store.SnapshotMissing, match="no loadable checkpoint"):
        checkpoints.load_checkpoint(tmp_path / "none")
    with pytest.raises(snapshot_store.SnapshotMissing, match="no checkpoint of step 3"):
        checkpoints.load_checkpoint(tmp_path, 3)


@pytest.mark.parametrize(("field", "value"), [("interval_steps", 0), ("keep", 0), ("worker", -1)])
def test_bad_checkpoint_settings_are_refused(tmp_path: Path, field: str, value: int) -> None:
    settings: dict[str, int] = {"worker": 0, "interval_steps": 1, field: value}
    with pytest.raises(snapshot_store.SnapshotConfigError, match=field):
        checkpoints.CheckpointConfig(root=tmp_path, **settings)
