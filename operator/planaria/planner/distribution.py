"""Layer and batch distribution of a DP/PP configuration (Odyssey §IV-A, Alg. 1 lines 13-14).

Layers (`split_layers`): the even split of the L layers into S stages plus every placement of
the L mod S remainder layers (`remainder_placements`), filtered by E's memory estimator and
ranked by E's time estimator on one pipeline alone (Odyssey §IV-A "Layer Distribution"). As in
Alg. 1 the split depends on the depth only; it is costed at S micro-batches, where every stage
reaches its steady-state number of micro-batches in flight, so the memory filter holds for any
larger count. More placements than `max_splits` are pre-ranked by their slowest stage's compute;
those left are costed in order of a lower bound on their step (`alone_bound_s`: the chain of
`step_bound_s` with its transfers, the commit barrier and the slowest optimizer step) until the
bound exceeds the best step found. The answer per depth is memoised in the `screening.Estimates`.

Batch (`distribute_batch`): the templates' exact min-makespan distribution (`batching`, Oobleck
eq. 6 solved exactly) on affine pipeline costs T(N_b) = a + c N_b fitted to E's estimator at
N_b = S and 2S (`pipeline_cost`); docs/policy.md says why this rather than Odyssey's
proportional pre-allocation.

Not here: which configurations to try (`candidates`), the estimators (`screening`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from planaria.contract import plan, profile
from planaria.planner import batching, estimator, screening

# Remainder placements enumerated at most (C(S, L mod S) can explode for deep pipelines): beyond
# this the pre-ranking by bottleneck compute would cost more than the estimates it saves.
_MAX_ENUMERATED = 20_000


def remainder_placements(num_layers: int, depth: int) -> Iterator[tuple[int, ...]]:
    """Every split of num_layers into depth stages of floor(L/depth) layers plus one extra
    layer on each of L mod depth stages: the even split with the remainder enumerated."""
    base, extra = divmod(num_layers, depth)
    even = [base] * depth
    for chosen in itertools.combinations(range(depth), extra):
        counts = even.copy()
        for s in chosen:
            counts[s] += 1
        yield tuple(counts)


def _work_s(prof: profile.Profile, a: int, b: int) -> float:
    return sum(layer.forward_s[0] + layer.backward_s[0] for layer in prof.layers[a:b])


def _placements(prof: profile.Profile, depth: int, max_splits: int) -> list[tuple[int, ...]]:
    """The placements `_best_split` costs: the first `_MAX_ENUMERATED` remainder placements,
    or when there are more than `max_splits` of those, the `max_splits` of least bottleneck
    compute (the largest forward + backward of one stage on 1 GPU; ties in placement order,
    as `heapq.nsmallest` keeps them), in that order. Every stage holds floor(L/S) or one more
    layers, so each layer range's sum is made once and the placements' keys are taken on
    arrays: at ~20,000 placements per deep depth, the Python tuples and maxima cost ~5x more
    (tests/planner/test_distribution.py keeps that ranking as the oracle)."""
    num_layers = len(prof.layers)
    base, extra = divmod(num_layers, depth)
    chosen = itertools.islice(itertools.combinations(range(depth), extra), _MAX_ENUMERATED)
    flat = np.fromiter(itertools.chain.from_iterable(chosen), dtype=np.intp)
    count = flat.size // extra if extra else 1
    if count <= max_splits:
        return list(itertools.islice(remainder_placements(num_layers, depth), _MAX_ENUMERATED))
    longer = np.zeros((count, depth), dtype=np.intp)  # 1 where a stage holds the extra layer
    longer[np.repeat(np.arange(count), extra), flat] = 1
    counts = longer + base
    starts = np.cumsum(counts, axis=1) - counts
    # work[a, k]: layers [a, a + base + k) (0.0 past the last layer, where no stage starts)
    work = np.array(
        [
            [_work_s(prof, a, a + n) if a + n <= num_layers else 0.0 for n in (base, base + 1)]
            for a in range(num_layers)
        ]
    )
    keys = work[starts, longer].max(axis=1)
    order = np.argsort(keys, kind="stable")[:max_splits]
    return [tuple(row) for row in counts[order].tolist()]


def split_layers(
    estimates: screening.Estimates, depth: int, running: plan.Plan, max_splits: int
) -> tuple[int, ...] | None:
    """The fastest fitting split of the profile's layers into `depth` stages (layer counts), or
    None when none fits in memory; costed on consecutive workers with the running plan's
    micro-batch size and GPUs per node. When there are more remainder placements than
    `max_splits`, the ones with the smallest bottleneck compute are costed. Memoised in
    `estimates` (every decision asks for the splits of its configurations' depths)."""
    key = (depth, running.micro_batch_size, running.gpus_per_node, max_splits)
    if key not in estimates.splits:
        estimates.splits[key] = _best_split(estimates, depth, running, max_splits)
    return estimates.splits[key]


def _best_split(
    estimates: screening.Estimates, depth: int, running: plan.Plan, max_splits: int
) -> tuple[int, ...] | None:
    prof = estimates.profile
    if depth > prof.num_layers:
        return None
    splits = _placements(prof, depth, max_splits)
    best: tuple[float, tuple[int, ...]] | None = None
    # cheapest bound first; a split whose bound exceeds the best step so far cannot win, and
    # neither can any after it (the answer is that of costing every split)
    gpus = running.gpus_per_node
    for bound, counts in sorted((alone_bound_s(prof, c, depth, gpus), c) for c in splits):
        if best is not None and bound * (1 - _ROUNDING) > best[0]:
            break
        # S micro-batches: each stage reaches its steady-state count in flight (memory holds
        # for any larger count) at the least estimation cost
        alone = pipeline_of(counts, [plan.WorkerId(w) for w in range(depth)], depth)
        estimate = estimates.pipeline(alone, running.micro_batch_size, running.gpus_per_node)
        if estimates.fits(estimate) and (best is None or (estimate.step_s, counts) < best):
            best = (estimate.step_s, counts)
    return None if best is None else best[1]


# Relative slack on a bound summed in another order than the replay adds the same costs.
_ROUNDING = 1e-9


def step_bound_s(prof: profile.Profile, counts: tuple[int, ...], num_micro_batches: int) -> float:
    """A lower bound on E's step of a pipeline of one-GPU stages of `counts` layers running
    `num_micro_batches` (free links): for each stage s, micro-batch 0's forward through the
    stages before it, all of s's forwards and backwards one after another, the last
    micro-batch's backward back through the stages before it, and stage 0's optimizer step
    are a chain of events each of which waits for the one before (Odyssey eq. 11)."""
    bounds = list(itertools.accumulate(counts, initial=0))
    stages = [prof.layers[a:b] for a, b in itertools.pairwise(bounds)]
    forward = [sum(layer.forward_s[0] for layer in layers) for layers in stages]
    backward = [sum(layer.backward_s[0] for layer in layers) for layers in stages]
    optimizer = sum(layer.optimizer_s for layer in stages[0])
    return optimizer + max(
        sum(forward[:s]) + num_micro_batches * (forward[s] + backward[s]) + sum(backward[:s])
        for s in range(len(counts))
    )


def alone_bound_s(
    prof: profile.Profile, counts: tuple[int, ...], num_micro_batches: int, gpus_per_node: int
) -> float:
    """A lower bound on E's step of the pipeline of one-GPU stages of `counts` layers alone on
    workers 0..S-1 (`gpus_per_node` per node) running `num_micro_batches`: `step_bound_s`'s
    chain with what else lies on it. For stage s: micro-batch 0's forward through the stages
    before it, each hop's activation transfer on its link (the receive waits for the arrival),
    all of s's forwards and backwards one after another, then the last micro-batch's backward
    back to stage 0, each hop's gradient transfer on its link; stage 0 then reaches its
    optimizer step, where every stage waits for the commit barrier among all S, and the step
    ends when the slowest optimizer step after it does (`estimator`'s rules, each wait one
    event after another, so the sum is at most E's step)."""
    bounds = list(itertools.accumulate(counts, initial=0))
    stages = [prof.layers[a:b] for a, b in itertools.pairwise(bounds)]
    forward = [sum(layer.forward_s[0] for layer in layers) for layers in stages]
    backward = [sum(layer.backward_s[0] for layer in layers) for layers in stages]
    # both directions of hop r -> r + 1 carry the output of the last layer of stage r
    hops = [
        estimator.link_among(prof, gpus_per_node, (r, r + 1)).transfer_s(
            prof.layers[bounds[r + 1] - 1].output_bytes
        )
        for r in range(len(counts) - 1)
    ]
    optimizer = max(sum(layer.optimizer_s for layer in layers) for layers in stages)
    barrier = estimator.barrier_s(
        estimator.link_among(prof, gpus_per_node, range(len(counts))), len(counts)
    )
    chain = max(
        sum(forward[:s])
        + num_micro_batches * (forward[s] + backward[s])
        + sum(backward[:s])
        + 2 * sum(hops[:s])
        for s in range(len(counts))
    )
    return chain + barrier + optimizer


def pipeline_of(
    counts: Sequence[int], workers: Sequence[plan.WorkerId], num_micro_batches: int
) -> plan.Pipeline:
    """Stages of `counts` layers each, in order, one worker each. Raises what `plan.Stage`
    raises for a count below one, ValueError when the lengths differ."""
    bounds = list(itertools.accumulate(counts, initial=0))
    if len(workers) != len(counts) or not all(n >= 1 for n in counts):
        stages = tuple(
            plan.Stage(layer_start=a, layer_stop=b, workers=(w,))
            for (a, b), w in zip(itertools.pairwise(bounds), workers, strict=True)
        )
    else:  # valid by construction: `plan.Stage`'s checks hold (~60k layouts a 2-hour run)
        stages = tuple(map(_one_worker_stage, bounds, bounds[1:], workers))
    return plan.Pipeline(stages=stages, num_micro_batches=num_micro_batches)


# A Stage's frozen-dataclass __init__ and __post_init__ cost more than the rest of laying out
# a pipeline: `pipeline_of` sets the slots directly on stages whose checks hold (a non-empty
# layer range, one worker). The object is the one Stage(...) builds (test_distribution.py).
_set_start, _set_stop, _set_workers = (
    vars(plan.Stage)[name].__set__ for name in ("layer_start", "layer_stop", "workers")
)


def _one_worker_stage(start: int, stop: int, worker: plan.WorkerId) -> plan.Stage:
    stage: plan.Stage = object.__new__(plan.Stage)
    _set_start(stage, start)
    _set_stop(stage, stop)
    _set_workers(stage, (worker,))
    return stage


def pipeline_cost(
    estimates: screening.Estimates, counts: tuple[int, ...], running: plan.Plan
) -> batching.PipelineCost:
    """T(N_b) = a + c N_b of a pipeline with layer counts `counts`, through E's estimates at
    N_b = S and 2S (S stages): past the fill, 1F1B adds one bottleneck slot per micro-batch."""
    depth = len(counts)
    workers = [plan.WorkerId(w) for w in range(depth)]
    at = [
        estimates.pipeline(
            pipeline_of(counts, workers, m), running.micro_batch_size, running.gpus_per_node
        ).step_s
        for m in (depth, 2 * depth)
    ]
    # past the fill, each extra micro-batch adds one bottleneck slot: the slope is constant
    slope = (at[1] - at[0]) / depth
    return batching.PipelineCost(fixed_s=at[0] - slope * depth, per_micro_batch_s=slope)


def distribute_batch(
    estimates: screening.Estimates, splits: Sequence[tuple[int, ...]], running: plan.Plan
) -> tuple[int, ...]:
    """Micro-batches per pipeline minimising the slowest one (Oobleck eq. 6 as solved exactly
    by `batching.distribute`) on the affine costs `pipeline_cost` fits to E's estimator."""
    fitted = {counts: pipeline_cost(estimates, counts, running) for counts in set(splits)}
    costs = [fitted[counts] for counts in splits]  # pipelines of one split share their cost
    spread = batching.distribute(costs, running.global_batch_size, running.micro_batch_size)
    return spread.micro_batches
