"""Pipeline instantiation (Oobleck §4.2): how many pipelines of each template, on which nodes,
with how many micro-batches, and which such plan to run.

Enumeration (§4.2.1, eq. 5) is the coin-change DP over template sizes: X(p', N') lists every
count vector of the first p' templates using exactly N' nodes, X(p', N') = X(p' - 1, N') ++
theta(X(p', N' - n_p')); those with at least f + 1 pipelines are feasible. It grows
exponentially (1.7 million vectors at 64 nodes of 34 sizes), so plan choice no longer lists it:
`enumerate_instantiations` stays for the reinstantiation of small survivor sets and as the
tests' oracle.

Choice (§4.2.2): the plan with the highest throughput, global batch / slowest pipeline's time
under its exact batch distribution (`planaria.planner.batching`), wins; ties go to fewer
pipelines (less gradient synchronisation), then to larger templates first. It is found without
enumerating by the exact parametric knapsack of `planaria.planner.mix`. The reason names the
runner-up, the best mix one pipeline split, merge or node move away, and why it lost.

Placing pipelines on nodes: the largest templates first, each on the next nodes in the order
given; a template's stage on its node i runs on that node's GPUs [gpu_start, gpu_start + k), so
WorkerId = node * gpus_per_node + GPU index (`planaria.contract.plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from planaria.contract import errors, plan, profile
from planaria.planner import batching, mix, templates

# Beyond this many instantiations the enumeration refuses rather than run for minutes.
MAX_INSTANTIATIONS = 200_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Instantiation:
    """How many pipelines of each template size: `counts` pairs (template nodes, pipelines),
    largest template first, zero counts left out."""

    counts: tuple[tuple[int, int], ...]

    @property
    def num_pipelines(self) -> int:
        return sum(count for _, count in self.counts)

    @property
    def num_nodes(self) -> int:
        return sum(size * count for size, count in self.counts)

    @property
    def pipeline_sizes(self) -> tuple[int, ...]:
        """The node count of every pipeline, largest first."""
        return tuple(size for size, count in self.counts for _ in range(count))

    def describe(self) -> str:
        return " + ".join(f"{count}x{size}" for size, count in self.counts) + " nodes"


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An instantiation with its batch distribution and estimated throughput (samples/s)."""

    instantiation: Instantiation
    distribution: batching.Distribution
    throughput: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanChoice:
    """The chosen plan, the candidate it came from, the runner-up, why, and how many
    instantiations eq. 5 has (all of them were weighed, none was listed)."""

    plan: plan.Plan
    chosen: Candidate
    runner_up: Candidate | None
    reason: str
    num_instantiations: int


def enumerate_instantiations(
    sizes: Sequence[int], num_nodes: int, fault_tolerance: int
) -> tuple[Instantiation, ...]:
    """Every way to use exactly `num_nodes` nodes with pipelines of the given template sizes,
    at least fault_tolerance + 1 pipelines (Oobleck eq. 5). Raises InfeasibleError past
    MAX_INSTANTIATIONS (the message says how to have fewer)."""
    ordered = sorted(set(sizes))
    _check_count(ordered, num_nodes)
    # table[n] holds X(p', n) for the templates seen so far: count vectors over `ordered`.
    table: list[list[tuple[int, ...]]] = [[] for _ in range(num_nodes + 1)]
    table[0] = [(0,) * len(ordered)]
    for p, size in enumerate(ordered):
        for n in range(size, num_nodes + 1):
            # X(p', n) = X(p' - 1, n) ++ theta(X(p', n - n_p')): add one pipeline of size n_p'.
            table[n] = table[n] + [_bump(x, p) for x in table[n - size]]
    feasible = [x for x in table[num_nodes] if sum(x) >= fault_tolerance + 1]
    return tuple(
        Instantiation(counts=tuple((s, c) for s, c in zip(ordered, x, strict=True) if c)[::-1])
        for x in feasible
    )


