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
   (the chain of its compute on free links), and at least each stage's chain (`_chain_s`):
   a micro-batch's forward through the stages before it, its m forwards and backwards, its
   layers' all-reduces among the DP pipelines and its optimizer step; the smaller over the
   group's one or two depths, and at least the chain of one micro-batch of every depth.
2. Groups are opened in order of that bound until it exceeds the best whole step found; in an
   open group, each layout is cut as soon as one of its increasingly costly lower bounds
   exceeds it: the chain bounds at the least share of the batch its busiest pipelines can
   have (no distribution), those of its distributed batch (no replay), its screen (each distinct
   pipeline, split x micro-batches x first GPU within a node, replayed once: a
   1,024-pipeline layout costs a few look-ups), and the tail bound (each stage's arrival alone
   plus its all-reduces one after another plus its optimizer step, which its worker runs in
   sequence in the whole plan). Only the layouts left are built and estimated whole.

A cut layout has a whole step above the best, so it can neither win nor take a tie. Bounds
sum costs in another order than the replay, so they carry a relative slack of 1e-9. Answers
are kept per worker count; screens, bounds and whole steps per layout, for every count.

Not here: what a plan's estimate is (`screening`, `composition`), the split per depth
(`distribution`).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from planaria.contract import errors, plan, profile
from planaria.planner import batching, composition, copies, distribution, estimator, screening

# Relative slack on the bounds: they sum the same costs in another order than the replay.
_ROUNDING = 1e-9

Layout = tuple[tuple[int, ...], ...]
"""Per pipeline its layer counts then its micro-batches, in worker order."""

