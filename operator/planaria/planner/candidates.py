"""Candidate search after a failure (Odyssey Alg. 1 and §IV-A): the plans the policy chooses from.

Given the running plan and the failed workers, `search` lists:
- rerouting (`rerouting`): the same layout, failed stages' micro-batches on same-stage peers;
- symmetric and asymmetric DP/PP configurations over all survivors (Alg. 1
  `get_parallel_strategy`): for each DP degree within `dp_radius` of the current one (Odyssey:
  "the new DP degree often differs from the original by less than 2"), the symmetric layout
  DP x floor(N/DP) and, when DP does not divide N, the balanced asymmetric one that uses every
  survivor (N mod DP pipelines one stage deeper);
- caller-given layouts, e.g. the Oobleck templates' reinstantiations over the survivors.

Per DP/PP configuration (Alg. 1 lines 13-14): the batch is distributed by the templates' exact
min-makespan batching (`batching`, Oobleck eq. 6) on affine pipeline costs fitted to E's
estimator (`distribute_batch`; docs/policy.md says why not Odyssey's pre-allocation), and
each pipeline depth gets its layer split from `split_layers`: the even split plus every placement
of the remainder layers, filtered by E's memory estimator and ranked by E's time estimator on one
pipeline (Odyssey §IV-A "Layer Distribution"). As in Alg. 1, the split depends on the depth
only; it is costed at depth micro-batches, where every stage reaches its steady-state number of
micro-batches in flight, so the memory filter holds for any larger count.

Every re-planned candidate is bound to the survivors by min-cost matching (`transfers`). Its step
time is first screened (Odyssey eq. 10: the slowest of its pipelines, each estimated alone by E's
estimator and memoised per distinct pipeline: identical pipelines have identical estimates);
`Estimates.whole` then estimates whole plans, with all-reduces and rerouted micro-batches, for the
candidates the policy shortlists. Rerouting is always estimated whole (its cost is the peers'
extra work, which no single pipeline shows). There is one performance model: `estimator` and
`memory`; this module only decides what to ask them.

Rejected candidates (out of memory, rerouting impossible) come back with the reason.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from planaria.planner import (
    batching,
    errors,
    estimator,
    memory,
    plan,
    profile,
    rerouting,
    schedule,
    transfers,
)

# Remainder placements screened when there are more than `max_splits`: enumerating more costs
# more than it can gain (ranked by bottleneck compute first, see `split_layers`).
_MAX_ENUMERATED = 20_000


class Kind(StrEnum):
    """How a candidate recovers: keep the layout, or which kind of new layout."""

    REROUTE = "reroute"
    SYMMETRIC = "symmetric"
    ASYMMETRIC = "asymmetric"
    GIVEN = "given"


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """What happened: the `running` plan, the workers that failed, and live workers
    outside the plan (idle spares) that a new layout may use."""

    running: plan.Plan
    failed: frozenset[plan.WorkerId]
    spare: frozenset[plan.WorkerId] = frozenset()

    def __post_init__(self) -> None:
        if not self.failed:
            raise errors.PlanInputError("a failure needs at least one failed worker")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSettings:
    """Knobs of the search: DP degrees tried are the current one +- `dp_radius`; `max_splits`
    caps the layer splits costed per pipeline depth; `overheads` of every transition."""

    dp_radius: int = 1
    max_splits: int = 32
    overheads: transfers.Overheads = field(default_factory=transfers.Overheads)

    def __post_init__(self) -> None:
        if self.dp_radius < 0:
            raise errors.PlanInputError(f"dp_radius is {self.dp_radius}; give 0 or more")
        if self.max_splits < 1:
            raise errors.PlanInputError(f"max_splits is {self.max_splits}; give 1 or more")


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """E's step time and peak memory for a plan (or one pipeline alone)."""

    step_s: float
    peak_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A plan the job could move to. `exact`: `estimate` is E's estimate of the whole plan;
    otherwise it is the eq. 10 screen (slowest pipeline alone, no all-reduce)."""

    kind: Kind
    label: str
    transition: transfers.Transition
    estimate: Estimate
    exact: bool

    @property
    def plan(self) -> plan.Plan:
        return self.transition.target


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A candidate that cannot run, and why."""

    kind: Kind
    label: str
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Search:
    """Every candidate found (in generation order) and every one rejected."""

    candidates: tuple[Candidate, ...]
    rejected: tuple[Rejection, ...]


