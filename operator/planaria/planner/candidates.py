"""Candidate search after a failure (Odyssey Alg. 1 and §IV-A): the plans the policy chooses from.

Given the running plan and the failed workers, `search` lists:
- rerouting (`rerouting`): the same layout, failed stages' micro-batches on same-stage peers;
- symmetric and asymmetric DP/PP configurations over all survivors (Alg. 1
  `get_parallel_strategy`): for each DP degree within `dp_radius` of the current one (Odyssey:
  "the new DP degree often differs from the original by less than 2", so 1 by default), the
  symmetric layout DP x floor(N/DP) and, when DP does not divide N, the balanced asymmetric one
  that uses every survivor (N mod DP pipelines one stage deeper). Each gets the fastest layer
  split per depth and, for depths the running plan has, also the running split (fewer layers
  move, which eq. 8 may prefer); layers and batch from `distribution` (Alg. 1 lines 13-14);
- caller-given layouts, e.g. the Oobleck templates' reinstantiations over the survivors.

Every re-planned candidate is bound to the survivors by min-cost matching (`transfers`). Its step
time is screened (`screening`: Odyssey eq. 10 over its pipelines estimated alone); `exact` asks
E's estimator for the whole plan, with all-reduces, for the candidates the policy shortlists.
Rerouting is always estimated whole (its cost is the peers' extra work, which no pipeline alone
shows). There is one performance model, `estimator` and `memory`; this module only decides what
to ask them. Rejected candidates (out of memory, rerouting impossible) come back with the reason.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from planaria.contract import errors, plan
from planaria.planner import distribution, rerouting, screening, transfers


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
class Candidate:
    """A plan the job could move to. `exact`: `estimate` is E's estimate of the whole plan;
    otherwise it is the eq. 10 screen (slowest pipeline alone, no all-reduce)."""

    kind: Kind
    label: str
    transition: transfers.Transition
    estimate: screening.Estimate
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


# --- Alg. 1 get_parallel_strategy --------------------------------------------------------------


def configurations(
    num_workers: int, old_dp: int, num_layers: int, num_micro_batches: int, dp_radius: int
) -> tuple[tuple[int, ...], ...]:
    """Pipeline depths of each DP/PP configuration to try, deepest pipeline first: for DP
    within the radius (at most one pipeline per worker and per micro-batch; when that leaves
    none in the radius, as many pipelines as there can be), the symmetric DP x floor(N/DP)
    and the balanced asymmetric layout using all N workers."""
    found: list[tuple[int, ...]] = []
    high = min(old_dp + dp_radius, num_workers, num_micro_batches)
    low = min(max(1, old_dp - dp_radius), high)  # too few survivors: the most pipelines left
    for dp in range(low, high + 1):
        depth, extra = divmod(num_workers, dp)
        symmetric = (min(depth, num_layers),) * dp
        found.append(symmetric)
        if extra and depth + 1 <= num_layers:  # N mod DP pipelines one deeper: nobody idles
            found.append((depth + 1,) * extra + (depth,) * (dp - extra))
    return tuple(dict.fromkeys(found))


# --- the search --------------------------------------------------------------------------------


def search(
    failure: Failure,
    estimates: screening.Estimates,
    settings: SearchSettings,
    given: Sequence[plan.Plan] = (),
    *,
    kinds: Collection[Kind] | None = None,
) -> Search:
    """Every candidate for recovering from `failure`, screened, bound to the survivors, with
    rejections. `given` layouts (over survivors, same global batch) are candidates too.
    `kinds` (default: all) builds only candidates of those kinds, the same ones in the same
    order as filtering the full search (the simulator's dynamic-only and rerouting-only
    policies: at 1,024 nodes rerouting's whole-plan estimate or the re-plans' matchings are
    most of a decision).

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
    wanted = frozenset(Kind if kinds is None else kinds)
    # shared by every binding below; their inner matchings by every decision
    survivors = transfers.Survivors(held, estimates.profile, estimates.matchings)
    found: list[Candidate | Rejection] = []
    if Kind.REROUTE in wanted:
        # rerouting is estimated whole here: its cost is the peers' extra work
        found.append(_rerouted(failure, estimates, settings))
    if wanted & {Kind.SYMMETRIC, Kind.ASYMMETRIC}:
        for depths in configurations(
            len(held),
            len(running.pipelines),
            running.num_layers,
            running.num_micro_batches,
            settings.dp_radius,
        ):
            found.extend(_configured(depths, survivors, running, estimates, settings))
    if Kind.GIVEN in wanted:
        for number, layout in enumerate(given):
            found.append(_given(number, layout, survivors, running, estimates, settings))
    found = [c for c in found if c.kind in wanted]
    return Search(
        candidates=tuple(c for c in found if isinstance(c, Candidate)),
        rejected=tuple(c for c in found if isinstance(c, Rejection)),
    )


