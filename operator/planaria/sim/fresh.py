"""The fastest plan over N workers planned from scratch: an exact best-first search.

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
order until no screen is below the best whole step, which keeps the least whole step, the first
in that order on a tie; over counts, a later count replaces the best only when strictly faster.
Since a screen is a lower bound of the whole step (a whole plan's stage waits for its
all-reduces after its arrival alone, `composition`; this needs a commit barrier within a node
to cost no more than one between nodes: the estimator prices a barrier that spans nodes at the
inter-node link, so with a slower intra-node link, which no real machine has, a pipeline alone
on one node can be estimated slower than the whole plan, and this search and the exhaustive
one may then both miss the least step), that answer is the least layout in the
order (whole step, count, screen, DP degree, symmetric first) among those that fit and pass
the test: the tie rule. This module finds that least layout best-first:

1. Layouts are grouped by (DP degree, depth): the symmetric grid DP x d (a plan of DP x d
   workers, the same at every larger count, so only its first count can win a tie) and the
   asymmetric layouts DP x d plus e deeper pipelines (count DP d + e, e = 1..DP-1). A group's
   lower bound: some pipeline runs at least ceil(M / DP) of the M micro-batches, and E's step of
   a pipeline of one-GPU stages with m micro-batches is at least `distribution.step_bound_s`
   (the chain of its compute on free links), and at least each stage's chain:
   a micro-batch's forward through the stages before it, its m forwards and backwards, its
   layers' all-reduces among the DP pipelines and its optimizer step; the smaller over the
   group's one or two depths, and at least the chain of one micro-batch of every depth.
2. Groups are opened in order of their bounds until the least exceeds the best whole step
   found. A group enters at a cheaper bound (each chain at its first stage alone) and is
   raised to its bound above, then to its tail bound (one pipeline runs ceil(M / DP), every one
   runs one: `step_bounds.Bounds.group_tail_s`), each only when the one before lets it through;
   it opens when it comes first again. In an open group, each layout is cut as soon as one of
   its increasingly costly lower bounds exceeds it: the chain bounds at the least share of the
   batch its busiest pipelines can have (no distribution), those of its distributed batch (no
   replay), its screen (each distinct pipeline, split x micro-batches x first GPU within a
   node, replayed once: a 1,024-pipeline layout costs a few look-ups), and the tail bound
   (each stage's arrival alone plus its all-reduces one after another plus its optimizer step,
   which its worker runs in sequence in the whole plan). Only the layouts left are built and
   estimated whole.

A cut layout has a whole step above the best, so it can neither win nor take a tie. Answers
are kept per worker count; batches, screens and whole steps per layout, for every count.

Here: the groups, the tie rule, the search's order and cuts, and each layout's batch, screen,
pipelines alone and whole step. Not here: the lower bounds themselves and their memos, shared
by the searches of a job (`step_bounds`: the chain, group, balanced, spread and tail bounds,
with their relative slack of 1e-9); what a plan's estimate is (`screening`, `composition`);
the split per depth (`distribution`).
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from planaria.contract import errors, plan
from planaria.planner import batching, composition, copies, distribution, screening
from planaria.sim import step_bounds

Layout = tuple[tuple[int, ...], ...]
"""Per pipeline its layer counts then its micro-batches, in worker order."""


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """A layout before its split and batch: `num_pipelines` pipelines, the first `num_deeper`
    of them `depth + 1` stages deep, the others `depth`."""

    num_pipelines: int
    depth: int
    num_deeper: int

    @property
    def num_workers(self) -> int:
        return self.num_pipelines * self.depth + self.num_deeper

    def depths(self) -> tuple[int, ...]:
        deeper = (self.depth + 1,) * self.num_deeper
        return deeper + (self.depth,) * (self.num_pipelines - self.num_deeper)

    def rank(self, step_s: float, screen_s: float) -> tuple[float, int, float, int, int]:
        """The tie rule's order (module docstring)."""
        return (step_s, self.num_workers, screen_s, self.num_pipelines, int(self.num_deeper > 0))


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """The best layout over a number of workers: its whole step, layout and count."""

    step_s: float
    layout: Layout
    num_workers: int


@dataclass(frozen=True, slots=True)
class _Screened:
    """A layout's eq. 10 screen, micro-batches per pipeline and its distinct pipelines."""

    screen_s: float
    micro_batches: tuple[int, ...]
    kinds: frozenset[step_bounds.Kind]


