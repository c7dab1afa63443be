"""The snapshot writer and the checkpoint writer of one epoch, as the training thread drives them.

Snapshots follow `snapshot_writer`'s contract: after committed step t that is due (every
`snapshot_interval_steps`, or asked for by TakeSnapshot), `begin` launches the copy of the live
state into the staging buffers; right before the next step's first OptimizerStep (before the
commit barrier) the training thread calls `release`, which waits only for that copy (REFT
§4.1: the checksums and writes go on in the background), and (RECOMPUTE) replays that step's
moment update on the writer's host replicas (`recompute`). `collect` (called at `release` and
after every step) records a snapshot once it is complete, bytes and checksums written, and
starts a due persistent checkpoint from it (`checkpoints`); `poll_checkpoint` records the
newest step a resume can load (`checkpoint_step`, which the heartbeat reports; it carries over
from the previous epoch).

Never blocking training on the writer, and every worker alike: each worker says at the commit
barrier of step t whether its writer is still busy (`busy_flag`; the barrier sums the flags,
`executor`), so every worker of the epoch learns the same thing at the same step. Snapshot t
is begun only when no writer was busy at barrier t; otherwise every worker skips it and it is
owed: taken after the first step whose barrier finds all writers free (the interval stretches;
the next due steps stay multiples of the interval). The members of a sharding group therefore
always snapshot the same steps, which the copy and parity redundancy need.
`achieved_interval_steps` is the mean distance between the snapshots begun this epoch.

What is complete everywhere (`confirmed`): a barrier with no writer busy proves that every
snapshot begun before it is complete on every worker of the epoch, the ones that die later
included. The heartbeat reports the newest snapshot at or before `confirmed` while training,
so what it reports stays complete everywhere although writes now run past the next barrier.
`confirmed` starts at this worker's newest complete snapshot when the epoch is set up (every
worker closed its writers before). The controller's roll-back reads `SnapshotState.held`
instead, every snapshot complete in this store: `control.recovery.resume_step` resumes only at
a step every survivor holds.

Three kinds of snapshot still wait for this worker's writer: one whose step a persistent
checkpoint is due at (skipping it would skip the checkpoint), one of the epoch's stop step
(FINISHED promises it; the run's final state is read from it) — every worker waits at the same
step for these, so what they waited for is complete everywhere at the next barrier — and one
asked for by TakeSnapshot.

Writers are rebuilt for every epoch (the sharding groups come from the plan); closing the old
ones first waits for their pending snapshot: complete, or failed (a mirror swap that met a
dead or stopped peer) and then not held, which `held` shows (docs/resilience.md, "Roll-back").

Not here: when the training thread calls these, and how long it waits (`training_thread`).

Errors: none escape from the background work. A failed snapshot or checkpoint is logged and
training goes on; the tier it would have fed is stale. A `begin` that breaks the writer's
contract (SnapshotConfigError: a layer outside its group) fails the step, as before.
"""

from __future__ import annotations

import logging
from pathlib import Path

from planaria.agent.execution import held_layers
from planaria.agent.state import (
    checkpoints,
    manifests,
    mirroring,
    snapshot_store,
    snapshot_writer,
    snapshots,
    staging,
)
from planaria.agent.training import model
from planaria.contract import plan
from planaria.wire import messages

LOG = logging.getLogger(__name__)


