"""Reinstantiation after node failures (Oobleck §5.1, with App. A and B's guarantees).

Two candidates are built on the surviving nodes, each with its exact batch distribution:

1. Oobleck §5.1: pipelines that lost no node stay as they are. A pipeline left with at least
   n0 nodes is reinstantiated from the template of its survivors (simple). One left with fewer
   borrows whole nodes from pipelines that have more than n0 until it has n0, the lenders
   becoming smaller templates (borrow); when the spare nodes do not suffice it is merged with
   another short pipeline or, failing that, with the smallest pipeline (merge). A merge joins
   fewer than n0 nodes to at most n0 plus the spare that could not cover the deficit, so it has
   n0..2 n0 - 1 nodes, for which App. B guarantees a template whenever at least (f + 1) n0
   nodes survive. A pipeline that lost every node is gone.
2. Re-optimised: the best instantiation of the surviving nodes (`planaria.planner.
   instantiation`), unlike the original code, which only redistributes the batch. Intact old
   pipelines of a size the new mix uses are kept; the other survivors fill the new pipelines in
   their old order.

The higher throughput wins; at equal throughput (relative 1e-9) the one that moves fewer bytes,
then §5.1's. Nodes of a reinstantiated pipeline are ordered by the first layer they held, so
workers tend to keep their layers. Moved bytes are counted exactly under this model: a worker
of a k-GPU stage at rank i holds shard [i n // k, (i + 1) n // k) of each of the stage's layers
(n = parameter + optimizer bytes, `planaria.contract.plan.LayerTransfer`'s split); it must
receive whatever part of its new shard it did not hold. Which live replica sends it (a
min-cost matching) is the transfer planner's business, not this module's.

Raises PlanInputError for failed nodes that are not in the plan, InfeasibleError when a layer
has no live replica or fewer than (f + 1) n0 nodes survive.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from planaria.contract import errors, plan
from planaria.planner import batching, instantiation, mix, templates

_TIE = 1e-9
# Survivor sets with more instantiations than this are searched, not listed (§4.2, `mix`).
_MAX_LISTED = 20_000


class Path(StrEnum):
    """Which way the new plan was made (the most drastic §5.1 step, or re-optimisation)."""

    SIMPLE = "simple"
    BORROW = "borrow"
    MERGE = "merge"
    REOPTIMISED = "re-optimised"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One candidate plan over the surviving nodes; `merged_sizes` are the node counts of
    pipelines made by merging (each has a template, App. B)."""

    path: Path
    plan: plan.Plan
    distribution: batching.Distribution
    throughput: float
    moved_bytes: int
    steps: tuple[str, ...]
    merged_sizes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Reinstantiation:
    """The chosen outcome, the other candidate (if any could be built), and why."""

    chosen: Outcome
    alternatives: tuple[Outcome, ...]
    reason: str

    @property
    def plan(self) -> plan.Plan:
        return self.chosen.plan

    @property
    def path(self) -> Path:
        return self.chosen.path


@dataclass(slots=True)
class _Layout:
    """What the old plan says about each node: its pipeline, the first layer it held and what
    its GPUs held (`places`); and the plan's global batch."""

    groups: list[list[int]]
    first_layer: dict[int, int] = field(default_factory=dict)
    pipeline_of: dict[int, int] = field(default_factory=dict)
    places: _NodePlaces | None = None
    global_batch: int = 0


def reinstantiate(
    current: plan.Plan, template_set: templates.TemplateSet, failed: Iterable[int]
) -> Reinstantiation:
    """A new plan over the nodes of `current` that survive `failed` (module docstring)."""
    lost = sorted(set(failed))
    layout = _layout(current)
    _check_failures(current, template_set, layout, lost)
    survivors = [n for group in layout.groups for n in group if n not in lost]
    global_batch = current.global_batch_size
    outcomes = []
    oobleck = _oobleck(current, template_set, layout, lost)
    if isinstance(oobleck, Outcome):
        outcomes.append(oobleck)
    outcomes.extend(_reoptimised(current, template_set, layout, survivors))
    best = _pick(outcomes)
    others = tuple(o for o in outcomes if o is not best)
    note = oobleck if isinstance(oobleck, str) else None
    return Reinstantiation(
        chosen=best,
        alternatives=others,
        reason=_explain(layout, lost, best, others, note, global_batch),
    )


