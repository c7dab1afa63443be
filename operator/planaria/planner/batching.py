"""Batch distribution (Oobleck §4.2.2, eq. 6): micro-batches per pipeline, summing to the
global batch, so that heterogeneous pipelines finish together.

Objective. Eq. 6 minimises the spread of the pipelines' times; what limits throughput is the
slowest pipeline, since every pipeline waits for the others at the gradient all-reduce. We
minimise the slowest pipeline's time (the makespan), and plan choice maximises global batch /
makespan, so distribution and choice use the same objective. A pipeline's time with N_b
micro-batches is T(N_b) = a + c N_b from the closed form of eq. 1-4 (`stage_table`): c is its
slowest stage time, a the rest. Every pipeline gets at least one micro-batch (a pipeline with
none would hold GPUs and do nothing).

Exact method: min max_i (a_i + c_i N_i) with sum N_i = B / b, N_i >= 1 is solved by handing out
micro-batches one at a time to the pipeline whose time after taking it is least: each pipeline's
successive "slots" a_i + c_i n grow with n, so the greedy takes the B / b cheapest slots, and no
distribution can have a smaller largest slot. To avoid B / b heap steps, the greedy starts from
"every slot up to a threshold" (found by bisection), a state it would pass through; the start is
checked and dropped if float rounding broke that property. Pipelines of one template share a
cost: listed as runs of one cost object (~1,000 pipelines in two runs at 1,024 nodes), the
greedy runs once per group of equal costs and the answer is built run by run (`_Runs`), the
same micro-batches and times as pipeline by pipeline.

A global batch that is not a multiple of the micro-batch size, or smaller than one micro-batch
per pipeline, cannot be distributed: UndistributableBatchError names the nearest global batch
that can, and nothing is changed silently.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planaria.contract import errors
from planaria.planner import stage_mapping, stage_table


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineCost:
    """T(N_b) = fixed_s + per_micro_batch_s * N_b for one pipeline (seconds)."""

    fixed_s: float
    per_micro_batch_s: float

    def time_s(self, num_micro_batches: int) -> float:
        return self.fixed_s + self.per_micro_batch_s * num_micro_batches


@dataclass(frozen=True, slots=True, kw_only=True)
class Distribution:
    """Micro-batches per pipeline (in the order given) and the resulting times."""

    micro_batches: tuple[int, ...]
    pipeline_times_s: tuple[float, ...]

    @property
    def iteration_time_s(self) -> float:
        """The makespan: the slowest pipeline's time."""
        return max(self.pipeline_times_s)

    def throughput(self, global_batch: int) -> float:
        """Samples per second."""
        return global_batch / self.iteration_time_s if self.iteration_time_s > 0 else math.inf


class UndistributableBatchError(errors.InfeasibleError):
    """The global batch cannot be split into whole micro-batches, at least one per pipeline;
    `recommended_global_batch` is the nearest one that can."""

    def __init__(self, message: str, recommended_global_batch: int) -> None:
        super().__init__(message)
        self.recommended_global_batch = recommended_global_batch


def pipeline_cost(mapping: stage_mapping.StageMapping) -> PipelineCost:
    """The linear form of eq. 1-4's T in N_b for a mapped pipeline."""
    times = [stage.time_s for stage in mapping.stages]
    slowest = stage_table.slowest_stage(times)
    # T(N_b) = sum t + (N_b - S + k* - 1) t_k* + sum_{k >= k*} t_k  (stage_table docstring)
    fixed = sum(times) + (slowest - len(times) - 1) * times[slowest] + sum(times[slowest:])
    return PipelineCost(fixed_s=fixed, per_micro_batch_s=times[slowest])


