"""Lower bounds on the whole step of a fresh-plan layout, kept for every count and search.

The fresh-plan search (`fresh`) opens groups of layouts and cuts layouts by these bounds, in
order of their cost (`fresh`'s docstring, 1 and 2); each is at most E's whole step of the
layout built (tests/sim/test_fresh.py checks each one, on jobs whose screens are lower bounds):

- the chain of a depth (`Bounds._chain_s`): per stage, micro-batch 0's forward reaching it, its
  m forwards and backwards, the last backward coming back, its layers' all-reduces among the DP
  pipelines and its optimizer step; with `distribution.step_bound_s` (the chain of the compute
  on free links) the pair bound of a depth, m micro-batches and DP pipelines;
- a group's bound (`group_s`): the busiest pipeline runs at least ceil(M / DP) micro-batches,
  the least over the group's one or two depths, and every depth runs at least one; below it
  the lead bound (`group_lead_s`: the busiest pipeline's chain at its first stage alone, one
  all-reduce instead of one per stage), and beside it the group's tail bound (`group_tail_s`:
  the same pigeonhole on `balanced_tail_s`'s sides);
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
        # per depth, then micro-batches; per (depth, pipelines, apart), then micro-batches: the
        # balanced bisections look up ~2 million pairs at 8,192 workers, by an int each
        self._bounds: dict[int, dict[int, float]] = {}
        self._chains: dict[tuple[int, int, bool], dict[int, float]] = {}
        self._parts: dict[int, _ChainParts | None] = {}
        self._dones: dict[tuple[int, int], list[float]] = {}
        self._reduced: dict[tuple[int, int, bool], list[float]] = {}
        self._fast: dict[bool, profile.LinkProfile] = {}
        self._groups: dict[Shape, float] = {}
        self._leads: dict[Shape, float] = {}
        self._group_tails: dict[Shape, float] = {}
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

    def group_lead_s(self, group: Shape) -> float:
        """At most `group_s`: its busiest pipeline's bound with each chain taken at its
        first stage alone (one all-reduce where the chain takes one per stage)."""
        found = self._leads.get(group)
        if found is None:
            found = self._leads[group] = self._group_lead_of(group)
        return found

    def group_tail_s(
        self, group: Shape, run: Callable[[int, int, int], composition.PipelineRun]
    ) -> float:
        """A lower bound on every member's `balanced_tail_s` of a group of layouts (as
        `group_s`): whatever the deeper pipelines' share, one pipeline runs at least
        ceil(M / DP) micro-batches (they cannot all run fewer), of one of the group's depths,
        and every pipeline runs one; at the least member's workers (the waits over either link
        unless they are `apart`, the least barrier). Costs a few look-ups where a member's
        bisects."""
        found = self._group_tails.get(group)
        if found is None:
            found = self._group_tails[group] = self._group_tail_bound_s(group, run)
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

    def _group_lead_of(self, shape: Shape) -> float:
        dp, apart = shape.num_pipelines, self.apart(shape)
        barrier = self._barrier_s(shape.num_workers, least=True)
        most = -(-self.reference.num_micro_batches // dp)
        depths = (shape.depth, shape.depth + 1) if shape.num_deeper else (shape.depth,)
        return min(
            max(self._depth_bound_s(d, most), self._lead_s(d, most, dp, apart) + barrier)
            for d in depths
        )

    def _lead_s(self, depth: int, num_micro_batches: int, num_pipelines: int, apart: bool) -> float:
        """At most `_chain_s`: its first stage's term alone (the same floats: the chain is
        the largest of its stages' terms, each then less its slack)."""
        parts = self._chain_parts(depth)
        if parts is None:
            return math.inf
        reduce_s = self._fastest(apart).allreduce_s(parts[3][0], num_pipelines)
        done = self._done(depth, num_micro_batches)
        return (done[0] + reduce_s + parts[4][0]) * (1 - _ROUNDING)

    def _balanced_bound_s(self, shape: Shape) -> float:
        dp, total = shape.num_pipelines, self.reference.num_micro_batches
        apart, barrier = self.apart(shape), self._barrier_s(shape.num_workers)
        if not shape.num_deeper:
            return self._pair_bound_s(shape.depth, -(-total // dp), dp, apart, barrier)
        deeper, others = shape.num_deeper, dp - shape.num_deeper
        if total < dp:
            return math.inf  # fewer micro-batches than pipelines: not distributable
        deep = self._pairs(shape.depth + 1, dp, apart, barrier)
        shallow = self._pairs(shape.depth, dp, apart, barrier)
        return _least_over_shares(deep, shallow, deeper, others, total)

    def _pairs(
        self, depth: int, num_pipelines: int, apart: bool, barrier: float
    ) -> Callable[[int], float]:
        """`_pair_bound_s` of the depth, pipelines, `apart` and `barrier` as a function of
        the micro-batches alone, reading the two memos' rows directly (the same values)."""
        steps = self._bounds.setdefault(depth, {})
        chains = self._chains.setdefault((depth, num_pipelines, apart), {})

        def pair(num_micro_batches: int) -> float:
            step = steps.get(num_micro_batches)
            if step is None:
                step = self._depth_bound_s(depth, num_micro_batches)
            chain = chains.get(num_micro_batches)
            if chain is None:
                chain = self._chain_s(depth, num_micro_batches, num_pipelines, apart)
            return max(step, chain + barrier)

        return pair

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
        row = self._bounds.setdefault(depth, {})
        if num_micro_batches not in row:
            split = self.split(depth)
            row[num_micro_batches] = (
                math.inf
                if split is None
                else distribution.step_bound_s(self.profile, split, num_micro_batches)
                * (1 - _ROUNDING)
            )
        return row[num_micro_batches]

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
        row = self._chains.setdefault((depth, num_pipelines, apart), {})
        if num_micro_batches not in row:
            row[num_micro_batches] = self._chained_s(depth, num_micro_batches, num_pipelines, apart)
        return row[num_micro_batches]

    def _chained_s(
        self, depth: int, num_micro_batches: int, num_pipelines: int, apart: bool
    ) -> float:
        parts = self._chain_parts(depth)
        if parts is None:
            return math.inf
        optimizers = parts[4]
        done = self._done(depth, num_micro_batches)
        reduces = self._reduces(depth, num_pipelines, apart)
        bound = 0.0
        for r in range(depth):
            bound = max(bound, done[r] + reduces[r] + optimizers[r])
        return bound * (1 - _ROUNDING)

    def _done(self, depth: int, num_micro_batches: int) -> list[float]:
        """Per stage r of the depth's split, when it can have run its last backward at
        `num_micro_batches`: after some stage s >= r ran all its micro-batches (from when
        micro-batch 0 reached it) and the backward came back (whatever the pipelines)."""
        key = (depth, num_micro_batches)
        found = self._dones.get(key)
        if found is None:
            parts = self._chain_parts(depth)
            assert parts is not None  # checked by the caller
            forward, backward, starts = parts[0], parts[1], parts[2]
            found = [0.0] * (depth + 1)
            for r in reversed(range(depth)):
                own = starts[r] + num_micro_batches * (forward[r] + backward[r])
                found[r] = max(own, backward[r] + found[r + 1]) if r + 1 < depth else own
            self._dones[key] = found
        return found

    def _reduces(self, depth: int, num_pipelines: int, apart: bool) -> list[float]:
        """Per stage of the depth's split, one all-reduce of its gradient bytes among
        `num_pipelines` over `_fastest(apart)` (whatever the micro-batches)."""
        key = (depth, num_pipelines, apart)
        found = self._reduced.get(key)
        if found is None:
            parts = self._chain_parts(depth)
            assert parts is not None  # checked by the caller
            fastest = self._fastest(apart)
            # stages of the same layer counts carry the same bytes: one all-reduce each
            each = {g: fastest.allreduce_s(g, num_pipelines) for g in set(parts[3])}
            found = [each[g] for g in parts[3]]
            self._reduced[key] = found
        return found

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
        if apart not in self._fast:
            self._fast[apart] = self._fastest_of(apart)
        return self._fast[apart]

    def _fastest_of(self, apart: bool) -> profile.LinkProfile:
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

        def deep(busiest: int) -> float:
            return self.tails.least_s(depth + 1, min(busiest, most), present, dp, apart, run)

        def shallow(busiest: int) -> float:
            return self.tails.least_s(depth, min(busiest, most), present, dp, apart, run)

        found = (
            _least_over_shares(deep, shallow, deeper, others, total)
            if deeper
            else shallow(-(-total // dp))
        )
        return found * (1 - _ROUNDING) + self._barrier_s(shape.num_workers)

    def _group_tail_bound_s(
        self, group: Shape, run: Callable[[int, int, int], composition.PipelineRun]
    ) -> float:
        dp, total, depth = group.num_pipelines, self.reference.num_micro_batches, group.depth
        present = frozenset((depth, depth + 1) if group.num_deeper else (depth,))
        if total < dp or any(self.split(d) is None for d in present):
            return math.inf  # as every member's balanced tail
        apart, even = self.apart(group), -(-total // dp)

        def tail(d: int, num_micro_batches: int) -> float:
            return self.tails.least_s(d, num_micro_batches, present, dp, apart, run)

        found = tail(depth, even)
        if group.num_deeper:
            found = max(min(tail(depth + 1, even), found), tail(depth, 1), tail(depth + 1, 1))
        return found * (1 - _ROUNDING) + self._barrier_s(group.num_workers, least=True)

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


def _least_over_shares(
    deep: Callable[[int], float],
    shallow: Callable[[int], float],
    deeper: int,
    others: int,
    total: int,
) -> float:
    """The least over the deeper pipelines' share t of the `total` micro-batches (from
    `deeper` to `total` - `others`: each pipeline runs one) of the larger of `deep` at their
    busiest count ceil(t / deeper) and `shallow` at the others' ceil((total - t) / others),
    both non-decreasing. Bisected over the side with fewer busiest counts rather than over t:
    the share least for the other side among those of one busiest count is the largest (or
    least) of them, so the least is the same value in a handful of steps where t spans
    hundreds (the bisection over t is the oracle of tests/sim/test_fresh.py)."""
    most_deep = -(-(total - others) // deeper)
    most_shallow = -(-(total - deeper) // others)
    if most_deep <= most_shallow:

        def rest(busiest: int) -> float:  # the others at the largest share of that count
            return shallow(-(-(total - min(busiest * deeper, total - others)) // others))

        return _least_larger(deep, rest, 1, most_deep)

    def deeps(busiest: int) -> float:  # the deeper at the least share of that count
        return deep(-(-max(total - busiest * others, deeper) // deeper))

    return _least_larger(shallow, deeps, 1, most_shallow)


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
