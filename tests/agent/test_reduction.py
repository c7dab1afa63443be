"""Gradient sums (planaria.agent.training.reduction): fast and exact mode.

Covers: exact mode's result is the correctly rounded exact sum (a brute-force oracle in
rational arithmetic) for any split of the micro-batches over workers, any order of absorbing
them and any grouping of the all-reduce, whenever the contributions span at most
29 - ceil(log2 n) binary orders (the condition the module docstring proves sufficient;
hypothesis draws values at its edge); float32 sums of the same values do depend on the order
(the reason exact mode exists); bucket and settle handle parameters nobody computed a gradient
for; a deferred parameter (a tied matrix's copy) keeps its reduced float64 sum until settle;
exact mode computes with one torch thread and restores the caller's count, fast mode leaves it
alone.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from planaria.agent.training import reduction
from planaria.wire import messages

EXACT, FAST = messages.Reduction.EXACT, messages.Reduction.FAST


@st.composite
def contributions(draw: st.DrawFn) -> list[list[float]]:
    """n micro-batches' float32 gradients of a few elements, every element's values integer
    multiples of 2^e below 2^(24 + e + S), with S = 29 - ceil(log2 n): the exactness condition
    at its edge."""
    n = draw(st.integers(min_value=1, max_value=16))
    num_elements = draw(st.integers(min_value=1, max_value=4))
    span = 29 - math.ceil(math.log2(n))
    rows = [[0.0] * num_elements for _ in range(n)]
    for element in range(num_elements):
        base = draw(st.integers(min_value=-140, max_value=60))
        for row in rows:
            mantissa = draw(st.integers(min_value=-(2**24 - 1), max_value=2**24 - 1))
            shift = draw(st.integers(min_value=0, max_value=span))
            row[element] = math.ldexp(mantissa, base + shift)
    return rows


def _oracle(rows: list[list[float]]) -> torch.Tensor:
    """The exact sum of each element, rounded once to float32."""
    sums = []
    for column in zip(*rows, strict=True):
        exact = sum((Fraction(x) for x in column), Fraction(0))
        assert Fraction(float(exact)) == exact  # within the condition float64 holds it exactly
        sums.append(np.float32(float(exact)))
    return torch.tensor(np.array(sums, dtype=np.float32))


def _distributed_sum(rows: list[list[float]], seed: int, num_workers: int) -> torch.Tensor:
    """Exact mode as a plan runs it: the micro-batches dealt to workers at random, each worker
    absorbing its own in a random order, the buckets then added in a random grouping."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    rng.shuffle(order)
    buckets = []
    for worker in range(num_workers):
        p = nn.Parameter(torch.zeros(len(rows[0])))
        sums = reduction.GradientSums(EXACT)
        for g in order[worker::num_workers]:
            p.grad = torch.tensor(rows[g], dtype=torch.float32)
            sums.absorb([p])
        buckets.append(sums.bucket([p]))
    while len(buckets) > 1:  # any tree: pick two, add, put back
        a = buckets.pop(rng.randrange(len(buckets)))
        b = buckets.pop(rng.randrange(len(buckets)))
        buckets.append(a + b)
    p = nn.Parameter(torch.zeros(len(rows[0])))
    reduction.GradientSums(EXACT).unpack([p], buckets[0])
    assert p.grad is not None and p.grad.dtype == torch.float32
    return p.grad


@settings(max_examples=300, deadline=None)
@given(contributions(), st.integers(min_value=0, max_value=2**32), st.integers(1, 5))
def test_exact_sums_are_the_correctly_rounded_sum_in_any_order(
    rows: list[list[float]], seed: int, num_workers: int
) -> None:
    # the values are float32 (drawn so), so the float32 tensors hold them exactly
    assert all(float(np.float32(x)) == x for row in rows for x in row)
    got = _distributed_sum(rows, seed, num_workers)
    want = _oracle(rows)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got, want)


def test_float32_sums_depend_on_the_order_and_exact_ones_do_not() -> None:
    rows = [[1.0], [2.0**-24], [2.0**-24]]  # 1 + 2^-24 rounds back to 1 in float32
    forward = torch.tensor(rows[0]) + torch.tensor(rows[1]) + torch.tensor(rows[2])
    backward = torch.tensor(rows[2]) + torch.tensor(rows[1]) + torch.tensor(rows[0])
    assert not torch.equal(forward, backward)
    assert all(torch.equal(_distributed_sum(rows, seed, 1), _oracle(rows)) for seed in range(6))


def _grad(p: nn.Parameter) -> torch.Tensor | None:
    return p.grad


def test_bucket_and_settle_cover_parameters_without_a_gradient() -> None:
    computed, untouched, alone = (nn.Parameter(torch.zeros(2)) for _ in range(3))
    sums = reduction.GradientSums(EXACT)
    for value in (0.5, 0.25):
        computed.grad = torch.full((2,), value)
        alone.grad = torch.full((2,), value)
        sums.absorb([computed, untouched, alone])
        assert _grad(computed) is None and _grad(alone) is None  # each backward writes afresh
    flat = sums.bucket([computed, untouched])
    assert flat.dtype == torch.float64 and flat.tolist() == [0.75, 0.75, 0.0, 0.0]
    sums.unpack([computed, untouched], flat)
    sums.settle([computed, untouched, alone])  # only `alone` was still pending
    assert computed.grad is not None and computed.grad.tolist() == [0.75, 0.75]
    assert untouched.grad is not None and untouched.grad.tolist() == [0.0, 0.0]
    assert alone.grad is not None and alone.grad.dtype == torch.float32
    assert alone.grad.tolist() == [0.75, 0.75]


def test_a_deferred_parameter_keeps_its_reduced_float64_sum_until_settle() -> None:
    """(A tied matrix's copy: its two uses are summed in float64 and rounded once.)"""
    tied, other = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
    sums = reduction.GradientSums(EXACT)
    sums.defer([tied])
    tiny = 2.0**-30  # lost in float32 next to 1.0, kept in float64
    for p in (tied, other):
        p.grad = torch.tensor([1.0])
    sums.absorb([tied, other])
    flat = sums.bucket([tied, other])
    flat += torch.tensor([tiny, tiny], dtype=torch.float64)  # what a peer's share adds
    sums.unpack([tied, other], flat)
    assert _grad(tied) is None and sums.total(tied).item() == 1.0 + tiny
    assert other.grad is not None and other.grad.item() == 1.0  # rounded at once
    sums.replace(tied, sums.total(tied) - 1.0)  # the other use's total added, in float64
    sums.settle([tied])
    assert tied.grad is not None and tied.grad.dtype == torch.float32
    assert tied.grad.item() == tiny  # rounding first would have given 0


def test_fast_mode_leaves_autograd_s_float32_accumulation_alone() -> None:
    p = nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([1.0, 2.0])
    sums = reduction.GradientSums(FAST)
    sums.absorb([p])
    sums.settle([p])
    assert p.grad is not None and p.grad.tolist() == [1.0, 2.0]
    flat = sums.bucket([p])
    assert flat.dtype == torch.float32
    sums.unpack([p], flat)
    assert p.grad.data_ptr() == flat.data_ptr()  # a view of the bucket, as before exact mode


def test_exact_mode_computes_with_one_thread_and_restores_the_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with reduction.compute_threads(EXACT):
            assert torch.get_num_threads() == reduction.EXACT_THREADS
        assert torch.get_num_threads() == 2
        with reduction.compute_threads(FAST):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