def check_distributable(num_pipelines: int, global_batch: int, micro_batch_size: int) -> None:
    """Raise UndistributableBatchError unless global_batch is a multiple of micro_batch_size
    with at least one micro-batch per pipeline."""
    if num_pipelines < 1 or micro_batch_size < 1:
        raise errors.PlanInputError("need at least one pipeline and a micro-batch size >= 1")
    smallest = num_pipelines * micro_batch_size
    if global_batch < smallest:
        raise UndistributableBatchError(
            f"global batch {global_batch} is less than one micro-batch of {micro_batch_size} for "
            f"each of {num_pipelines} pipelines; the nearest distributable global batch is "
            f"{smallest}",
            smallest,
        )
    if global_batch % micro_batch_size:
        lower = global_batch - global_batch % micro_batch_size
        upper = lower + micro_batch_size
        nearest = (
            upper if lower < smallest or upper - global_batch <= global_batch - lower else lower
        )
        raise UndistributableBatchError(
            f"global batch {global_batch} is not a multiple of the micro-batch size "
            f"{micro_batch_size}; the nearest distributable global batch is {nearest}",
            nearest,
        )


def distribute(
    costs: Sequence[PipelineCost], global_batch: int, micro_batch_size: int
) -> Distribution:
    """Micro-batches per pipeline minimising the slowest pipeline's time (module docstring).

    Raises UndistributableBatchError (with the nearest distributable global batch) when
    global_batch is not a multiple of micro_batch_size or gives fewer micro-batches than
    pipelines.
    """
    check_distributable(len(costs), global_batch, micro_batch_size)
    total = global_batch // micro_batch_size
    runs = _Runs.of(costs)
    if runs is not None:
        return runs.distribute(total)
    counts = _jump_start(costs, total)
    _hand_out(costs, counts, total - sum(counts))
    return Distribution(
        micro_batches=tuple(counts),
        pipeline_times_s=tuple(cost.time_s(n) for cost, n in zip(costs, counts, strict=True)),
    )


# Runs of one cost object looked for at most (beyond this pipeline by pipeline is cheaper).
_MAX_RUNS = 32


