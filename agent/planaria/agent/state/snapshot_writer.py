"""The asynchronous snapshot writer: stages live layer state, then writes it in the background.

THE CONTRACT WITH THE EXECUTOR (REFT §4.1: the snapshot overlaps training):

    ... forward/backward/all-reduce of step t ...
    [RECOMPUTE only] writer.recompute_step(t, layers and their gradients)   before the update
    OptimizerStep of step t
    writer.begin(step=t, ...)        right after: parameters and optimizer state are now stable
    ... forward/backward/all-reduce of step t+1 run while the snapshot is staged and written ...
    writer.release(timeout_s)        before the next update (and its recompute_step) changes them
    OptimizerStep of step t+1
    ... the checksums and writes of snapshot t may still run here, from the staging buffers ...
    writer.poll() / writer.wait()    its manifest once it is complete

`begin` takes the live tensors by reference (`snapshots.live_layer_state`) and launches their
copy into preallocated staging buffers (`staging`: a plain copy on a CPU, pinned buffers and a
side stream on a GPU). A background thread completes the copy (and, RECOMPUTE, takes the
replica's moments), which is all that reads the live state: `release` waits for exactly that.
The same thread then computes the redundancy and the checksums from the staging buffers,
writes the files and commits the manifest (`snapshot_store`); only then is the snapshot
complete: `poll`/`wait` return its manifest and the store reports its step, never before.

One snapshot at a time: while one is being written, `busy` is true and `begin` refuses; the
caller skips the step instead of blocking training (`epoch_writers` stretches the interval and
reports the achieved one). `begin` does nothing on steps that are not a multiple of
`interval_steps`; steps count committed optimizer steps from 1 (after the reference trainer's
`step(i)` it is i + 1).

Errors: SnapshotTimeout from `release`/`wait` when not done in time (the work goes on; wait
again), SnapshotWriteError when the background work failed, SnapshotConfigError for bad
settings or a begin that breaks the contract.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from planaria.agent.state import (
    manifests,
    mirroring,
    parity,
    recompute,
    snapshot_store,
    snapshots,
    staging,
)
from planaria.agent.training import model
from planaria.contract import plan as plans
from planaria.wire import messages

LOG = logging.getLogger(__name__)
Groups = Mapping[int, tuple[plans.WorkerId, ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterConfig:
    """Who writes and how: job and worker (recorded in manifests), redundancy, interval, and
    the optimizer's betas (RECOMPUTE replays AdamW's moment updates with them)."""

    job: str
    worker: plans.WorkerId
    redundancy: messages.RedundancyMode = messages.RedundancyMode.XOR
    interval_steps: int = 1
    optimizer: model.OptimizerConfig = field(default_factory=model.OptimizerConfig)
    # Threads that checksum and write a snapshot's layer files side by side. One by default:
    # on an H200 host (16 cores) 4 threads wrote gpt3-medium's 4.6 GB 2.6x faster (0.7 s vs
    # 1.8 s) but slowed bf16 steps, which are bound by the CPU launching kernels, by +20% (every
    # 5 steps) and +41% (every step) against +3% and +8% with one (docs/benchmarks.md).
    file_threads: int = 1

    def __post_init__(self) -> None:
        snapshot_store.check_name("job", self.job)
        if self.interval_steps < 1:
            raise snapshot_store.SnapshotConfigError(
                f"snapshot interval_steps is {self.interval_steps}; give a whole number >= 1"
            )
        if self.file_threads < 1:
            raise snapshot_store.SnapshotConfigError(
                f"snapshot file_threads is {self.file_threads}; give a whole number >= 1"
            )


class SnapshotWriter:
    """Writes a worker's snapshots into `store` on one background thread, staging them with
    `copier` (default: the CPU's)."""

    def __init__(
        self,
        store: snapshot_store.SnapshotStore,
        config: WriterConfig,
        copier: staging.Copier | None = None,
        mirrors: mirroring.Mirroring | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self._mirrors = mirrors
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshot")
        threads = config.file_threads
        self._files = (  # None: the snapshot thread writes every file itself
            concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="snapshot-file")
            if threads > 1
            else None
        )
        self._future: concurrent.futures.Future[manifests.Manifest] | None = None
        self._ticket: staging.Ticket | None = None
        self._released = threading.Event()
        self._released.set()
        self._parity_buffers: dict[int, parity.Bytes] = {}
        self._staging = staging.Staging(copier)
        self._reserving: concurrent.futures.Future[None] | None = None
        self._replicas: dict[int, recompute.OptimizerReplica] = {}

    def reserve(self, states: Sequence[model.LayerState], groups: Groups) -> None:
        """Allocate on the writer's thread the staging buffers a `begin` of `states` will take,
        so that the first snapshot of an epoch does not allocate them on the training thread
        (pinned memory on a GPU host: 4.3 s for gpt3-medium's 4.6 GB on an H200 host, all of it
        a training stall at the first snapshot). Buffers the copier already holds (handed back
        by the previous epoch's writer) are kept, not allocated again; a `begin` while this
        still runs waits for it (no longer than allocating itself)."""
        sizes = []
        for state in states:
            group = groups.get(state.index, ())
            if self.config.worker in group:
                wanted = self._wanted(state.nbytes, group.index(self.config.worker), len(group))
                sizes.append(staging.staged_bytes(wanted))
        self._reserving = self._pool.submit(self._reserve, sizes)

    def _reserve(self, sizes: Sequence[int]) -> None:
        copier = self._staging.copier
        taken = [copier.buffer(n) for n in sizes]  # all at once: equal sizes need one each
        for buffer in taken:
            copier.recycle(buffer)

    def due(self, step: int) -> bool:
        """Whether `begin(step)` takes a snapshot."""
        return step >= 1 and step % self.config.interval_steps == 0

    @property
    def in_progress(self) -> bool:
        return self._future is not None and not self._future.done()

    @property
    def busy(self) -> bool:
        """Whether a snapshot is begun and not yet collected by `poll` or `wait`."""
        return self._future is not None

    def begin(
        self,
        *,
        step: int,
        epoch: int,
        states: Sequence[model.LayerState],
        groups: Groups,
        mirror: bool = True,
    ) -> bool:
        """Launch the copy of `step`'s state and its write in the background; False when the
        step is not due.

        `states` are this worker's layers (live references, see the module docstring) and
        `groups` every layer's sharding group (`snapshots.sharding_groups`). With `mirror` (and
        a `Mirroring`), the written files are also swapped with the mirrors before the
        manifest is committed: every worker of the epoch must take this snapshot with `mirror`
        alike, at the same step (the commit barrier's decision). A TakeSnapshot does not mirror:
        each worker takes it at its own next step boundary, in any state, so a holder and its
        mirror would swap different steps, or one would wait alone until the epoch's timeout
        (docs/resilience.md, "TakeSnapshot and the mirrors"). Refused (SnapshotConfigError)
        while the previous snapshot is `busy`.
        """
        if self._future is not None:
            raise snapshot_store.SnapshotConfigError(
                "a snapshot is still pending; poll() or wait() before begin() (see the contract)"
            )
        if not self.due(step):
            return False
        reserving, self._reserving = self._reserving, None
        if reserving is not None:
            reserving.result()  # its buffers are in the copier's pool now
        jobs = [self._layer_job(state, groups, step) for state in states]
        self._staging.copier.trim()  # buffers of a layout no layer has any more
        self._ticket = ticket = self._staging.copier.launch([job.prepared.copy for job in jobs])
        self._released = released = threading.Event()
        mirrors = self._mirrors if mirror else None
        self._future = self._pool.submit(self._write, step, epoch, jobs, ticket, released, mirrors)
        return True

    def release(self, timeout_s: float | None = None) -> None:
        """Return once nothing of the pending snapshot reads the live tensors (or the RECOMPUTE
        replicas) any more: the next optimizer step may change them. SnapshotTimeout after
        `timeout_s` (the copy goes on)."""
        ticket = self._ticket
        if ticket is None:
            return
        ticket.release()
        recomputing = self.config.redundancy is messages.RedundancyMode.RECOMPUTE
        if (ticket.host_waits or recomputing) and not self._released.wait(timeout_s):
            raise snapshot_store.SnapshotTimeout(f"snapshot not staged after {timeout_s} s")
        self._ticket = None

    def poll(self) -> manifests.Manifest | None:
        """The pending snapshot's manifest once it is complete (collecting it), else None.
        SnapshotWriteError when it failed."""
        future = self._future
        if future is None or not future.done():
            return None
        return self.wait()

    def wait(self, timeout_s: float | None = None) -> manifests.Manifest | None:
        """Block until the pending snapshot is complete; its manifest, or None if none was
        pending. SnapshotTimeout after `timeout_s` (the write goes on), SnapshotWriteError
        when it failed."""
        future = self._future
        if future is None:
            return None
        try:
            manifest = future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError as exc:
            raise snapshot_store.SnapshotTimeout(
                f"snapshot not complete after {timeout_s} s"
            ) from exc
        except Exception as exc:  # a background-thread failure, re-raised to the caller
            self._future = self._ticket = None
            raise snapshot_store.SnapshotWriteError(f"writing the snapshot failed: {exc}") from exc
        self._future = self._ticket = None
        return manifest

    def state(self) -> messages.SnapshotState:
        """What the heartbeat reports."""
        return self.store.state(in_progress=self.in_progress)

    def close(self) -> None:
        """Finish the pending snapshot (if any), stop the threads and give the staging buffers
        back to the copier (a copier kept across epochs hands them to the next writer)."""
        self._pool.shutdown(wait=True)
        if self._files is not None:
            self._files.shutdown(wait=True)
        self._staging.close()

    # -- RECOMPUTE (AOR)

    def recompute_step(
        self,
        step: int,
        states: Sequence[model.LayerState],
        gradients: Sequence[Sequence[torch.Tensor | None]],
        groups: Groups,
    ) -> None:
        """Replay step `step`'s moment update on the host replicas (REFT AOR, eq. 4).

        Call every step, before OptimizerStep, with the live pre-update states and each
        parameter's gradient (after the all-reduce). A replica is (re)started from the state
        when it is new or the layer's group changed.
        """
        if self.config.redundancy is not messages.RedundancyMode.RECOMPUTE:
            return
        for state, grads in zip(states, gradients, strict=True):
            group = groups[state.index]
            if len(group) < 2:  # no peer whose shard to protect
                continue
            replica = self._replicas.get(state.index)
            if replica is None or replica.group != group:
                replica = self._new_replica(state, group, step - 1)
            replica.update(step, grads)

    def _new_replica(
        self, state: model.LayerState, group: tuple[plans.WorkerId, ...], step: int
    ) -> recompute.OptimizerReplica:
        member = group.index(self.config.worker)
        peer = (member + 1) % len(group)
        layout = snapshots.tensor_layout(state)
        total = layout[-1].offset + layout[-1].nbytes if layout else 0
        span = parity.shard_range(total, len(group), peer)
        replica = recompute.OptimizerReplica(
            state=state,
            layout=layout,
            span=span,
            group=group,
            step=step,
            config=self.config.optimizer,
        )
        self._replicas[state.index] = replica
        return replica

    # -- the background work

    def _layer_job(self, state: model.LayerState, groups: Groups, step: int) -> _LayerJob:
        group = groups.get(state.index, ())
        if self.config.worker not in group:
            raise snapshot_store.SnapshotConfigError(
                f"layer {state.index}: worker {self.config.worker} is not in its sharding group "
                f"{group}; pass the groups of the current plan"
            )
        replica = None
        recomputing = self.config.redundancy is messages.RedundancyMode.RECOMPUTE
        if recomputing and len(group) > 1:
            replica = self._replicas.get(state.index)
            if replica is None or replica.group != group or replica.step != step:
                raise snapshot_store.SnapshotConfigError(
                    f"layer {state.index}: the recompute replica is not at step {step}; call "
                    "recompute_step before every optimizer step"
                )
        member = group.index(self.config.worker)
        wanted = self._wanted(state.nbytes, member, len(group))
        prepared = self._staging.prepare(state, wanted)
        return _LayerJob(index=state.index, group=group, replica=replica, prepared=prepared)

    def _write(
        self,
        step: int,
        epoch: int,
        jobs: Sequence[_LayerJob],
        ticket: staging.Ticket,
        released: threading.Event,
        mirrors: mirroring.Mirroring | None,
    ) -> manifests.Manifest:
        try:  # the only part that reads the live state (and the replicas)
            ticket.complete()
            staged = [self._staged(job) for job in jobs]
        finally:
            released.set()
        directory = self.store.begin(step)
        pairs = list(zip(jobs, staged, strict=True))

        def write(pair: tuple[_LayerJob, tuple[parity.FlatBytes, parity.FlatBytes]]) -> Files:
            job, (data, copy) = pair
            return self._write_layer(directory, job, data, copy)

        files = self._files
        # Layers' files are independent (each its own files and parity buffer): side by side.
        written = list(map(write, pairs) if files is None else files.map(write, pairs))
        entries = tuple(files.entry for files in written)
        if mirrors is not None:
            entries += self._store_mirrored(directory, mirrors, step, epoch, written)
        self._staging.keep_only({job.index for job in jobs})
        mode = self.config.redundancy
        unprotected = [e.layer for e in entries if e.tolerated_losses == 0]
        note = "" if not unprotected else f"layers {unprotected} survive no lost member"
        manifest = manifests.Manifest(
            job=self.config.job,
            worker=self.config.worker,
            epoch=epoch,
            step=step,
            redundancy=mode,
            layers=entries,
            note=note,
        )
        self.store.commit(directory, manifest)
        return manifest

    def _store_mirrored(
        self,
        directory: Path,
        mirrors: mirroring.Mirroring,
        step: int,
        epoch: int,
        written: Sequence[mirroring.MemberFiles],
    ) -> tuple[manifests.LayerEntry, ...]:
        """Swap this snapshot's files with the mirrors and write the members this worker
        mirrors into the same snapshot, byte for byte. A failed swap (MirrorError: a peer
        died) fails the snapshot, so that every snapshot a store reports complete holds its
        mirrors (the controller resumes from what the survivors report); a member damaged in
        transit is only left out (the transport logs it), which its group's redundancy covers."""
        arrived = mirrors.swap(step=step, epoch=epoch, mine=written)
        for member in arrived:
            for stored, chunks in zip(member.entry.files, member.chunks, strict=True):
                checksum = self.store.write_file(directory, stored.file, chunks)
                if checksum != stored.checksum:  # verified on arrival: a store of another
                    raise snapshot_store.SnapshotWriteError(  # checksum algorithm
                        f"mirrored {stored.file} stored as {checksum}, sent as {stored.checksum}"
                    )
        return tuple(member.entry for member in arrived)

    def _staged(self, job: _LayerJob) -> tuple[parity.FlatBytes, parity.FlatBytes]:
        """The layer's staged bytes, and the bytes its COPY file is written from: the same,
        except under RECOMPUTE, where the peer's shard takes the replica's moments (copied now,
        before the next step's recompute_step updates them)."""
        data = job.prepared.staged
        if job.replica is None:
            return data, data
        m = len(job.group)
        span = parity.shard_range(data.nbytes, m, (job.group.index(self.config.worker) + 1) % m)
        copy = job.replica.overlay(data).copy(span.start, span.stop)
        gap = staging.zeros(span.start), copy, staging.zeros(data.nbytes - span.stop)
        return data, parity.FlatBytes(gap)

    def _write_layer(
        self, directory: Path, job: _LayerJob, data: parity.FlatBytes, copy: parity.FlatBytes
    ) -> mirroring.MemberFiles:
        """Write this member's files of the layer; its entry and the files' bytes."""
        group = job.group
        member, m = group.index(self.config.worker), len(group)
        files = [self._write_range(directory, job, data, member, manifests.FileKind.SHARD)]
        tolerated = snapshots.tolerated_losses(self.config.redundancy, m)
        if tolerated:
            files.append(self._write_redundancy(directory, job, data, copy, member))
        entry = manifests.LayerEntry(
            layer=job.index,
            names=job.prepared.names,
            group=tuple(int(w) for w in group),
            member=member,
            total_bytes=data.nbytes,
            tensors=job.prepared.layout,
            files=tuple(f for f, _ in files),
            tolerated_losses=tolerated,
        )
        return mirroring.MemberFiles(entry=entry, chunks=tuple(c for _, c in files))

    def _wanted(self, total_bytes: int, member: int, m: int) -> list[range]:
        """The bytes of the flattened state this member writes: its shard, and the peer's
        shard (COPY, RECOMPUTE) or the pieces of its parity (XOR)."""
        wanted = [parity.shard_range(total_bytes, m, member)]
        if not snapshots.tolerated_losses(self.config.redundancy, m):
            return wanted
        if self.config.redundancy is messages.RedundancyMode.XOR:
            sources = parity.parity_sources(member, m)
            return wanted + [parity.piece_range(total_bytes, m, i, j) for i, j in sources]
        return [*wanted, parity.shard_range(total_bytes, m, (member + 1) % m)]

    def _write_redundancy(
        self,
        directory: Path,
        job: _LayerJob,
        data: parity.FlatBytes,
        copy: parity.FlatBytes,
        member: int,
    ) -> Written:
        m = len(job.group)
        if self.config.redundancy is messages.RedundancyMode.XOR:
            return self._write_parity(directory, job.index, data, member, m)
        return self._write_range(directory, job, copy, (member + 1) % m, manifests.FileKind.COPY)

    def _write_range(
        self,
        directory: Path,
        job: _LayerJob,
        data: parity.FlatBytes,
        owner: int,
        kind: manifests.FileKind,
    ) -> Written:
        """Write member `owner`'s shard of `data` (as this member's SHARD or as a COPY)."""
        span = parity.shard_range(data.nbytes, len(job.group), owner)
        name = f"layer-{job.index}.{kind.value}"
        chunks = tuple(data.views(span.start, span.stop))
        checksum = self.store.write_file(directory, name, chunks)
        stored = manifests.StoredFile(
            kind=kind, file=name, member=owner, start=span.start, stop=span.stop, checksum=checksum
        )
        return stored, chunks

    def _write_parity(
        self, directory: Path, layer: int, data: parity.FlatBytes, member: int, m: int
    ) -> Written:
        size = parity.piece_bytes(data.nbytes, m)
        buffer = self._parity_buffers.get(layer)
        if buffer is None or buffer.size != size:
            buffer = self._parity_buffers[layer] = np.empty(size, dtype=np.uint8)
        parity.encode_parity(member, m, data, buffer)
        name = f"layer-{layer}.parity"
        checksum = self.store.write_file(directory, name, [buffer])
        stored = manifests.StoredFile(
            kind=manifests.FileKind.PARITY,
            file=name,
            member=member,
            start=0,
            stop=size,
            checksum=checksum,
        )
        return stored, (buffer,)


# A file written: its manifest record and its bytes (views of the staging or parity buffers,
# valid until the next snapshot begins).
Written = tuple[manifests.StoredFile, tuple[parity.Bytes, ...]]
Files = mirroring.MemberFiles  # one layer's files of this member


@dataclass(frozen=True, slots=True, kw_only=True)
class _LayerJob:
    """One layer to snapshot: its index, its group, for RECOMPUTE its replica, and its staging
    (the copy plan from the live tensors and the staged bytes)."""

    index: int
    group: tuple[plans.WorkerId, ...]
    replica: recompute.OptimizerReplica | None
    prepared: staging.Prepared