# The fastest link, then per stage: forward, backward, start, gradient bytes, optimizer step.
_ChainParts = tuple[
    profile.LinkProfile, list[float], list[float], list[float], list[int], list[float]
]


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
    kinds: frozenset[tuple[int, int, int]]  # (depth, micro-batches, first GPU within a node)


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
        memos of each layout's bounds, batch and screen this one shares (and of its whole step
        when neither has a test): they do not depend on which layouts a search may choose."""
        self.estimates = estimates
        self.reference = reference  # one pipeline of every micro-batch: the batch and its size
        self.split = split
        self.plan_of = plan_of
        self.symmetric = symmetric
        self.test = test
        self._answers: dict[int, Found | None] = {}
        self._bounds: dict[tuple[int, int], float] = {}
        self._chains: dict[tuple[int, int, int], float] = {}
        self._parts: dict[int, _ChainParts | None] = {}
        self._costs: dict[int, batching.PipelineCost] = {}
        self._spread: dict[Shape, tuple[int, ...] | None] = {}
        self._screens: dict[Shape, _Screened | None] = {}
        self._tails: dict[Shape, float] = {}
        self._kind_tails: dict[tuple[int, int, int, frozenset[int], int], float] = {}
        self._wait_lists: dict[tuple[frozenset[int], int, int], list[float]] = {}
        self._pairs: dict[tuple[int, int, int], float] = {}
        self._groups: dict[Shape, float] = {}  # each group's bound, for every count
        self._balanced: dict[Shape, float] = {}
        self._spread_bounds: dict[Shape, float] = {}
        self._wholes: dict[Shape, float | None] = {}  # None: does not fit or fails the test
        self._alone: dict[tuple[int, int, int], screening.Estimate] = {}
        self._runs: dict[tuple[int, int, int], composition.PipelineRun] = {}
        if shared is not None:
            self._share(shared)

    def _share(self, other: Search) -> None:
        self._bounds, self._chains, self._parts = other._bounds, other._chains, other._parts
        self._costs, self._spread, self._screens = other._costs, other._spread, other._screens
        self._tails, self._balanced = other._tails, other._balanced
        self._kind_tails, self._wait_lists = other._kind_tails, other._wait_lists
        self._pairs, self._groups = other._pairs, other._groups
        self._spread_bounds, self._alone, self._runs = (
            other._spread_bounds,
            other._alone,
            other._runs,
        )
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
        heap = [
            (self._group_bound_s(shape), shape, room)
            for shape, room in groups(num_workers, prof.num_layers, total, self.symmetric)
        ]
        heapq.heapify(heap)
        best: tuple[tuple[float, int, float, int, int], Shape] | None = None
        while heap and heap[0][0] <= (math.inf if best is None else best[0][0]):
            _, group, room = heapq.heappop(heap)
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
        if shape not in self._balanced:
            self._balanced[shape] = self._balanced_bound_s(shape)
        if self._balanced[shape] > limit:
            return None
        if shape not in self._spread_bounds:
            self._spread_bounds[shape] = self._spread_bound_s(shape)
        if self._spread_bounds[shape] > limit:
            return None
        screened = self._screen(shape)
        if screened is None or screened.screen_s > limit or self._tail_s(shape) > limit:
            return None
        if shape not in self._wholes:
            self._wholes[shape] = self._whole_s(shape, screened)
        step_s = self._wholes[shape]
        return None if step_s is None else shape.rank(step_s, screened.screen_s)

    def _whole_s(self, shape: Shape, screened: _Screened) -> float | None:
        """E's whole step of the layout (None: it does not fit or fails the test): from its
        kinds of pipelines (`copies`) when no test needs the plan, every node has one GPU and
        the estimates compose, else of the plan built."""
        if self.test is None and self.reference.gpus_per_node == 1 and self.estimates.compose:
            step_s, peak_bytes = copies.whole(self._copies(shape, screened), self.estimates.profile)
            return step_s if peak_bytes <= self.estimates.memory_bytes else None
        built = self.plan_of(self._layout(shape, screened), shape.num_workers)
        whole = self.estimates.whole(built)
        valid = self.estimates.fits(whole) and (self.test is None or self.test(built))
        return whole.step_s if valid else None

    def _copies(self, shape: Shape, screened: _Screened) -> list[copies.Copies]:
        """The layout's kinds of pipelines (depth and micro-batches) with their runs."""
        counts = collections.Counter(zip(shape.depths(), screened.micro_batches, strict=True))
        return [
            copies.Copies(split=self._split_of(d), run=self._run(d, m, 0), count=n)
            for (d, m), n in counts.items()
        ]

    # --- lower bounds ----------------------------------------------------------------------

    def _group_bound_s(self, shape: Shape) -> float:
        found = self._groups.get(shape)
        if found is None:
            found = self._groups[shape] = self._group_bound_of(shape)
        return found

    def _group_bound_of(self, shape: Shape) -> float:
        dp = shape.num_pipelines
        most = -(-self.reference.num_micro_batches // dp)
        depths = (shape.depth, shape.depth + 1) if shape.num_deeper else (shape.depth,)
        # the busiest pipeline is of one of the depths; every depth runs at least one
        busiest = min(max(self._depth_bound_s(d, most), self._chain_s(d, most, dp)) for d in depths)
        return max(busiest, *(self._chain_s(d, 1, dp) for d in depths))

    def _chain_s(self, depth: int, num_micro_batches: int, num_pipelines: int) -> float:
        """A lower bound on the whole step of a layout with a pipeline of `depth` running
        `num_micro_batches` among `num_pipelines`: a stage's last backward comes after some
        later (or the same) stage ran all its forwards and backwards, from when micro-batch 0's
        forward reached it, and the backward came back (`distribution.step_bound_s`'s chain);
        then its worker runs its layers' all-reduces (one ring of all their bytes is no longer
        than one per bucket: each pays the latency) and its optimizer step (inf: no split
        fits)."""
        key = (depth, num_micro_batches, num_pipelines)
        if key not in self._chains:
            self._chains[key] = self._chained_s(depth, num_micro_batches, num_pipelines)
        return self._chains[key]

    def _chained_s(self, depth: int, num_micro_batches: int, num_pipelines: int) -> float:
        parts = self._chain_parts(depth)
        if parts is None:
            return math.inf
        fastest, forward, backward, starts, gradients, optimizers = parts
        # done[r]: when stage r can have run its last backward: after some stage s >= r ran all
        # its micro-batches (from when micro-batch 0 reached it) and the backward came back
        done = [0.0] * (depth + 1)
        for r in reversed(range(depth)):
            own = starts[r] + num_micro_batches * (forward[r] + backward[r])
            done[r] = max(own, backward[r] + done[r + 1]) if r + 1 < depth else own
        bound = 0.0
        for r in range(depth):
            reduce_s = fastest.allreduce_s(gradients[r], num_pipelines)
            bound = max(bound, done[r] + reduce_s + optimizers[r])
        return bound * (1 - _ROUNDING)

    def _chain_parts(self, depth: int) -> _ChainParts | None:
        """What `_chained_s` needs of a depth's split, whatever the micro-batches and
        pipelines (None: no split fits): the fastest link terms, per stage its forward and
        backward, when micro-batch 0 reaches it, its gradient bytes and optimizer step."""
        if depth not in self._parts:
            self._parts[depth] = self._chain_parts_of(depth)
        return self._parts[depth]

    def _chain_parts_of(self, depth: int) -> _ChainParts | None:
        split = self.split(depth)
        if split is None:
            return None
        prof, gpus = self.estimates.profile, self.reference.gpus_per_node
        # buckets may go over either link: the faster of each term bounds them all
        fastest = profile.LinkProfile(
            bandwidth_bytes_per_s=max(k.bandwidth_bytes_per_s for k in _links(prof, gpus)),
            latency_s=min(k.latency_s for k in _links(prof, gpus)),
        )
        ranges = list(itertools.pairwise(_cuts(split)))
        forward = [sum(layer.forward_s[0] for layer in prof.layers[a:b]) for a, b in ranges]
        backward = [sum(layer.backward_s[0] for layer in prof.layers[a:b]) for a, b in ranges]
        starts = list(itertools.accumulate(forward, initial=0.0))
        gradients = [sum(layer.gradient_bytes for layer in prof.layers[a:b]) for a, b in ranges]
        optimizers = [estimator.optimizer_s(prof, range(a, b), 1) for a, b in ranges]
        return fastest, forward, backward, starts, gradients, optimizers

    def _depth_bound_s(self, depth: int, num_micro_batches: int) -> float:
        """`distribution.step_bound_s` of the depth's split (inf: no split fits)."""
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

    def _balanced_bound_s(self, shape: Shape) -> float:
        """A lower bound on the whole step before the batch is distributed: if the deeper
        pipelines take M_A of the M micro-batches, one of them runs ceil(M_A / e) and one of
        the others ceil((M - M_A) / (DP - e)); the least over M_A of the larger chain bound
        (one bound grows with M_A, the other shrinks: bisect to where they cross)."""
        dp, total = shape.num_pipelines, self.reference.num_micro_batches
        if not shape.num_deeper:
            return self._pair_bound_s(shape.depth, -(-total // dp), dp)
        deeper, others = shape.num_deeper, dp - shape.num_deeper
        if total < dp:
            return math.inf  # fewer micro-batches than pipelines: not distributable

        def deep(taken: int) -> float:
            return self._pair_bound_s(shape.depth + 1, -(-taken // deeper), dp)

        def shallow(taken: int) -> float:
            return self._pair_bound_s(shape.depth, -(-(total - taken) // others), dp)

        lo, hi = deeper, total - others
        while lo < hi:  # the least share at which the deeper ones' bound reaches the others'
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if deep(mid) >= shallow(mid) else (mid + 1, hi)
        candidates = [max(deep(lo), shallow(lo))]
        if lo > deeper:
            candidates.append(max(deep(lo - 1), shallow(lo - 1)))
        return min(candidates)

    def _pair_bound_s(self, depth: int, num_micro_batches: int, num_pipelines: int) -> float:
        key = (depth, num_micro_batches, num_pipelines)
        found = self._pairs.get(key)
        if found is None:
            found = self._pairs[key] = max(
                self._depth_bound_s(depth, num_micro_batches),
                self._chain_s(depth, num_micro_batches, num_pipelines),
            )
        return found

    def _spread_bound_s(self, shape: Shape) -> float:
        """The step bound of the pipelines with their distributed batch (inf: no split of a
        depth fits or the batch cannot be shared)."""
        spread = self._micro_batches(shape)
        if spread is None:
            return math.inf
        pairs = set(zip(shape.depths(), spread, strict=True))
        return max(self._pair_bound_s(d, m, shape.num_pipelines) for d, m in pairs)

    def _tail_s(self, shape: Shape) -> float:
        """A lower bound on the whole step: per distinct pipeline and stage, its arrival alone,
        its all-reduces (one per bucket of layers with the same holders, shared by every
        pipeline) one after another and its optimizer step."""
        if shape not in self._tails:
            self._tails[shape] = self._tail_bound_s(shape)
        return self._tails[shape]

    def _tail_bound_s(self, shape: Shape) -> float:
        screened = self._screens[shape]
        assert screened is not None
        present = frozenset(d for d, _, _ in screened.kinds)
        dp = shape.num_pipelines
        # the running maximum from 0 over every kind's stages, taken per kind (memoised)
        tails = [self._kind_tail_s(kind, present, dp) for kind in screened.kinds]
        return max([0.0, *tails]) * (1 - _ROUNDING)

    def _kind_tail_s(self, kind: tuple[int, int, int], present: frozenset[int], dp: int) -> float:
        """The largest of a kind's stages' arrival alone plus waits plus optimizer step, among
        `dp` pipelines of the depths `present` (0 at least)."""
        key = (*kind, present, dp)
        found = self._kind_tails.get(key)
        if found is None:
            parts = self._chain_parts(kind[0])
            assert parts is not None  # the depth has a split
            waits = self._waits(present, dp, kind[0])
            ends = zip(self._run(*kind).arrival_s, waits, parts[-1], strict=True)
            found = self._kind_tails[key] = max([0.0, *(a + w + o for a, w, o in ends)])
        return found

    def _waits(self, present: frozenset[int], dp: int, depth: int) -> list[float]:
        """Per stage of `depth`, its buckets' all-reduces one after another (one per bucket of
        layers with the same holders among `dp` pipelines of the depths `present`), in layer
        order."""
        key = (present, dp, depth)
        if key not in self._wait_lists:
            prof, gpus = self.estimates.profile, self.reference.gpus_per_node
            cuts = sorted({c for d in present for c in itertools.accumulate(self._split_of(d))})
            reduce_s = {}  # seconds of each bucket's all-reduce, by its first layer
            for a, b in itertools.pairwise([0, *cuts]):
                gradient = sum(layer.gradient_bytes for layer in prof.layers[a:b])
                reduce_s[a] = min(link.allreduce_s(gradient, dp) for link in _links(prof, gpus))
            bounds = list(itertools.accumulate(self._split_of(depth), initial=0))
            self._wait_lists[key] = [
                sum(reduce_s[c] for c in reduce_s if a <= c < b)
                for a, b in itertools.pairwise(bounds)
            ]
        return self._wait_lists[key]

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


def _links(prof: profile.Profile, gpus_per_node: int) -> list[profile.LinkProfile]:
    """The links an all-reduce of one-GPU stages can use: between nodes, and within one when
    nodes have several GPUs."""
    return [prof.inter_node] if gpus_per_node == 1 else [prof.inter_node, prof.intra_node]


def _cuts(split: tuple[int, ...]) -> list[int]:
    """The first layer of each stage and the layer count."""
    return list(itertools.accumulate(split, initial=0))