class Estimates:
    """E's estimators behind a memo. Estimates of identical plans are identical, so a pipeline
    is keyed by its layer ranges, micro-batches and node pattern; keep one instance per profile
    to reuse the memo across decisions (Odyssey: the search can run ahead of failures).
    `memory_bytes` is the per-worker limit plans must fit (default: the profile's accelerator)."""

    def __init__(self, prof: profile.Profile, memory_bytes: int | None = None) -> None:
        if memory_bytes is not None and memory_bytes < 1:
            raise errors.PlanInputError(f"memory_bytes is {memory_bytes}; give bytes >= 1")
        self.profile = prof
        self.memory_bytes = prof.memory_bytes if memory_bytes is None else memory_bytes
        self._memo: dict[object, Estimate] = {}

    def whole(self, plan_: plan.Plan) -> Estimate:
        """Step time and peak memory of the whole plan (all-reduces, reroutes included)."""
        key = (plan_.pipelines, plan_.micro_batch_size, plan_.gpus_per_node, plan_.reroutes)
        if key not in self._memo:
            sched = schedule.compile_schedule(plan_)
            self._memo[key] = Estimate(
                step_s=estimator.estimate_step(sched, self.profile).step_s,
                peak_bytes=memory.estimate_memory(sched, self.profile).peak_bytes,
            )
        return self._memo[key]

    def pipeline(self, pipeline: plan.Pipeline, micro_batch_size: int, gpus: int) -> Estimate:
        """One pipeline run alone, on workers renumbered to keep only its node pattern."""
        stages = _canonical(pipeline, gpus)
        key = (stages, pipeline.num_micro_batches, micro_batch_size, gpus)
        if key not in self._memo:
            alone = plan.Plan(
                pipelines=(_rebuilt(stages, pipeline.num_micro_batches),),
                micro_batch_size=micro_batch_size,
                gpus_per_node=gpus,
            )
            self._memo[key] = self.whole(alone)
        return self._memo[key]

    def fits(self, estimate: Estimate) -> bool:
        return estimate.peak_bytes <= self.memory_bytes


_Stages = tuple[tuple[int, int, tuple[int, ...]], ...]


