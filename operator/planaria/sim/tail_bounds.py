"""The tail side of the fresh-plan search's bounds: when a pipeline's stages reach their tail
and what follows there, per kind of pipeline (`step_bounds.Bounds` combines them per layout).

A stage of a whole plan reaches its tail when its pipeline alone does (`composition`), then
runs its buckets' all-reduces (each at least the ring of the bucket's bytes over the faster
link it may use), then, after the commit barrier, its optimizer step. Here, memoised:

- `Tails.kind_s`: the largest over a kind's stages (depth, micro-batches, first GPU within a
  node) of its arrival alone plus its waits plus its optimizer step, among `dp` pipelines of
  the depths present;
- `Tails.least_s`: at most `kind_s` of a pipeline of a depth running m micro-batches or more
  from any first GPU: per stage the least arrival (its run with every hop over a link no slower
  than either, when nodes have several GPUs). More micro-batches never make a stage arrive
  earlier: 1F1B's order of m + 1 micro-batches holds the order of m with ops added, and every
  time is a max and sum of the same costs over a larger graph, which is monotone in floats too
  (tests/sim/test_fresh.py checks the arrivals over m and the faster hops).

Not here: the barrier, the slack and the per-layout memos (`step_bounds`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

from planaria.contract import plan, profile
from planaria.planner import composition, distribution, estimator

Kind = tuple[int, int, int]
"""A distinct pipeline of a layout: its depth, micro-batches and first GPU within a node."""

Run = Callable[[int, int, int], composition.PipelineRun]
"""A kind's run alone (`fresh.Search._run`)."""


class Tails:
    """The tail parts of one job's bounds (module docstring); `split(depth)` is a depth's best
    split, asked only for depths that have one."""

    def __init__(
        self,
        prof: profile.Profile,
        gpus_per_node: int,
        split: Callable[[int], tuple[int, ...] | None],
    ) -> None:
        self.profile = prof
        self.gpus_per_node = gpus_per_node
        self.split = split
        self._kinds: dict[tuple[int, int, int, frozenset[int], int, bool], float] = {}
        self._least: dict[tuple[int, int, frozenset[int], int, bool], float] = {}
        self._arrivals: dict[tuple[int, int], tuple[float, ...]] = {}
        self._waits: dict[tuple[frozenset[int], int, int, bool], list[float]] = {}
        self._optimizers: dict[int, list[float]] = {}
        self._fast: profile.Profile | None = None

    def kind_s(self, kind: Kind, present: frozenset[int], dp: int, apart: bool, run: Run) -> float:
        """The largest of a kind's stages' arrival alone plus waits plus optimizer step, among
        `dp` pipelines of the depths `present` (0 at least; `apart`: every all-reduce is
        between nodes, `step_bounds.Bounds.apart`)."""
        key = (*kind, present, dp, apart)
        found = self._kinds.get(key)
        if found is None:
            arrivals = run(*kind).arrival_s
            found = self._kinds[key] = self._largest(arrivals, present, dp, kind[0], apart)
        return found

    def least_s(
        self,
        depth: int,
        num_micro_batches: int,
        present: frozenset[int],
        dp: int,
        apart: bool,
        run: Run,
    ) -> float:
        """At most `kind_s` of a pipeline of `depth` running `num_micro_batches` or more, from
        any first GPU within a node (module docstring)."""
        key = (depth, num_micro_batches, present, dp, apart)
        found = self._least.get(key)
        if found is None:
            arrivals = self._least_arrivals(depth, num_micro_batches, run)
            found = self._least[key] = self._largest(arrivals, present, dp, depth, apart)
        return found

    def fast_hops(self) -> profile.Profile:
        """The profile with both links the faster of each point-to-point term."""
        if self._fast is None:
            intra, inter = self.profile.intra_node, self.profile.inter_node
            link = profile.LinkProfile(
                bandwidth_bytes_per_s=max(intra.bandwidth_bytes_per_s, inter.bandwidth_bytes_per_s),
                latency_s=min(intra.latency_s, inter.latency_s),
            )
            self._fast = dataclasses.replace(self.profile, intra_node=link, inter_node=link)
        return self._fast

    def _largest(
        self,
        arrivals: tuple[float, ...],
        present: frozenset[int],
        dp: int,
        depth: int,
        apart: bool,
    ) -> float:
        waits = self._waits_of(present, dp, depth, apart)
        ends = zip(arrivals, waits, self._optimizers_of(depth), strict=True)
        return max([0.0, *(a + w + o for a, w, o in ends)])

    def _least_arrivals(self, depth: int, num_micro_batches: int, run: Run) -> tuple[float, ...]:
        """Per stage, at most the arrival of a pipeline of `depth` alone from any first GPU:
        its run alone (one-GPU nodes), else its run with every hop over the faster link."""
        key = (depth, num_micro_batches)
        if key not in self._arrivals:
            if self.gpus_per_node == 1:
                self._arrivals[key] = run(depth, num_micro_batches, 0).arrival_s
            else:
                workers = [plan.WorkerId(s) for s in range(depth)]
                alone = distribution.pipeline_of(self._split_of(depth), workers, num_micro_batches)
                self._arrivals[key] = composition.run_chain(alone, 1, self.fast_hops()).arrival_s
        return self._arrivals[key]

    def _waits_of(self, present: frozenset[int], dp: int, depth: int, apart: bool) -> list[float]:
        """Per stage of `depth`, its buckets' all-reduces one after another (one per bucket of
        layers with the same holders among `dp` pipelines of the depths `present`), in layer
        order, each over the faster link it may use."""
        key = (present, dp, depth, apart)
        if key not in self._waits:
            prof = self.profile
            cuts = sorted({c for d in present for c in itertools.accumulate(self._split_of(d))})
            reduce_s = {}  # seconds of each bucket's all-reduce, by its first layer
            for a, b in itertools.pairwise([0, *cuts]):
                gradient = sum(layer.gradient_bytes for layer in prof.layers[a:b])
                mine = links(prof, self.gpus_per_node, apart)
                reduce_s[a] = min(link.allreduce_s(gradient, dp) for link in mine)
            bounds = list(itertools.accumulate(self._split_of(depth), initial=0))
            self._waits[key] = [
                sum(reduce_s[c] for c in reduce_s if a <= c < b)
                for a, b in itertools.pairwise(bounds)
            ]
        return self._waits[key]

    def _optimizers_of(self, depth: int) -> list[float]:
        """Each stage's optimizer step of the depth's split."""
        if depth not in self._optimizers:
            cuts = itertools.accumulate(self._split_of(depth), initial=0)
            self._optimizers[depth] = [
                estimator.optimizer_s(self.profile, range(a, b), 1)
                for a, b in itertools.pairwise(cuts)
            ]
        return self._optimizers[depth]

    def _split_of(self, depth: int) -> tuple[int, ...]:
        split = self.split(depth)
        assert split is not None  # checked by the caller
        return split


def links(prof: profile.Profile, gpus_per_node: int, apart: bool) -> list[profile.LinkProfile]:
    """The links an all-reduce of one-GPU stages can use: between nodes, and within one when
    nodes have several GPUs and the layout's pipelines are not `apart`."""
    return [prof.inter_node] if gpus_per_node == 1 or apart else [prof.inter_node, prof.intra_node]
