"""Snapshot mirrors over the epoch's host group: at every snapshot, each member's files go to
its mirror on another node (`planaria.contract.snapshot_placement`; docs/resilience.md, "Mirrors").

`Link.swap` runs on the snapshot writer's background thread, off the training's critical path,
on every worker of the epoch for the same snapshots (the commit barrier makes every worker
begin or skip a snapshot alike). Per member this worker holds and whose mirror exists, it sends
to the mirror, point to point on the epoch's host group:

    tag + 0   the header's length (one int64)
    tag + 1   the header: a one-layer manifest (the member's entry, with its files' checksums,
              and the job, worker, epoch, step, redundancy), checked JSON as on disk
    tag + 2 + i   file i of the entry, as written

with tag = 2^22 + 8 x layer (each layer travels once between a holder and its mirror per
snapshot; the layer copies use 2^20 + layer, the restore's pieces 2^21 + 4 x layer + i, the
executor its schedule's small tags; point-to-point gloo work needs no worker thread, so these
run beside the training thread's sends and collectives). Every send is posted first, then the
receives (lengths, headers, then files, each stage posted at once), then the sends are awaited:
no order between two workers that mirror each other can deadlock.

Checked on arrival: the header must be the expected sender's entry of the expected layer,
member, step and epoch, and each file must match its checksum (`snapshot_store.verify`); a
member that fails either is left out (logged), so the mirror does not hold it at that step.

The bytes travel on the epoch's host group (`groups.Epoch.host`): a gloo epoch's world group,
or the gloo side group an NCCL epoch forms beside its world (whose NCCL communicators move
device tensors only); it is formed and released with the epoch's groups (`groups.form_epoch`,
`Epoch.release`), so the same release that ends the step's waits ends the swap's.

Errors: MirrorError (`planaria.agent.state.mirroring`) when a transfer fails or stalls past the
epoch's timeout (a peer died; the release of a failed epoch ends the waits at once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from planaria.agent.execution import groups
from planaria.agent.state import manifests, mirroring, snapshot_store
from planaria.contract import configure_rules, snapshot_placement
from planaria.contract import plan as plans
from planaria.wire import messages

LOG = logging.getLogger(__name__)
MIRROR_TAG_BASE = 1 << 22
TAGS_PER_LAYER = 8  # length, header, and up to 6 files (a shard and one redundancy today)
MAX_HEADER_BYTES = 1 << 24  # a one-layer manifest is kilobytes; more is a damaged length


class Link:
    """Worker `worker`'s mirrors in `epoch` of `plan` (a `mirroring.Mirroring`)."""

    def __init__(
        self,
        *,
        epoch: groups.Epoch,
        plan: plans.Plan,
        worker: plans.WorkerId,
        job: str,
        redundancy: messages.RedundancyMode,
    ) -> None:
        self._epoch, self._worker, self._job, self._redundancy = epoch, worker, job, redundancy
        self._host = epoch.host  # ranks in it are the world's
        self._ranks = configure_rules.ranks(plan.workers)
        self._groups = snapshot_placement.sharding_groups(plan)
        self._mirrors = snapshot_placement.mirrors(plan)
        self._kept = snapshot_placement.mirrored_by(plan, worker)
        self._in_flight: list[Any] = []  # tensors of sends a failed swap left posted

    def swap(
        self, *, step: int, epoch: int, mine: Sequence[mirroring.MemberFiles]
    ) -> list[mirroring.MemberFiles]:
        """Send `mine` to their mirrors, receive what this worker mirrors (module docstring)."""
        self._in_flight.clear()
        sends = []
        for files in mine:
            mirror = self._mirrors[files.entry.layer][files.entry.member]
            if mirror is not None:
                sends += self._send(files, mirror, step, epoch)
        arrived = self._receive(step, epoch)
        for work, peer, _ in sends:
            self._wait(work, peer)
        self._in_flight.clear()
        return arrived

    def _send(
        self, files: mirroring.MemberFiles, mirror: plans.WorkerId, step: int, epoch: int
    ) -> list[tuple[Any, plans.WorkerId, torch.Tensor]]:
        header = manifests.encode(
            manifests.Manifest(
                job=self._job,
                worker=self._worker,
                epoch=epoch,
                step=step,
                redundancy=self._redundancy,
                layers=(files.entry,),
            )
        )
        payloads = [
            torch.tensor([len(header)], dtype=torch.int64),
            torch.from_numpy(np.frombuffer(header, dtype=np.uint8).copy()),
        ]
        payloads += [torch.from_numpy(_joined(chunks)) for chunks in files.chunks]
        tag = _tag(files.entry.layer)
        posted = []
        for i, payload in enumerate(payloads):
            if payload.numel() == 0:
                continue
            work = self._post(dist.isend, payload, mirror, tag + i)
            self._in_flight.append(payload)
            posted.append((work, mirror, payload))
        return posted

    def _receive(self, step: int, epoch: int) -> list[mirroring.MemberFiles]:
        """Every member this worker mirrors, from its holder: lengths, headers, then files."""
        kept = sorted(self._kept.items())
        sources = [self._groups[layer][member] for layer, member in kept]
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in kept]
        self._await(lengths, sources, [_tag(layer) for layer, _ in kept])
        for n, source in zip(lengths, sources, strict=True):
            if not 0 < int(n.item()) <= MAX_HEADER_BYTES:
                raise mirroring.MirrorError(f"worker {source} announced a header of {n.item()} B")
        headers = [torch.empty(int(n.item()), dtype=torch.uint8) for n in lengths]
        self._await(headers, sources, [_tag(layer) + 1 for layer, _ in kept])
        entries = [
            self._entry(bytes(h.numpy()), source, layer, member, step, epoch)
            for h, source, (layer, member) in zip(headers, sources, kept, strict=True)
        ]
        buffers, peers, tags = [], [], []
        for entry, source in zip(entries, sources, strict=True):
            for i, stored in enumerate(entry.files):
                if stored.stop > stored.start:
                    buffers.append(torch.empty(stored.stop - stored.start, dtype=torch.uint8))
                    peers.append(source)
                    tags.append(_tag(entry.layer) + 2 + i)
        self._await(buffers, peers, tags)
        landed = iter(buffers)
        arrived = []
        for entry, source in zip(entries, sources, strict=True):
            data = [
                next(landed).numpy() if f.stop > f.start else np.empty(0, np.uint8)
                for f in entry.files
            ]
            member = _verified(entry, data, source, step)
            if member is not None:
                arrived.append(member)
        return arrived

    def _entry(
        self, raw: bytes, source: plans.WorkerId, layer: int, member: int, step: int, epoch: int
    ) -> manifests.LayerEntry:
        """The entry a header names; MirrorError unless it is the one expected of `source`
        (the files that follow could not be sized, so the whole swap fails)."""
        try:
            manifest = manifests.decode(raw)
        except manifests.ManifestError as exc:
            raise mirroring.MirrorError(f"worker {source}'s mirror header: {exc}") from exc
        expected = (self._job, source, step, epoch, (layer,))
        got = (manifest.job, manifest.worker, manifest.step, manifest.epoch)
        got_layers = tuple(e.layer for e in manifest.layers)
        if (*got, got_layers) != expected or manifest.layers[0].member != member:
            raise mirroring.MirrorError(
                f"worker {source} sent a mirror header of {got} layers {got_layers}, expected "
                f"{expected} member {member}"
            )
        if manifest.redundancy is not self._redundancy:
            raise mirroring.MirrorError(f"worker {source} snapshots with another redundancy")
        return manifest.layers[0]

    def _await(
        self, buffers: Sequence[torch.Tensor], peers: Sequence[plans.WorkerId], tags: Sequence[int]
    ) -> None:
        posted = [
            (self._post(dist.irecv, b, p, t), p)
            for b, p, t in zip(buffers, peers, tags, strict=True)
            if b.numel() > 0
        ]
        for work, peer in posted:
            self._wait(work, peer)

    def _post(self, post: Any, tensor: torch.Tensor, peer: plans.WorkerId, tag: int) -> Any:
        try:
            work = post(tensor, self._ranks[peer], group=self._host, tag=tag)
        except RuntimeError as exc:
            raise mirroring.MirrorError(f"posting to worker {peer}: {_first_line(exc)}") from exc
        assert work is not None, "every worker of the plan is in the epoch's host group"
        return work

    def _wait(self, work: Any, peer: plans.WorkerId) -> None:
        try:
            work.wait(self._epoch.timeout)
        except RuntimeError as exc:
            raise mirroring.MirrorError(
                f"mirror transfer with worker {peer} in epoch {self._epoch.number} failed: "
                f"{_first_line(exc)}"
            ) from exc