class _Runs:
    """The pipelines as runs of one cost object (callers list pipelines of one template
    together: ~1,000 pipelines in two or three runs), their costs grouped by value: the
    greedy with one bisection term, heap entry and slot count per group, and the answer
    built run by run. The same micro-batches and times as pipeline by pipeline (`_jump_start`,
    `_hand_out`, the oracle in tests/planner/test_batching_runs.py). Only for finite costs
    that grow with every micro-batch: then equal costs give equal times (a zero's sign cannot
    show) and each pipeline's slots grow, so the heap's pops are a sorted merge."""

    __slots__ = ("costs", "first", "runs", "sizes")

    def __init__(self, runs: list[tuple[int, int, PipelineCost]]) -> None:
        group: dict[PipelineCost, int] = {}
        # (start, length, group) of each run, in order; groups in order of first use
        self.runs = [(start, length, group.setdefault(c, len(group))) for start, length, c in runs]
        self.costs = list(group)  # distinct by value, in order of first use (Counter's keys)
        self.sizes = [0] * len(group)
        self.first = [-1] * len(group)  # each group's lowest pipeline
        for start, length, g in self.runs:
            self.sizes[g] += length
            self.first[g] = start if self.first[g] < 0 else self.first[g]

    @classmethod
    def of(cls, costs: Sequence[PipelineCost]) -> _Runs | None:
        """The runs of `costs`, or None when there are many or a cost does not qualify."""
        runs: list[tuple[int, int, PipelineCost]] = []
        start = 0
        while start < len(costs):
            if len(runs) == _MAX_RUNS:
                return None
            cost = costs[start]
            if not (math.isfinite(cost.fixed_s) and 0 < cost.per_micro_batch_s < math.inf):
                return None
            stop = _run_end(costs, start)
            runs.append((start, stop - start, cost))
            start = stop
        return cls(runs)

    def distribute(self, total: int) -> Distribution:
        """`distribute`'s answer: `_jump_start` then `_hand_out`, by group."""
        base = self._jump_start(total)
        remaining = total - sum(size * n for size, n in zip(self.sizes, base, strict=True))
        level, tied = self._hand_out(base, remaining) if remaining > 0 else (base, {})
        taken = sum(size * n for size, n in zip(self.sizes, level, strict=True))
        return self._answer(level, tied, total - taken)

    def _jump_start(self, total: int) -> list[int]:
        """`_jump_start` per group: each group's count at the threshold."""
        ones = [1] * len(self.costs)
        if total <= 2 * sum(self.sizes):
            return ones
        lo = max(cost.time_s(1) for cost in self.costs)
        hi = max(cost.time_s(total) for cost in self.costs)
        terms = [
            (c.fixed_s, c.per_micro_batch_s, n) for c, n in zip(self.costs, self.sizes, strict=True)
        ]
        for step in range(100):
            mid = (lo + hi) / 2
            if not lo < mid < hi:
                break
            counts = _counts_at(terms, mid, total)
            taken = sum(size * n for (_, _, size), n in zip(terms, counts, strict=True))
            lo, hi = (mid, hi) if taken <= total else (lo, mid)
            # the bisection ends at some threshold in [lo, hi), where every group's count is
            # that at lo once the counts at lo and at the float below hi agree (each grows
            # with the threshold): what follows is only read through those counts
            if step % 4 == 3 and _counts_at(terms, lo, total) == _counts_at(
                terms, math.nextafter(hi, -math.inf), total
            ):
                break
        counts = _counts_at(terms, lo, total)
        fits = sum(size * n for size, n in zip(self.sizes, counts, strict=True)) <= total
        return counts if fits and _is_cheapest_set(self.costs, counts) else ones

    def _hand_out(self, base: list[int], remaining: int) -> tuple[list[int], dict[int, int]]:
        """`_hand_out`'s heap takes the `remaining` cheapest slots in (time, pipeline) order:
        whole levels of slots of one time, every pipeline of a group at once, in time order,
        up to the level that is more than is left. Returns each group's slots below that
        level and the level's slots per pipeline of each group in it (a pipeline's next slot
        may cost the same after rounding)."""
        level = list(base)
        heap = [(c.time_s(n + 1), g) for g, (c, n) in enumerate(zip(self.costs, base, strict=True))]
        heapq.heapify(heap)
        while remaining:
            time_s, tied = heap[0][0], {}
            while heap and heap[0][0] == time_s:
                g = heapq.heappop(heap)[1]
                n = level[g] + 1
                # (past `remaining` slots the level is more than is left whatever its size)
                while n - level[g] < remaining and self.costs[g].time_s(n + 1) == time_s:
                    n += 1
                tied[g] = n - level[g]
            wanted = sum(self.sizes[g] * m for g, m in tied.items())
            if wanted > remaining:
                return level, tied
            remaining -= wanted
            for g, m in tied.items():
                level[g] += m
                heapq.heappush(heap, (self.costs[g].time_s(level[g] + 1), g))
        return level, {}

    def _answer(self, level: list[int], tied: dict[int, int], left: int) -> Distribution:
        """Every pipeline at its group's level, plus the tied level's slots to the pipelines
        of the tied groups in index order (each all its slots of that time) until `left` are
        given; built run by run."""
        counts: list[int] = []
        times: list[float] = []
        for _, length, g in self.runs:
            parts = [(level[g], length)]
            if left and g in tied:
                m = tied[g]
                full = min(length, left // m)
                part = min(left - full * m, m) if full < length else 0
                left -= full * m + part
                rest = length - full - (1 if part else 0)
                parts = [
                    (level[g] + m, full),
                    (level[g] + part, 1 if part else 0),
                    (level[g], rest),
                ]
            for n, k in parts:
                counts += [n] * k
                times += [self.costs[g].time_s(n)] * k
        return Distribution(micro_batches=tuple(counts), pipeline_times_s=tuple(times))


def _run_end(costs: Sequence[PipelineCost], start: int) -> int:
    """The end of the run of `costs[start]` (the first later index holding another object):
    galloping, then checked whole (a C-speed count; identity decides it)."""
    cost, lo, step = costs[start], start, 1  # costs[lo] is cost
    while lo + step < len(costs) and costs[lo + step] is cost:
        lo, step = lo + step, step * 2
    hi = min(lo + step, len(costs))  # costs[hi] is not cost (or the end)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if costs[mid] is cost else (lo, mid)
    # the run [start, hi) holds only `cost` unless an equal object sits inside: still one
    # group (equal costs with positive slopes time alike); anything else cuts the run short
    if list(costs[start:hi]).count(cost) == hi - start:
        return hi
    return next(i for i in range(start + 1, hi) if costs[i] is not cost and costs[i] != cost)


def _hand_out(costs: Sequence[PipelineCost], counts: list[int], remaining: int) -> None:
    """The greedy: each next micro-batch to the pipeline whose next slot is cheapest (ties to
    the lower index)."""
    if remaining <= 0:
        return
    flat = [i for i, cost in enumerate(costs) if cost.per_micro_batch_s == 0]
    if flat:
        # A pipeline whose time does not grow takes every remaining micro-batch for free.
        counts[min(flat, key=lambda i: (costs[i].fixed_s, i))] += remaining
        return
    heap = [(cost.time_s(counts[i] + 1), i) for i, cost in enumerate(costs)]
    heapq.heapify(heap)
    for _ in range(remaining):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, (costs[i].time_s(counts[i] + 1), i))