def exact(candidate: Candidate, estimates: screening.Estimates) -> Candidate | Rejection:
    """The candidate with E's estimate of its whole plan (all-reduces, reroutes included), or
    its rejection when the whole plan's peak memory is over the limit."""
    if candidate.exact:
        return candidate
    # Every re-planned candidate is bound by `Survivors.replan`, which plays each of the
    # layout's nodes by a whole surviving node, a different one each: the target numbers its
    # nodes by first use as the layout does, so it has the layout's memo key, and E's estimate
    # does not depend on the labels (test_screening). Estimating the layout leaves the target
    # unbuilt unless eq. 8 chooses it (relabelling ~5,800 stages was most of this call).
    estimate = estimates.whole(candidate.transition.layout)
    if not estimates.fits(estimate):
        why = _over(estimate, estimates) + " (whole plan)"
        return Rejection(kind=candidate.kind, label=candidate.label, why=why)
    return replace(candidate, estimate=estimate, exact=True)


def _rerouted(
    failure: Failure, estimates: screening.Estimates, settings: SearchSettings
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
    """ "pipeline 1 stage 1 -> pipelines 0, 2", one part per hole; a pipeline whose every stage
    is a hole with the same peers reads "pipeline 1 (all stages) -> pipelines 0, 2"."""
    peers: dict[int, dict[int, list[int]]] = {}
    for r in new.reroutes:
        peers.setdefault(r.pipeline, {}).setdefault(r.stage, []).append(r.peer_pipeline)
    parts = []
    for p, stages in sorted(peers.items()):
        targets = {tuple(qs) for qs in stages.values()}
        if len(stages) == len(new.pipelines[p].stages) > 1 and len(targets) == 1:
            parts.append(f"pipeline {p} (all stages) -> {_pipelines(next(iter(targets)))}")
        else:
            parts.extend(f"pipeline {p} stage {s} -> {_pipelines(qs)}" for s, qs in stages.items())
    return "; ".join(parts)


def _pipelines(indices: Sequence[int]) -> str:
    return f"pipeline{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"


def _configured(
    depths: tuple[int, ...],
    survivors: transfers.Survivors,
    running: plan.Plan,
    estimates: screening.Estimates,
    settings: SearchSettings,
) -> list[Candidate | Rejection]:
    """The DP/PP configuration `depths` with the best split per depth (Alg. 1 lines 13-15) and,
    when it differs, with the running plan's split for depths it already runs: fewer layers
    move, which eq. 8 may prefer to a slightly faster step."""
    best = {
        d: distribution.split_layers(estimates, d, running, settings.max_splits)
        for d in sorted(set(depths))
    }
    found = [_laid_out(depths, best, "", survivors, running, estimates, settings)]
    # the first running pipeline of each depth wins (reversed: later ones are overwritten)
    current = {len(p.stages): _counts(p) for p in reversed(running.pipelines)}
    kept = {d: current.get(d, counts) for d, counts in best.items()}
    if kept != best:
        found.append(
            _laid_out(depths, kept, " (running split)", survivors, running, estimates, settings)
        )
    return found


def _counts(pipeline: plan.Pipeline) -> tuple[int, ...]:
    return tuple(len(stage.layers) for stage in pipeline.stages)


def _laid_out(
    depths: tuple[int, ...],
    splits: dict[int, tuple[int, ...] | None],
    suffix: str,
    survivors: transfers.Survivors,
    running: plan.Plan,
    estimates: screening.Estimates,
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
    # what `_layout` reads of its arguments; the same layout whenever they recur
    key = (
        survivors.key,
        depths,
        tuple(sorted(splits.items())),
        running.micro_batch_size,
        running.gpus_per_node,
        running.global_batch_size,
    )
    found = estimates.layouts.get(key)
    if found is None:
        layout = _layout(depths, splits, survivors.workers, running, estimates)
        found = (layout, _screen(layout, estimates))
        estimates.remember(estimates.layouts, key, found, sum(depths))  # a worker per stage
    return _screened(kind, label, found[0], survivors, estimates, settings, found[1])


def _layout(
    depths: tuple[int, ...],
    splits: dict[int, tuple[int, ...] | None],
    workers: list[plan.WorkerId],
    running: plan.Plan,
    estimates: screening.Estimates,
) -> plan.Plan:
    """Pipelines of `depths` on consecutive `workers`, the running batch distributed."""
    counts = [splits[d] for d in depths]
    assert all(c is not None for c in counts), "callers reject depths without a split"
    chosen = [c for c in counts if c is not None]
    batch = distribution.distribute_batch(estimates, chosen, running)
    # consecutive workers: with several GPUs per node, neighbouring stages share a node
    pipelines, used = [], 0
    for split, num_micro_batches in zip(chosen, batch, strict=True):
        pipelines.append(
            distribution.pipeline_of(split, workers[used : used + len(split)], num_micro_batches)
        )
        used += len(split)
    return plan.Plan(
        pipelines=tuple(pipelines),
        micro_batch_size=running.micro_batch_size,
        gpus_per_node=running.gpus_per_node,
    )


def prepare(
    running: plan.Plan,
    estimates: screening.Estimates,
    settings: SearchSettings,
    max_failed: int = 1,
) -> None:
    """Fill the memo ahead of failures of up to `max_failed` workers of `running` (Odyssey
    §IV-C: the search overlaps with training): run the search for the last k workers failing
    and estimate every re-planned candidate whole. With one GPU per node every failure of k
    workers lays out the same node patterns, so a later decision only estimates its
    rerouting; with more, layouts after other failures may differ and are estimated then."""
    workers = sorted(running.workers)
    for k in range(1, min(max_failed, len(workers) - 1) + 1):
        failure = Failure(running=running, failed=frozenset(workers[-k:]))
        for candidate in search(failure, estimates, settings).candidates:
            exact(candidate, estimates)


def _depths_label(depths: tuple[int, ...], splits: dict[int, tuple[int, ...] | None]) -> str:
    """ "DP=2 x PP=4 [2, 2, 2, 3]", or "DP=3: 2 x PP=3 [..] + 1 x PP=2 [..]" (layer counts)."""

    def pp(depth: int) -> str:
        counts = splits[depth]
        return f"PP={depth}" + ("" if counts is None else f" {list(counts)}")

    if len(set(depths)) == 1:
        return f"DP={len(depths)} x {pp(depths[0])}"
    groups = sorted(set(depths), reverse=True)
    return f"DP={len(depths)}: " + " + ".join(f"{depths.count(d)} x {pp(d)}" for d in groups)


def _depth_counts(depths: Sequence[int]) -> str:
    """ "DP=1022 x PP=1", or "DP=257: 1 x PP=4 + 256 x PP=1": one term per depth, deepest first
    (at 1,024 nodes a layout's depths one by one made a label of thousands of characters)."""
    if len(set(depths)) == 1:
        return f"DP={len(depths)} x PP={depths[0]}"
    counts = sorted(set(depths), reverse=True)
    return f"DP={len(depths)}: " + " + ".join(f"{depths.count(d)} x PP={d}" for d in counts)


def _given(
    number: int,
    layout: plan.Plan,
    survivors: transfers.Survivors,
    running: plan.Plan,
    estimates: screening.Estimates,
    settings: SearchSettings,
) -> Candidate | Rejection:
    if layout.global_batch_size != running.global_batch_size:
        raise errors.PlanInputError(
            f"given layout {number} trains a global batch of {layout.global_batch_size} "
            f"samples but the job's is {running.global_batch_size}; keep the global batch"
        )
    label = f"given {number}: {_depth_counts([len(p.stages) for p in layout.pipelines])}"
    return _screened(Kind.GIVEN, label, layout, survivors, estimates, settings)


def _screened(
    kind: Kind,
    label: str,
    layout: plan.Plan,
    survivors: transfers.Survivors,
    estimates: screening.Estimates,
    settings: SearchSettings,
    screen: screening.Estimate | None = None,
) -> Candidate | Rejection:
    """Bind the layout to the survivors and screen it (`screen`, its `_screen` when known)."""
    if screen is None:
        screen = _screen(layout, estimates)
    if not estimates.fits(screen):
        return Rejection(kind=kind, label=label, why=_over(screen, estimates))
    # the same binding whenever these survivors meet this layout again (`Estimates.transitions`)
    key = (survivors.key, layout, settings.overheads)
    transition = estimates.transitions.get(key)
    if transition is None:
        transition = survivors.replan(layout, settings.overheads)
        estimates.remember(estimates.transitions, key, transition, len(transition.binding or ()))
    return Candidate(kind=kind, label=label, transition=transition, estimate=screen, exact=False)


def _screen(layout: plan.Plan, estimates: screening.Estimates) -> screening.Estimate:
    """Eq. 10 over the layout's pipelines alone: the slowest step and the largest peak."""
    alone = [
        estimates.pipeline(p, layout.micro_batch_size, layout.gpus_per_node)
        for p in layout.pipelines
    ]
    return screening.Estimate(
        step_s=max(e.step_s for e in alone), peak_bytes=max(e.peak_bytes for e in alone)
    )


def _over(estimate: screening.Estimate, estimates: screening.Estimates) -> str:
    return (
        f"needs {estimate.peak_bytes / 2**30:.2f} GiB at peak on some worker, over the "
        f"{estimates.memory_bytes / 2**30:.2f} GiB per worker"
    )