def _bump(counts: tuple[int, ...], index: int) -> tuple[int, ...]:
    return counts[:index] + (counts[index] + 1,) + counts[index + 1 :]


def _check_count(sizes: Sequence[int], num_nodes: int) -> None:
    """Count the solutions first (cheap) so that a huge enumeration fails fast."""
    ways = [1] + [0] * num_nodes
    for size in sizes:
        for n in range(size, num_nodes + 1):
            ways[n] += ways[n - size]
    if ways[num_nodes] > MAX_INSTANTIATIONS:
        raise errors.InfeasibleError(
            f"{ways[num_nodes]} ways to place pipelines of {len(sizes)} template sizes on "
            f"{num_nodes} nodes, more than the {MAX_INSTANTIATIONS} the planner enumerates; "
            "raise the fault tolerance (fewer, larger templates) or plan fewer nodes"
        )


def evaluate(
    instantiation: Instantiation,
    template_set: templates.TemplateSet,
    global_batch: int,
    costs: Mapping[int, batching.PipelineCost] | None = None,
) -> Candidate:
    """Batch distribution and throughput of one instantiation (UndistributableBatchError if
    the global batch cannot be split over its pipelines); `costs` by size (`size_costs`) spares
    recomputing them."""
    by_size = size_costs(template_set) if costs is None else costs
    distribution = batching.distribute(
        [by_size[size] for size in instantiation.pipeline_sizes],
        global_batch,
        template_set.micro_batch_size,
    )
    return Candidate(
        instantiation=instantiation,
        distribution=distribution,
        throughput=distribution.throughput(global_batch),
    )


