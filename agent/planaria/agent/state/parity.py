"""Byte layout of a sharding group's snapshot: equal shards and XOR parity (REFT §4.1-4.2).

A layer's state, flattened into N bytes, is split among the m members of its sharding group
into contiguous shards: member k owns bytes [k*N//m, (k+1)*N//m) (`shard_range`), the byte
analogue of `plan.LayerTransfer.shard`. Every member holds the whole layer (vanilla data
parallelism), so it can compute any peer's shard, and any parity, without communication.

XOR parity (REFT AEC, eq. 1-2). Each shard is cut into m-1 pieces of P = ceil(ceil(N/m)/(m-1))
bytes (the last ones shorter or empty). Piece j of shard i goes into the parity of member
`parity_holder(i, j) = (i + 1 + j) mod m`, so member k's parity is the XOR of one distinct piece
of every other member's shard, and never of its own. For m = 4 (shards a, b, c, d):

    member 0 holds a + parity p0 = b2 ^ c1 ^ d0
    member 1 holds b + parity p1 = a0 ^ c2 ^ d1
    member 2 holds c + parity p2 = a1 ^ b0 ^ d2
    member 3 holds d + parity p3 = a2 ^ b1 ^ c0

A lost member's pieces sit in m-1 different surviving parities, each XORed only with pieces of
surviving shards, so `rebuild_shard` recovers it (eq. 2: a0 = p1 ^ c2 ^ d1). Parity costs P,
about N/(m(m-1)) bytes per member (REFT: W_n/(m(m-1))). With m = 2 the parity is the peer's
whole shard (a copy); with m = 1 there is no peer and so no parity (`ParityLayoutError`).

Pieces are zero-padded to P bytes inside a parity; zero is the XOR identity, so padding never
changes a rebuilt byte. `FlatBytes` lets the encoder read byte ranges of the state straight
from the tensors' memory, with no flattening copy.

Not here: files, checksums, manifests (`snapshot_store`); tensors and LayerState
(`snapshots`).

Errors: ParityLayoutError (ValueError) for a group size, member or buffer that does not fit.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

Bytes = npt.NDArray[np.uint8]


class ParityLayoutError(ValueError):
    """A group size, member index or buffer length that does not fit the layout."""


class FlatBytes:
    """A byte string given as consecutive uint8 segments (zero-copy views of tensors)."""

    def __init__(self, segments: Sequence[Bytes]) -> None:
        self._segments = tuple(segments)
        starts = [0]
        for segment in self._segments:
            starts.append(starts[-1] + segment.size)
        self._starts = starts

    @property
    def nbytes(self) -> int:
        return self._starts[-1]

    def views(self, start: int, stop: int) -> Iterator[Bytes]:
        """Zero-copy pieces of the segments that together are bytes [start, stop)."""
        if not 0 <= start <= stop <= self.nbytes:
            raise ParityLayoutError(f"byte range [{start}, {stop}) is outside 0..{self.nbytes}")
        index = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            base = self._starts[index]
            segment = self._segments[index]
            end = min(stop, base + segment.size)
            if end > start:
                yield segment[start - base : end - base]
            start = end
            index += 1

    def copy(self, start: int, stop: int) -> Bytes:
        """Bytes [start, stop) as one new array."""
        out = np.empty(stop - start, dtype=np.uint8)
        position = 0
        for view in self.views(start, stop):
            out[position : position + view.size] = view
            position += view.size
        return out


def _check_group(group_size: int, member: int) -> None:
    if group_size < 1:
        raise ParityLayoutError(f"group size {group_size} must be >= 1")
    if not 0 <= member < group_size:
        raise ParityLayoutError(f"member {member} is outside 0..{group_size - 1}")


def shard_range(total_bytes: int, group_size: int, member: int) -> range:
    """Bytes of the flattened state that `member` owns: [k*N//m, (k+1)*N//m)."""
    _check_group(group_size, member)
    return range(member * total_bytes // group_size, (member + 1) * total_bytes // group_size)


def piece_bytes(total_bytes: int, group_size: int) -> int:
    """P: the length of every parity (and the most any piece holds)."""
    if group_size < 2:
        raise ParityLayoutError(
            f"a group of {group_size} member has no peer to protect; XOR parity needs >= 2"
        )
    largest_shard = -(-total_bytes // group_size)
    return -(-largest_shard // (group_size - 1))


def piece_range(total_bytes: int, group_size: int, member: int, piece: int) -> range:
    """Piece `piece` of `member`'s shard, in bytes of the flattened state (may be empty)."""
    size = piece_bytes(total_bytes, group_size)
    if not 0 <= piece < group_size - 1:
        raise ParityLayoutError(f"piece {piece} is outside 0..{group_size - 2}")
    shard = shard_range(total_bytes, group_size, member)
    start = min(shard.start + piece * size, shard.stop)
    return range(start, min(start + size, shard.stop))


def parity_holder(member: int, piece: int, group_size: int) -> int:
    """The member whose parity contains piece `piece` of `member`'s shard."""
    _check_group(group_size, member)
    return (member + 1 + piece) % group_size


def parity_sources(holder: int, group_size: int) -> tuple[tuple[int, int], ...]:
    """(member, piece) of every piece XORed into `holder`'s parity: one per other member."""
    _check_group(group_size, holder)
    others = (i for i in range(group_size) if i != holder)
    return tuple((i, (holder - i - 1) % group_size) for i in others)


def encode_parity(holder: int, group_size: int, data: FlatBytes, out: Bytes) -> None:
    """Write `holder`'s parity of the whole state `data` into `out` (P bytes; eq. 1)."""
    size = piece_bytes(data.nbytes, group_size)
    if out.size != size:
        raise ParityLayoutError(f"parity buffer holds {out.size} bytes; it needs {size}")
    out[:] = 0
    for member, piece in parity_sources(holder, group_size):
        span = piece_range(data.nbytes, group_size, member, piece)
        position = 0
        for view in data.views(span.start, span.stop):
            target = out[position : position + view.size]
            np.bitwise_xor(target, view, out=target)
            position += view.size


def rebuild_shard(
    lost: int,
    group_size: int,
    total_bytes: int,
    shards: Mapping[int, Bytes],
    parities: Mapping[int, Bytes],
) -> Bytes:
    """The shard of member `lost` from the other members' shards and parities (eq. 2).

    `shards[i]` is member i's whole shard and `parities[i]` its parity, for every i != lost.
    """
    _check_inputs(lost, group_size, total_bytes, shards, parities)
    span = shard_range(total_bytes, group_size, lost)
    out = np.empty(len(span), dtype=np.uint8)
    for piece in range(group_size - 1):
        target = piece_range(total_bytes, group_size, lost, piece)
        holder = parity_holder(lost, piece, group_size)
        decoded = _decode_piece(lost, holder, group_size, total_bytes, shards, parities)
        out[target.start - span.start : target.stop - span.start] = decoded[: len(target)]
    return out


def _check_inputs(
    lost: int,
    group_size: int,
    total_bytes: int,
    shards: Mapping[int, Bytes],
    parities: Mapping[int, Bytes],
) -> None:
    """Every survivor's shard and parity is present and has its exact length."""
    size = piece_bytes(total_bytes, group_size)
    for member in range(group_size):
        if member == lost:
            continue
        if member not in shards or member not in parities:
            raise ParityLayoutError(f"member {member}'s shard or parity is missing")
        expected = len(shard_range(total_bytes, group_size, member))
        if shards[member].size != expected or parities[member].size != size:
            raise ParityLayoutError(
                f"member {member}: shard of {shards[member].size} bytes and parity of "
                f"{parities[member].size}; expected {expected} and {size}"
            )


def _decode_piece(
    lost: int,
    holder: int,
    group_size: int,
    total_bytes: int,
    shards: Mapping[int, Bytes],
    parities: Mapping[int, Bytes],
) -> Bytes:
    """The lost piece held in `holder`'s parity: the parity XOR every other source piece."""
    buffer = np.array(parities[holder], dtype=np.uint8, copy=True)
    for member, piece in parity_sources(holder, group_size):
        if member == lost:
            continue
        span = piece_range(total_bytes, group_size, member, piece)
        start = shard_range(total_bytes, group_size, member).start
        source = shards[member][span.start - start : span.stop - start]
        target = buffer[: source.size]
        np.bitwise_xor(target, source, out=target)
    return buffer
