"""Peer snapshot transfer: snapshot pieces fetched from the surviving holders over the epoch's
host group, so the snapshot tier protects across nodes (REFT §4.2-4.3; docs/resilience.md,
"Peer snapshots over the network").

The pieces are host-memory bytes (uint8 CPU tensors), so every message of the round travels on
`groups.Epoch.host`: a gloo epoch's world group, or the gloo side group an NCCL epoch forms
beside its world (NCCL moves device tensors only). A release of the epoch ends its waits.

One round per epoch set-up that resumes at a step s > 0 with more than one worker, on every rank
(a collective: every rank calls `exchange`, whether it wants anything or not):

1. `gather`: every rank publishes its offer, the manifest of its own complete snapshot of step
   s (or none), and what it wants, the layers that KEPT and its own store cannot serve. Two
   all_gathers of uint8 tensors on the host group (lengths, then the padded JSON): nothing is
   pickled, and a peer's manifest is decoded and checked exactly like one read from disk.
   Every rank decodes the same bytes with the same rules, so every rank sees the same offers.
2. `plan_pieces`: the same deterministic list on every rank: for every rank d that wants layer
   L, each member of L's group that d does not hold comes from one other rank whose manifest
   has it (the member's holder, else its mirror on another node), which sends each file of
   that entry (its shard, and its copy or parity) to d. The Configure names the step and the
   members (the plan's ranks); the members' manifests name the pieces, so no piece is asked
   of a member that does not hold it.
3. Sends read the files as stored, unverified (`OpenSnapshot.read_unverified`); receives land
   in buffers of the manifest's lengths. Every piece is verified on arrival against the
   checksum in its sender's manifest (`snapshot_store.verify`); a member with a damaged piece
   counts as lost, so the group's redundancy covers it, or the layer falls to the next tier.

Not here: rebuilding a layer from members (`snapshots.rebuild_layer`), which tier is tried when
(`epoch_setup`).

Errors: ExchangeError when a peer dies or stalls during the round (the set-up fails with
PEER_LOST, as a layer copy does). A peer's unusable offer is no error: it is logged and serves
nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from planaria.agent.execution import groups
from planaria.agent.state import manifests, parity, snapshot_store, snapshots
from planaria.contract import plan

LOG = logging.getLogger(__name__)
PIECE_TAG_BASE = 1 << 21  # above layer_transfer's 2^20 + layer
MAX_FILES = 4  # files per layer entry a tag has room for (a shard and one redundancy today)


class ExchangeError(Exception):
    """A peer failed during the exchange; `peer` is it when known."""

    def __init__(self, message: str, *, peer: plan.WorkerId | None) -> None:
        super().__init__(message)
        self.peer = peer


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """What one rank published: its worker, the layers it wants, its manifest of the step."""

    worker: plan.WorkerId
    wanted: tuple[int, ...]
    manifest: manifests.Manifest | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """File `file` (the `index`-th of layer `layer`'s entry) from rank `source` to `destination`."""

    source: int
    destination: int
    layer: int
    index: int
    file: manifests.StoredFile

    @property
    def tag(self) -> int:
        return PIECE_TAG_BASE + self.layer * MAX_FILES + self.index

    @property
    def nbytes(self) -> int:
        return self.file.stop - self.file.start


@dataclass(slots=True, kw_only=True)
class Received:
    """The round's outcome on one rank: verified member snapshots by layer, what went wrong
    by layer, and the bytes and seconds it took."""

    members: dict[int, list[snapshots.MemberSnapshot]] = field(default_factory=dict)
    problems: dict[int, list[str]] = field(default_factory=dict)
    received_bytes: int = 0
    sent_bytes: int = 0
    seconds: float = 0.0


# --- the offers -----------------------------------------------------------------------------


def encode_offer(wanted: Sequence[int], own: snapshot_store.SnapshotStore, step: int) -> bytes:
    """This rank's offer as JSON bytes: the wanted layers and its manifest of `step`, if any."""
    try:
        manifest: str | None = manifests.encode(own.manifest(step)).decode()
    except snapshot_store.SnapshotError:
        manifest = None
    return json.dumps({"wanted": sorted(set(wanted)), "manifest": manifest}).encode()


def decode_offer(raw: bytes, worker: plan.WorkerId, step: int) -> Offer:
    """Rank `worker`'s offer; a malformed one, or a manifest of another worker or step, wants
    nothing and offers nothing (logged). Deterministic: every rank decodes it alike."""
    try:
        body = json.loads(raw)
        wanted = _layers(body["wanted"])
        manifest = _manifest(body["manifest"], worker, step)
    except (ValueError, KeyError, TypeError, manifests.ManifestError) as exc:
        LOG.warning("worker %d's snapshot offer is unusable: %s", worker, exc)
        return Offer(worker=worker, wanted=(), manifest=None)
    return Offer(worker=worker, wanted=wanted, manifest=manifest)


def _layers(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise ValueError(f"wanted layers must be a list of counts, got {value!r}")
    return tuple(sorted(set(value)))


def _manifest(text: Any, worker: plan.WorkerId, step: int) -> manifests.Manifest | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError("the manifest must be JSON text")
    manifest = manifests.decode(text.encode())
    if (manifest.worker, manifest.step) != (worker, step):
        raise ValueError(
            f"its manifest is worker {manifest.worker}'s of step {manifest.step}, "
            f"not worker {worker}'s of step {step}"
        )
    if any(len(entry.files) > MAX_FILES for entry in manifest.layers):
        raise ValueError(f"a layer entry has more than {MAX_FILES} files")
    return manifest


def gather(epoch: groups.Epoch, mine: bytes) -> list[bytes]:
    """Every rank's offer bytes, by rank (two all_gathers on the epoch's host group)."""
    host, n = epoch.host, epoch.world_size
    try:
        length = torch.tensor([len(mine)], dtype=torch.int64)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
        dist.all_gather(lengths, length, group=host)
        longest = max(int(t.item()) for t in lengths)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        everyone = [torch.empty(longest, dtype=torch.uint8) for _ in range(n)]
        dist.all_gather(everyone, padded, group=host)
    except RuntimeError as exc:
        raise ExchangeError(
            f"gathering the snapshot offers of epoch {epoch.number} failed: {_first_line(exc)}",
            peer=None,
        ) from exc
    return [bytes(t[: int(k.item())].numpy()) for t, k in zip(everyone, lengths, strict=True)]


# --- the pieces -----------------------------------------------------------------------------


def plan_pieces(offers: Sequence[Offer]) -> tuple[Piece, ...]:
    """Every piece of the round, by rank (offers[r] is rank r's): for each rank that wants
    layer L, each member of L's group that it does not hold itself comes from one other rank
    whose manifest has it: the member's holder when it offers it, else its mirror (the two
    store the same files, `planaria.agent.state.mirroring`), and every file of that entry is
    sent. Zero-length files are left out (nothing to send). The same list on every rank, in
    the same order."""
    pieces = []
    for destination, wanting in enumerate(offers):
        for layer in wanting.wanted:
            for source, entry in _sources(offers, destination, layer):
                for index, stored in enumerate(entry.files):
                    piece = Piece(
                        source=source,
                        destination=destination,
                        layer=layer,
                        index=index,
                        file=stored,
                    )
                    if piece.nbytes > 0:
                        pieces.append(piece)
    return tuple(pieces)


def _sources(
    offers: Sequence[Offer], destination: int, layer: int
) -> list[tuple[int, manifests.LayerEntry]]:
    """(rank, entry) serving each member of `layer` that `destination` lacks, by member."""
    own = _entry(offers[destination], layer)
    chosen: dict[int, tuple[int, manifests.LayerEntry]] = {}
    for source, offer in enumerate(offers):
        entry = _entry(offer, layer)
        if source == destination or entry is None or (own and own.member == entry.member):
            continue
        holder = entry.group[entry.member] == offer.worker
        if entry.member not in chosen or holder:
            chosen.setdefault(entry.member, (source, entry))
            if holder:
                chosen[entry.member] = (source, entry)
    return [chosen[k] for k in sorted(chosen)]


def _entry(offer: Offer, layer: int) -> manifests.LayerEntry | None:
    if offer.manifest is None:
        return None
    return next((e for e in offer.manifest.layers if e.layer == layer), None)


def exchange(
    *,
    epoch: groups.Epoch,
    step: int,
    wanted: Sequence[int],
    own: snapshot_store.SnapshotStore,
    workers: Sequence[plan.WorkerId],
) -> Received:
    """Run the round on this rank (module docstring); `workers[r]` is rank r's worker.
    ExchangeError when a peer fails; damaged pieces are in `problems`, not raised."""
    started = time.perf_counter()
    raw = gather(epoch, encode_offer(wanted, own, step))
    offers = [decode_offer(b, workers[r], step) for r, b in enumerate(raw)]
    pieces = plan_pieces(offers)
    me = epoch.rank
    result = Received()
    sending = [p for p in pieces if p.source == me]
    receiving = [p for p in pieces if p.destination == me]
    outgoing = _read_pieces(own, step, sending)
    buffers = {p: torch.empty(p.nbytes, dtype=torch.uint8) for p in receiving}
    host = epoch.host
    pending = [_post(dist.isend, t, p.destination, p, workers, host) for p, t in outgoing]
    pending += [_post(dist.irecv, t, p.source, p, workers, host) for p, t in buffers.items()]
    for work, rank in pending:  # the tensors live in `outgoing` and `buffers` until here
        _wait(work, workers[rank], epoch)
    result.sent_bytes = sum(p.nbytes for p in sending)
    result.received_bytes = sum(p.nbytes for p in receiving)
    _collect(result, offers, step, {p: t.numpy() for p, t in buffers.items()})
    result.seconds = time.perf_counter() - started
    return result


def _read_pieces(
    own: snapshot_store.SnapshotStore, step: int, pieces: Sequence[Piece]
) -> list[tuple[Piece, torch.Tensor]]:
    """The bytes of each piece this rank sends, as stored. When the snapshot cannot be opened
    any more, zeros of the promised length go instead: the peer's checksum rejects them, and
    no receive is left waiting."""
    if not pieces:
        return []
    try:
        with own.open_snapshot(step) as snapshot:
            return [(p, torch.from_numpy(snapshot.read_unverified(p.file))) for p in pieces]
    except snapshot_store.SnapshotError as exc:
        LOG.warning("sending zeros for the snapshot of step %d: %s", step, exc)
        return [(p, torch.zeros(p.nbytes, dtype=torch.uint8)) for p in pieces]


def _collect(
    result: Received,
    offers: Sequence[Offer],
    step: int,
    arrived: Mapping[Piece, parity.Bytes],
) -> None:
    """Verify every arrived piece and assemble one MemberSnapshot per (sender, layer) whose
    pieces all verify; a damaged piece loses its whole member (noted in `problems`)."""
    by_member: dict[tuple[int, int], list[Piece]] = {}
    for piece in arrived:
        by_member.setdefault((piece.source, piece.layer), []).append(piece)
    for (source, layer), pieces in sorted(by_member.items(), key=lambda kv: kv[0]):
        offer = offers[source]
        assert offer.manifest is not None
        where = f"worker {offer.worker}'s snapshot of step {step}"
        try:
            files = {
                p.file.file: snapshot_store.verify(arrived[p], p.file, f"{where}: {p.file.file}")
                for p in pieces
            }
            member = _member(offer.manifest, offer.manifest.layer(layer), files)
        except snapshot_store.SnapshotError as exc:
            LOG.warning("layer %d: a piece from %s is rejected: %s", layer, where, exc)
            result.problems.setdefault(layer, []).append(str(exc))
            continue
        result.members.setdefault(layer, []).append(member)


def _member(
    manifest: manifests.Manifest,
    entry: manifests.LayerEntry,
    files: Mapping[str, parity.Bytes],
) -> snapshots.MemberSnapshot:
    """A member's snapshot of one layer from its verified files (as `snapshots.read_member`
    builds it from a store)."""
    shard = entry.file(manifests.FileKind.SHARD)
    if shard is None or shard.file not in files:
        raise snapshot_store.SnapshotCorrupt(f"layer {entry.layer} arrived without its shard")
    extra = [f for f in entry.files if f.kind is not manifests.FileKind.SHARD]
    redundant = files.get(extra[0].file) if extra else None
    if extra and redundant is None:
        raise snapshot_store.SnapshotCorrupt(f"layer {entry.layer} arrived without its redundancy")
    return snapshots.MemberSnapshot(
        step=manifest.step,
        redundancy=manifest.redundancy,
        entry=entry,
        shard=files[shard.file],
        redundant=redundant,
    )


def _post(
    post: Any,
    tensor: torch.Tensor,
    rank: int,
    piece: Piece,
    workers: Sequence[plan.WorkerId],
    host: dist.ProcessGroup,
) -> tuple[dist.Work, int]:
    try:  # (the host group spans every rank in the world's order: its ranks are the world's)
        work = post(tensor, rank, group=host, tag=piece.tag)
    except RuntimeError as exc:
        raise ExchangeError(
            f"posting snapshot piece {piece.file.file} to or from worker {workers[rank]} failed: "
            f"{_first_line(exc)}",
            peer=workers[rank],
        ) from exc
    assert work is not None, "every rank of the epoch is in its host group"
    return work, rank


def _wait(work: dist.Work, peer: plan.WorkerId, epoch: groups.Epoch) -> None:
    try:
        work.wait(epoch.timeout)
    except RuntimeError as exc:
        raise ExchangeError(
            f"snapshot transfer with worker {peer} failed in epoch {epoch.number}: "
            f"{_first_line(exc)}",
            peer=peer,
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
