"""E's estimators behind a memo, for the candidate search (Odyssey §IV-C, eq. 10 screening).

`Estimates.whole` is E's time and memory estimate of a whole plan (`schedule`, `estimator`,
`memory`); `Estimates.pipeline` the same for one pipeline run alone. Both are keyed by what an
estimate depends on (layer ranges, micro-batches, node pattern: `canonical`), so identical
pipelines and relabelled plans are estimated once (with one GPU per node, by each stage's layer
range and worker count, which say the same). The candidate search screens a layout by
its slowest pipeline alone (Odyssey eq. 10, t_step = max over pipelines) and estimates whole
plans only for the shortlist; the memo can be filled ahead of a failure (Odyssey §IV-C: the
search overlaps with training). A plan without reroutes is not replayed whole: its pipelines'
replays alone (memoised, usually already made by the screen) and a replay of its all-reduce
tail give the same numbers (`composition`). The same object keeps the planner's other memos
across decisions: each depth's best split, and the candidate search's re-planned layouts and
their min-cost bindings.

This module adds no cost model of its own: every number comes from `estimator` and `memory`.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from planaria.contract import errors, plan, profile, schedule
from planaria.planner import composition, copies, estimator, memory, transfers


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """E's step time and peak memory for a plan (or one pipeline alone)."""

    step_s: float
    peak_bytes: int


# Workers of the remembered re-plans (`Estimates.layouts`, `.transitions`, each counted) at
# most: a 1,024-worker layout takes ~0.5 MB, so ~80 MB here; past it the oldest are forgotten
# (the simulator's policies meet a failure one after another, so the newest are the ones asked)
MAX_REMEMBERED_WORKERS = 1 << 18
# Inner matchings' cost blocks (`Estimates.matchings`) at most: a 2-hour run of 1,024 nodes of
# 8 GPUs meets 87; each is a few hundred bytes
MAX_MATCHINGS = 1 << 12

_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


