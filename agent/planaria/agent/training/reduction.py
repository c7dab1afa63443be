"""How a worker sums its gradients over micro-batches and workers: fast or exact.

The gradient of a step is a sum over its micro-batches, whoever computed them: accumulation on
one worker, then an all-reduce across the layer's holders (Oobleck §6.1). Floating-point
addition is not associative, so in float32 the result depends on the order, and the order
depends on the plan: which worker ran which micro-batches (rerouting included), in which order,
and how the all-reduce groups the workers' partial sums. AdamW amplifies such differences where
gradients nearly cancel, so two plans drift apart element by element (docs/numerics.md).

`GradientSums` implements both modes of `messages.Reduction` behind one interface that the
executor and the reference trainer call in the same places:

    after each micro-batch's backward    absorb(parameters it reached)
    an all-reduce of a bucket            bucket(parameters) -> flat, reduce, unpack(...)
    tied parameters (`tying`)            total(p) of each use, replace(p, combined)
    before the optimizer step            settle(parameters)

FAST: autograd accumulates float32 gradients in `p.grad`; `absorb` and `settle` do nothing and
the bucket is the float32 gradients. EXACT: `absorb` moves each parameter's fresh float32
gradient (one micro-batch's, computed by the same kernels on every worker) into a float64 sum
and clears `p.grad`, so the next backward writes only its own micro-batch; the bucket is the
float64 sums; `unpack` and `settle` round each sum once to the parameter's dtype. A parameter
marked `defer` (a copy of a tied matrix) keeps its reduced float64 sum through `unpack`, so the
sum of its two uses is taken in float64 and rounded once, by `settle`.

Why EXACT is exact. Take one element and its n <= M nonzero micro-batch gradients x_i (float32,
n at most the step's number of micro-batches). Each x_i is an integer multiple of its own ulp;
let q be the smallest ulp among them and X the largest |x_i|. Every partial sum, in any order
and any grouping (a worker's accumulation, any all-reduce algorithm's tree or ring), is then an
integer multiple of q of magnitude <= n * X, and float64 holds every such multiple exactly while
n * X < 2^53 * q. X < 2^24 * ulp(X), so that holds whenever ulp(X) / q <= 2^29 / n: the x_i span
at most 29 - log2(n) binary orders of magnitude (26 for 8 micro-batches: a ratio of about 6.7e7
between the largest and smallest contribution). Then every float64 sum equals the exact real sum,
the one rounding to float32 is a function of that sum alone, and the result is bitwise the same
for every plan. Outside that condition a float64 sum may round (relative error below
n * 2^-53 of sum |x_i|), and the float32 results of two plans differ only if the exact sum lies
that close to a float32 rounding midpoint: at most one ulp, in a fraction of about
n * 2^-29 * (sum |x_i| / |sum x_i|) of such elements. bench/exact.py counts how often the
condition fails on real gradients.

What it costs: a float64 sum per parameter during the step (8 bytes each, freed at the
optimizer step), float64 all-reduce buckets (twice the bytes) and one conversion per
micro-batch; docs/benchmarks.md has the figures.

What it needs from the rest: each micro-batch's float32 gradient must itself be the same on
every worker that could compute it, and in the reference. On the CPU the same kernels on the
same inputs give the same bits in any process, but only for the same number of intra-op
threads: reductions inside the kernels (a weight gradient over the micro-batch's tokens, a
LayerNorm gain) are split by thread. Measured on the tiny model: a reference with 2 threads
differs from 1-thread workers in 60-110 thousand elements after 5 steps. So exact mode computes
with one intra-op thread (`compute_threads`), in the executor and in the reference alike, and
the result does not depend on how many threads the process was given. Workers must also share
the CPU's kernel family (the same SIMD path: one CPU model) or, on CUDA, the GPU model and
deterministic kernels (docs/numerics.md).

Not here: the all-reduce itself and the optimizer (the executor, `held_layers`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from planaria.wire import messages

SUM_DTYPE = torch.float64  # the dtype of exact sums and of exact all-reduce buckets
EXACT_THREADS = 1  # intra-op threads of exact mode's compute (module docstring)


@contextlib.contextmanager
def compute_threads(mode: messages.Reduction) -> Iterator[None]:
    """Exact mode: torch's intra-op threads are EXACT_THREADS inside, restored on leaving (the
    setting is process-wide: call it from the one thread that trains). Fast mode: unchanged."""
    if mode is not messages.Reduction.EXACT:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(EXACT_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class GradientSums:
    """One worker's gradient sums over a step's micro-batches (module docstring).

    Parameters are keyed by identity; a parameter is pending between its first `absorb` of a
    step and the `unpack` or `settle` that rounds it into `p.grad`.
    """

    def __init__(self, mode: messages.Reduction) -> None:
        self.mode = mode
        self._sums: dict[nn.Parameter, torch.Tensor] = {}
        self._deferred: set[nn.Parameter] = set()

    @property
    def exact(self) -> bool:
        return self.mode is messages.Reduction.EXACT

    def absorb(self, params: Iterable[nn.Parameter]) -> None:
        """After one micro-batch's backward: move its gradients into the float64 sums."""
        if not self.exact:
            return
        for p in params:
            grad = p.grad
            if grad is None:
                continue
            total = self._sums.get(p)
            if total is None:
                self._sums[p] = grad.to(SUM_DTYPE)  # the first addend: 0 + x is exact
            else:
                total.add_(grad)  # float32 promoted to float64 exactly, then added
            p.grad = None

    def bucket(self, params: Sequence[nn.Parameter]) -> torch.Tensor:
        """The flat all-reduce bucket of `params`: their sums (exact) or gradients (fast), with
        zeros where this worker computed none."""
        parts = [self._pending(p).reshape(-1) for p in params]
        return torch.cat(parts)

    def unpack(self, params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
        """Set every `p.grad` from the reduced bucket, rounded once to the parameter dtype."""
        sizes = [p.numel() for p in params]
        for p, chunk in zip(params, torch.split(flat, sizes), strict=True):
            self._sums.pop(p, None)
            if self.exact and p in self._deferred:
                self._sums[p] = chunk.view_as(p)  # the float64 sum, rounded by `settle`
            else:
                p.grad = chunk.view_as(p).to(p.dtype)  # a view, without a copy, in fast mode

    def settle(self, params: Iterable[nn.Parameter]) -> None:
        """Before the optimizer step: round the sums no all-reduce took into `p.grad`."""
        for p in params:
            total = self._sums.pop(p, None)
            if total is not None:
                p.grad = total.to(p.dtype)

    def defer(self, params: Iterable[nn.Parameter]) -> None:
        """Keep the reduced sums of `params` unrounded through `unpack` (exact mode), for
        `total` and `replace`; `settle` rounds them."""
        self._deferred.update(params)

    def total(self, p: nn.Parameter) -> torch.Tensor:
        """`p`'s gradient sum so far: the float64 sum (exact; a deferred parameter's after its
        all-reduce too) or the float32 gradient (fast); zeros where none was computed."""
        return self._pending(p)

    def replace(self, p: nn.Parameter, total: torch.Tensor) -> None:
        """Make `total` (of `total`'s dtype) `p`'s gradient sum; exact mode rounds it in
        `settle`."""
        if self.exact:
            self._sums[p] = total
        else:
            p.grad = total

    def clear(self) -> None:
        """Drop every pending sum (an aborted step's)."""
        self._sums.clear()

    def _pending(self, p: nn.Parameter) -> torch.Tensor:
        if self.exact:
            total = self._sums.get(p)
            return total if total is not None else torch.zeros_like(p, dtype=SUM_DTYPE)
        return p.grad if p.grad is not None else torch.zeros_like(p)
