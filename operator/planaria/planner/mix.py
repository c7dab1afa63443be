"""The best template mix without enumerating instantiations (Oobleck §4.2 at cluster scale).

Problem. Template sizes s with affine pipeline costs T_s(k) = a_s + c_s k (`batching`), N
nodes, at least f + 1 pipelines, M = B / b micro-batches. An instantiation x (x_s pipelines of
size s, sum s x_s = N) runs in the makespan of its exact batch distribution (Oobleck eq. 6 as
`batching.distribute` solves it); the plan choice (§4.2.2) maximises B / makespan, ties to
fewer pipelines, then to larger templates first. Eq. 5 enumerates every x: at 64 nodes of 34
sizes that is 1.7 million, at 1,024 nodes about 10^27.

Parametric knapsack, exact. Let cap_s(T) = #{k in 1..M : T_s(k) <= T}, the micro-batches a
pipeline of size s can run within T. The greedy of `batching` hands out the M cheapest slots,
one per pipeline first, so an instantiation's makespan is <= T iff every pipeline has
cap_s(T) >= 1, it has at most M pipelines, and sum x_s cap_s(T) >= M. Hence

    best makespan T* = min { T : max_x sum_s x_s cap_s(T) >= M },  x over sum s x_s = N,
                                                                f + 1 <= sum x_s <= M,

a monotone test in T: an unbounded knapsack with exact fill, solved by a DP over nodes with
the pipeline count as a layer (counts >= f + 1 share one layer unless the M bound can bind).
T* is one of the slot values T_s(k), so a bisection over T that stops when (lo, hi] holds a
single distinct slot value finds it exactly, in the same float arithmetic as `batching`.

Ties, exact as well. Every x whose throughput equals the best (makespan T* or a slot value
with the same B / T in floats) is feasible at the largest such T, and no other x is. Among
them: the fewest pipelines p* (the first count layer that reaches M), then larger templates
first, i.e. the lexicographically largest count vector read from the largest size down,
chosen greedily: each x_s is the largest count with which the smaller sizes can still
complete exactly N nodes, p* pipelines and M micro-batches (tables per prefix of sizes).
So the result is the very instantiation that ranking every enumerated x would choose;
tests/planner/test_mix.py checks it against that enumeration.

Cost: O(log(range) * L * |S| * N) integer work for the bisection (L = f + 2 layers, or M + 1
when M < N / n0 so that the pipeline-count bound can bind) plus O(p* * |S| * N) time and
memory for the tie tables, numpy-vectorised over nodes.

Not here: evaluating and placing the chosen mix (`instantiation`), the costs (`batching`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from planaria.planner import batching

Table = npt.NDArray[np.int64]
Compact = npt.NDArray[np.signedinteger[Any]]
# Unreachable states; any state reached from one stays below zero (N * M << 2**50).
_UNREACHABLE = -(2**50)

Counts = tuple[tuple[int, int], ...]


def best_counts(
    costs: Sequence[tuple[int, batching.PipelineCost]],
    *,
    num_nodes: int,
    min_pipelines: int,
    global_batch: int,
    micro_batch_size: int,
) -> Counts | None:
    """The best instantiation as (template size, pipelines) pairs, largest size first, zero
    counts left out; None when no instantiation can take the global batch. `costs` pairs each
    template size with its pipeline cost. See the module docstring for the objective."""
    if global_batch % micro_batch_size or not costs:
        return None
    search = _Search(costs, num_nodes, min_pipelines, global_batch // micro_batch_size)
    top = search.slot_bound()
    if not search.feasible(top):
        return None
    best = search.tie_threshold(search.least_feasible(top), global_batch)
    return search.lexicographic_best(best)


def count_instantiations(sizes: Sequence[int], num_nodes: int, min_pipelines: int) -> int:
    """How many instantiations eq. 5 would list: count vectors over the sizes using exactly
    num_nodes nodes with at least min_pipelines pipelines (exact, Python integers)."""
    ordered = sorted(set(sizes))
    # ways[j][n]: vectors on n nodes with min(pipelines, min_pipelines) == j
    ways = [[0] * (num_nodes + 1) for _ in range(min_pipelines + 1)]
    ways[0][0] = 1
    for s in ordered:
        for n in range(s, num_nodes + 1):
            for j in range(min_pipelines, 0, -1):
                ways[j][n] += ways[j - 1][n - s] + (ways[j][n - s] if j == min_pipelines else 0)
    return ways[min_pipelines][num_nodes]


def fewest_pipelines(sizes: Sequence[int], num_nodes: int, min_pipelines: int) -> int | None:
    """The fewest pipelines (at least min_pipelines) of the given sizes that use exactly
    num_nodes nodes, or None when there is no such instantiation."""
    fill = _exact_fill(sorted(set(sizes)), num_nodes)
    layer = [p for p in range(min_pipelines, num_nodes + 1) if fill[p]]
    return layer[0] if layer else None


def _exact_fill(sizes: Sequence[int], num_nodes: int) -> list[bool]:
    """reach[p]: some p pipelines of the given sizes use exactly num_nodes nodes."""
    reach = np.zeros(num_nodes + 1, dtype=bool)
    reach[0] = True
    found = [num_nodes == 0]
    for _ in range(num_nodes):
        step = np.zeros_like(reach)
        for s in sizes:
            if s <= num_nodes:
                step[s:] |= reach[:-s]
        reach = step
        found.append(bool(reach[num_nodes]))
        if not reach.any():
            break
    return found + [False] * (num_nodes + 1 - len(found))


class _Search:
    """One problem instance: sizes ascending, their costs as arrays, N, f + 1 and M."""

    def __init__(
        self,
        costs: Sequence[tuple[int, batching.PipelineCost]],
        num_nodes: int,
        min_pipelines: int,
        num_micro_batches: int,
    ) -> None:
        ordered = sorted(costs, key=lambda pair: pair[0])
        self.sizes = [s for s, _ in ordered if s <= num_nodes]
        kept = [c for s, c in ordered if s <= num_nodes]
        self.fixed = np.array([c.fixed_s for c in kept], dtype=np.float64)
        self.slope = np.array([c.per_micro_batch_s for c in kept], dtype=np.float64)
        self.num_nodes = num_nodes
        self.min_pipelines = min_pipelines
        self.m = num_micro_batches
        # Counts beyond M cannot take the batch; the bound binds only if N / n0 exceeds M.
        self.max_pipelines = min(self.m, num_nodes // min(self.sizes)) if self.sizes else 0
        self.count_binds = bool(self.sizes) and num_nodes // min(self.sizes) > self.m

    # -- slots -------------------------------------------------------------------------------

    def caps(self, threshold: float) -> npt.NDArray[np.int64]:
        """cap_s(T) per size, computed with batching.PipelineCost.time_s's arithmetic."""
        k = np.zeros(len(self.sizes), dtype=np.int64)
        for i in range(len(self.sizes)):
            k[i] = self._cap(i, threshold)
        return k

    def _cap(self, i: int, threshold: float) -> int:
        a, c = float(self.fixed[i]), float(self.slope[i])
        if c == 0:
            return self.m if a <= threshold else 0
        room = (threshold - a) / c
        k = 0 if room < 1 else self.m if room >= self.m else int(room)
        # the division may round either way: settle k on time_s itself
        while k < self.m and a + c * (k + 1) <= threshold:
            k += 1
        while k > 0 and a + c * k > threshold:
            k -= 1
        return k

    def slot_bound(self) -> float:
        """The largest slot value: every pipeline can run M micro-batches within it."""
        return float(np.max(self.fixed + self.slope * float(self.m))) if self.sizes else 0.0

    def _slot(self, i: int, k: int) -> float:
        return float(self.fixed[i]) + float(self.slope[i]) * k

    # -- feasibility -------------------------------------------------------------------------

    def feasible(self, threshold: float) -> bool:
        """Some instantiation has makespan <= threshold (module docstring)."""
        caps = self.caps(threshold)
        if self.count_binds:
            layers = self._layers(caps)[self.min_pipelines :]
            return any(layer[self.num_nodes] >= self.m for layer in layers)
        layers = self._layers(caps, last=self.min_pipelines)
        closed = layers[-1]
        for s, cap in zip(self.sizes, caps, strict=True):
            if cap > 0:
                closed = _unbounded(closed, s, int(cap), self.m)
        return bool(closed[self.num_nodes] >= self.m)

    def _layers(
        self, caps: npt.NDArray[np.int64], last: int | None = None, stop_at_m: bool = False
    ) -> list[Table]:
        """V_p[n] = most micro-batches (clipped at M) of exactly p pipelines on n nodes, for
        p = 0..last (default: max_pipelines); only layers p >= f + 1 count as answers. With
        stop_at_m, stops at the first answer layer reaching M at N."""
        top = self.max_pipelines if last is None else last
        first = np.full(self.num_nodes + 1, _UNREACHABLE, dtype=np.int64)
        first[0] = 0
        layers = [first]
        for p in range(1, top + 1):
            layers.append(_one_more(layers[-1], self.sizes, caps, self.m))
            answer = p >= self.min_pipelines and layers[-1][self.num_nodes] >= self.m
            if stop_at_m and answer:
                break
        return layers

    def least_feasible(self, top: float) -> float:
        """T*: the least slot value at which feasible() holds, given that it holds at top."""
        lo, hi = -math.inf, top
        while True:
            between = self._distinct_slots(lo, hi)
            if between <= 1:
                return hi if between == 0 else self._least_slot_above(lo)
            mid = self._least_slot_above(lo) if lo == -math.inf else (lo + hi) / 2
            if not lo < mid < hi:
                return self._least_slot_above(lo)
            if self.feasible(mid):
                hi = mid
            else:
                lo = mid

    def _distinct_slots(self, lo: float, hi: float) -> int:
        """How many distinct slot values lie in (lo, hi]: 0, 1 or 2 (meaning more)."""
        low = self.caps(lo) if lo != -math.inf else np.zeros(len(self.sizes), dtype=np.int64)
        high = self.caps(hi)
        values: set[float] = set()
        for i in range(len(self.sizes)):
            if high[i] > low[i]:
                values.add(self._slot(i, int(low[i]) + 1))
                values.add(self._slot(i, int(high[i])))
            if len(values) > 1:
                return 2
        return len(values)

    def _least_slot_above(self, threshold: float) -> float:
        low = self.caps(threshold) if threshold != -math.inf else [0] * len(self.sizes)
        slots = [self._slot(i, int(k) + 1) for i, k in enumerate(low) if k < self.m]
        return min(slots)

    def tie_threshold(self, best: float, global_batch: int) -> float:
        """The largest slot value whose throughput B / T equals that of `best` in floats
        (the ranking compares throughputs): every instantiation feasible there ties."""
        target = _throughput(global_batch, best)
        current = best
        while True:
            caps = self.caps(current)
            above = [self._slot(i, int(k) + 1) for i, k in enumerate(caps) if k < self.m]
            if not above or _throughput(global_batch, min(above)) != target:
                return current
            current = min(above)

    # -- ties --------------------------------------------------------------------------------

    def lexicographic_best(self, threshold: float) -> Counts:
        """Among instantiations feasible at threshold: fewest pipelines, then the largest
        count vector read from the largest size down (module docstring)."""
        caps = self.caps(threshold)
        layers = self._layers(caps, stop_at_m=True)
        p_star = len(layers) - 1
        assert layers[-1][self.num_nodes] >= self.m, "threshold must be feasible"
        prefix = self._prefix_tables(caps, p_star)
        n, p, need = self.num_nodes, p_star, self.m
        counts = []
        for k in range(len(self.sizes) - 1, -1, -1):
            s, cap, rest = self.sizes[k], int(caps[k]), prefix[k]
            x = 0
            if cap > 0:
                x = min(p, n // s)
                while x > 0 and rest[p - x][n - x * s] < max(0, need - x * cap):
                    x -= 1
            if x:
                counts.append((s, x))
            n, p, need = n - x * s, p - x, need - x * cap
        assert n == 0 and p == 0 and need <= 0, "the prefix tables admit the greedy's choice"
        return tuple(counts)

    def _prefix_tables(self, caps: npt.NDArray[np.int64], p_star: int) -> list[Compact]:
        """prefix[k][p][n]: most micro-batches (clipped at M) of exactly p pipelines of the k
        smallest sizes on exactly n nodes; below zero if impossible."""
        current = np.full((p_star + 1, self.num_nodes + 1), _UNREACHABLE, dtype=np.int64)
        current[0][0] = 0
        # compact copies for the greedy's lookups, -1 for unreachable: int32 (half the bytes)
        # whenever M fits
        compact: type[np.signedinteger[Any]] = np.int32 if self.m < 2**31 - 1 else np.int64
        prefix: list[Compact] = [np.maximum(current, -1).astype(compact)]
        for s, cap in zip(self.sizes, caps, strict=True):
            if cap > 0:
                for p in range(1, p_star + 1):
                    # unbounded in this size: one more pipeline of size s on top of row p - 1
                    np.maximum(current[p, s:], current[p - 1, :-s] + int(cap), out=current[p, s:])
                np.minimum(current, self.m, out=current)
                prefix.append(np.maximum(current, -1).astype(compact))
            else:
                prefix.append(prefix[-1])
        return prefix


def _one_more(layer: Table, sizes: Sequence[int], caps: npt.NDArray[np.int64], m: int) -> Table:
    """Exactly one more pipeline of any usable size on top of `layer`."""
    out = np.full_like(layer, _UNREACHABLE)
    for s, cap in zip(sizes, caps, strict=True):
        if cap > 0 and s < len(layer):
            np.maximum(out[s:], layer[:-s] + int(cap), out=out[s:])
    np.minimum(out, m, out=out)
    return out


def _unbounded(layer: Table, size: int, cap: int, m: int) -> Table:
    """Any number (>= 0) of extra pipelines of one size on top of `layer`: along each residue
    class n = r + j*size, new[j] = max_{i <= j} (layer[i] + (j - i) cap), a running maximum of
    layer[i] - i cap plus j cap."""
    length = len(layer)
    rows = -(-length // size)
    padded = np.full(rows * size, _UNREACHABLE, dtype=np.int64)
    padded[:length] = layer
    grid = padded.reshape(rows, size)
    steps = np.arange(rows, dtype=np.int64)[:, None] * cap
    best = np.maximum.accumulate(grid - steps, axis=0) + steps
    return np.minimum(best.reshape(-1)[:length], m)


def _throughput(global_batch: int, makespan: float) -> float:
    """As batching.Distribution.throughput."""
    return global_batch / makespan if makespan > 0 else math.inf