def _canonical(pipeline: plan.Pipeline, gpus_per_node: int) -> _Stages:
    """(layer_start, layer_stop, workers) per stage, with nodes renumbered 0, 1, ... in order of
    first use and GPUs in order of use within a node: what its estimate depends on."""
    nodes: dict[int, int] = {}
    used: dict[int, int] = defaultdict(int)
    stages = []
    for stage in pipeline.stages:
        workers = []
        for worker in stage.workers:
            node = nodes.setdefault(worker // gpus_per_node, len(nodes))
            workers.append(node * gpus_per_node + used[node])
            used[node] += 1
        stages.append((stage.layer_start, stage.layer_stop, tuple(workers)))
    return tuple(stages)


def _rebuilt(stages: _Stages, num_micro_batches: int) -> plan.Pipeline:
    return plan.Pipeline(
        stages=tuple(
            plan.Stage(layer_start=a, layer_stop=b, workers=tuple(map(plan.WorkerId, w)))
            for a, b, w in stages
        ),
        num_micro_batches=num_micro_batches,
    )


# --- Alg. 1 get_parallel_strategy --------------------------------------------------------------


def configurations(
    num_workers: int, old_dp: int, num_layers: int, num_micro_batches: int, dp_radius: int
) -> tuple[tuple[int, ...], ...]:
    """Pipeline depths of each DP/PP configuration to try, deepest pipeline first: for DP
    within the radius (and at most one pipeline per worker and per micro-batch), the symmetric
    DP x floor(N/DP) and the balanced asymmetric layout using all N workers."""
    found: list[tuple[int, ...]] = []
    low, high = max(1, old_dp - dp_radius), min(old_dp + dp_radius, num_workers, num_micro_batches)
    for dp in range(low, high + 1):
        depth, extra = divmod(num_workers, dp)
        symmetric = (min(depth, num_layers),) * dp
        found.append(symmetric)
        if extra and depth + 1 <= num_layers:
            found.append((depth + 1,) * extra + (depth,) * (dp - extra))
    return tuple(dict.fromkeys(found))


# --- Alg. 1 distribute_batch ------------------------------------------------------------------


def pipeline_cost(
    estimates: Estimates, counts: tuple[int, ...], running: plan.Plan
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
    slope = (at[1] - at[0]) / depth
    return batching.PipelineCost(fixed_s=at[0] - slope * depth, per_micro_batch_s=slope)


def distribute_batch(
    estimates: Estimates, splits: Sequence[tuple[int, ...]], running: plan.Plan
) -> tuple[int, ...]:
    """Micro-batches per pipeline minimising the slowest one (Oobleck eq. 6 as solved exactly
    by `batching.distribute`) on the affine costs `pipeline_cost` fits to E's estimator."""
    costs = [pipeline_cost(estimates, counts, running) for counts in splits]
    distribution = batching.distribute(costs, running.global_batch_size, running.micro_batch_size)
    return distribution.micro_batches


# --- Alg. 1 split_layers (Odyssey §IV-A "Layer Distribution") ----------------------------------


def remainder_placements(num_layers: int, depth: int) -> Iterator[tuple[int, ...]]:
    """Every split of num_layers into depth stages of floor(L/depth) layers plus one extra
    layer on each of L mod depth stages: the even split with the remainder enumerated."""
    base, extra = divmod(num_layers, depth)
    for chosen in itertools.combinations(range(depth), extra):
        yield tuple(base + (1 if s in chosen else 0) for s in range(depth))


def _stage_work_s(prof: profile.Profile, counts: tuple[int, ...]) -> float:
    """The largest forward + backward compute of one stage (1 GPU): a pre-ranking only."""
    bounds = list(itertools.accumulate(counts, initial=0))
    return max(
        sum(layer.forward_s[0] + layer.backward_s[0] for layer in prof.layers[a:b])
        for a, b in itertools.pairwise(bounds)
    )


def split_layers(
    estimates: Estimates, depth: int, running: plan.Plan, settings: SearchSettings
) -> tuple[int, ...] | None:
    """The fastest fitting split of the profile's layers into `depth` stages (layer counts), or
    None when none fits in memory; costed on consecutive workers with the running plan's
    micro-batch size and GPUs per node. When there are more remainder placements than
    `max_splits`, the ones with the smallest bottleneck compute are costed."""
    prof = estimates.profile
    if depth > prof.num_layers:
        return None
    placements = itertools.islice(remainder_placements(prof.num_layers, depth), _MAX_ENUMERATED)
    splits = list(placements)
    if len(splits) > settings.max_splits:
        splits = heapq.nsmallest(settings.max_splits, splits, key=lambda c: _stage_work_s(prof, c))
    best: tuple[float, tuple[int, ...]] | None = None
    for counts in splits:
        alone = pipeline_of(counts, [plan.WorkerId(w) for w in range(depth)], depth)
        estimate = estimates.pipeline(alone, running.micro_batch_size, running.gpus_per_node)
        if estimates.fits(estimate) and (best is None or (estimate.step_s, counts) < best):
            best = (estimate.step_s, counts)
    return None if best is None else best[1]


def pipeline_of(
    counts: Sequence[int], workers: Sequence[plan.WorkerId], num_micro_batches: int
) -> plan.Pipeline:
    """Stages of `counts` layers each, in order, one worker each."""
    bounds = list(itertools.accumulate(counts, initial=0))
    stages = tuple(
        plan.Stage(layer_start=a, layer_stop=b, workers=(w,))
        for (a, b), w in zip(itertools.pairwise(bounds), workers, strict=True)
    )
    return plan.Pipeline(stages=stages, num_micro_batches=num_micro_batches)


# --- the search --------------------------------------------------------------------------------


def search(
    failure: Failure,
    estimates: Estimates,
    settings: SearchSettings,
    given: Sequence[plan.Plan] = (),
) -> Search:
    """Every candidate for recovering from `failure`, screened, bound to the survivors, with
    rejections. `given` layouts (over survivors, same global batch) are candidates too.

    Raises PlanInputError when the profile does not fit the plan or a given layout does not
    fit the job; InfeasibleError when no worker survives.
    """
    running = failure.running
    if estimates.profile.num_layers != running.num_layers:
        raise errors.PlanInputError(
            f"the profile has {estimates.profile.num_layers} layers but the plan "
            f"{running.num_layers}; profile the model the plan is for"
        )
    held = transfers.holdings(running, failure.failed, failure.spare)
    if not held:
        raise errors.InfeasibleError("every worker of the plan failed; nothing can recover")
    found: list[Candidate | Rejection] = [_rerouted(failure, estimates, settings)]
    for depths in configurations(
        len(held),
        len(running.pipelines),
        running.num_layers,
        running.num_micro_batches,
        settings.dp_radius,
    ):
        found.extend(_configured(depths, held, running, estimates, settings))
    for number, layout in enumerate(given):
        found.append(_given(number, layout, held, running, estimates, settings))
    return Search(
        candidates=tuple(c for c in found if isinstance(c, Candidate)),
        rejected=tuple(c for c in found if isinstance(c, Rejection)),
    )


def exact(candidate: Candidate, estimates: Estimates) -> Candidate:
    """The candidate with E's estimate of its whole plan (all-reduces, reroutes included)."""
    if candidate.exact:
        return candidate
    return replace(candidate, estimate=estimates.whole(candidate.plan), exact=True)


def _rerouted(
    failure: Failure, estimates: Estimates, settings: SearchSettings
) -> Candidate | Rejection:
    try:
        new = rerouting.reroute(failure.running, failure.failed)
    except errors.InfeasibleError as exc:
        return Rejection(kind=Kind.REROUTE, label="reroute", why=str(exc))
    label = "reroute " + _reroute_label(new)
    estimate = estimates.whole(new)
    if not estimates.fits(estimate):
        return Rejection(kind=Kind.REROUTE, label=label, why=_over(estimate, estimates))
    return Candidate(
        kind=Kind.REROUTE,
        label=label,
        transition=transfers.keep(new, settings.overheads),
        estimate=estimate,
        exact=True,
    )


def _reroute_label(new: plan.Plan) -> str:
    peers: dict[tuple[int, int], list[int]] = {}
    for r in new.reroutes:
        peers.setdefault((r.pipeline, r.stage), []).append(r.peer_pipeline)
    return "; ".join(
        f"pipeline {p} stage {s} -> pipeline{'s' if len(qs) > 1 else ''} {', '.join(map(str, qs))}"
        for (p, s), qs in sorted(peers.items())
    )


def _configured(
    depths: tuple[int, ...],
    held: transfers.Holdings,
    running: plan.Plan,
    estimates: Estimates,
    settings: SearchSettings,
) -> list[Candidate | Rejection]:
    """The DP/PP configuration `depths` with the best split per depth (Alg. 1 lines 13-15) and,
    when it differs, with the running plan's split for depths it already runs: fewer layers
    move, which eq. 8 may prefer to a slightly faster step."""
    best = {d: split_layers(estimates, d, running, settings) for d in sorted(set(depths))}
    found = [_laid_out(depths, best, "", held, running, estimates, settings)]
    current = {len(p.stages): _counts(p) for p in reversed(running.pipelines)}
    kept = {d: current.get(d, counts) for d, counts in best.items()}
    if kept != best:
        found.append(
            _laid_out(depths, kept, " (running split)", held, running, estimates, settings)
        )
    return found


def _counts(pipeline: plan.Pipeline) -> tuple[int, ...]:
    return tuple(len(stage.layers) for stage in pipeline.stages)


def _laid_out(
    depths: tuple[int, ...],
    splits: dict[int, tuple[int, ...] | None],
    suffix: str,
    held: transfers.Holdings,
    running: plan.Plan,
    estimates: Estimates,
    settings: SearchSettings,
) -> Candidate | Rejection:
    """`depths` with `splits` laid out on the survivors in order, batch distributed."""
    kind = Kind.SYMMETRIC if len(set(depths)) == 1 else Kind.ASYMMETRIC
    label = _depths_label(depths, splits) + suffix
    unfit = [d for d, counts in splits.items() if counts is None]
    if unfit:
        why = (
            f"no split of {running.num_layers} layers into {unfit[0]} stages fits in "
            f"{estimates.memory_bytes / 2**30:.2f} GiB per worker"
        )
        return Rejection(kind=kind, label=label, why=why)
    layout = _layout(depths, splits, list(held), running, estimates)
    return _screened(kind, label, layout, held, estimates, settings)


def _layout(
    depths: tuple[int, ...],
    splits: dict[int, tuple[int, ...] | None],
    workers: list[plan.WorkerId],
    running: plan.Plan,
    estimates: Estimates,
) -> plan.Plan:
    """Pipelines of `depths` on consecutive `workers`, the running batch distributed."""
    counts = [splits[d] for d in depths]
    assert all(c is not None for c in counts), "callers reject depths without a split"
    chosen = [c for c in counts if c is not None]
    batch = distribute_batch(estimates, chosen, running)
    pipelines, used = [], 0
    for split, num_micro_batches in zip(chosen, batch, strict=True):
        pipelines.append(pipeline_of(split, workers[used : used + len(split)], num_micro_batches))
        used += len(split)
    return plan.Plan(
        pipelines=tuple(pipelines),
        micro_batch_size=running.micro_batch_size,
        gpus_per_node=running.gpus_per_node,
    )


def prepare(
    running: plan.Plan, estimates: Estimates, settings: SearchSettings, max_failed: int = 1
) -> None:
    """Fill the memo for failures of up to `max_failed` workers of `running` ahead of time
    (Odyssey §IV-C: the search overlaps with training): layer splits of every depth the search
    may try and screens of the pipelines it lays out (exact keys for one GPU per node)."""
    for survivors in range(max(1, len(running.workers) - max_failed), len(running.workers)):
        for depths in configurations(
            survivors,
            len(running.pipelines),
            running.num_layers,
            running.num_micro_batches,
            settings.dp_radius,
        ):
            splits = {d: split_layers(estimates, d, running, settings) for d in set(depths)}
            if None not in splits.values():
                workers = [plan.WorkerId(w) for w in range(survivors)]
                layout = _layout(depths, splits, workers, running, estimates)
                for p in layout.pipelines:
                    estimates.pipeline(p, layout.micro_batch_size, layout.gpus_per_node)


def _depths_label(depths: tuple[int, ...], splits: dict[int, tuple[int, ...] | None]) -> str:
    """ "DP=2 x PP=4 [2, 2, 2, 3]", or "DP=3: 2 x PP=3 [..] + 1 x PP=2 [..]" (layer counts)."""

    def pp(depth: int) -> str:
        counts = splits[depth]
        return f"PP={depth}" + ("" if counts is None else f" {list(counts)}")

    if len(set(depths)) == 1:
        return f"DP={len(depths)} x {pp(depths[0])}"
    groups = sorted(set(depths), reverse=True)
    return f"DP={len(depths)}: " + " + ".join(f"{depths.count(d)} x {pp(d)}" for d in groups)


def _given(
    number: int,
    layout: plan.Plan,
    held: transfers.Holdings,
    running: plan.Plan,
    estimates: Estimates,
    settings: SearchSettings,
) -> Candidate | Rejection:
    if layout.global_batch_size != running.global_batch_size:
        raise errors.PlanInputError(
            f"given layout {number} trains a global batch of {layout.global_batch_size} "
            f"samples but the job's is {running.global_batch_size}; keep the global batch"
        )
    depths = "+".join(str(len(p.stages)) for p in layout.pipelines)
    label = f"given {number}: DP={len(layout.pipelines)} PP={depths}"
    return _screened(Kind.GIVEN, label, layout, held, estimates, settings)


def _screened(
    kind: Kind,
    label: str,
    layout: plan.Plan,
    held: transfers.Holdings,
    estimates: Estimates,
    settings: SearchSettings,
) -> Candidate | Rejection:
    """Bind the layout to the survivors and screen it (eq. 10 over its pipelines alone)."""
    alone = [
        estimates.pipeline(p, layout.micro_batch_size, layout.gpus_per_node)
        for p in layout.pipelines
    ]
    screen = Estimate(
        step_s=max(e.step_s for e in alone), peak_bytes=max(e.peak_bytes for e in alone)
    )
    if not estimates.fits(screen):
        return Rejection(kind=kind, label=label, why=_over(screen, estimates))
    transition = transfers.replan(held, layout, estimates.profile, settings.overheads)
    return Candidate(kind=kind, label=label, transition=transition, estimate=screen, exact=False)


def _over(estimate: Estimate, estimates: Estimates) -> str:
    return (
        f"needs {estimate.peak_bytes / 2**30:.2f} GiB at peak on some worker, over the "
        f"{estimates.memory_bytes / 2**30:.2f} GiB per worker"
    )