def _pick(outcomes: Sequence[Outcome]) -> Outcome:
    """The highest throughput; among those within _TIE of it, the fewest moved bytes, then
    the earliest (§5.1's candidate comes first)."""
    top = max(o.throughput for o in outcomes)
    contenders = [o for o in outcomes if _equal(o.throughput, top)]
    return min(contenders, key=lambda o: o.moved_bytes)


def _equal(throughput: float, top: float) -> bool:
    return throughput >= top * (1 - _TIE)


def _layout(current: plan.Plan) -> _Layout:
    places = _NodePlaces.of(_placements(current), current.gpus_per_node)
    layout = _Layout(groups=[], places=places, global_batch=current.global_batch_size)
    for index, pipeline in enumerate(current.pipelines):
        nodes: list[int] = []
        for stage in pipeline.stages:
            for worker in stage.workers:
                node = int(current.node_of(worker))
                if node not in nodes:
                    nodes.append(node)
                    layout.first_layer[node] = stage.layer_start
                    layout.pipeline_of[node] = index
        layout.groups.append(nodes)
    return layout


def _check_failures(
    current: plan.Plan, template_set: templates.TemplateSet, layout: _Layout, lost: list[int]
) -> None:
    if not lost:
        raise errors.PlanInputError("give at least one failed node to reinstantiate after")
    unknown = [n for n in lost if n not in layout.pipeline_of]
    if unknown:
        known = sorted(layout.pipeline_of)
        raise errors.PlanInputError(f"failed node(s) {unknown} are not in the plan (nodes {known})")
    if (current.gpus_per_node, current.micro_batch_size) != (
        template_set.gpus_per_node,
        template_set.micro_batch_size,
    ):
        raise errors.PlanInputError(
            f"the plan has {current.gpus_per_node} GPUs per node and micro-batches of "
            f"{current.micro_batch_size} but the templates {template_set.gpus_per_node} and "
            f"{template_set.micro_batch_size}; reinstantiate with the templates the plan came from"
        )
    orphans = _orphaned_layers(current, set(lost))
    if orphans:
        raise errors.InfeasibleError(
            f"layers {orphans} have no live replica on the surviving nodes; restore them from "
            "a snapshot or checkpoint"
        )
    survivors = len(layout.pipeline_of) - len(lost)
    needed = (template_set.fault_tolerance + 1) * template_set.min_nodes
    if survivors < needed:
        raise errors.InfeasibleError(
            f"{survivors} node(s) survive but f + 1 = {template_set.fault_tolerance + 1} "
            f"pipelines of at least {template_set.min_nodes} nodes need {needed}; add nodes or "
            "lower the fault tolerance"
        )


def _orphaned_layers(current: plan.Plan, lost: set[int]) -> list[int]:
    alive: set[int] = set()
    for pipeline in current.pipelines:
        for stage in pipeline.stages:
            if any(current.node_of(w) not in lost for w in stage.workers):
                alive.update(stage.layers)
    return [layer for layer in range(current.num_layers) if layer not in alive]


# -- Oobleck §5.1 -------------------------------------------------------------------------------


def _oobleck(
    current: plan.Plan, template_set: templates.TemplateSet, layout: _Layout, lost: list[int]
) -> Outcome | str:
    """§5.1's candidate, or why it could not be built."""
    n0 = template_set.min_nodes
    groups = [[n for n in group if n not in lost] for group in layout.groups]
    steps: list[str] = []
    for index, (before, after) in enumerate(zip(layout.groups, groups, strict=True)):
        if len(after) < len(before) and len(after) >= n0:
            steps.append(f"pipeline {index}: simple, {len(before)} -> {len(after)} nodes")
        elif not after:
            steps.append(f"pipeline {index}: lost all its nodes")
    short = sorted(
        (i for i, g in enumerate(groups) if 0 < len(g) < n0), key=lambda i: n0 - len(groups[i])
    )
    borrowed = _borrow(groups, short, n0, steps)
    merged = _merge(groups, [i for i in short if i not in borrowed], n0, steps)
    path = Path.MERGE if merged else Path.BORROW if borrowed else Path.SIMPLE
    kept = [sorted(g, key=lambda n: (layout.first_layer[n], n)) for g in groups if g]
    missing = sorted({len(g) for g in kept} - set(template_set.sizes))
    if missing:
        return f"§5.1 needs templates of {missing} nodes, which the template set lacks"
    if len(kept) < template_set.fault_tolerance + 1:
        return f"§5.1 leaves {len(kept)} pipeline(s), fewer than f + 1"
    return _outcome(layout, template_set, kept, path, steps, tuple(merged))


