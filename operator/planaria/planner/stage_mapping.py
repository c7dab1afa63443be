"""GPU-stage mapping (Oobleck §4.1.2), solved exactly: layers to stages, stages to GPUs.

The model. A template of n nodes with M GPUs each runs S stages (n <= S <= L). Every stage sits
on one node; the stages of a node are consecutive in the pipeline and share the node's M GPUs in
any split (k_1 + ... + k_q = M, each k at most the profile's widest timed stage), so every GPU
is used and every node holds at least one stage. Stage times (activation transfers included) and
memory come from `planaria.planner.stage_table`; the objective is T = T1 + T2 + T3 of eq. 1-4
with N_b = 4S while planning templates, or a given N_b.

Why not eq. 1-3's divide and conquer keeping one best result per sub-problem: T2 depends on the
slowest stage and its position, so the best half-pipeline need not be part of the best pipeline.
Exact reformulation: with c = t_{k*} the slowest stage time and N_b - S + 1 = a + b*S (a = 1,
b = 3 for N_b = 4S; a = N_b + 1, b = -1 for a given N_b), the closed form of T regroups as

    T = sum_{k<k*} (t_k + (1 + b) c)  +  (a + b) c  +  sum_{k>k*} (2 t_k + b c),

a sum of per-stage costs once c is fixed and each stage knows whether it is before, at or after
k*. Under a cap c the DP admits stages before k* with t < c (k* is the first argmax), the
bottleneck with t == c and stages after with t <= c, so every pipeline is counted exactly once,
at c = its slowest stage time: the minimum over the distinct stage times c is the exact optimum.
S leaves the state, entering only through b*c per stage, so all S in [n, L] are solved at once;
nodes are identical, so one DP pass up to the largest template answers every smaller one too.
The DP itself is `planaria.planner.stage_dp`.

Which caps: branch and bound over the sorted distinct stage times. Caps below the least possible
slowest stage (a min-max DP) are skipped; an interval of caps gets a lower bound from one relaxed
pass (stage_dp), or from T >= (a + b n) c without one; intervals whose bound reaches the best
exact value are dropped, others split until single caps, which are solved exactly. Passes are
vectorised over a batch of intervals, and every value is cached for all template sizes (the
paper's "the largest template's cache serves the rest"). The stage table is built once per profile.

Memory depth. Exact values need depth buckets up to the largest memory limit (in stages) that a
candidate pipeline could reach. While planning every stage costs at least 3c, so a pipeline that
beats the incumbent T has S < T / (3 lo) stages; limits beyond that need no bucket. An entry
solved with such a bound is exact below 3 lo (bound + 1) and re-solved if needed there.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np

from planaria.contract import errors
from planaria.planner import stage_dp, stage_table

_INF = math.inf
# Search tuning (speed only, never the result): intervals expanded per round once there is an
# incumbent (8, or up to 32 while their passes are cheap); element operations that cost about as
# much as one pass's fixed numpy overhead (a pass this cheap splits its interval more ways); the
# work under which one pass takes intervals of any stage length; float64 elements one batched
# pass may hold.
_ROUND_INTERVALS = (8, 32)
_PASS_OVERHEAD = 2_000_000
_CHEAP_CHUNK = 4 * _PASS_OVERHEAD
_BATCH_ELEMENTS = 4_000_000

Interval = tuple[int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class MappedStage:
    """Layers [layer_start, layer_stop) on GPUs [gpu_start, gpu_start + num_gpus) of the
    template's node `node` (0-based within the template); `time_s` is its stage time t."""

    layer_start: int
    layer_stop: int
    node: int
    gpu_start: int
    num_gpus: int
    time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMapping:
    """The best pipeline on `num_nodes` nodes: stages in pipeline order, planned for
    `planned_micro_batches` micro-batches (None: 4S, the planning default)."""

    num_nodes: int
    gpus_per_node: int
    stages: tuple[MappedStage, ...]
    planned_micro_batches: int | None = None

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def slowest_stage(self) -> int:
        """k*, the first slowest stage."""
        return stage_table.slowest_stage([s.time_s for s in self.stages])

    @property
    def planning_micro_batches(self) -> int:
        return self.planned_micro_batches or 4 * self.num_stages

    def iteration_time_s(self, num_micro_batches: int | None = None) -> float:
        """T of Oobleck eq. 1-4 with `num_micro_batches` (default: what it was planned for)."""
        n_b = self.planning_micro_batches if num_micro_batches is None else num_micro_batches
        return stage_table.pipeline_time_s([s.time_s for s in self.stages], n_b)