class EpochWriters:
    """One epoch's writers for `worker` of `config`'s plan (single-threaded: the training
    thread). `checkpoint_step` is the newest complete checkpoint known before this epoch."""

    def __init__(
        self,
        *,
        store: snapshot_store.SnapshotStore,
        worker: plan.WorkerId,
        config: messages.WorkerConfig,
        writer: snapshot_writer.WriterConfig,
        checkpoint_step: int | None,
        copier: staging.Copier | None = None,
        mirrors: mirroring.Mirroring | None = None,
    ) -> None:
        settings = config.settings
        self.store, self.worker, self.config = store, worker, config
        self.checkpoint_step = checkpoint_step
        self.groups = snapshots.sharding_groups(config.plan)
        self.writer = snapshot_writer.SnapshotWriter(store, writer, copier, mirrors)
        self.checkpoints: checkpoints.CheckpointWriter | None = None
        if settings.checkpoint_dir and settings.checkpoint_interval_steps:
            self.checkpoints = checkpoints.CheckpointWriter(
                checkpoints.CheckpointConfig(
                    root=Path(settings.checkpoint_dir),
                    worker=worker,
                    interval_steps=settings.checkpoint_interval_steps,
                )
            )
        self._checkpoint_pending: int | None = None
        self._owed = False  # a due snapshot was skipped: take one once every writer is free
        # The snapshots begun this epoch: how many, the first's step and the last's (0: none).
        self._num_begun, self._first_begun, self._last_begun = 0, 0, 0
        self._all_free = True  # no writer was busy at the last commit barrier
        self._settled: int | None = None  # begun before a wait every worker made alike
        self.skipped = 0  # due snapshots skipped because a writer was busy
        latest = store.complete_manifests()
        self.confirmed = latest[0].step if latest else 0  # 0: none yet

    @property
    def in_progress(self) -> bool:
        """Whether a snapshot is being written (safe to read from any thread)."""
        return self.writer.in_progress

    def due(self, t: int) -> bool:
        """Whether committed step `t` is snapshotted by the interval (or one is owed)."""
        interval = self.config.settings.snapshot_interval_steps
        return self._owed or (bool(interval) and t % interval == 0)

    @property
    def num_begun(self) -> int:
        """Snapshots begun this epoch."""
        return self._num_begun

    @property
    def achieved_interval_steps(self) -> float:
        """Mean committed steps between the snapshots begun this epoch; 0.0 before two."""
        n = self._num_begun
        return 0.0 if n < 2 else (self._last_begun - self._first_begun) / (n - 1)

    def busy_flag(self) -> float:
        """What this worker says at the commit barrier: 1.0 while its writer still writes."""
        return 1.0 if self.writer.in_progress else 0.0

    def barrier(self, t: int, flags: float) -> None:
        """Step `t` committed and its barrier summed the workers' `busy_flag`s to `flags`."""
        self._all_free = flags == 0
        if self._all_free:  # every snapshot begun so far (all before barrier t) is complete
            self.confirmed = max(self.confirmed, self._last_begun)
        if self._settled is not None:
            self.confirmed = max(self.confirmed, self._settled)
        self._settled = None

    def begin(
        self, t: int, layers: held_layers.HeldLayers, *, forced: bool = False, last: bool = False
    ) -> bool:
        """Start the snapshot of committed step `t` from the live layers; False when every
        worker skips it because a writer was busy at its barrier (module docstring). Not
        skipped: a `forced` one (TakeSnapshot), the epoch's `last` step (its stop step, which
        FINISHED promises) and a step a checkpoint is due at; these wait for the writer."""
        self.collect()
        ckpt = self.checkpoints
        if forced or last or (ckpt is not None and ckpt.due(t)):
            if not forced and self._num_begun:  # every worker waits here alike
                self._settled = self._last_begun
            self.finish_snapshot()
        elif not self._all_free:
            self.skipped += 0 if self._owed else 1
            self._owed = True
            return False
        self.writer.begin(  # a TakeSnapshot is taken at no barrier: it cannot mirror
            step=t,
            epoch=self.config.epoch,
            states=live_states(layers),
            groups=self.groups,
            mirror=not forced,
        )
        self._owed = False
        if not self._num_begun:
            self._first_begun = t
        self._num_begun, self._last_begun = self._num_begun + 1, t
        return True

    def reserve(self, layers: held_layers.HeldLayers) -> None:
        """When the epoch opens: let the writer allocate the staging buffers of periodic
        snapshots in the background (`SnapshotWriter.reserve`), not at the first snapshot."""
        if self.config.settings.snapshot_interval_steps:
            self.writer.reserve(live_states(layers), self.groups)

    def release(self) -> None:
        """Before the next optimizer step: wait until the pending snapshot no longer reads the
        live state (its copy), not for its writes; then collect it if it is complete."""
        self.writer.release()
        self.collect()

    def collect(self) -> None:
        """Record the pending snapshot if it is complete, starting a due checkpoint from it."""
        try:
            manifest = self.writer.poll()
        except snapshot_store.SnapshotError as exc:  # training goes on; the tier is stale
            LOG.warning("worker %d: snapshot failed: %s", self.worker, exc)
            return
        self._completed(manifest)

    def recompute(self, t: int, layers: held_layers.HeldLayers) -> None:
        """(RECOMPUTE) replay step `t`'s moment update on the host replicas, before the
        optimizer step."""
        if self.writer.config.redundancy is not messages.RedundancyMode.RECOMPUTE:
            return
        states = live_states(layers)
        grads = [[p.grad for p in layers.modules[s.index].parameters()] for s in states]
        self.writer.recompute_step(t, states, grads, self.groups)

    def finish_snapshot(self) -> None:
        """Wait until the pending snapshot is complete; start a due checkpoint from it."""
        try:
            manifest = self.writer.wait()
        except snapshot_store.SnapshotError as exc:  # training goes on; the tier is stale
            LOG.warning("worker %d: snapshot failed: %s", self.worker, exc)
            return
        self._completed(manifest)

    def _completed(self, manifest: manifests.Manifest | None) -> None:
        ckpt = self.checkpoints
        if manifest is not None and ckpt is not None and ckpt.due(manifest.step):
            self.poll_checkpoint(wait=True)
            members = tuple(self.config.plan.workers)
            since = self.config.resume_step
            if ckpt.begin(
                self.store, manifest.step, members, since=since, keep_from=self.checkpoint_step
            ):
                self._checkpoint_pending = manifest.step

    def poll_checkpoint(self, *, wait: bool = False) -> None:
        """Record a finished background checkpoint (wait for it when `wait`)."""
        ckpt, pending = self.checkpoints, self._checkpoint_pending
        if ckpt is None or pending is None:
            return
        try:
            ckpt.wait(None if wait else 0.0)
        except snapshot_store.SnapshotTimeout:
            return
        except snapshot_store.SnapshotError as exc:
            LOG.warning("worker %d: checkpoint of step %d failed: %s", self.worker, pending, exc)
        else:  # the newest step a resume can load, which may trail this worker's own part
            if ckpt.complete_step is not None:  # else the epoch has none yet: keep the last
                self.checkpoint_step = ckpt.complete_step
        self._checkpoint_pending = None

    def close(self) -> None:
        """Complete the pending snapshot and checkpoint, then close both writers."""
        self.finish_snapshot()
        self.poll_checkpoint(wait=True)
        for closing in (self.writer, self.checkpoints):
            if closing is not None:
                closing.close()


def live_states(layers: held_layers.HeldLayers) -> list[model.LayerState]:
    """Every held layer's state, by reference to the live tensors (no copy)."""
    return [
        snapshots.live_layer_state(i, layers.modules[i], layers.optimizers[i])
        for i in layers.indices
    ]