def _borrow(groups: list[list[int]], short: list[int], n0: int, steps: list[str]) -> list[int]:
    """Give each short pipeline whole nodes from pipelines above n0 (most spare first, taken
    from the lender's tail) when the spare covers its whole deficit; returns those served."""
    served = []
    for index in short:
        deficit = n0 - len(groups[index])
        lenders = [i for i, g in enumerate(groups) if i not in short and len(g) > n0]
        if sum(len(groups[i]) - n0 for i in lenders) < deficit:
            continue
        while deficit:
            lender = max(lenders, key=lambda i: (len(groups[i]), -i))
            take = min(deficit, len(groups[lender]) - n0)
            moved = groups[lender][-take:]
            del groups[lender][-take:]
            groups[index].extend(moved)
            deficit -= take
            steps.append(f"pipeline {index}: borrow nodes {moved} from pipeline {lender}")
        served.append(index)
    return served


def _merge(groups: list[list[int]], short: list[int], n0: int, steps: list[str]) -> list[int]:
    """Merge each still-short pipeline with another short one, else with the smallest other
    pipeline, until it has n0 nodes; returns the merged pipelines' node counts."""
    merged_sizes = []
    queue = list(short)
    while queue:
        index = queue.pop(0)
        others = [i for i, g in enumerate(groups) if g and i != index]
        if not others:
            break
        partner = queue.pop(0) if queue else min(others, key=lambda i: (len(groups[i]), i))
        groups[index].extend(groups[partner])
        groups[partner] = []
        steps.append(f"pipeline {index}: merge with pipeline {partner}")
        if len(groups[index]) < n0:
            queue.insert(0, index)
        else:
            merged_sizes.append(len(groups[index]))
    return merged_sizes


# -- re-optimised -------------------------------------------------------------------------------


def _reoptimised(
    current: plan.Plan,
    template_set: templates.TemplateSet,
    layout: _Layout,
    survivors: Sequence[int],
) -> list[Outcome]:
    """The best instantiations of the survivors (all within _TIE of the best throughput),
    placed to keep intact pipelines; the one moving the fewest bytes."""
    options = _survivor_mixes(template_set, len(survivors), current.global_batch_size)
    candidates = []
    for option in options:
        try:
            candidates.append(
                instantiation.evaluate(option, template_set, current.global_batch_size)
            )
        except batching.UndistributableBatchError:
            continue
    if not candidates:
        return []
    top = instantiation.rank(candidates)[0].throughput
    tied = [c for c in candidates if _equal(c.throughput, top)]
    placed = [_assign(layout, survivors, c.instantiation.pipeline_sizes) for c in tied]
    # `_pick` over every tied outcome, scored without building their plans (at 1,024 nodes
    # a dozen tie, each a plan of 8,192 workers); only the winner's plan is built
    scores = [_score(layout, template_set, groups) for groups in placed]
    top_score = max(throughput for throughput, _ in scores)
    contenders = [i for i, (throughput, _) in enumerate(scores) if _equal(throughput, top_score)]
    best = min(contenders, key=lambda i: scores[i][1])
    steps = [f"re-optimised: {tied[best].instantiation.describe()}"]
    return [_outcome(layout, template_set, placed[best], Path.REOPTIMISED, steps, ())]