def rank(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Best first: throughput, then fewer pipelines, then larger templates first."""
    return sorted(
        candidates,
        key=lambda c: (
            -c.throughput,
            c.instantiation.num_pipelines,
            [-s for s in c.instantiation.pipeline_sizes],
        ),
    )


def choose_plan(
    template_set: templates.TemplateSet, nodes: Sequence[int], global_batch: int
) -> PlanChoice:
    """The highest-throughput plan using every node in `nodes` (Oobleck §4.2), found by the
    exact parametric knapsack of `planaria.planner.mix` rather than by enumerating eq. 5: the
    same choice as ranking every instantiation, at any cluster size. The runner-up is the best
    of the chosen mix's neighbours (`neighbours`).

    Raises InfeasibleError when too few nodes remain for f + 1 pipelines, and
    UndistributableBatchError (recommending the nearest global batch that fits some
    instantiation) when no instantiation can take the global batch.
    """
    _check_nodes(template_set, nodes)
    f, num_nodes = template_set.fault_tolerance, len(nodes)
    costs = size_costs(template_set)
    chosen = best_candidate(template_set, num_nodes, global_batch, costs)
    if chosen is None:
        _refuse(template_set, num_nodes, global_batch)
    others = []
    for option in neighbours(chosen.instantiation, template_set.sizes, f):
        try:
            others.append(evaluate(option, template_set, global_batch, costs))
        except batching.UndistributableBatchError:
            continue
    ranked = rank([chosen, *others])
    # the search is exact: no neighbour may rank above its result
    assert ranked[0] is chosen, "mix.best_counts lost to a neighbour"
    runner_up = ranked[1] if len(ranked) > 1 else None
    total = mix.count_instantiations(template_set.sizes, num_nodes, f + 1)
    return PlanChoice(
        plan=place(template_set, chosen, nodes),
        chosen=chosen,
        runner_up=runner_up,
        reason=explain(chosen, runner_up, total, len(others)),
        num_instantiations=total,
    )


def best_candidate(
    template_set: templates.TemplateSet,
    num_nodes: int,
    global_batch: int,
    costs: Mapping[int, batching.PipelineCost] | None = None,
) -> Candidate | None:
    """The instantiation on num_nodes nodes that ranks first (`rank`) among all of eq. 5's,
    found by `mix.best_counts`, with its distribution; None when none exists or none can take
    the global batch."""
    by_size = size_costs(template_set) if costs is None else costs
    counts = mix.best_counts(
        list(by_size.items()),
        num_nodes=num_nodes,
        min_pipelines=template_set.fault_tolerance + 1,
        global_batch=global_batch,
        micro_batch_size=template_set.micro_batch_size,
    )
    if counts is None:
        return None
    return evaluate(Instantiation(counts=counts), template_set, global_batch, by_size)


# Rounds of fit_templates: each re-maps the sizes the best mix uses; two settle every case seen.
FIT_ROUNDS = 3


def fit_templates(
    template_set: templates.TemplateSet,
    source: profile.Profile,
    global_batch: int,
    memory_bytes: int | None = None,
) -> templates.TemplateSet:
    """Templates mapped for the micro-batches the job's plan runs, not 4S (#17 item 2).

    On all of the set's nodes: choose the best mix, re-map each size it uses exactly for the
    most micro-batches a pipeline of that size gets (`templates.remap`), choose again, until the
    mix's sizes and counts are those the templates were mapped for, or no re-mapping is kept
    (`templates.remap` drops one deeper than its count), at most FIT_ROUNDS rounds.
    A round is kept only if the best throughput does not drop, so the result is never worse
    than the 4S templates. Sizes the plan does not use stay at 4S (they serve reinstantiation,
    whose counts are not known yet). Call again when the global batch or micro-batch changes.
    """
    current = template_set
    best = best_candidate(current, current.num_nodes, global_batch)
    for _ in range(FIT_ROUNDS):
        if best is None:
            return current
        counts: dict[int, int] = {}
        for size, count in zip(
            best.instantiation.pipeline_sizes, best.distribution.micro_batches, strict=True
        ):
            counts[size] = max(counts.get(size, 0), count)
        if all(current.template(s).mapping.planned_micro_batches == m for s, m in counts.items()):
            return current
        refit = templates.remap(current, source, counts, memory_bytes)
        if refit == current:  # every re-mapping was dropped (deeper than its count)
            return current
        after = best_candidate(refit, refit.num_nodes, global_batch)
        if after is None or after.throughput < best.throughput:
            return current
        current, best = refit, after
    return current


def size_costs(template_set: templates.TemplateSet) -> dict[int, batching.PipelineCost]:
    """T(N_b) = a + c N_b of every template (batching.pipeline_cost), by size."""
    return {t.num_nodes: batching.pipeline_cost(t.mapping) for t in template_set.templates}


def _refuse(template_set: templates.TemplateSet, num_nodes: int, global_batch: int) -> NoReturn:
    """Why no instantiation exists or none can take the global batch; the batch error names
    the global batch nearest to this one that the fewest pipelines can take."""
    f = template_set.fault_tolerance
    fewest = mix.fewest_pipelines(template_set.sizes, num_nodes, f + 1)
    if fewest is None:
        raise errors.InfeasibleError(_too_few_nodes(template_set, num_nodes))
    batching.check_distributable(fewest, global_batch, template_set.micro_batch_size)
    raise AssertionError("mix.best_counts refused a distributable batch")


def neighbours(
    instantiation: Instantiation, sizes: Sequence[int], fault_tolerance: int
) -> list[Instantiation]:
    """Instantiations one step from `instantiation`, f + 1 pipelines or more, of the given
    sizes: one pipeline split in two, two merged into one, or one node moved between two."""
    counts = dict(instantiation.counts)
    allowed = set(sizes)
    found: set[tuple[tuple[int, int], ...]] = set()

    def add(removed: Sequence[int], added: Sequence[int]) -> None:
        new = dict(counts)
        for size in removed:
            new[size] -= 1
        for size in added:
            new[size] = new.get(size, 0) + 1
        if all(size in allowed for size in added) and sum(new.values()) >= fault_tolerance + 1:
            found.add(tuple(sorted(((s, c) for s, c in new.items() if c), reverse=True)))

    used = sorted(counts)
    for s in used:
        for part in range(1, s // 2 + 1):
            add([s], [part, s - part])
    for i, s in enumerate(used):
        for t in used[i:]:
            if s == t and counts[s] < 2:
                continue
            add([s, t], [s + t])
            add([s, t], [s + 1, t - 1])
            add([s, t], [s - 1, t + 1])
    found.discard(tuple(instantiation.counts))
    return [Instantiation(counts=c) for c in sorted(found, reverse=True)]


def explain(chosen: Candidate, runner_up: Candidate | None, num: int, num_neighbours: int) -> str:
    """Why `chosen` beat `runner_up`, the best of `num_neighbours` neighbouring mixes (STYLE
    rule 1: the choice and the alternative that lost); `num` instantiations exist in all."""
    head = (
        f"chose {chosen.instantiation.describe()} ({chosen.throughput:.4g} samples/s, "
        f"slowest pipeline {chosen.distribution.iteration_time_s:.4g} s), the best of "
        f"{_count(num)} instantiation(s) (exact search, Oobleck §4.2)"
    )
    if runner_up is None:
        return head + "; no neighbouring mix can take the global batch"
    loss = 1 - runner_up.throughput / chosen.throughput if chosen.throughput > 0 else 0.0
    slowest = runner_up.distribution.iteration_time_s
    if loss > 0:
        why = f"{loss:.2%} lower throughput (slowest pipeline {slowest:.4g} s)"
    elif runner_up.instantiation.num_pipelines > chosen.instantiation.num_pipelines:
        why = "equal throughput but more pipelines to synchronise"
    else:
        why = "equal throughput and pipelines; larger templates come first"
    return (
        f"{head}; runner-up (best of {num_neighbours} mixes one split, merge or node move "
        f"away) {runner_up.instantiation.describe()} lost: {why}"
    )


def _count(num: int) -> str:
    return str(num) if num < 10**9 else f"{num:.3g}"


def place(
    template_set: templates.TemplateSet, candidate: Candidate, nodes: Sequence[int]
) -> plan.Plan:
    """The Plan of `candidate` on `nodes`: pipelines largest first, consecutive nodes each."""
    sizes = candidate.instantiation.pipeline_sizes
    groups, start = [], 0
    for size in sizes:
        groups.append(tuple(nodes[start : start + size]))
        start += size
    return build_plan(template_set, groups, candidate.distribution.micro_batches)


def build_plan(
    template_set: templates.TemplateSet,
    node_groups: Sequence[Sequence[int]],
    micro_batches: Sequence[int],
) -> plan.Plan:
    """A Plan with pipeline i instantiated from the template of len(node_groups[i]) nodes on
    those nodes, in that order, with micro_batches[i] micro-batches."""
    m = template_set.gpus_per_node
    pipelines = []
    for group, count in zip(node_groups, micro_batches, strict=True):
        mapping = template_set.template(len(group)).mapping
        stages = tuple(
            plan.Stage(
                layer_start=s.layer_start,
                layer_stop=s.layer_stop,
                workers=tuple(
                    plan.WorkerId(group[s.node] * m + s.gpu_start + j) for j in range(s.num_gpus)
                ),
            )
            for s in mapping.stages
        )
        pipelines.append(plan.Pipeline(stages=stages, num_micro_batches=count))
    return plan.Plan(
        pipelines=tuple(pipelines),
        micro_batch_size=template_set.micro_batch_size,
        gpus_per_node=m,
    )


def _check_nodes(template_set: templates.TemplateSet, nodes: Sequence[int]) -> None:
    if len(set(nodes)) != len(nodes) or any(node < 0 for node in nodes):
        raise errors.PlanInputError(f"nodes {list(nodes)} must be distinct ids >= 0")


def _too_few_nodes(template_set: templates.TemplateSet, num_nodes: int) -> str:
    f, n0 = template_set.fault_tolerance, template_set.min_nodes
    return (
        f"{num_nodes} node(s) cannot hold f + 1 = {f + 1} pipelines of {n0}..."
        f"{template_set.sizes[-1]} nodes; at least {(f + 1) * n0} nodes are needed"
    )