@dataclass(frozen=True, slots=True)
class _Entry:
    """Cached values of one cap interval for every template size. A single cap's value is
    exact below `exact_below`; above, it is only a lower bound (see the module docstring)."""

    values: stage_table.FloatArray
    exact_below: float


@dataclass(frozen=True, slots=True)
class _Found:
    """The best single cap for one template size, and the pass that solved it (if kept)."""

    cap: int
    value: float
    solved: tuple[stage_dp.Pass, int] | None


class MappingSearch:
    """Exact GPU-stage mapping for every template size up to `max_nodes`, sharing one cache.

    Memoises (not thread-safe); deterministic. Raises PlanInputError on bad sizes.
    """

    def __init__(
        self,
        table: stage_table.StageTable,
        *,
        gpus_per_node: int,
        max_nodes: int,
        num_micro_batches: int | None = None,
    ) -> None:
        if max_nodes < 1 or gpus_per_node < 1:
            raise errors.PlanInputError(
                f"nodes and GPUs per node must be >= 1 (got {max_nodes} and {gpus_per_node})"
            )
        if num_micro_batches is not None and num_micro_batches < 1:
            raise errors.PlanInputError(f"num_micro_batches must be >= 1 (got {num_micro_batches})")
        self.table = table
        self.gpus_per_node = gpus_per_node
        self.max_nodes = max_nodes
        self.num_micro_batches = num_micro_batches
        self._objective = stage_dp.Objective.of(num_micro_batches)
        self._depth_limit = stage_table.effective_depth(table.max_depth, num_micro_batches)
        self._relevant = stage_table.usable_times(
            table, self._depth_limit, gpus_per_node, max_nodes
        )
        self.caps = np.unique(self._relevant[np.isfinite(self._relevant)])
        self._sensitive = stage_table.depth_sensitivity(
            self._relevant, self._depth_limit, self._max_stages(max_nodes)
        )
        self._cache: dict[Interval, _Entry] = {}
        # No pipeline's slowest stage is faster than this: caps below it are never solved.
        self._floors = stage_dp.bottleneck_floor(self._relevant, gpus_per_node, max_nodes)

    def feasible(self) -> list[bool]:
        """feasible[n]: whether some n-node pipeline fits in memory (n = 0..max_nodes)."""
        fewest = stage_dp.fewest_stages(
            self._depth_limit, self.table.max_gpus, self.gpus_per_node, self.max_nodes
        )
        return [bool(np.isfinite(stages)) for stages in fewest]

    def map(self, num_nodes: int) -> StageMapping:
        """The minimum-T mapping on `num_nodes` nodes; raises InfeasibleError if none fits."""
        if not 1 <= num_nodes <= self.max_nodes:
            raise errors.PlanInputError(
                f"template of {num_nodes} nodes: give 1..{self.max_nodes} nodes to this search"
            )
        found = self._search(num_nodes)
        if found is None:
            raise errors.InfeasibleError(self.why_infeasible(num_nodes))
        result, entry = found.solved or self._solve(found, num_nodes)
        m = self.gpus_per_node
        stages = tuple(
            MappedStage(
                layer_start=s.start,
                layer_stop=s.stop,
                node=s.gpu // m,
                gpu_start=s.gpu % m,
                num_gpus=s.num_gpus,
                time_s=self.table.stage_time_s(s.start, s.stop, s.num_gpus, s.link),
            )
            for s in stage_dp.trace(result, entry, num_nodes, m)
        )
        for position, stage in enumerate(stages):
            depth = min(len(stages) - position, self.num_micro_batches or len(stages))
            assert self.table.fits(stage.layer_start, stage.layer_stop, stage.num_gpus, depth)
        return StageMapping(
            num_nodes=num_nodes,
            gpus_per_node=m,
            stages=stages,
            planned_micro_batches=self.num_micro_batches,
        )

    def _solve(self, found: _Found, n: int) -> tuple[stage_dp.Pass, int]:
        cap = float(self.caps[found.cap])
        depth = self._depth_needed(cap, self._stage_bound(found.value, cap, n))
        return self._run([(found.cap, found.cap + 1)], depth, n), 0

    # -- branch and bound over caps --------------------------------------------------------

    def _search(self, n: int) -> _Found | None:
        """The exact optimum for n nodes among all caps (None: no pipeline fits)."""
        if len(self.caps) == 0:
            return None
        found = None
        for (i, j), entry in sorted(self._cache.items()):
            bound = found.value if found else _INF
            if j == i + 1 and entry.values[n] < min(bound, entry.exact_below):
                found = _Found(i, float(entry.values[n]), None)
        heap: list[tuple[float, Interval]] = []
        pending = [(0, len(self.caps))]
        while pending:
            best = found.value if found else _INF
            solved = self._evaluate(pending, best, n)
            for interval in pending:
                best = found.value if found else _INF
                value = self._value(interval, n, best, solved)
                if value >= best:
                    continue
                if interval[1] - interval[0] == 1:
                    found = _Found(interval[0], value, solved.get(interval))
                else:
                    heapq.heappush(heap, (value, interval))
            pending = self._next_round(heap, found.value if found else _INF, n)
        return found

    def _next_round(
        self, heap: list[tuple[float, Interval]], best: float, n: int
    ) -> list[Interval]:
        # Dive one interval at a time until there is an incumbent to prune with.
        fewest, most = _ROUND_INTERVALS if best < _INF else (1, 1)
        batch: list[Interval] = []
        work = 0
        while heap and heap[0][0] < best and len(batch) < most:
            if len(batch) >= fewest and work >= 4 * _PASS_OVERHEAD:
                break
            interval = heapq.heappop(heap)[1]
            batch.append(interval)
            work += self._pass_work(float(self.caps[interval[1] - 1]), n)
        children = [child for interval in batch for child in self._split(interval, n)]
        return [child for child in children if self._floor(child, n) < best]

    def _floor(self, interval: Interval, n: int) -> float:
        """A bound without a pass: the slowest stage c is at least lo and the bottleneck floor
        (inf: no pipeline has its slowest stage in the interval), and while planning S >= n
        stages each cost at least b c and the bottleneck (a + b) c; so T >= (a + b n) c."""
        if float(self.caps[interval[1] - 1]) < self._floors[n]:
            return _INF
        a, b = self._objective.a, self._objective.b
        c = max(float(self.caps[interval[0]]), self._floors[n])
        return (a + b * n) * c if b > 0 else -_INF

    def _value(
        self,
        interval: Interval,
        n: int,
        best: float,
        solved: dict[Interval, tuple[stage_dp.Pass, int]],
    ) -> float:
        """The interval's bound for n nodes; a single cap's value is re-solved with more depth
        buckets when the cached one may count pipelines too deep for memory."""
        entry = self._cache[interval]
        value = float(entry.values[n])
        if entry.exact_below <= value < best:
            del self._cache[interval]
            solved.update(self._evaluate([interval], best, n))
            value = float(self._cache[interval].values[n])
        return value

    def _evaluate(
        self, intervals: list[Interval], best: float, n: int
    ) -> dict[Interval, tuple[stage_dp.Pass, int]]:
        """Fill the cache for `intervals` and templates of up to n nodes; returns the passes
        that solved single caps."""
        missing = [iv for iv in dict.fromkeys(intervals) if not self._cached(iv, n)]
        depths = {iv: self._depth_of(iv, best, n) for iv in missing}
        solved = {}
        for depth in sorted(set(depths.values())):
            group = [iv for iv in missing if depths[iv] == depth]
            for chunk in self._chunks(group, depth, n):
                result = self._run(chunk, depth, n)
                for index, interval in enumerate(chunk):
                    lo = float(self.caps[interval[0]])
                    bound = self._exact_below(self._stage_bound(best, lo, n), lo, n)
                    values = np.full(self.max_nodes + 1, math.nan)
                    values[: n + 1] = result.final[index]
                    self._cache[interval] = _Entry(values, bound)
                    if interval[1] - interval[0] == 1:
                        solved[interval] = (result, index)
        return solved

    def _cached(self, interval: Interval, n: int) -> bool:
        entry = self._cache.get(interval)
        return entry is not None and not math.isnan(entry.values[n])

    def _depth_of(self, interval: Interval, best: float, n: int) -> int:
        """Depth buckets for an interval: one for bounds, enough for exactness for a cap."""
        i, j = interval
        if j - i > 1:
            return 1
        cap = float(self.caps[i])
        return self._depth_needed(cap, self._stage_bound(best, cap, n))

    def _run(self, intervals: list[Interval], depth: int, n: int) -> stage_dp.Pass:
        """One DP pass over `intervals` for templates of up to n nodes."""
        lo = np.array([self.caps[i] for i, _ in intervals])
        hi = np.array([self.caps[j - 1] for _, j in intervals])
        exact = np.array([j - i == 1 for i, j in intervals])
        band = _band(self._relevant, float(hi.max()))
        costs = stage_dp.costs(
            self.table, self._depth_limit, (lo, hi, exact), self._objective, depth=depth, band=band
        )
        return stage_dp.forward(costs, self.table.num_layers, self.gpus_per_node, n)

    def _split(self, interval: Interval, n: int) -> list[Interval]:
        """Children of an interval: two, or more when one pass over it is cheap."""
        i, j = interval
        work = self._pass_work(float(self.caps[j - 1]), n)
        parts = max(2, min(j - i, 32, _PASS_OVERHEAD // max(work, 1)))
        cuts = [i + (j - i) * p // parts for p in range(parts + 1)]
        return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]

    def _pass_work(self, hi: float, n: int) -> int:
        """Element operations of one DP pass for one interval with cap `hi` (an estimate)."""
        m, widest = self.gpus_per_node, self.table.max_gpus
        stages_per_gpu = sum(min(widest, m - r) for r in range(m)) / m
        band = _band(self._relevant, hi)
        return int(3 * n * m * stages_per_gpu * self.table.num_layers * band)

    def _chunks(self, group: list[Interval], depth: int, n: int) -> list[list[Interval]]:
        """Batches of intervals for one pass each: similar stage lengths (a pass costs as much
        as its longest) unless the whole batch is cheap, and state and cost arrays within
        _BATCH_ELEMENTS."""
        chunks: list[list[Interval]] = []
        first_band = 0
        for interval in sorted(group, key=lambda iv: (iv[1], iv[0])):
            hi = float(self.caps[interval[1] - 1])
            band = _band(self._relevant, hi)
            if chunks and self._joins(chunks[-1], hi, band <= 2 * first_band, depth, n):
                chunks[-1].append(interval)
            else:
                chunks.append([interval])
                first_band = max(band, 2)
        return chunks

    def _joins(self, chunk: list[Interval], hi: float, similar: bool, depth: int, n: int) -> bool:
        """Whether an interval with cap `hi` joins `chunk`: it fits, and its stage lengths are
        similar or the whole chunk stays cheap."""
        band = _band(self._relevant, hi)
        if len(chunk) >= self._batch_size(band, depth, n):
            return False
        return similar or (len(chunk) + 1) * self._pass_work(hi, n) <= _CHEAP_CHUNK

    def _batch_size(self, band: int, depth: int, n: int) -> int:
        """Intervals per pass so that its state and cost arrays stay within _BATCH_ELEMENTS."""
        layers = self.table.num_layers
        states = 2 * (n * self.gpus_per_node + 1) * depth * (layers + 1 + band)
        costs = 3 * len(stage_table.Link) * self.table.max_gpus * (layers + 1) * band
        return max(1, _BATCH_ELEMENTS // (states + costs))

    # -- memory depth --------------------------------------------------------------------------

    def _max_stages(self, n: int) -> int:
        return min(self.table.num_layers, n * self.gpus_per_node)

    def _stage_bound(self, best: float, lo: float, n: int) -> int:
        """Most stages an n-node pipeline that beats `best` can have: while planning each stage
        costs at least b * c >= b * lo, so S < best / (b * lo)."""
        b = self._objective.b
        if b <= 0 or lo <= 0 or not math.isfinite(best):
            return self._max_stages(n)
        return min(self._max_stages(n), math.floor(best / (b * lo)))

    def _exact_below(self, bound: int, lo: float, n: int) -> float:
        if bound >= self._max_stages(n):
            return _INF
        return self._objective.b * lo * (bound + 1)

    def _depth_needed(self, hi: float, stage_bound: int) -> int:
        """Buckets that tell apart every memory limit below `stage_bound` among the stages no
        slower than `hi`: 1 + the largest such limit."""
        times, limits = self._sensitive
        limits = limits[: int(np.searchsorted(times, hi, side="right"))]
        limits = limits[limits < stage_bound]
        return 1 + int(limits.max()) if limits.size else 1

    def why_infeasible(self, n: int) -> str:
        """Why no pipeline fits on n nodes, and what would fix it (one clause)."""
        fewest = n * max(1, math.ceil(self.gpus_per_node / self.table.max_gpus))
        if fewest > self.table.num_layers:
            return (
                f"a pipeline on {n} node(s) needs at least {fewest} stages (every node holds a "
                f"stage of at most {self.table.max_gpus} GPU(s)) but the model has only "
                f"{self.table.num_layers} layers; use fewer nodes per pipeline"
            )
        return (
            f"no pipeline on {n} node(s) fits in {self.table.memory_bytes / 2**30:.3g} GiB per "
            "GPU; use more nodes per pipeline, GPUs with more memory, or a smaller micro-batch"
        )


def _band(relevant: stage_table.FloatArray, hi: float) -> int:
    """The most layers a stage can hold under cap `hi`."""
    hits = np.flatnonzero((relevant <= hi).any(axis=(0, 1, 2)))
    return int(hits[-1]) + 1 if hits.size else 1