def groups(
    num_workers: int, num_layers: int, num_micro_batches: int, symmetric: bool
) -> Iterator[tuple[Shape, int]]:
    """Every group of layouts over at most `num_workers` (module docstring, 1): the symmetric
    grid as Shape(DP, d, 0) with 0, the asymmetric ones as Shape(DP, d, 1) with how many
    (e = 1..that many)."""
    for dp in range(1, min(num_workers, num_micro_batches) + 1):
        for depth in range(1, min(num_layers, num_workers // dp) + 1):
            yield Shape(dp, depth, 0), 0
            room = min(dp - 1, num_workers - dp * depth)
            if room > 0 and depth + 1 <= num_layers and not symmetric:
                yield Shape(dp, depth, 1), room


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
        shared: Search | None = None,
    ) -> None:
        """`shared`: a search of the same job (estimates, reference, split and plan_of) whose
        bounds and memos of each layout's batch and screen this one shares (and of its whole
        step when neither has a test): they do not depend on which layouts a search may
        choose."""
        self.estimates = estimates
        self.reference = reference  # one pipeline of every micro-batch: the batch and its size
        self.split = split
        self.plan_of = plan_of
        self.symmetric = symmetric
        self.test = test
        self._answers: dict[int, Found | None] = {}
        self.bounds = step_bounds.Bounds(estimates.profile, reference, split)
        self._costs: dict[int, batching.PipelineCost] = {}
        self._spread: dict[Shape, tuple[int, ...] | None] = {}
        self._screens: dict[Shape, _Screened | None] = {}
        self._wholes: dict[Shape, float | None] = {}  # None: does not fit or fails the test
        self._alone: dict[tuple[int, int, int], screening.Estimate] = {}
        self._runs: dict[tuple[int, int, int], composition.PipelineRun] = {}
        if shared is not None:
            self._share(shared)

    def _share(self, other: Search) -> None:
        self.bounds, self._costs = other.bounds, other._costs
        self._spread, self._screens = other._spread, other._screens
        self._alone, self._runs = other._alone, other._runs
        if self.test is None and other.test is None:
            self._wholes = other._wholes

    def best(self, num_workers: int) -> Found | None:
        """The fastest layout over a prefix of `num_workers` workers (None: nothing fits)."""
        if num_workers not in self._answers:
            # the least layout over more workers is the least over fewer when it fits in them
            known = (
                found
                for more, found in self._answers.items()
                if more > num_workers and found is not None and found.num_workers <= num_workers
            )
            reused = next(known, None)
            self._answers[num_workers] = reused or self._search(num_workers)
        return self._answers[num_workers]

    def _search(self, num_workers: int) -> Found | None:
        prof, total = self.estimates.profile, self.reference.num_micro_batches
        # a group's bounds from the cheapest; each costlier one only when the last lets it through
        refinements = (self.bounds.group_s, lambda g: self.bounds.group_tail_s(g, self._run))
        heap = [
            (self.bounds.group_lead_s(shape), shape, room, 0)
            for shape, room in groups(num_workers, prof.num_layers, total, self.symmetric)
        ]
        heapq.heapify(heap)
        best: tuple[tuple[float, int, float, int, int], Shape] | None = None
        while heap and heap[0][0] <= (math.inf if best is None else best[0][0]):
            bound, group, room, stage = heapq.heappop(heap)
            if stage < len(refinements):
                tighter = max(bound, refinements[stage](group))
                heapq.heappush(heap, (tighter, group, room, stage + 1))
                continue
            members = (
                [group]
                if room == 0
                else [Shape(group.num_pipelines, group.depth, e) for e in range(1, room + 1)]
            )
            for shape in members:
                rank = self._rank(shape, math.inf if best is None else best[0][0])
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, shape)
        if best is None:
            return None
        rank, shape = best
        screened = self._screens[shape]
        assert screened is not None  # it was estimated whole
        return Found(step_s=rank[0], layout=self._layout(shape, screened), num_workers=rank[1])

    def _rank(self, shape: Shape, limit: float) -> tuple[float, int, float, int, int] | None:
        """The layout's place in the tie rule's order, or None when it does not fit, fails the
        test, or a lower bound on its step exceeds `limit` (module docstring, 2)."""
        # the bounds before any replay, kept for the searches of other counts
        if self.bounds.balanced_s(shape) > limit:
            return None
        if self.bounds.balanced_tail_s(shape, self._run) > limit:
            return None
        if self.bounds.spread_s(shape, self._micro_batches(shape)) > limit:
            return None
        screened = self._screen(shape)
        if screened is None or screened.screen_s > limit:
            return None
        if self.bounds.tail_s(shape, screened.kinds, self._run) > limit:
            return None
        if shape not in self._wholes:
            self._wholes[shape] = self._whole_s(shape, screened)
        step_s = self._wholes[shape]
        return None if step_s is None else shape.rank(step_s, screened.screen_s)

    def _whole_s(self, shape: Shape, screened: _Screened) -> float | None:
        """E's whole step of the layout (None: it does not fit or fails the test): from its
        kinds of pipelines (`copies`) when no test needs the plan and the estimates compose,
        else of the plan built."""
        if self.test is None and self.estimates.compose:
            kinds, nodes = self._copies(shape, screened)
            step_s, peak_bytes = copies.whole(kinds, self.estimates.profile, nodes)
            return step_s if peak_bytes <= self.estimates.memory_bytes else None
        built = self.plan_of(self._layout(shape, screened), shape.num_workers)
        whole = self.estimates.whole(built)
        valid = self.estimates.fits(whole) and (self.test is None or self.test(built))
        return whole.step_s if valid else None

    def _copies(
        self, shape: Shape, screened: _Screened
    ) -> tuple[list[copies.Copies], copies.Nodes | None]:
        """The layout's kinds of pipelines (depth, micro-batches and first GPU within a node)
        with their runs, and where they lie when nodes have several GPUs."""
        gpus = self.reference.gpus_per_node
        pairs = zip(shape.depths(), screened.micro_batches, strict=True)
        if gpus == 1:
            counts = collections.Counter((d, m, 0) for d, m in pairs)
        else:
            kinds, first = [], 0
            for d, m in pairs:
                kinds.append((d, m, first % gpus))
                first += d
            counts = collections.Counter(kinds)
        found = [
            copies.Copies(split=self._split_of(d), run=self._run(d, m, g), count=n)
            for (d, m, g), n in counts.items()
        ]
        if gpus == 1:
            return found, None
        index = {kind: i for i, kind in enumerate(counts)}
        nodes = copies.Nodes(
            gpus_per_node=gpus,
            num_workers=shape.num_workers,
            first=index[kinds[0]],
            last=index[kinds[-1]],
        )
        return found, nodes

    # --- the layout's parts ----------------------------------------------------------------

    def _micro_batches(self, shape: Shape) -> tuple[int, ...] | None:
        """`batching.distribute` over the layout's pipelines (None: a depth has no split, or
        the batch cannot be shared)."""
        if shape not in self._spread:
            self._spread[shape] = self._distributed(shape)
        return self._spread[shape]

    def _distributed(self, shape: Shape) -> tuple[int, ...] | None:
        depths = shape.depths()
        if any(self.split(d) is None for d in set(depths)):
            return None
        # the same list as one cost per pipeline (pipelines of a depth share it), built whole
        deeper, others = shape.num_deeper, shape.num_pipelines - shape.num_deeper
        costs = [self._cost(shape.depth + 1)] * deeper if deeper else []
        costs += [self._cost(shape.depth)] * others
        try:
            spread = batching.distribute(
                costs,
                self.reference.global_batch_size,
                self.reference.micro_batch_size,
            )
        except errors.InfeasibleError:
            return None  # this many pipelines cannot share the global batch
        return spread.micro_batches

    def _screen(self, shape: Shape) -> _Screened | None:
        """The eq. 10 screen from the distinct pipelines (None: a pipeline does not fit)."""
        if shape not in self._screens:
            self._screens[shape] = self._screened(shape)
        return self._screens[shape]

    def _screened(self, shape: Shape) -> _Screened | None:
        spread = self._micro_batches(shape)
        if spread is None:
            return None
        gpus, first, kinds = self.reference.gpus_per_node, 0, set()
        for depth, num_micro_batches in zip(shape.depths(), spread, strict=True):
            kinds.add((depth, num_micro_batches, first % gpus))
            first += depth
        alone = [self._pipeline(*kind) for kind in kinds]
        if not all(self.estimates.fits(e) for e in alone):
            return None
        return _Screened(max(e.step_s for e in alone), spread, frozenset(kinds))

    def _layout(self, shape: Shape, screened: _Screened) -> Layout:
        pairs = zip(shape.depths(), screened.micro_batches, strict=True)
        return tuple((*self._split_of(d), m) for d, m in pairs)

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

    def _alone_of(self, depth: int, num_micro_batches: int, gpu: int) -> plan.Pipeline:
        """The pipeline of `depth` alone, its first worker GPU `gpu` of a node."""
        workers = [plan.WorkerId(gpu + s) for s in range(depth)]
        return distribution.pipeline_of(self._split_of(depth), workers, num_micro_batches)

    def _pipeline(self, depth: int, num_micro_batches: int, gpu: int) -> screening.Estimate:
        key = (depth, num_micro_batches, gpu)
        if key not in self._alone:
            self._alone[key] = self.estimates.pipeline(
                self._alone_of(*key), self.reference.micro_batch_size, self.reference.gpus_per_node
            )
        return self._alone[key]

    def _run(self, depth: int, num_micro_batches: int, gpu: int) -> composition.PipelineRun:
        key = (depth, num_micro_batches, gpu)
        if key not in self._runs:  # the estimates' memo would build the pipeline to look it up
            self._runs[key] = self.estimates.run(
                self._alone_of(*key), self.reference.micro_batch_size, self.reference.gpus_per_node
            )
        return self._runs[key]
