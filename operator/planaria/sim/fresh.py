"""The fastest plan over N workers planned from scratch: an exact search over prefix counts.

The question (`planning.Planner.fresh`): over every prefix of the sorted workers (count 1..N,
since fewer workers can train faster) and every layout of that count, the layout with the
least step estimate of the whole plan (E's, `screening.Estimates.whole`). A count's layouts
are `candidates.configurations` with an unbounded radius: for each DP degree up to
min(count, micro-batches) the symmetric DP x floor(count / DP) grid (depth capped at the layer
count) and the balanced asymmetric layout, count mod DP pipelines one deeper, deeper first; each
depth's layer split is the best one (`distribution.split_layers`), the batch is distributed
exactly (`batching.distribute` on `distribution.pipeline_cost`), and pipelines lie on
consecutive workers.

The answer is defined by the exhaustive search it replaces (kept as the oracle in
tests/sim/test_fresh.py): per count, layouts that fit are sorted by their eq. 10 screen (the
slowest pipeline alone; a stable sort, so ties keep the order above) and estimated whole in that
order until no screen is below the best whole step; the best is the least whole step, the first
in that order on a tie; over counts, a later count replaces the best only when strictly faster
(ties: the fewest workers). Three exact cuts give the same answer without visiting every layout:

1. A layout seen at an earlier count is not visited again: a symmetric grid DP x d uses DP x d
   workers whatever the count, so it is the same plan at every count in [DP d, DP (d + 1)) and
   from DP x L on; only a strictly faster plan replaces the best, so its repeats cannot.
2. A layout is screened only if a lower bound on its step is below the best whole step of the
   earlier counts: some pipeline runs at least ceil(M / DP) of the M micro-batches, and E's
   step of a pipeline with m micro-batches is at least `distribution.step_bound_s` (the chain
   of its compute, free links), at least the smaller over the layout's (one or two) depths.
3. A layout is screened from its distinct pipelines: a pipeline's estimate depends only on its
   split, its micro-batches and its first worker's GPU within a node (`screening.canonical`),
   so a 1,024-pipeline layout costs a few memo look-ups; the whole plan is built only for the
   layouts whose screen is below the best so far.

Cuts 2 and 3 rest on the screen being a lower bound of the whole step (the whole plan's
stage waits for its all-reduces after its arrival alone, `composition`) and on the step bound;
a layout they skip has a whole step at least the best of the earlier counts, so it can neither
win nor change which of the faster layouts wins a tie. The answer of the first n counts does
not depend on later counts, so it is kept per count and a search serves every n.

Not here: what a plan's estimate is (`screening`), the split per depth (`distribution`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from planaria.contract import errors, plan
from planaria.planner import batching, distribution, screening

# Relative slack on the step bound: it sums the same costs in another order than the replay.
_ROUNDING = 1e-9

Layout = tuple[tuple[int, ...], ...]
"""Per pipeline its layer counts then its micro-batches, in worker order."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A layout before its split and batch: `num_pipelines` pipelines, the first `num_deeper`
    of them `depth + 1` stages deep, the others `depth`."""

    num_pipelines: int
    depth: int
    num_deeper: int

    def depths(self) -> tuple[int, ...]:
        deeper = (self.depth + 1,) * self.num_deeper
        return deeper + (self.depth,) * (self.num_pipelines - self.num_deeper)


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """The best layout of the counts searched so far: its whole step, layout and count."""

    step_s: float
    layout: Layout
    num_workers: int


def shapes(
    num_workers: int, num_layers: int, num_micro_batches: int, symmetric: bool
) -> Iterator[tuple[Shape, bool]]:
    """`candidates.configurations(num_workers, 1, L, M, num_workers)` in its order (asymmetric
    ones dropped when `symmetric`), each with whether it is new at this count (cut 1)."""
    for dp in range(1, min(num_workers, num_micro_batches) + 1):
        depth, extra = divmod(num_workers, dp)
        capped = min(depth, num_layers)
        yield Shape(dp, capped, 0), dp * capped == num_workers
        if extra and depth + 1 <= num_layers and not symmetric:
            yield Shape(dp, depth, extra), True


class Search:
    """The fresh-plan search for one job and one kind of plan (all layouts, or symmetric grids
    only, with an optional test every plan must pass); `best(n)` is the answer over n workers.
    `split(depth)` is the best split of a depth (None: none fits), `plan_of(layout, n)` the
    layout on workers 0..n-1."""

    def __init__(
        self,
        estimates: screening.Estimates,
        reference: plan.Plan,
        split: Callable[[int], tuple[int, ...] | None],
        plan_of: Callable[[Layout, int], plan.Plan],
        symmetric: bool,
        test: Callable[[plan.Plan], bool] | None,
    ) -> None:
        self.estimates = estimates
        self.reference = reference  # one pipeline of every micro-batch: the batch and its size
        self.split = split
        self.plan_of = plan_of
        self.symmetric = symmetric
        self.test = test
        self._upto: list[Found | None] = []  # best over counts 1..n+1, per n
        self._costs: dict[int, batching.PipelineCost] = {}
        self._bounds: dict[tuple[int, int], float] = {}
        self._alone: dict[tuple[int, int, int], screening.Estimate] = {}

    def best(self, num_workers: int) -> Found | None:
        """The fastest layout over a prefix of `num_workers` workers (None: nothing fits)."""
        while len(self._upto) < num_workers:
            incumbent = self._upto[-1] if self._upto else None
            found = self._count(len(self._upto) + 1, incumbent)
            better = found is not None and (incumbent is None or found.step_s < incumbent.step_s)
            self._upto.append(found if better else incumbent)
        return self._upto[num_workers - 1] if num_workers > 0 else None

    def _count(self, num_workers: int, incumbent: Found | None) -> Found | None:
        """The count's best layout among those that could beat `incumbent` (cuts 1-3)."""
        limit = math.inf if incumbent is None else incumbent.step_s
        prof = self.estimates.profile
        screened = []
        for shape, new in shapes(
            num_workers, prof.num_layers, self.reference.num_micro_batches, self.symmetric
        ):
            if not new or self._bound_s(shape) >= limit:
                continue
            found = self._screen(shape)
            if found is not None:
                screened.append((found[0], shape, found[1]))
        screened.sort(key=lambda item: item[0])  # stable: ties keep the configurations' order
        best: Found | None = None
        for screen_s, shape, micro_batches in screened:
            if screen_s >= min(limit, math.inf if best is None else best.step_s):
                break  # a screen is a lower bound: nothing later can beat the best
            layout = tuple(
                (*self._split_of(d), m) for d, m in zip(shape.depths(), micro_batches, strict=True)
            )
            built = self.plan_of(layout, num_workers)
            whole = self.estimates.whole(built)
            if not self.estimates.fits(whole) or (self.test and not self.test(built)):
                continue
            if best is None or whole.step_s < best.step_s:
                best = Found(step_s=whole.step_s, layout=layout, num_workers=num_workers)
        return best

    def _bound_s(self, shape: Shape) -> float:
        """A lower bound on the whole step of any plan of `shape` (cut 2); inf when a depth has
        no split that fits (such a layout is not tried)."""
        most = -(-self.reference.num_micro_batches // shape.num_pipelines)
        depths = {shape.depth, shape.depth + 1} if shape.num_deeper else {shape.depth}
        return min(self._depth_bound_s(d, most) for d in depths)

    def _depth_bound_s(self, depth: int, num_micro_batches: int) -> float:
        key = (depth, num_micro_batches)
        if key not in self._bounds:
            split = self.split(depth)
            self._bounds[key] = (
                math.inf
                if split is None
                else distribution.step_bound_s(self.estimates.profile, split, num_micro_batches)
                * (1 - _ROUNDING)
            )
        return self._bounds[key]

    def _screen(self, shape: Shape) -> tuple[float, tuple[int, ...]] | None:
        """The eq. 10 screen (slowest pipeline alone) and the micro-batches per pipeline, or
        None when a depth has no split, the batch cannot be shared, or a pipeline does not fit
        alone (cut 3)."""
        depths = shape.depths()
        splits = [self.split(d) for d in {shape.depth, shape.depth + 1} & set(depths)]
        if any(s is None for s in splits):
            return None
        try:
            spread = batching.distribute(
                [self._cost(d) for d in depths],
                self.reference.global_batch_size,
                self.reference.micro_batch_size,
            )
        except errors.InfeasibleError:
            return None  # this many pipelines cannot share the global batch
        gpus, first, distinct = self.reference.gpus_per_node, 0, set()
        for depth, num_micro_batches in zip(depths, spread.micro_batches, strict=True):
            distinct.add((depth, num_micro_batches, first % gpus))
            first += depth
        alone = [self._pipeline(*key) for key in distinct]
        if not all(self.estimates.fits(e) for e in alone):
            return None
        return max(e.step_s for e in alone), spread.micro_batches

    def _split_of(self, depth: int) -> tuple[int, ...]:
        split = self.split(depth)
        assert split is not None  # checked by the caller
        return split

    def _cost(self, depth: int) -> batching.PipelineCost:
        if depth not in self._costs:
            self._costs[depth] = distribution.pipeline_cost(
                self.estimates, self._split_of(depth), self.reference
            )
        return self._costs[depth]

    def _pipeline(self, depth: int, num_micro_batches: int, gpu: int) -> screening.Estimate:
        """E's estimate of the pipeline of `depth` alone, its first worker GPU `gpu` of a node."""
        key = (depth, num_micro_batches, gpu)
        if key not in self._alone:
            workers = [plan.WorkerId(gpu + s) for s in range(depth)]
            pipeline = distribution.pipeline_of(self._split_of(depth), workers, num_micro_batches)
            self._alone[key] = self.estimates.pipeline(
                pipeline, self.reference.micro_batch_size, self.reference.gpus_per_node
            )
        return self._alone[key]
