"""The DP behind the GPU-stage mapping: one vectorised pass over a batch of caps, and its trace.

Per-stage costs (see `planaria.planner.stage_mapping` for why they sum to T). With the slowest
stage time c and N_b - S + 1 = a + b*S, a stage before the bottleneck costs t + (1 + b) c, the
bottleneck (a + b) c, a stage after it 2t + b c. One batch entry is a cap interval [lo, hi]:

- exact (lo == hi == c): stages before need t < c, the bottleneck t == c, stages after t <= c;
  the pass returns the least T over pipelines whose first slowest stage has time exactly c.
- relaxed (lo < hi): every stage t <= hi, the bottleneck t in [lo, hi], each c term costed at
  max(lo, t) (a pipeline's c is at least both), or at hi where its coefficient is negative. The
  pass returns a lower bound on T over pipelines whose slowest stage lies in [lo, hi].

State, built from the end of the pipeline: g GPUs used so far, the suffix's first layer u, phase
(after: no bottleneck yet; before: bottleneck placed), and a depth bucket b (the next stage's
depth from the end is b + 1; the last bucket stands for every deeper depth). A stage of k GPUs
starting g GPUs from the end stays on one node (g mod M + k <= M) and sends over the intra-node
link unless it ends its node (inter-node) or the pipeline (nothing). Arrays are (g, batch,
bucket, u); one numpy step per g does every k and every stage length d at once. Costs are laid
out (link, k, d, move, batch, w) so that a step's sum over every k and d is one add over
contiguous memory (long inner loops, not one per (d, move, batch, k) row), the source windows
copied once per step; the columns a step visits are tracked in Python, not found with numpy.

Memory: a stage at bucket b must fit at depth b + 1. With fewer buckets than distinct limits
this is a relaxation (deep stages are checked at the last bucket's depth), which is safe for
bounds; callers choose enough buckets for exact entries (`planaria.planner.stage_mapping`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from planaria.planner import stage_table

_INF = math.inf
# Above this many elements a step's GPU counts k are summed one by one, in cache (speed only).
_STACKED_ELEMENTS = 200_000
# Above this much work a step finds its live columns exactly, not from the tracked hull.
_EXACT_LIVE_ELEMENTS = 100_000
# The source phase of each move: after -> after and after -> before start after, before ->
# before starts before.
_PHASE_OF_MOVE = np.array([0, 0, 1])


@dataclass(frozen=True, slots=True)
class Objective:
    """N_b - S + 1 = a + b * S: (1, 3) for N_b = 4S while planning, (N_b + 1, -1) for a given
    N_b."""

    a: float
    b: float

    @classmethod
    def of(cls, num_micro_batches: int | None) -> Objective:
        if num_micro_batches is None:
            return cls(1.0, 3.0)
        return cls(float(num_micro_batches + 1), -1.0)


@dataclass(frozen=True, slots=True)
class Costs:
    """Per-stage costs for a batch: `moves[link, k - 1, d - 1, move, batch, w]` for the moves
    after -> after, after -> before (placing the bottleneck) and before -> before, and the
    memory penalty (k - 1, d - 1, bucket, w), folded into the costs when there is one bucket.
    A step reads `moves[link, :k]`, contiguous but for the column range; `after`,
    `bottleneck` and `before` are views indexed (d - 1, batch, link, k - 1, w)."""

    moves: stage_table.FloatArray
    penalty: stage_table.FloatArray | None
    band: int
    depth: int

    @property
    def widest(self) -> int:
        return int(self.moves.shape[1])

    @property
    def batch(self) -> int:
        return int(self.moves.shape[4])

    @property
    def after(self) -> stage_table.FloatArray:
        return self._move(0)

    @property
    def bottleneck(self) -> stage_table.FloatArray:
        return self._move(1)

    @property
    def before(self) -> stage_table.FloatArray:
        return self._move(2)

    def _move(self, move: int) -> stage_table.FloatArray:
        view: stage_table.FloatArray = self.moves[:, :, :, move].transpose(2, 3, 0, 1, 4)
        return view


@dataclass(frozen=True, slots=True)
class Pass:
    """One DP pass: state values `states[g, phase, batch, bucket, u]` (phase 0: after, no
    bottleneck yet; 1: before), and `final[b, n]`, the value of a whole pipeline on n nodes for
    batch entry b."""

    states: stage_table.FloatArray
    costs: Costs
    final: stage_table.FloatArray

    @property
    def after(self) -> stage_table.FloatArray:
        return self.states[:, 0]

    @property
    def before(self) -> stage_table.FloatArray:
        return self.states[:, 1]


@dataclass(frozen=True, slots=True)
class TracedStage:
    """A stage of a traced pipeline: layers [start, stop) on GPUs [gpu, gpu + num_gpus)
    counted from the front of the pipeline, followed by `link`."""

    start: int
    stop: int
    gpu: int
    num_gpus: int
    link: stage_table.Link


def costs(
    table: stage_table.StageTable,
    depth_limit: stage_table.FloatArray,
    bounds: tuple[stage_table.FloatArray, stage_table.FloatArray, stage_table.FloatArray],
    objective: Objective,
    *,
    depth: int,
    band: int,
) -> Costs:
    """Costs of the batch whose entries have caps in [lo, hi] (`bounds` = lo, hi, exact flags),
    for stages of up to `band` layers, with `depth` buckets."""
    shape = (1, 1, 1, -1, 1)  # (link, k, d, batch, w)
    lo, hi, exact = (np.asarray(x).reshape(shape) for x in bounds)
    # Stages start at w < L: the column w = L is left out, so that full rows stay contiguous.
    t = table.times[:, :, :-1, :band].transpose(0, 1, 3, 2)[:, :, :, None]
    before_hi = np.where(exact, np.nextafter(hi, -_INF), hi)
    a, b = objective.a, objective.b
    floor = np.maximum(lo, t)
    limit = depth_limit[:, :-1, :band].transpose(0, 2, 1)[:, :, None]  # (k, d, 1, w)
    # With one bucket, memory is a condition on the stage like the caps; with more, a penalty
    # (0 or inf) per bucket added in the pass.
    fits: npt.NDArray[np.bool_] | bool = True
    penalty = None
    if depth == 1:
        fits = limit >= 1
    else:
        buckets = np.arange(1, depth + 1).reshape(1, 1, -1, 1)
        penalty = np.where(limit >= buckets, 0.0, _INF)
    below_hi = (t <= hi) & fits
    links, widest, _, _, width = t.shape
    moves = np.full((links, widest, band, 3, lo.shape[3], width), _INF)
    np.copyto(moves[:, :, :, 0], 2 * t + _term(b, floor, hi), where=below_hi)
    np.copyto(moves[:, :, :, 1], _term(a + b, t, hi), where=below_hi & (t >= lo))
    np.copyto(moves[:, :, :, 2], t + _term(1 + b, floor, hi), where=(t <= before_hi) & fits)
    return Costs(moves, penalty, band, depth)


def _term(
    coefficient: float, floor: stage_table.FloatArray, hi: stage_table.FloatArray
) -> stage_table.FloatArray | float:
    """coefficient * c bounded from below: c >= floor for coefficients >= 0, c <= hi else."""
    if coefficient == 0:
        return 0.0
    result: stage_table.FloatArray = coefficient * (floor if coefficient > 0 else hi)
    return result


def link_after(g: int, m: int) -> stage_table.Link:
    """The link after a stage whose GPUs start g GPUs from the end of the pipeline."""
    if g == 0:
        return stage_table.Link.NONE
    return stage_table.Link.INTER if g % m == 0 else stage_table.Link.INTRA


def forward(costs: Costs, num_layers: int, m: int, max_nodes: int) -> Pass:
    """Run the DP up to max_nodes * m GPUs; every template size is read off the same pass."""
    band, total = costs.band, max_nodes * m
    states = np.full((total + 1, 2, costs.batch, costs.depth, num_layers + 1 + band), _INF)
    states[0, 0, :, 0, num_layers] = 0.0
    windows = _windows(states, band)
    steps = _Steps(costs)
    # hull[g]: first and last column that step g may find finite (a superset of the live ones).
    hull = [(num_layers, num_layers)] + [(num_layers + 1, -1)] * total
    for g in range(total):
        w0, w1 = _targets(states[g], hull[g], band, costs)
        if w1 <= w0:
            continue
        k = min(costs.widest, m - g % m)
        best = steps.relax(windows[g, ..., w0:w1], link_after(g, m), k, (w0, w1))
        _merge(states[g + 1 : g + 1 + k, :, :, :, w0:w1], best)
        for target in range(g + 1, g + 1 + k):
            hull[target] = (min(hull[target][0], w0), max(hull[target][1], w1 - 1))
    final = np.full((costs.batch, max_nodes + 1), _INF)
    for n in range(1, max_nodes + 1):
        final[:, n] = states[n * m, 1, :, :, 0].min(axis=1)
    return Pass(states, costs, final)


def _targets(
    values: stage_table.FloatArray, hull: tuple[int, int], band: int, costs: Costs
) -> tuple[int, int]:
    """Columns [w0, w1) that stages ending in a live column of `values` (phase, batch, bucket,
    u) can start at, a superset being as exact (dead columns are inf and change no minimum).
    Live columns lie in the tracked hull; a big step narrows it to the live ones, a small one
    runs to the last column (L - 1) so that its costs stay contiguous."""
    first, last = hull
    width = int(costs.moves.shape[5])
    work = (width - first + band) * band * 3 * costs.batch * costs.depth * costs.widest
    if last < first or work <= _EXACT_LIVE_ELEMENTS:
        return max(0, first - band), width if last > 0 else 0
    live = np.flatnonzero(values[..., first : last + 1].min(axis=(0, 1, 2)) < _INF)
    if live.size == 0:
        return 0, 0
    return max(0, first + int(live[0]) - band), first + int(live[-1])


_Plan = tuple[
    stage_table.FloatArray,  # cost (k, d, move, b, [bucket,] w)
    stage_table.FloatArray | None,  # memory penalty, broadcast like the cost
    stage_table.FloatArray,  # the sums: all k at once, or one k's if `stacked` is false
    bool,  # stacked
    stage_table.FloatArray,  # result (k, move, b, bucket, w)
]


class _Steps:
    """The relaxation of one DP step, with the views it needs cached per (link, k, columns):
    a pass repeats a few of them many times, and small steps cost their numpy calls."""

    __slots__ = ("_costs", "_plans", "_sums", "_best")

    def __init__(self, costs: Costs) -> None:
        _, widest, band, moves, batch, width = costs.moves.shape
        per_k = band * moves * batch * costs.depth * width
        self._costs = costs
        self._plans: dict[tuple[int, int, int, int], _Plan] = {}
        self._sums = np.empty(min(widest * per_k, max(_STACKED_ELEMENTS, per_k)))
        self._best = np.empty(widest * moves * batch * costs.depth * width)

    def relax(
        self, source: stage_table.FloatArray, link: int, k: int, columns: tuple[int, int]
    ) -> stage_table.FloatArray:
        """best[k, phase, b, bucket, w] = min over d and moves of V[w + d] + cost (+ memory
        penalty), from the window `source` (d, phase, b, bucket, w); moves 0 and 1 start from
        the after phase, move 2 from the before phase, 1 and 2 end before. Every k in one
        add while that is small, else one k at a time (it stays in cache). The sums are
        V + cost, then + penalty, as in `trace`."""
        key = (link, k, *columns)
        plan = self._plans.get(key) or self._plans.setdefault(key, self._plan(*key))
        cost, penalty, sums, stacked, result = plan
        moved = source.take(_PHASE_OF_MOVE, axis=1)  # (d, move, b, bucket, w), contiguous
        best = result
        if self._costs.depth == 1:
            moved, best = moved[:, :, :, 0], result[:, :, :, 0]
        if stacked:
            _sum_min(moved, cost, penalty, sums, best)
        for i in range(0 if stacked else k):
            _sum_min(moved, cost[i], None if penalty is None else penalty[i], sums, best[i])
        np.minimum(result[:, 1], result[:, 2], out=result[:, 1])
        return result[:, :2]

    def _plan(self, link: int, k: int, w0: int, w1: int) -> _Plan:
        c = self._costs
        cost = c.moves[link, :k, :, :, :, w0:w1]
        penalty = None if c.penalty is None else c.penalty[:k, :, None, None, :, w0:w1]
        if c.depth > 1:
            cost = cost[:, :, :, :, None]
        shape = (*cost.shape[:4], c.depth, w1 - w0)  # (k, d, move, b, bucket, w)
        result = _view(self._best, (k, *shape[2:]))
        shape = shape if c.depth > 1 else shape[:4] + shape[5:]
        stacked = math.prod(shape) <= _STACKED_ELEMENTS
        shape = shape if stacked else shape[1:]
        if self._sums.size < math.prod(shape):
            self._sums = np.empty(math.prod(shape))
        return cost, penalty, _view(self._sums, shape), stacked, result


def _view(buffer: stage_table.FloatArray, shape: tuple[int, ...]) -> stage_table.FloatArray:
    """A contiguous array of `shape` at the front of `buffer`."""
    view: stage_table.FloatArray = buffer[: math.prod(shape)].reshape(shape)
    return view


def _sum_min(
    moved: stage_table.FloatArray,
    cost: stage_table.FloatArray,
    penalty: stage_table.FloatArray | None,
    sums: stage_table.FloatArray,
    out: stage_table.FloatArray,
) -> None:
    """out = min over the d axis (the first of `moved`) of moved + cost (+ penalty)."""
    np.add(cost, moved, out=sums)
    if penalty is not None:
        sums += penalty
    np.minimum.reduce(sums, axis=sums.ndim - moved.ndim, out=out)


def _windows(values: stage_table.FloatArray, band: int) -> stage_table.FloatArray:
    """A read-only view w[g, d - 1, phase, b, bucket, u] = values[g, phase, b, bucket, u + d]
    for u < num_layers + 1 (the states carry `band` columns of inf padding for u + d)."""
    s0, s1, s2, s3, s4 = values.strides
    g, phases, b, bucket, width = values.shape
    shape = (g, band, phases, b, bucket, width - band)
    view: stage_table.FloatArray = as_strided(
        values[..., 1:], shape=shape, strides=(s0, s4, s1, s2, s3, s4), writeable=False
    )
    return view


def _merge(target: stage_table.FloatArray, new: stage_table.FloatArray) -> None:
    """Fold new values (k, phase, batch, bucket b = stage depth b + 1, w) into the target
    states' next buckets, the last bucket absorbing deeper ones."""
    if new.shape[3] == 1:
        np.minimum(target, new, out=target)
        return
    np.minimum(target[:, :, :, 1:], new[:, :, :, :-1], out=target[:, :, :, 1:])
    np.minimum(target[:, :, :, -1:], new[:, :, :, -1:], out=target[:, :, :, -1:])