class Estimates:
    """E's estimators behind a memo. A step estimate depends on the workers only through which
    share a node, so plans are keyed with nodes renumbered in order of first use (`canonical`):
    estimates of relabelled plans (a layout and its matched copy, the same layout after
    different failures) and of identical pipelines are computed once. Keep one instance per
    profile to reuse the memo across decisions (Odyssey: the search can run ahead of failures).
    `memory_bytes` is the per-worker limit plans must fit (default: the profile's accelerator).

    A plan without reroutes is estimated from its pipelines run alone (each replayed once, and
    usually already, by the screen) and a replay of its gradient tail (`composition`): the
    same numbers as replaying it whole, bit for bit. `compose=False` replays every plan whole
    (the reference the tests and `bench/policy.py --before` compare with)."""

    def __init__(
        self, prof: profile.Profile, memory_bytes: int | None = None, *, compose: bool = True
    ) -> None:
        if memory_bytes is not None and memory_bytes < 1:
            raise errors.PlanInputError(f"memory_bytes is {memory_bytes}; give bytes >= 1")
        self.profile = prof
        self.memory_bytes = prof.memory_bytes if memory_bytes is None else memory_bytes
        self.compose = compose
        self._memo: dict[object, Estimate] = {}
        self._runs: dict[object, composition.PipelineRun] = {}
        # `distribution.split_layers`' answers by (depth, micro-batch size, GPUs per node,
        # max_splits): what it depends on besides this profile and memory limit
        self.splits: dict[tuple[int, int, int, int], tuple[int, ...] | None] = {}
        # `candidates`' re-planned layouts bound to the survivors, by (the survivors'
        # holdings, layout, overheads): policies that decide alike meet the same failure with
        # the same running plan (in the simulator half the matchings of a 1,024-node run)
        # `candidates`' re-planned layouts with their eq. 10 screens, by (the survivors'
        # holdings, depths, splits, the running plan's micro-batch size, GPUs per node and
        # global batch): for the same reason
        self.layouts: dict[tuple[object, ...], tuple[plan.Plan, Estimate]] = {}
        self.transitions: dict[
            tuple[tuple[tuple[plan.WorkerId, frozenset[int]], ...], plan.Plan, transfers.Overheads],
            transfers.Transition,
        ] = {}
        # `transfers`' inner matchings of a survivors' node and a layout's node, by their cost
        # block: a few dozen distinct blocks over a run's tens of thousands (`Survivors`)
        self.matchings: transfers.Matchings = {}
        self.computed = 0  # estimator runs so far (schedules compiled and replayed)
        self._remembered = 0  # workers of the entries of `layouts` and `transitions`
        # those entries, oldest first: (memo, key, workers)
        self._kept: deque[tuple[dict[Any, Any], object, int]] = deque()

    def whole(self, plan_: plan.Plan) -> Estimate:
        """Step time and peak memory of the whole plan (all-reduces, reroutes included)."""
        # E's estimates are invariant under relabelling nodes and GPUs (test_screening)
        shape = _shape(plan_.pipelines, plan_.gpus_per_node, distinct=True)
        key = (shape, plan_.micro_batch_size, plan_.gpus_per_node, plan_.reroutes)
        if key not in self._memo:
            composed = self._composed(plan_) if self.compose else None
            if composed is not None:
                self._memo[key] = composed
            else:
                self.computed += 1
                sched = schedule.compile_schedule(plan_)
                self._memo[key] = Estimate(
                    step_s=estimator.estimate_step(sched, self.profile).step_s,
                    peak_bytes=memory.estimate_memory(sched, self.profile).peak_bytes,
                )
        return self._memo[key]

    def pipeline(self, pipeline: plan.Pipeline, micro_batch_size: int, gpus: int) -> Estimate:
        """One pipeline run alone (no all-reduce: nobody shares its layers)."""
        key = (_shape((pipeline,), gpus), micro_batch_size, gpus, ())
        if key not in self._memo:
            alone = plan.Plan(
                pipelines=(pipeline,), micro_batch_size=micro_batch_size, gpus_per_node=gpus
            )
            self.whole(alone)
        return self._memo[key]

    def remember(
        self, memo: dict[_Key, _Value], key: _Key, value: _Value, num_workers: int
    ) -> _Value:
        """Keep `value` under `key` in `memo` (`layouts` or `transitions`), counted as
        `num_workers` workers, and give it back. Past `MAX_REMEMBERED_WORKERS` in all the
        oldest entries are forgotten, and past `MAX_MATCHINGS` blocks `matchings` is emptied (a
        controller decides for as long as its job runs): no answer changes, only what is
        computed again."""
        memo[key] = value
        self._kept.append((memo, key, num_workers))
        self._remembered += num_workers
        while self._remembered > MAX_REMEMBERED_WORKERS:
            oldest, old_key, old_workers = self._kept.popleft()
            del oldest[old_key]
            self._remembered -= old_workers
        if len(self.matchings) > MAX_MATCHINGS:
            self.matchings.clear()
        return value

    def fits(self, estimate: Estimate) -> bool:
        return estimate.peak_bytes <= self.memory_bytes

    def _composed(self, plan_: plan.Plan) -> Estimate | None:
        """`composition`'s estimate: each distinct pipeline outside the reroutes replayed alone
        once, those in them together, then the tail; None when it must be replayed whole."""
        moved = composition.involved(plan_)
        arrival: dict[plan.WorkerId, float] = {}
        peak = 0
        if moved:
            rerouted = composition.run_rerouted(plan_, moved, self.profile)
            if rerouted is None:
                return None
            self.computed += 1
            arrival, peak = rerouted
        gpus = plan_.gpus_per_node
        if not moved and gpus == 1 and plan_.num_layers == self.profile.num_layers:
            kinds = self._kinds(plan_)
            if kinds is not None:  # one-worker stages on one-GPU nodes: per kind (`copies`)
                step_s, peak_bytes = copies.whole(kinds, self.profile)
                return Estimate(step_s=step_s, peak_bytes=peak_bytes)
        alone = [p for q, p in enumerate(plan_.pipelines) if q not in moved]
        runs = [self.run(p, plan_.micro_batch_size, gpus, planned=True) for p in alone]
        if len(runs) == len(plan_.pipelines) == 1:  # alone, the replay timed the tail already
            return Estimate(step_s=runs[0].step_s, peak_bytes=runs[0].peak_bytes)
        for pipeline, run in zip(alone, runs, strict=True):
            arrival.update(composition.arrivals(pipeline, run))
        return Estimate(
            step_s=composition.step_s(plan_, arrival, self.profile),
            peak_bytes=max([peak, *(r.peak_bytes for r in runs)]),
        )

    def _kinds(self, plan_: plan.Plan) -> list[copies.Copies] | None:
        """`plan_`'s pipelines as kinds of copies (split and micro-batches) with their runs,
        or None when a stage has several workers."""
        found: dict[tuple[tuple[int, ...], int], tuple[plan.Pipeline, int]] = {}
        for pipeline in plan_.pipelines:
            if any(len(stage.workers) != 1 for stage in pipeline.stages):
                return None
            split = tuple([stage.layer_stop - stage.layer_start for stage in pipeline.stages])
            key = (split, pipeline.num_micro_batches)
            first, count = found.get(key, (pipeline, 0))
            found[key] = (first, count + 1)
        return [
            copies.Copies(
                split=split, run=self.run(first, plan_.micro_batch_size, 1, planned=True), count=n
            )
            for (split, _), (first, n) in found.items()
        ]

    def run(
        self, pipeline: plan.Pipeline, micro_batch_size: int, gpus: int, *, planned: bool = False
    ) -> composition.PipelineRun:
        """`pipeline` replayed alone (memoised): when each stage reaches its tail, its step
        and peak; what whole estimates are composed from. `planned`: the pipeline belongs to
        a `plan.Plan`, so no worker appears twice in it (the memo key need not look)."""
        key = (_shape((pipeline,), gpus, distinct=planned), micro_batch_size, gpus)
        if key not in self._runs:
            self.computed += 1
            self._runs[key] = composition.run_alone(pipeline, micro_batch_size, gpus, self.profile)
        return self._runs[key]