def _jump_start(costs: Sequence[PipelineCost], total: int) -> list[int]:
    """Counts holding every slot up to a threshold (at least one each), at most `total` in all;
    one per pipeline if rounding makes the threshold state doubtful."""
    ones = [1] * len(costs)
    if any(cost.per_micro_batch_s == 0 for cost in costs) or total <= 2 * len(costs):
        return ones
    # pipelines of one template share a cost: bisect over the distinct costs, each counted as
    # often as it occurs (the same integer sums as pipeline by pipeline)
    distinct = Counter(costs)
    lo = max(cost.time_s(1) for cost in distinct)
    hi = max(cost.time_s(total) for cost in distinct)
    for _ in range(100):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        taken = _slots_upto(distinct, mid, total)
        fits = sum(n * distinct[cost] for cost, n in taken.items()) <= total
        lo, hi = (mid, hi) if fits else (lo, mid)
    slots = _slots_upto(distinct, lo, total)
    counts = [slots[cost] for cost in costs]
    return counts if sum(counts) <= total and _is_cheapest_set(costs, counts) else ones


def _slots_upto(
    costs: Iterable[PipelineCost], threshold: float, total: int
) -> dict[PipelineCost, int]:
    """Per pipeline cost, how many of its slots cost at most `threshold` (1..total)."""
    return {
        cost: _slot_count(cost.fixed_s, cost.per_micro_batch_s, threshold, total) for cost in costs
    }


def _counts_at(terms: list[tuple[float, float, int]], threshold: float, total: int) -> list[int]:
    """`_slots_upto` of each (fixed, per micro-batch, size) term."""
    return [_slot_count(fixed, per, threshold, total) for fixed, per, _ in terms]


def _slot_count(fixed_s: float, per_micro_batch_s: float, threshold: float, total: int) -> int:
    """How many slots of a pipeline cost at most `threshold` (1..total)."""
    room = (threshold - fixed_s) / per_micro_batch_s
    return total if room >= total else math.floor(room) if room >= 1 else 1


def _is_cheapest_set(costs: Sequence[PipelineCost], counts: Sequence[int]) -> bool:
    """Whether every slot taken beyond the first is no dearer than every slot not taken."""
    taken = [cost.time_s(n) for cost, n in zip(costs, counts, strict=True) if n > 1]
    untaken = min(cost.time_s(n + 1) for cost, n in zip(costs, counts, strict=True))
    return not taken or max(taken) <= untaken