def trace(result: Pass, entry: int, n: int, m: int) -> list[TracedStage]:
    """The pipeline on n nodes behind `result.final[entry, n]`, front to back. Costs are re-added
    in the forward pass's order, so the predecessor of each state is found by exact equality."""
    g, w, phase = n * m, 0, "before"
    bucket = int(np.argmin(result.before[g][entry, :, 0]))
    stages = []
    while g > 0:
        k, d, phase, bucket = _predecessor(result, entry, (g, w, phase, bucket), m)
        stages.append(TracedStage(w, w + d, n * m - g, k, link_after(g - k, m)))
        g, w = g - k, w + d
    assert phase == "after" and result.after[0][entry, 0, w] == 0.0
    return stages


def _predecessor(
    result: Pass, entry: int, state: tuple[int, int, str, int], m: int
) -> tuple[int, int, str, int]:
    """(k, d, previous phase, previous bucket) of the stage [w, w + d) that produced `state`
    = (g, w, phase, bucket)."""
    g, w, phase, bucket = state
    c = result.costs
    values = {"after": result.after, "before": result.before}
    target = values[phase][g][entry, bucket, w]
    moves = [("after", c.bottleneck), ("before", c.before)] if phase == "before" else []
    moves = moves or [("after", c.after)]
    sources = ([bucket - 1] if bucket > 0 else []) + ([bucket] if bucket == c.depth - 1 else [])
    for k in range(1, c.widest + 1):
        gs = g - k
        if gs < 0 or gs % m + k > m:
            continue
        link = link_after(gs, m)
        for source in sources:
            for previous, cost in moves:
                for d in range(1, c.band + 1):
                    value = (
                        values[previous][gs][entry, source, w + d]
                        + cost[d - 1, entry, link, k - 1, w]
                    )
                    if c.penalty is not None:
                        value = value + c.penalty[k - 1, d - 1, source, w]
                    if value == target:
                        return k, d, previous, source
    raise AssertionError(f"no predecessor for DP state {state}")


