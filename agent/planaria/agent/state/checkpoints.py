"""Persistent checkpoints: complete snapshots copied to a directory that outlives the nodes.

The last tier of recovery (DESIGN.md): when more members of a sharding group fail than the
host-memory redundancy covers, training resumes from here. Every `interval_steps` steps, a
worker copies one COMPLETE host-memory snapshot (never the live training state, which keeps
changing) into the checkpoint directory, in a background thread, so training does not stop:

    <root>/step-<N>/worker-<W>.tmp/   being written
    <root>/step-<N>/worker-<W>/       complete: renamed from .tmp after every file is fsync'ed
        manifest.json, layer-<L>.shard, layer-<L>.copy | layer-<L>.parity

The format is the snapshot's own (raw bytes, JSON manifest, checksums; see `snapshot_store`);
each file is verified against the snapshot's checksum before it is copied. Each worker writes
and renames its own part, so workers never coordinate; a step is loadable when every layer can
be rebuilt from the parts present (the redundancy also covers a worker that never wrote).

Retention and what a worker reports: after each write, the writer finds the newest step
written in the current epoch (after its resume step, `begin`'s `since`) of which every member
of the current plan (`members`) has a complete part: the step a resume can load
(`complete_step`, what the agent's heartbeat reports as its checkpoint step; steps of an
earlier epoch were written by that epoch's plan, whose other parts may be gone). A worker keeps
its parts of its last `keep` (2) steps and of every step from the complete one on (or, before
the epoch has one, from `keep_from`, the step it reported last), and deletes older ones. So the
newest complete step is never pruned, even when a member lags or dies between its write and its
next heartbeat (the controller takes the newest step any worker reported complete), and parts
of workers that left the plan do not hold back pruning.

`load_checkpoint` has weights-only semantics: it reads JSON and raw bytes and returns layer
states; nothing is unpickled or executed. `root` is a local path or a mounted volume.

Errors: `snapshot_store`'s tree (SnapshotMissing, SnapshotCorrupt, SnapshotTimeout,
SnapshotWriteError; SnapshotConfigError for bad settings).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from planaria.agent.state import durable_files, manifests, mirroring, snapshot_store, snapshots
from planaria.agent.training import model

LOG = logging.getLogger(__name__)
_STEP = re.compile(r"^step-(\d+)$")
_WORKER = re.compile(r"^worker-(\d+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
    """Where and how often worker `worker` checkpoints, and how many steps it keeps."""

    root: Path
    worker: int
    interval_steps: int
    keep: int = 2

    def __post_init__(self) -> None:
        for name in ("interval_steps", "keep"):
            if getattr(self, name) < 1:
                raise snapshot_store.SnapshotConfigError(
                    f"checkpoint {name} is {getattr(self, name)}; give a whole number >= 1"
                )
        if self.worker < 0:
            raise snapshot_store.SnapshotConfigError(
                f"checkpoint worker {self.worker} must be >= 0"
            )


class CheckpointWriter:
    """Copies complete snapshots from a store to the checkpoint directory in the background."""

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._future: concurrent.futures.Future[Path] | None = None
        # The newest step every member has a complete part of, as of the last write (written
        # on the writer thread before its future completes; read after `wait`).
        self.complete_step: int | None = None

    def due(self, step: int) -> bool:
        return step >= 1 and step % self.config.interval_steps == 0

    def begin(
        self,
        store: snapshot_store.SnapshotStore,
        step: int,
        members: tuple[int, ...] = (),
        *,
        since: int = 0,
        keep_from: int | None = None,
    ) -> bool:
        """Start copying the complete snapshot of `step` from `store`; False when not due or
        when the previous checkpoint is still being written (it is never queued behind).
        `members`: the workers of the current plan, whose parts make a step complete (empty:
        this worker alone); `since`: the epoch's resume step (only later steps count);
        `keep_from`: the step last reported complete, kept until the epoch completes one."""
        if not self.due(step) or (self._future is not None and not self._future.done()):
            return False
        self._future = self._pool.submit(self._write, store, step, members, since, keep_from)
        return True

    def wait(self, timeout_s: float | None = None) -> Path | None:
        """The directory of the last checkpoint part written, or None if none was pending.
        SnapshotTimeout after `timeout_s`; SnapshotWriteError when writing failed."""
        future, self._future = self._future, None
        if future is None:
            return None
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError as exc:
            self._future = future
            raise snapshot_store.SnapshotTimeout(
                f"checkpoint not done after {timeout_s} s"
            ) from exc
        except snapshot_store.SnapshotError:
            raise
        except Exception as exc:  # an I/O failure on the background thread
            raise snapshot_store.SnapshotWriteError(
                f"writing the checkpoint failed: {exc}"
            ) from exc

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _write(
        self,
        store: snapshot_store.SnapshotStore,
        step: int,
        members: tuple[int, ...],
        since: int,
        keep_from: int | None,
    ) -> Path:
        step_dir = self.config.root / f"step-{step}"
        final = step_dir / f"worker-{self.config.worker}"
        temp = step_dir / f"worker-{self.config.worker}.tmp"
        durable_files.make_private_dir(step_dir)
        shutil.rmtree(temp, ignore_errors=True)
        durable_files.make_private_dir(temp)
        with store.open_snapshot(step) as snapshot:  # its own layers: a mirror's are another's
            manifest = snapshot.manifest
            own = tuple(e for e in manifest.layers if not mirroring.is_mirrored(manifest, e))
            for entry in own:
                for stored in entry.files:
                    _copy_file(snapshot, stored, temp)
            snapshot_store.commit_manifest(temp, dataclasses.replace(manifest, layers=own))
        shutil.rmtree(final, ignore_errors=True)
        temp.rename(final)
        durable_files.fsync_dir(step_dir)
        found = complete_step(self.config.root, members or (self.config.worker,), after=since)
        self.complete_step = found
        self._prune(found if found is not None else keep_from)
        return final

    def _prune(self, complete: int | None) -> None:
        """Delete this worker's parts of all but its newest `keep` steps and those from the
        `complete` step on, and its half-written parts left by a crash; remove step
        directories older than those kept once empty.

        Other workers prune the same directory concurrently (on other nodes too), so a
        directory may vanish or fill up under us: those races are tolerated, and a step this
        worker keeps, or newer than all it keeps, is never removed, so a peer writing it (all
        workers checkpoint the same steps) is not disturbed.
        """
        me = f"worker-{self.config.worker}"
        mine = _complete_steps(self.config.root, self.config.worker)
        kept = mine[-self.config.keep :]
        for step_dir in list(_step_dirs(self.config.root)):
            shutil.rmtree(step_dir / f"{me}.tmp", ignore_errors=True)
            step = _step_of(step_dir)
            needed = complete is not None and step >= complete
            if kept and step < kept[-1] and step not in kept and not needed:
                shutil.rmtree(step_dir / me, ignore_errors=True)
                with contextlib.suppress(OSError):  # not empty (a peer's part), or gone
                    step_dir.rmdir()


def _copy_file(
    snapshot: snapshot_store.OpenSnapshot, stored: manifests.StoredFile, target: Path
) -> None:
    data = snapshot.read(stored)  # verified against the snapshot's checksum
    algorithm = stored.checksum.split(":", 1)[0]
    written = durable_files.write_private_file(target / stored.file, [data], algorithm)
    if written != stored.checksum:
        raise snapshot_store.SnapshotCorrupt(f"{target / stored.file}: changed while copied")


def _complete_steps(root: Path, worker: int | None = None) -> list[int]:
    """Steps with a complete part (of `worker`, or of anyone), oldest first."""
    steps = []
    for step_dir in _step_dirs(root):
        parts = list(_parts(step_dir))
        if any(worker is None or part_worker == worker for part_worker, _ in parts):
            steps.append(_step_of(step_dir))
    return sorted(steps)


def complete_step(root: Path, members: tuple[int, ...], *, after: int = 0) -> int | None:
    """The newest step after `after` of which every one of `members` has a complete part
    (None if none)."""
    common: set[int] | None = None
    for member in members:
        steps = {s for s in _complete_steps(root, member) if s > after}
        common = steps if common is None else common & steps
    return max(common) if common else None


def _step_of(step_dir: Path) -> int:
    match = _STEP.match(step_dir.name)
    assert match is not None
    return int(match.group(1))


def _step_dirs(root: Path) -> Iterator[Path]:
    if root.is_dir():
        yield from (p for p in root.iterdir() if p.is_dir() and _STEP.match(p.name))


def _parts(step_dir: Path) -> Iterator[tuple[int, Path]]:
    """Complete worker parts in a step directory (none if it vanished meanwhile)."""
    try:
        entries = list(step_dir.iterdir())
    except FileNotFoundError:
        return
    for p in entries:
        match = _WORKER.match(p.name)
        if match and p.is_dir():
            yield int(match.group(1)), p


# --- loading --------------------------------------------------------------------------------


def checkpoint_steps(root: Path) -> tuple[int, ...]:
    """Steps of which at least one worker's part is complete, oldest first."""
    return tuple(_complete_steps(root))