def link_for(
    epoch: groups.Epoch,
    plan: plans.Plan,
    worker: plans.WorkerId,
    job: str,
    redundancy: messages.RedundancyMode,
) -> Link | None:
    """The mirrors' link of this epoch, or None where there are none: no redundancy (a job
    that chose NONE asked for no copies) or one worker. Any backend: the link sends on the
    epoch's host group (module docstring)."""
    if redundancy is messages.RedundancyMode.NONE or epoch.world_size < 2:
        return None
    return Link(epoch=epoch, plan=plan, worker=worker, job=job, redundancy=redundancy)


def _verified(
    entry: manifests.LayerEntry,
    data: Sequence[np.ndarray[Any, Any]],
    source: plans.WorkerId,
    step: int,
) -> mirroring.MemberFiles | None:
    where = f"worker {source}'s layer {entry.layer} of step {step}"
    try:
        checked = [
            snapshot_store.verify(d, f, f"{where}: {f.file}")
            for d, f in zip(data, entry.files, strict=True)
        ]
    except snapshot_store.SnapshotError as exc:
        LOG.warning("a mirrored member is rejected: %s", exc)
        return None
    return mirroring.MemberFiles(entry=entry, chunks=tuple((d,) for d in checked))


def _tag(layer: int) -> int:
    return MIRROR_TAG_BASE + TAGS_PER_LAYER * layer


def _joined(chunks: Sequence[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """One file's bytes in one new buffer (the chunks are views of buffers the next snapshot
    reuses)."""
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.uint8)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
