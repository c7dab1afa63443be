"""Lower bounds on the whole step of a fresh-plan layout, kept for every count and search.

The fresh-plan search (`fresh`) opens groups of layouts and cuts layouts by these bounds, in
order of their cost (`fresh`'s docstring, 1 and 2); each is at most E's whole step of the
layout built (tests/sim/test_fresh.py checks each one, on jobs whose screens are lower bounds):

- the chain of a depth (`Bounds._chain_s`): per stage, micro-batch 0's forward reaching it, its
  m forwards and backwards, the last backward coming back, its layers' all-reduces among the DP
  pipelines and its optimizer step; with `distribution.step_bound_s` (the chain of the compute
  on free links) the pair bound of a depth, m micro-batches and DP pipelines;
- a group's bound (`group_s`): the busiest pipeline runs at least ceil(M / DP) micro-batches,
  the least over the group's one or two depths, and every depth runs at least one;
- a layout's bound before its batch is distributed (`balanced_s`: the least share of the batch
  its busiest pipelines can have, bisected) and with it (`spread_s`);
- the tail bound (`tail_s`): per distinct pipeline and stage, its arrival alone plus its
  buckets' all-reduces one after another plus its optimizer step, kept per kind of pipeline,
  set of depths present and DP degree (`tail_bounds`), and the same before the batch is
  distributed (`balanced_tail_s`: at the busiest pipelines' least share, as `balanced_s`);
- every bound then adds the commit barrier among the layout's workers (`_barrier_s`), and with
  several GPUs per node takes the inter-node link alone when no bucket's holders can share a
  node (`apart`).

Bounds sum costs in another order than the replay, so they carry a relative slack of 1e-9
(`_ROUNDING`). None depends on which layouts a search may choose: the searches of one job share
one `Bounds`.

Not here: the search, its tie rule and the layouts' batch, screen and whole step (`fresh`);
what an estimate is (`screening`, `composition`); the split per depth (`distribution`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable
from typing import Protocol

from planaria.contract import plan, profile
from planaria.planner import composition, distribution, estimator
from planaria.sim import tail_bounds

# Relative slack on the bounds: they sum the same costs in another order than the replay.
_ROUNDING = 1e-9

# Per stage: forward, backward, start, gradient bytes, optimizer step.
_ChainParts = tuple[list[float], list[float], list[float], list[int], list[float]]

Kind = tail_bounds.Kind


class Shape(Hashable, Protocol):
    """What the bounds read of a layout before its split and batch (`fresh.Shape`):
    `num_pipelines` pipelines, the first `num_deeper` of them `depth + 1` stages deep,
    `num_workers` workers in all."""

    @property
    def num_pipelines(self) -> int: ...

    @property
    def depth(self) -> int: ...

    @property
    def num_deeper(self) -> int: ...

    @property
    def num_workers(self) -> int: ...

    def depths(self) -> tuple[int, ...]: ...


class Bounds:
    """The lower bounds of one job's layouts (module docstring), each memoised. `split(depth)`
    is the best split of a depth (None: none fits); `reference` is one pipeline of every
    micro-batch (the batch and the GPUs per node)."""

    def __init__(
        self,
        prof: profile.Profile,
        reference: plan.Plan,
        split: Callable[[int], tuple[int, ...] | None],
    ) -> None:
        self.profile = prof
        self.reference = reference
        self.split = split
        self._bounds: dict[tuple[int, int], float] = {}
        self._chains: dict[tuple[int, int, int, bool], float] = {}
        self._parts: dict[int, _ChainParts | None] = {}
        self._groups: dict[Shape, float] = {}
        self._balanced: dict[Shape, float] = {}
        self._spread: dict[Shape, float] = {}
        self._tails: dict[Shape, float] = {}
        self._balanced_tails: dict[Shape, float] = {}
        self.tails = tail_bounds.Tails(prof, reference.gpus_per_node, split)

    # --- per layout, memoised --------------------------------------------------------------

    def group_s(self, group: Shape) -> float:
        """The bound of a group of layouts (`fresh.groups`): the symmetric grid when
        `group.num_deeper` is 0, else the layouts with 1..DP-1 pipelines one deeper."""
        found = self._groups.get(group)
        if found is None:
            found = self._groups[group] = self._group_bound_of(group)
        return found

    def balanced_s(self, shape: Shape) -> float:
        """A lower bound on the whole step before the batch is distributed: if the deeper
        pipelines take M_A of the M micro-batches, one of them runs ceil(M_A / e) and one of
        the others ceil((M - M_A) / (DP - e)); the least over M_A of the larger chain bound
        (one bound grows with M_A, the other shrinks: bisect to where they cross)."""
        if shape not in self._balanced:
            self._balanced[shape] = self._balanced_bound_s(shape)
        return self._balanced[shape]

    def spread_s(self, shape: Shape, micro_batches: tuple[int, ...] | None) -> float:
        """The step bound of the pipelines with their distributed batch `micro_batches` (per
        pipeline; inf when None: no split of a depth fits or the batch cannot be shared)."""
        if shape not in self._spread:
            self._spread[shape] = self._spread_bound_s(shape, micro_batches)
        return self._spread[shape]

    def balanced_tail_s(
        self, shape: Shape, run: Callable[[int, int, int], composition.PipelineRun]
    ) -> float:
        """The tail bound before the batch is distributed, as `balanced_s` bounds the chains:
        the busiest pipelines' tails at the least share of the batch they can have, each the
        least over the pipeline's first GPU within a node. A pipeline alone reaches each
        stage's tail no earlier with more micro-batches (`_least_tail_s`)."""
        if shape not in self._balanced_tails:
            self._balanced_tails[shape] = self._balanced_tail_bound_s(shape, run)
        return self._balanced_tails[shape]

    def tail_s(
        self,
        shape: Shape,
        kinds: frozenset[Kind],
        run: Callable[[int, int, int], composition.PipelineRun],
    ) -> float:
        """A lower bound on the whole step of a layout of distinct pipelines `kinds` (`run`:
        a kind's run alone): per kind and stage, its arrival alone, its all-reduces (one per
        bucket of layers with the same holders, shared by every pipeline) one after another
        and its optimizer step."""
        if shape not in self._tails:
            self._tails[shape] = self._tail_bound_s(shape, kinds, run)
        return self._tails[shape]

    # --- the group, balanced and spread bounds ---------------------------------------------

    def _group_bound_of(self, shape: Shape) -> float:
        # its least member's workers, and whether they are apart (more are, at more workers)
        dp, apart = shape.num_pipelines, self.apart(shape)
        barrier = self._barrier_s(shape.num_workers, least=True)
        most = -(-self.reference.num_micro_batches // dp)
        depths = (shape.depth, shape.depth + 1) if shape.num_deeper else (shape.depth,)
        # the busiest pipeline is of one of the depths; every depth runs at least one
        busiest = min(self._pair_bound_s(d, most, dp, apart, barrier) for d in depths)
        return max(busiest, *(self._chain_s(d, 1, dp, apart) + barrier for d in depths))

    def _balanced_bound_s(self, shape: Shape) -> float:
        dp, total = shape.num_pipelines, self.reference.num_micro_batches
        apart, barrier = self.apart(shape), self._barrier_s(shape.num_workers)
        if not shape.num_deeper:
            return self._pair_bound_s(shape.depth, -(-total // dp), dp, apart, barrier)
        deeper, others = shape.num_deeper, dp - shape.num_deeper
        if total < dp:
            return math.inf  # fewer micro-batches than pipelines: not distributable

        def deep(taken: int) -> float:
            return self._pair_bound_s(shape.depth + 1, -(-taken // deeper), dp, apart, barrier)

        def shallow(taken: int) -> float:
            taken_s = -(-(total - taken) // others)
            return self._pair_bound_s(shape.depth, taken_s, dp, apart, barrier)

        return _least_larger(deep, shallow, deeper, total - others)

    def _spread_bound_s(self, shape: Shape, micro_batches: tuple[int, ...] | None) -> float:
        if micro_batches is None:
            return math.inf
        pairs = set(zip(shape.depths(), micro_batches, strict=True))
        dp, apart = shape.num_pipelines, self.apart(shape)
        barrier = self._barrier_s(shape.num_workers)
        return max(self._pair_bound_s(d, m, dp, apart, barrier) for d, m in pairs)

    # --- per depth, micro-batches and pipelines --------------------------------------------

    def _pair_bound_s(
        self, depth: int, num_micro_batches: int, num_pipelines: int, apart: bool, barrier: float
    ) -> float:
        """The larger of the depth's step bound and its chain bound followed by `barrier`
        (`_barrier_s`: every stage's optimizer step waits for the commit barrier)."""
        return max(
            self._depth_bound_s(depth, num_micro_batches),
            self._chain_s(depth, num_micro_batches, num_pipelines, apart) + barrier,
        )

    def _barrier_s(self, num_workers: int, least: bool = False) -> float:
        """The commit barrier among the `num_workers` workers of a layout (every stage is one
        worker, on workers 0 to `num_workers` - 1: the intra-node link when they fit one node),
        less `_ROUNDING`. `least`: the least over layouts of `num_workers` or more workers (the
        barrier grows with the workers over either link, whose choice may change)."""
        prof, gpus = self.profile, self.reference.gpus_per_node
        inter = estimator.barrier_s(prof.inter_node, num_workers)
        if num_workers > gpus:
            found = inter
        elif least:
            found = min(inter, estimator.barrier_s(prof.intra_node, num_workers))
        else:
            found = estimator.barrier_s(prof.intra_node, num_workers)
        return found * (1 - _ROUNDING)

    def _depth_bound_s(self, depth: int, num_micro_batches: int) -> float:
        """`distribution.step_bound_s` of the depth's split (inf: no split fits)."""
        key = (depth, num_micro_batches)
        if key not in self._bounds:
            split = self.split(depth)
            self._bounds[key] = (
                math.inf
                if split is None
                else distribution.step_bound_s(self.profile, split, num_micro_batches)
                * (1 - _ROUNDING)
            )
        return self._bounds[key]

    def _chain_s(
        self, depth: int, num_micro_batches: int, num_pipelines: int, apart: bool
    ) -> float:
        """A lower bound on the whole step of a layout with a pipeline of `depth` running
        `num_micro_batches` among `num_pipelines`: a stage's last backward comes after some
        later (or the same) stage ran all its forwards and backwards, from when micro-batch 0's
        forward reached it, and the backward came back (`distribution.step_bound_s`'s chain);
        then its worker runs its layers' all-reduces (one ring of all their bytes is no longer
        than one per bucket: each pays the latency) and its optimizer step (inf: no split
        fits). `apart`: every all-reduce is between nodes (`apart`), else over either link."""
        key = (depth, num_micro_batches, num_pipelines, apart)
        if key not in self._chains:
            self._chains[key] = self._chained_s(depth, num_micro_batches, num_pipelines, apart)
        return self._chains[key]

    def _chained_s(
        self, depth: int, num_micro_batches: int, num_pipelines: int, apart: bool
    ) -> float:
        parts = self._chain_parts(depth)
        if parts is None:
            return math.inf
        forward, backward, starts, gradients, optimizers = parts
        fastest = self._fastest(apart)
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
        pipelines (None: no split fits): per stage its forward and backward, when micro-batch
        0 reaches it, its gradient bytes and optimizer step."""
        if depth not in self._parts:
            self._parts[depth] = self._chain_parts_of(depth)
        return self._parts[depth]

    def _chain_parts_of(self, depth: int) -> _ChainParts | None:
        split = self.split(depth)
        if split is None:
            return None
        prof = self.profile
        ranges = list(itertools.pairwise(_cuts(split)))
        forward = [sum(layer.forward_s[0] for layer in prof.layers[a:b]) for a, b in ranges]
        backward = [sum(layer.backward_s[0] for layer in prof.layers[a:b]) for a, b in ranges]
        starts = list(itertools.accumulate(forward, initial=0.0))
        gradients = [sum(layer.gradient_bytes for layer in prof.layers[a:b]) for a, b in ranges]
        optimizers = [estimator.optimizer_s(prof, range(a, b), 1) for a, b in ranges]
        return forward, backward, starts, gradients, optimizers

    def _fastest(self, apart: bool) -> profile.LinkProfile:
        """A link no slower than any an all-reduce of the layouts can use: the inter-node link
        when they are `apart`, else the faster of each all-reduce term of the two."""
        links = tail_bounds.links(self.profile, self.reference.gpus_per_node, apart)
        if len(links) == 1:
            return links[0]
        return profile.LinkProfile(
            bandwidth_bytes_per_s=max(map(_allreduce_bandwidth, links)),
            latency_s=min(map(_allreduce_latency, links)),
        )

    def apart(self, shape: Shape) -> bool:
        """Whether every all-reduce of the layout is between nodes: its first and last
        pipelines' holders of a bucket share no node once the workers between them fill one
        (the pipelines lie on consecutive workers, the first `depth + 1` deep when any is).
        Always with one GPU per node; the bounds then take the inter-node link's terms."""
        gpus = self.reference.gpus_per_node
        first = shape.depth + (1 if shape.num_deeper else 0)
        return gpus == 1 or shape.num_workers >= gpus + first + shape.depth - 1

    # --- the tail bounds -------------------------------------------------------------------

    def _balanced_tail_bound_s(
        self, shape: Shape, run: Callable[[int, int, int], composition.PipelineRun]
    ) -> float:
        dp, total, depth = shape.num_pipelines, self.reference.num_micro_batches, shape.depth
        present = frozenset((depth, depth + 1) if shape.num_deeper else (depth,))
        if total < dp or any(self.split(d) is None for d in present):
            return math.inf  # not distributable, or a depth has no split
        apart, deeper, others = self.apart(shape), shape.num_deeper, dp - shape.num_deeper
        # past twice the even share the tails are taken at that share: lower, still
        # non-decreasing, and above where the two sides cross; the runs stay short
        most = 2 * -(-total // dp)

        def deep(taken: int) -> float:
            busiest = min(-(-taken // deeper), most)
            return self.tails.least_s(depth + 1, busiest, present, dp, apart, run)

        def shallow(taken: int) -> float:
            busiest = min(-(-(total - taken) // others), most)
            return self.tails.least_s(depth, busiest, present, dp, apart, run)

        found = _least_larger(deep, shallow, deeper, total - others) if deeper else shallow(0)
        return found * (1 - _ROUNDING) + self._barrier_s(shape.num_workers)

    def _tail_bound_s(
        self,
        shape: Shape,
        kinds: frozenset[Kind],
        run: Callable[[int, int, int], composition.PipelineRun],
    ) -> float:
        present = frozenset(d for d, _, _ in kinds)
        dp, apart = shape.num_pipelines, self.apart(shape)
        # the running maximum from 0 over every kind's stages, taken per kind (memoised)
        tails = [self.tails.kind_s(kind, present, dp, apart, run) for kind in kinds]
        return max([0.0, *tails]) * (1 - _ROUNDING) + self._barrier_s(shape.num_workers)

    def _split_of(self, depth: int) -> tuple[int, ...]:
        split = self.split(depth)
        assert split is not None  # checked by the caller
        return split


def _least_larger(
    rising: Callable[[int], float], falling: Callable[[int], float], lo: int, hi: int
) -> float:
    """The least over lo..hi of the larger of `rising` (non-decreasing) and `falling`
    (non-increasing): bisect to where the first reaches the second."""
    first = lo
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if rising(mid) >= falling(mid) else (mid + 1, hi)
    candidates = [max(rising(lo), falling(lo))]
    if lo > first:
        candidates.append(max(rising(lo - 1), falling(lo - 1)))
    return min(candidates)


def _allreduce_bandwidth(link: profile.LinkProfile) -> float:
    """The bandwidth `LinkProfile.allreduce_s` uses."""
    return link.allreduce_bandwidth_bytes_per_s or link.bandwidth_bytes_per_s


def _allreduce_latency(link: profile.LinkProfile) -> float:
    """The per-step latency `LinkProfile.allreduce_s` uses."""
    return link.latency_s if link.allreduce_latency_s is None else link.allreduce_latency_s


def _cuts(split: tuple[int, ...]) -> list[int]:
    """The first layer of each stage and the layer count."""
    return list(itertools.accumulate(split, initial=0))