def load_checkpoint(root: Path, step: int | None = None) -> dict[int, model.LayerState]:
    """Every layer's state at `step` (default: the newest step that loads), rebuilt from the
    workers' parts. SnapshotMissing when no step loads or a layer cannot be rebuilt."""
    if step is not None:
        return _load_step(root, step)
    problems = []
    for candidate in reversed(checkpoint_steps(root)):
        try:
            return _load_step(root, candidate)
        except snapshot_store.SnapshotError as exc:
            problems.append(f"step {candidate}: {exc}")
    raise snapshot_store.SnapshotMissing(f"no loadable checkpoint in {root}: {problems}")


def _load_step(root: Path, step: int) -> dict[int, model.LayerState]:
    step_dir = root / f"step-{step}"
    if not step_dir.is_dir():
        raise snapshot_store.SnapshotMissing(f"{root} has no checkpoint of step {step}")
    members: dict[int, list[snapshots.MemberSnapshot]] = {}
    for _, part in sorted(_parts(step_dir)):
        for member in _read_part(part, step):
            members.setdefault(member.entry.layer, []).append(member)
    if not members:
        raise snapshot_store.SnapshotMissing(f"{step_dir} holds no complete worker part")
    return {layer: snapshots.rebuild_layer(found) for layer, found in sorted(members.items())}


