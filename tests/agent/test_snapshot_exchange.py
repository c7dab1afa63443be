"""The peer snapshot round's pure parts (planaria.agent.recovery.snapshot_exchange).

Covers: `plan_pieces` over any offers (hypothesis) sends every positive-length file of each
member of a wanted layer that the destination lacks exactly once, from the member's holder or
else from a mirror of it (the lowest rank), only to a rank that wants it, never to itself,
with tags unique per pair of ranks, and is the same list whatever order it is computed in;
`decode_offer` keeps a well-formed offer, and turns a malformed one, or a manifest of another
worker or step, into an offer that wants and serves nothing; a piece damaged in transit is
rejected by its sender's checksum and its member left out. The round over real processes is
tests/agent/test_runtime.py's `test_a_replacement_with_an_empty_store_...` (on the world group of
a gloo epoch) and tests/agent/test_host_group.py's (on a gloo side group, as on NCCL epochs).
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planaria.agent.recovery import snapshot_exchange
from planaria.agent.state import durable_files, manifests
from planaria.contract import plan
from planaria.wire import messages

STEP = 7
W = plan.WorkerId


def _stored(layer: int, kind: manifests.FileKind, member: int, size: int) -> manifests.StoredFile:
    data = np.arange(size, dtype=np.uint8)
    return manifests.StoredFile(
        kind=kind,
        file=f"layer-{layer}.{kind.value}",
        member=member,
        start=0,
        stop=size,
        checksum=durable_files.checksum_of("xxh3", [data]),
    )


def _manifest(worker: int, layers: dict[int, tuple[int, int]]) -> manifests.Manifest:
    """Worker `worker`'s snapshot of STEP with, per layer, a shard and a parity of those sizes."""
    entries = tuple(
        manifests.LayerEntry(
            layer=layer,
            names=(),
            group=(0, 1),
            member=worker % 2,
            total_bytes=0,
            tensors=(),
            files=(
                _stored(layer, manifests.FileKind.SHARD, worker % 2, shard),
                _stored(layer, manifests.FileKind.PARITY, worker % 2, extra),
            ),
            tolerated_losses=1,
        )
        for layer, (shard, extra) in sorted(layers.items())
    )
    return manifests.Manifest(
        job="job",
        worker=worker,
        epoch=1,
        step=STEP,
        redundancy=messages.RedundancyMode.XOR,
        layers=entries,
    )


@st.composite
def _offers(draw: st.DrawFn) -> list[snapshot_exchange.Offer]:
    n = draw(st.integers(1, 5))
    offers = []
    for worker in range(n):
        wanted = draw(st.lists(st.integers(0, 5), max_size=4, unique=True))
        sizes = st.tuples(st.integers(0, 3), st.integers(0, 3))
        held = draw(st.dictionaries(st.integers(0, 5), sizes, max_size=4))
        manifest = _manifest(worker, held) if draw(st.booleans()) else None
        offer = snapshot_exchange.Offer(
            worker=W(worker), wanted=tuple(sorted(wanted)), manifest=manifest
        )
        offers.append(offer)
    return offers


def _entry(offer: snapshot_exchange.Offer, layer: int) -> manifests.LayerEntry | None:
    if offer.manifest is None:
        return None
    return next((e for e in offer.manifest.layers if e.layer == layer), None)


@given(_offers())
def test_every_wanted_member_comes_once_from_its_holder_or_else_its_mirror(
    offers: list[snapshot_exchange.Offer],
) -> None:
    """Workers 0 and 1 hold members 0 and 1 (`_manifest`: member = worker % 2); workers 2-4
    keep the same members as mirrors. The oracle enumerates, per destination, wanted layer and
    member the destination lacks, the ranks offering that member and takes the holder, else
    the lowest rank."""
    pieces = snapshot_exchange.plan_pieces(offers)
    expected: Counter[tuple[int, int, int, str]] = Counter()
    for d, wanting in enumerate(offers):
        for layer in wanting.wanted:
            own = _entry(offers[d], layer)
            for member in (0, 1):
                if own is not None and own.member == member:
                    continue
                serving = [
                    s
                    for s, offer in enumerate(offers)
                    if s != d and (e := _entry(offer, layer)) is not None and e.member == member
                ]
                holders = [s for s in serving if offers[s].worker == member]
                if not serving:
                    continue
                source = holders[0] if holders else min(serving)
                entry = _entry(offers[source], layer)
                assert entry is not None
                for stored in entry.files:
                    if stored.stop > stored.start:
                        expected[(source, d, layer, stored.file)] += 1
    got = Counter((p.source, p.destination, p.layer, p.file.file) for p in pieces)
    assert got == expected
    assert all(p.nbytes > 0 and p.source != p.destination for p in pieces)
    tags = Counter((p.source, p.destination, p.tag) for p in pieces)
    assert all(count == 1 for count in tags.values())
    assert snapshot_exchange.plan_pieces(list(offers)) == pieces  # deterministic


def _raw(wanted: object, manifest: manifests.Manifest | None) -> bytes:
    text = manifests.encode(manifest).decode() if manifest is not None else None
    return json.dumps({"wanted": wanted, "manifest": text}).encode()


def test_a_well_formed_offer_is_kept_and_a_malformed_one_serves_nothing() -> None:
    manifest = _manifest(1, {2: (3, 2)})
    offer = snapshot_exchange.decode_offer(_raw([4, 2], manifest), W(1), STEP)
    assert offer.wanted == (2, 4) and offer.manifest == manifest
    unusable = [
        b"not json",
        _raw([-1], None),
        _raw("all", None),
        _raw([1], _manifest(0, {2: (3, 2)})),  # another worker's manifest
        json.dumps({"wanted": [], "manifest": "{}"}).encode(),
    ]
    for raw in unusable:
        assert snapshot_exchange.decode_offer(raw, W(1), STEP) == snapshot_exchange.Offer(
            worker=W(1), wanted=(), manifest=None
        )
    assert snapshot_exchange.decode_offer(_raw([], manifest), W(1), STEP + 1).manifest is None


def test_a_piece_damaged_in_transit_loses_its_member() -> None:
    offers = [
        snapshot_exchange.Offer(worker=W(0), wanted=(), manifest=_manifest(0, {3: (4, 2)})),
        snapshot_exchange.Offer(worker=W(1), wanted=(3,), manifest=None),
    ]
    pieces = snapshot_exchange.plan_pieces(offers)
    arrived = {p: np.arange(p.nbytes, dtype=np.uint8) for p in pieces}
    whole = snapshot_exchange.Received()
    snapshot_exchange._collect(whole, offers, STEP, arrived)
    assert [m.entry.member for m in whole.members[3]] == [0] and not whole.problems
    shard = next(p for p in pieces if p.file.kind is manifests.FileKind.SHARD)
    arrived[shard] = arrived[shard].copy()
    arrived[shard][1] ^= 0xFF
    damaged = snapshot_exchange.Received()
    snapshot_exchange._collect(damaged, offers, STEP, arrived)
    assert not damaged.members
    assert "checksum mismatch" in damaged.problems[3][0] and "worker 0's" in damaged.problems[3][0]