def fewest_stages(
    depth_limit: stage_table.FloatArray, max_gpus: int, m: int, max_nodes: int
) -> list[float]:
    """Feasibility: the fewest stages of a whole pipeline on n nodes that fits in memory, for
    n = 0..max_nodes (inf: none fits). Keeping the fewest stages per suffix state is exact for
    feasibility: fewer stages behind a stage means a smaller depth, so more room, for it."""
    num_layers = depth_limit.shape[1] - 1
    total = max_nodes * m
    stages = np.full((total + 1, 2 * num_layers + 1), _INF)
    stages[0][num_layers] = 0.0
    every = sliding_window_view(stages[:, 1:], num_layers, axis=1)  # a view: sees later writes
    for g in range(total):
        if not np.isfinite(stages[g]).any():
            continue
        windows = every[g, : num_layers + 1] + 1
        for k in range(1, min(max_gpus, m - g % m) + 1):
            fits = np.where(depth_limit[k - 1] >= windows, windows, _INF)
            target = stages[g + k][: num_layers + 1]
            np.minimum(target, fits.min(axis=1), out=target)
    return [float(stages[n * m][0]) for n in range(max_nodes + 1)]


def bottleneck_floor(usable: stage_table.FloatArray, m: int, max_nodes: int) -> list[float]:
    """For n = 0..max_nodes, the least possible slowest-stage time of an n-node pipeline (a
    min-max DP over `usable` stage times, inf where unusable). Memory is only checked at
    depth 1 there, so this is a lower bound: no pipeline has a slowest stage below it."""
    num_layers = usable.shape[2] - 1
    total = max_nodes * m
    worst = np.full((total + 1, 2 * num_layers + 1), _INF)
    worst[0, num_layers] = 0.0
    every = sliding_window_view(worst[:, 1:], num_layers, axis=1)  # a view: sees later writes
    for g in range(total):
        if not np.isfinite(worst[g]).any():
            continue
        widest = min(usable.shape[1], m - g % m)
        windows = every[g, : num_layers + 1]
        slowest = np.maximum(windows, usable[link_after(g, m), :widest]).min(axis=2)
        target = worst[g + 1 : g + 1 + widest, : num_layers + 1]
        np.minimum(target, slowest, out=target)
    return [float(worst[n * m, 0]) for n in range(max_nodes + 1)]