def _read_part(part: Path, step: int) -> list[snapshots.MemberSnapshot]:
    """The readable layers of one worker's part; damaged ones are logged and left out, so the
    redundancy in the other parts can stand in for them."""
    try:
        manifest = snapshot_store.read_manifest(part)
    except snapshot_store.SnapshotError as exc:
        LOG.warning("checkpoint part %s is unreadable: %s", part, exc)
        return []
    if manifest.step != step:
        LOG.warning("checkpoint part %s holds step %d, not %d", part, manifest.step, step)
        return []
    found = []
    for entry in manifest.layers:
        try:
            found.append(_read_entry(part, manifest, entry))
        except snapshot_store.SnapshotError as exc:
            LOG.warning("checkpoint part %s, layer %d: %s", part, entry.layer, exc)
    return found


def _read_entry(
    part: Path, manifest: manifests.Manifest, entry: manifests.LayerEntry
) -> snapshots.MemberSnapshot:
    blobs = {}
    for stored in entry.files:
        try:
            with open(part / stored.file, "rb") as handle:
                blobs[stored.kind] = snapshot_store.read_verified(handle, stored, str(part))
        except FileNotFoundError as exc:
            raise snapshot_store.SnapshotCorrupt(f"{part / stored.file} is missing") from exc
    shard = blobs.pop(manifests.FileKind.SHARD, None)
    if shard is None:
        raise snapshot_store.SnapshotCorrupt(f"{part}: layer {entry.layer} has no shard")
    return snapshots.MemberSnapshot(
        step=manifest.step,
        redundancy=manifest.redundancy,
        entry=entry,
        shard=shard,
        redundant=next(iter(blobs.values()), None),
    )