@dataclass(frozen=True, slots=True, kw_only=True)
class _NodePlaces:
    """What each node's GPUs held in the old plan (`_placements`, None for a GPU outside it),
    as an index into the distinct such tuples: a running plan repeats a handful of them."""

    shape: dict[int, int]
    shapes: list[tuple[_Place | None, ...]]

    @classmethod
    def of(cls, held: dict[int, _Place], gpus: int) -> _NodePlaces:
        index: dict[tuple[_Place | None, ...], int] = {}
        shape = {
            node: index.setdefault(
                tuple(held.get(node * gpus + g) for g in range(gpus)), len(index)
            )
            for node in sorted({worker // gpus for worker in held})
        }
        return cls(shape=shape, shapes=list(index))


def _score(
    layout: _Layout, template_set: templates.TemplateSet, groups: list[list[int]]
) -> tuple[float, int]:
    """`_outcome`'s throughput and moved bytes for pipelines on `groups`, without the plan."""
    costs = _costs(template_set, groups)
    spread = batching.distribute(costs, layout.global_batch, template_set.micro_batch_size)
    return spread.throughput(layout.global_batch), _moved_on(layout, template_set, groups)


def _moved_on(layout: _Layout, template_set: templates.TemplateSet, groups: list[list[int]]) -> int:
    """`moved_bytes` from the old plan to the templates' pipelines on node `groups` (the
    workers and ranks `instantiation.build_plan` gives), without the new plan: a worker's bytes
    depend on its new place (template, node position in it, GPU) and what it held, so nodes
    are counted by (template, position, old node shape), 8x fewer than workers."""
    assert layout.places is not None, "_layout fills the old plan's places"
    held = layout.places
    nodes = Counter(
        (len(group), k, held.shape[node]) for group in groups for k, node in enumerate(group)
    )
    places: Counter[tuple[_Place, _Place | None]] = Counter()
    for (size, k, before), count in nodes.items():
        for s in template_set.template(size).mapping.stages:
            if s.node == k:
                for j in range(s.num_gpus):
                    need = (s.layer_start, s.layer_stop, j, s.num_gpus)
                    places[need, held.shapes[before][s.gpu_start + j]] += count
    return sum(
        count * _worker_moved_bytes(need, have, template_set.layer_state_bytes)
        for (need, have), count in places.items()
    )


def _survivor_mixes(
    template_set: templates.TemplateSet, num_nodes: int, global_batch: int
) -> Sequence[instantiation.Instantiation]:
    """Every instantiation of the survivors while eq. 5 is small enough to list; beyond, the
    exact best (`instantiation.best_candidate`) and its neighbours, which hold every mix tied
    with it that is one step away (ties further away are not weighed for moved bytes)."""
    f = template_set.fault_tolerance
    if mix.count_instantiations(template_set.sizes, num_nodes, f + 1) <= _MAX_LISTED:
        return instantiation.enumerate_instantiations(template_set.sizes, num_nodes, f)
    best = instantiation.best_candidate(template_set, num_nodes, global_batch)
    if best is None:
        return []
    return [
        best.instantiation,
        *instantiation.neighbours(best.instantiation, template_set.sizes, f),
    ]


def _assign(layout: _Layout, survivors: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Node groups for pipelines of `sizes`: intact old pipelines first (each takes the first
    size equal to its own still free), then the rest in order, on the other survivors in order."""
    alive = set(survivors)
    free = Counter(sizes)  # counted, not a list searched per old pipeline: 1,000 at 1,024 nodes
    kept: Counter[int] = Counter()
    groups, used = [], set()
    for group in layout.groups:
        if free[len(group)] > 0 and all(n in alive for n in group):
            free[len(group)] -= 1
            kept[len(group)] += 1
            groups.append(list(group))
            used.update(group)
    remaining = []  # `sizes` without the first kept[size] of each size
    for size in sizes:
        if kept[size]:
            kept[size] -= 1
        else:
            remaining.append(size)
    pool = [n for n in survivors if n not in used]
    start = 0
    for size in remaining:
        chunk = pool[start : start + size]
        start += size
        groups.append(sorted(chunk, key=lambda n: (layout.first_layer[n], n)))
    return groups


# -- shared ---------------------------------------------------------------------------------


def _outcome(
    layout: _Layout,
    template_set: templates.TemplateSet,
    groups: list[list[int]],
    path: Path,
    steps: list[str],
    merged: tuple[int, ...],
) -> Outcome:
    costs = _costs(template_set, groups)
    distribution = batching.distribute(costs, layout.global_batch, template_set.micro_batch_size)
    new = instantiation.build_plan(template_set, groups, distribution.micro_batches)
    return Outcome(
        path=path,
        plan=new,
        distribution=distribution,
        throughput=distribution.throughput(layout.global_batch),
        moved_bytes=_moved_on(layout, template_set, groups),
        steps=tuple(steps),
        merged_sizes=merged,
    )


def _costs(
    template_set: templates.TemplateSet, groups: list[list[int]]
) -> list[batching.PipelineCost]:
    """T(N_b) of each group's template (`batching.pipeline_cost`), computed once per size: a
    thousand groups share a handful of sizes at 1,024 nodes."""
    by_size = {
        size: batching.pipeline_cost(template_set.template(size).mapping)
        for size in {len(g) for g in groups}
    }
    return [by_size[len(g)] for g in groups]


_Place = tuple[int, int, int, int]  # a worker's stage layers [start, stop), its rank, ranks


def moved_bytes(old: plan.Plan, new: plan.Plan, layer_bytes: Sequence[int]) -> int:
    """Bytes of layer state that workers of `new` must receive: for each worker and layer of
    its stage, the part of its shard it did not hold in `old` (module docstring)."""
    # a worker's bytes depend only on its old and new (layers, rank, ranks): sum each distinct
    # pair once (a few dozen at 8,192 workers instead of a quarter million worker-layers);
    # integer sums, so the same total as worker by worker
    return _moved(_placements(old), _placements(new).items(), layer_bytes)


def _placements(plan_: plan.Plan) -> dict[int, _Place]:
    """Each worker's stage layers, rank and ranks in `plan_`."""
    placed: dict[int, _Place] = {}
    for stage in (s for p in plan_.pipelines for s in p.stages):
        for rank, worker in enumerate(stage.workers):
            placed[worker] = (stage.layer_start, stage.layer_stop, rank, len(stage.workers))
    return placed


def _moved(
    held: dict[int, _Place], places: Iterable[tuple[int, _Place]], layer_bytes: Sequence[int]
) -> int:
    """Bytes the workers at `places` receive when they held `held` (`moved_bytes`)."""
    moves: Counter[tuple[_Place, _Place | None]] = Counter(
        (place, held.get(worker)) for worker, place in places
    )
    return sum(
        count * _worker_moved_bytes(need, have, layer_bytes)
        for (need, have), count in moves.items()
    )


def _worker_moved_bytes(need: _Place, have: _Place | None, layer_bytes: Sequence[int]) -> int:
    """Bytes a worker at `need` receives when it held `have` (None: nothing)."""
    start, stop, rank, ranks = need
    total = 0
    for layer in range(start, stop):
        wanted = _shard(layer_bytes[layer], rank, ranks)
        held = range(0)
        if have is not None and have[0] <= layer < have[1]:
            held = _shard(layer_bytes[layer], have[2], have[3])
        overlap = max(0, min(wanted.stop, held.stop) - max(wanted.start, held.start))
        total += len(wanted) - overlap
    return total


def _shard(num_bytes: int, rank: int, ranks: int) -> range:
    return range(rank * num_bytes // ranks, (rank + 1) * num_bytes // ranks)


def _explain(
    layout: _Layout,
    lost: list[int],
    best: Outcome,
    others: tuple[Outcome, ...],
    note: str | None,
    global_batch: int,
) -> str:
    hit = sorted({layout.pipeline_of[n] for n in lost})
    head = f"lost node(s) {lost} of pipeline(s) {hit}"
    chosen = (
        f"chose {best.path.value} ({'; '.join(best.steps)}): {best.throughput:.4g} samples/s "
        f"at global batch {global_batch}, {_gib(best.moved_bytes)} of layer state to copy"
    )
    parts = [head, chosen]
    for other in others:
        if not _equal(other.throughput, best.throughput):
            why = f"{1 - other.throughput / best.throughput:.2%} lower throughput"
        elif other.moved_bytes > best.moved_bytes:
            why = f"equal throughput but {_gib(other.moved_bytes)} to copy"
        else:
            why = "equal throughput and bytes; §5.1's plan is preferred"
        parts.append(f"{other.path.value} ({'; '.join(other.steps)}) lost: {why}")
    if note:
        parts.append(f"Oobleck §5.1 not possible: {note}")
    return "; ".join(parts)


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.3g} GiB"
