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
bucket, u); one numpy step per g does every k and every stage length d at once.

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
# Above this many elements a step's three moves are computed one by one (speed only).
_STACKED_ELEMENTS = 200_000


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
    """Per-stage costs for a batch: `moves[d - 1, move, batch, link, k, w]` for the moves
    after -> after, after -> before (placing the bottleneck) and before -> before, and the
    memory penalty (d - 1, bucket, k, w), folded into the costs when there is one bucket. The
    stage length d leads so that minimising over it reduces over the outermost axis."""

    moves: stage_table.FloatArray
    penalty: stage_table.FloatArray | None
    band: int
    depth: int

    @property
    def after(self) -> stage_table.FloatArray:
        return self.moves[:, 0]

    @property
    def bottleneck(self) -> stage_table.FloatArray:
        return self.moves[:, 1]

    @property
    def before(self) -> stage_table.FloatArray:
        return self.moves[:, 2]


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
    shape = (1, -1, 1, 1, 1)
    lo, hi, exact = (np.asarray(x).reshape(shape) for x in bounds)
    t = table.times[:, :, :, :band].transpose(3, 0, 1, 2)[:, None]
    before_hi = np.where(exact, np.nextafter(hi, -_INF), hi)
    a, b = objective.a, objective.b
    floor = np.maximum(lo, t)
    limit = depth_limit[:, :, :band].transpose(2, 0, 1)[:, None]
    # With one bucket, memory is a condition on the stage like the caps; with more, a penalty
    # (0 or inf) per bucket added in the pass.
    fits: npt.NDArray[np.bool_] | bool = True
    penalty = None
    if depth == 1:
        fits = limit[:, :, None] >= 1
    else:
        buckets = np.arange(1, depth + 1).reshape(1, -1, 1, 1)
        penalty = np.where(limit >= buckets, 0.0, _INF)
    below_hi = (t <= hi) & fits
    moves = np.full((band, 3, lo.shape[1], *t.shape[2:]), _INF)
    np.copyto(moves[:, 0], 2 * t + _term(b, floor, hi), where=below_hi)
    np.copyto(moves[:, 1], _term(a + b, t, hi), where=below_hi & (t >= lo))
    np.copyto(moves[:, 2], t + _term(1 + b, floor, hi), where=(t <= before_hi) & fits)
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
    batch, band, depth = costs.moves.shape[2], costs.band, costs.depth
    total = max_nodes * m
    states = np.full((total + 1, 2, batch, depth, num_layers + 1 + band), _INF)
    states[0, 0, :, 0, num_layers] = 0.0
    windows = _windows(states, band)
    for g in range(total):
        live = np.flatnonzero(states[g].min(axis=(0, 1, 2)) < _INF)
        if live.size == 0:
            continue
        w0, w1 = max(0, int(live[0]) - band), int(live[-1])  # targets w in [w0, w1)
        if w1 <= w0:
            continue
        widest = min(costs.moves.shape[4], m - g % m)
        cost = costs.moves[:, :, :, link_after(g, m), :widest, w0:w1][:, :, :, None]
        source = windows[:, g, :, :, :, w0:w1, None].swapaxes(-1, -2)
        penalty = None if costs.penalty is None else costs.penalty[:, :, :widest, w0:w1]
        best = _relax(source, cost, penalty)
        np.minimum(best[1], best[2], out=best[1])
        _merge(states[g + 1 : g + 1 + widest, :, :, :, w0:w1], best[:2].transpose(3, 0, 1, 2, 4))
    final = np.full((batch, max_nodes + 1), _INF)
    for n in range(1, max_nodes + 1):
        final[:, n] = states[n * m, 1, :, :, 0].min(axis=1)
    return Pass(states, costs, final)


def _relax(
    source: stage_table.FloatArray,
    cost: stage_table.FloatArray,
    penalty: stage_table.FloatArray | None,
) -> stage_table.FloatArray:
    """best[move, b, bucket, k, w] = min over d of V[w + d] + cost (+ memory penalty); moves 0
    and 1 start from the after phase, move 2 from the before phase. All moves in one array
    while it is small (fewer numpy calls), else one move at a time (it stays in cache)."""
    band, _, batch, depth, _, width = source.shape
    widest = cost.shape[4]
    if penalty is None and band * 3 * batch * widest * width <= _STACKED_ELEMENTS:
        values = np.empty((band, 3, batch, depth, widest, width))
        np.add(source[:, :1], cost[:, :2], out=values[:, :2])
        np.add(source[:, 1:], cost[:, 2:], out=values[:, 2:])
        stacked: stage_table.FloatArray = values.min(axis=0)
        return stacked
    best = np.empty((3, batch, depth, widest, width))
    for move, phase in enumerate((0, 0, 1)):
        values = source[:, phase] + cost[:, move]
        if penalty is not None:
            values += penalty[:, None]
        best[move] = values.min(axis=0)
    return best


def _windows(values: stage_table.FloatArray, band: int) -> stage_table.FloatArray:
    """A read-only view w[d - 1, g, phase, b, bucket, u] = values[g, phase, b, bucket, u + d]
    for u < num_layers + 1 (the states carry `band` columns of inf padding for u + d)."""
    s0, s1, s2, s3, s4 = values.strides
    g, phases, b, bucket, width = values.shape
    shape = (band, g, phases, b, bucket, width - band)
    view: stage_table.FloatArray = as_strided(
        values[..., 1:], shape=shape, strides=(s4, s0, s1, s2, s3, s4), writeable=False
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
    for k in range(1, c.moves.shape[4] + 1):
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
                        value = value + c.penalty[d - 1, source, k - 1, w]
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
    stages = [np.full(2 * num_layers + 1, _INF) for _ in range(total + 1)]
    stages[0][num_layers] = 0.0
    for g in range(total):
        if not np.isfinite(stages[g]).any():
            continue
        windows = sliding_window_view(stages[g][1:], num_layers)[: num_layers + 1] + 1
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
    for g in range(total):
        if not np.isfinite(worst[g]).any():
            continue
        widest = min(usable.shape[1], m - g % m)
        windows = sliding_window_view(worst[g, 1:], num_layers)[: num_layers + 1]
        slowest = np.maximum(windows, usable[link_after(g, m), :widest]).min(axis=2)
        target = worst[g + 1 : g + 1 + widest, : num_layers + 1]
        np.minimum(target, slowest, out=target)
    return [float(worst[n * m, 0]) for n in range(max_nodes + 1)]
