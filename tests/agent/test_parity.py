"""XOR parity and shard layout of a sharding group (planaria.agent.state.parity, REFT eq. 1-2).

Covers: shards tile the state contiguously and differ by at most one byte; every piece of every
shard goes into exactly one other member's parity, each parity taking one piece from each other
member; parity size is about N/(m(m-1)) bytes; the encoder matches a byte-by-byte brute-force
XOR; any single lost member's shard is rebuilt byte-exactly for group sizes 2..6 and any state
length (hypothesis); `FlatBytes` views equal slices of the concatenation whatever the
segmentation; a group of one, a wrong buffer and a missing or short survivor are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.agent.state import parity

GROUP_SIZES = st.integers(min_value=2, max_value=6)


def _random_bytes(seed: int, n: int) -> parity.Bytes:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def _segmented(data: parity.Bytes, cuts: list[int]) -> parity.FlatBytes:
    bounds = sorted({0, data.size, *(c % (data.size + 1) for c in cuts)})
    return parity.FlatBytes([data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])


def _member_files(
    data: parity.Bytes, m: int
) -> tuple[dict[int, parity.Bytes], dict[int, parity.Bytes]]:
    flat = parity.FlatBytes([data])
    shards, parities = {}, {}
    for k in range(m):
        span = parity.shard_range(data.size, m, k)
        shards[k] = data[span.start : span.stop].copy()
        out = np.empty(parity.piece_bytes(data.size, m), dtype=np.uint8)
        parity.encode_parity(k, m, flat, out)
        parities[k] = out
    return shards, parities


@given(n=st.integers(min_value=0, max_value=10_000), m=st.integers(min_value=1, max_value=9))
def test_shards_tile_the_state_and_differ_by_at_most_one_byte(n: int, m: int) -> None:
    spans = [parity.shard_range(n, m, k) for k in range(m)]
    assert spans[0].start == 0 and spans[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(spans, spans[1:], strict=False))
    assert max(map(len, spans)) - min(map(len, spans)) <= 1


@given(m=GROUP_SIZES)
def test_every_piece_is_in_exactly_one_other_members_parity(m: int) -> None:
    placed = [(i, j) for holder in range(m) for i, j in parity.parity_sources(holder, m)]
    assert sorted(placed) == [(i, j) for i in range(m) for j in range(m - 1)]
    for holder in range(m):
        sources = parity.parity_sources(holder, m)
        assert sorted(i for i, _ in sources) == [i for i in range(m) if i != holder]
        assert all(parity.parity_holder(i, j, m) == holder for i, j in sources)


@given(n=st.integers(min_value=0, max_value=100_000), m=GROUP_SIZES)
def test_parity_is_about_a_share_of_one_over_m_times_m_minus_one(n: int, m: int) -> None:
    size = parity.piece_bytes(n, m)
    assert n / (m * (m - 1)) <= size <= n / (m * (m - 1)) + 2
    for k in range(m):
        pieces = [parity.piece_range(n, m, k, j) for j in range(m - 1)]
        assert sum(map(len, pieces)) == len(parity.shard_range(n, m, k))
        assert all(len(p) <= size for p in pieces)


def test_the_four_member_layout_of_the_docstring() -> None:
    # member 1's parity is a0 ^ c2 ^ d1 (a=0, b=1, c=2, d=3)
    assert parity.parity_sources(1, 4) == ((0, 0), (2, 2), (3, 1))
    assert parity.parity_sources(0, 4) == ((1, 2), (2, 1), (3, 0))


@given(n=st.integers(min_value=0, max_value=300), m=GROUP_SIZES, seed=st.integers(0, 2**32))
def test_encoder_matches_a_brute_force_xor(n: int, m: int, seed: int) -> None:
    data = _random_bytes(seed, n)
    _, parities = _member_files(data, m)
    size = parity.piece_bytes(n, m)
    for holder in range(m):
        expected = [0] * size
        for member, piece in parity.parity_sources(holder, m):
            span = parity.piece_range(n, m, member, piece)
            for position, byte in enumerate(data.tolist()[span.start : span.stop]):
                expected[position] ^= byte
        assert parities[holder].tolist() == expected


@given(
    n=st.integers(min_value=0, max_value=5_000),
    m=GROUP_SIZES,
    lost=st.integers(min_value=0, max_value=5),
    seed=st.integers(0, 2**32),
)
def test_any_single_lost_shard_is_rebuilt_byte_exactly(
    n: int, m: int, lost: int, seed: int
) -> None:
    lost %= m
    data = _random_bytes(seed, n)
    shards, parities = _member_files(data, m)
    expected = shards.pop(lost)
    parities.pop(lost)
    rebuilt = parity.rebuild_shard(lost, m, n, shards, parities)
    assert rebuilt.tobytes() == expected.tobytes()


@given(
    data=st.binary(max_size=500),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
    bounds=st.tuples(st.integers(0, 500), st.integers(0, 500)),
)
def test_flat_bytes_views_are_slices_of_the_concatenation(
    data: bytes, cuts: list[int], bounds: tuple[int, int]
) -> None:
    array = np.frombuffer(data, dtype=np.uint8)
    flat = _segmented(array, cuts)
    start, stop = sorted(b % (len(data) + 1) for b in bounds)
    assert flat.nbytes == len(data)
    assert b"".join(v.tobytes() for v in flat.views(start, stop)) == data[start:stop]
    assert flat.copy(start, stop).tobytes() == data[start:stop]


def test_a_group_of_one_has_no_parity() -> None:
    with pytest.raises(parity.ParityLayoutError, match="no peer"):
        parity.piece_bytes(100, 1)


def test_a_parity_buffer_of_the_wrong_size_is_refused() -> None:
    flat = parity.FlatBytes([_random_bytes(0, 100)])
    with pytest.raises(parity.ParityLayoutError, match="needs 17"):
        parity.encode_parity(0, 3, flat, np.empty(16, dtype=np.uint8))


def test_a_missing_or_short_survivor_is_refused() -> None:
    data = _random_bytes(1, 99)
    shards, parities = _member_files(data, 3)
    del shards[0], parities[0]
    with pytest.raises(parity.ParityLayoutError, match="member 2's shard or parity is missing"):
        parity.rebuild_shard(0, 3, 99, {1: shards[1]}, parities)
    with pytest.raises(parity.ParityLayoutError, match="member 1: shard of 32 bytes"):
        parity.rebuild_shard(0, 3, 99, {1: shards[1][:-1], 2: shards[2]}, parities)


def test_views_outside_the_bytes_are_refused() -> None:
    with pytest.raises(parity.ParityLayoutError, match="outside"):
        list(parity.FlatBytes([_random_bytes(0, 4)]).views(2, 5))