_Shape = tuple[tuple[tuple[tuple[int, int, tuple[int, ...]], ...], int], ...]
_OneGpuShape = tuple[tuple[tuple[tuple[int, int, int], ...], int], ...]
_NodeShape = tuple[str, _OneGpuShape, tuple[int, ...]]


def _shape(
    pipelines: Sequence[plan.Pipeline], gpus_per_node: int, *, distinct: bool = False
) -> _Shape | _OneGpuShape | _NodeShape:
    """The memo key of `pipelines`: per stage its layer range and worker count, with several
    GPUs per node also each worker's node in order of use (`_node_shape`), a fraction of
    `canonical`'s cost; `canonical` itself when it numbers the workers as no pipelines without
    a repeated worker would (always possible when no worker appears twice: `distinct`, as a
    `plan.Plan` checks it, skips the look). The three forms never compare equal (a count is
    no tuple; a node shape starts with a string), and `canonical`'s numbers follow from each
    other form and give it back, so pipelines share a key exactly when they share
    `canonical`'s (tests/planner/test_screening.py)."""
    if not distinct:
        workers = [w for p in pipelines for stage in p.stages for w in stage.workers]
        if len(set(workers)) != len(workers):
            shape = canonical(pipelines, gpus_per_node)
            numbers = [w for stages, _ in shape for _, _, mine in stages for w in mine]
            nodes = _nodes_of(numbers, gpus_per_node)
            if nodes is None:
                return shape
            if gpus_per_node != 1:
                return ("nodes", _one_gpu_shape(pipelines), nodes)
    if gpus_per_node != 1:
        return _node_shape(pipelines, gpus_per_node)
    return _one_gpu_shape(pipelines)


def _nodes_of(numbers: Sequence[int], gpus_per_node: int) -> tuple[int, ...] | None:
    """The nodes in order of use of workers that `canonical` numbered `numbers`, when workers
    appearing once each would be numbered so: every node numbered by first use and each
    worker's GPU the count of its node's workers before it (None: no such workers)."""
    nodes = [n // gpus_per_node for n in numbers]
    used: dict[int, int] = {}
    for node, number in zip(nodes, numbers, strict=True):
        if node > len(used) or node * gpus_per_node + used.get(node, 0) != number:
            return None
        used[node] = used.get(node, 0) + 1
    return tuple(nodes)


def _one_gpu_shape(pipelines: Sequence[plan.Pipeline]) -> _OneGpuShape:
    """Per pipeline its stages' (layer_start, layer_stop, worker count) and micro-batches."""
    return tuple(
        (
            tuple([(s.layer_start, s.layer_stop, len(s.workers)) for s in p.stages]),
            p.num_micro_batches,
        )
        for p in pipelines
    )


def _node_shape(pipelines: Sequence[plan.Pipeline], gpus_per_node: int) -> _NodeShape:
    """The key of pipelines in which no worker appears twice, on nodes of `gpus_per_node`:
    `_one_gpu_shape` and each worker's node in order of use, numbered 0, 1, ... by first use.
    `canonical`'s numbers follow (a worker's GPU is the count of its node's earlier workers)
    and give these back (its node is its number // `gpus_per_node`); about two thirds of its
    cost at ~6,000 workers, where it walked every worker of every re-planned plan."""
    first: dict[int, int] = {}
    nodes = tuple(
        [
            first.setdefault(w // gpus_per_node, len(first))
            for p in pipelines
            for stage in p.stages
            for w in stage.workers
        ]
    )
    return ("nodes", _one_gpu_shape(pipelines), nodes)


def canonical(pipelines: Sequence[plan.Pipeline], gpus_per_node: int) -> _Shape:
    """Per pipeline its (layer_start, layer_stop, workers) stages and micro-batches, with nodes
    renumbered 0, 1, ... in order of first use and GPUs in order of use within a node: what
    an estimate depends on."""
    nodes: dict[int, int] = {}
    used: dict[int, int] = defaultdict(int)
    shape = []
    for pipeline in pipelines:
        stages = []
        for stage in pipeline.stages:
            workers = []
            for worker in stage.workers:
                node = nodes.setdefault(worker // gpus_per_node, len(nodes))
                workers.append(node * gpus_per_node + used[node])
                used[node] += 1
            stages.append((stage.layer_start, stage.layer_stop, tuple(workers)))
        shape.append((tuple(stages), pipeline.num_micro_batches))
    return tuple(shape)
