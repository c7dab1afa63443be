"""LayerTransfer (planaria.contract.plan): what a valid transfer is, and how its shards split.

Covers: at least one source, no repeated source, the destination never a source, a non-negative
layer; `shard` gives every source a contiguous range, the ranges partition the flattened state in
source order and differ in size by at most one element, and follow the documented formula
(hand-computed cases);
asking for the shard of a non-source is refused.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import errors
from planaria.contract import plan as plans

W = plans.WorkerId


@pytest.mark.parametrize(
    ("layer", "destination", "sources", "complaint"),
    [
        (0, 1, (), "at least one source"),
        (0, 1, (2, 2), "repeat"),
        (0, 1, (2, 1), "also a source"),
        (-1, 1, (2,), "layer -1"),
    ],
    ids=["no sources", "a repeated source", "the destination as a source", "a negative layer"],
)
def test_a_transfer_is_refused_with(
    layer: int, destination: int, sources: tuple[int, ...], complaint: str
) -> None:
    with pytest.raises(errors.PlanInputError, match=complaint):
        plans.LayerTransfer(
            layer=layer, destination=W(destination), sources=tuple(W(s) for s in sources)
        )


@given(
    st.lists(st.integers(min_value=1, max_value=99), min_size=1, max_size=8, unique=True),
    st.integers(min_value=0, max_value=10_000),
)
def test_shards_partition_the_state_in_source_order(sources: list[int], n: int) -> None:
    transfer = plans.LayerTransfer(layer=3, destination=W(0), sources=tuple(W(s) for s in sources))
    shards = [list(transfer.shard(W(s), n)) for s in sources]
    assert [e for shard in shards for e in shard] == list(range(n))
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("n", "k", "bounds"),
    [
        (10, 3, [(0, 3), (3, 6), (6, 10)]),
        (2, 4, [(0, 0), (0, 1), (1, 1), (1, 2)]),
        (0, 2, [(0, 0), (0, 0)]),
        (7, 1, [(0, 7)]),
    ],
    ids=["10 elements from 3 sources", "2 elements from 4", "an empty state", "one source"],
)
def test_source_i_sends_elements_i_n_over_k_to_the_next_for(
    n: int, k: int, bounds: list[tuple[int, int]]
) -> None:
    # The formula documented in agent.proto: sender and receiver must agree on it exactly.
    transfer = plans.LayerTransfer(
        layer=0, destination=W(0), sources=tuple(W(s) for s in range(1, k + 1))
    )
    assert [transfer.shard(W(s), n) for s in range(1, k + 1)] == [range(a, b) for a, b in bounds]


def test_the_shard_of_a_worker_that_is_not_a_source_is_refused() -> None:
    transfer = plans.LayerTransfer(layer=0, destination=W(0), sources=(W(1), W(2)))
    with pytest.raises(errors.PlanInputError, match="one of the sources"):
        transfer.shard(W(5), 10)
