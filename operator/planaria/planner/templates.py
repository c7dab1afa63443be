"""Pipeline templates (Oobleck §4.1): how many nodes each template uses, and its stages.

Node specification (§4.1.1). n0 is the fewest nodes on which some pipeline of the model fits in
GPU memory (1F1B activations included, see `planaria.planner.stage_table`). Templates use
n0, n0 + 1, ..., N - f*n0 nodes: consecutive sizes from n0 with at least n0 of them make every
N' in [(f + 1) n0, N] a sum of at least f + 1 template sizes (App. A; with N' = q n0 + r, take
q - 1 pipelines of n0 nodes and one of n0 + r), and the largest leaves room for the other f
replicas at n0 nodes each. Unlike the original code, which makes a template for every node
count and ignores f, this follows the paper.

One departure, stated where it happens: a model with too few layers (or too little memory at
depth) cannot span N - f*n0 nodes. Then the sizes stop at the last size below the first one
that admits no pipeline, provided they still reach min(2 n0 - 1, N - f*n0): that is all App. A
and App. B need (merges produce at most 2 n0 - 1 nodes). Otherwise, or if nothing fits, or if
N < (f + 1) n0, InfeasibleError says why and what would fix it.

GPU-stage mapping (§4.1.2) of every size is `planaria.planner.stage_mapping`, one search shared
by all sizes, largest first, at Oobleck's N_b = 4S. `remap` maps chosen sizes again, exactly, for
the micro-batches they will run (`instantiation.fit_templates` decides which and how many).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planaria.contract import errors, profile
from planaria.planner import stage_mapping, stage_table


@dataclass(frozen=True, slots=True, kw_only=True)
class Template:
    """A pipeline template: its node count and the stages of its best mapping."""

    num_nodes: int
    mapping: stage_mapping.StageMapping

    @property
    def num_stages(self) -> int:
        return self.mapping.num_stages

    def iteration_time_s(self, num_micro_batches: int | None = None) -> float:
        """T of Oobleck eq. 1-4 (default: the N_b it was mapped for, 4S unless re-mapped)."""
        return self.mapping.iteration_time_s(num_micro_batches)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """§4.1.1's result: template sizes min_nodes..max_nodes (n0..), and why."""

    min_nodes: int
    max_nodes: int
    reason: str

    @property
    def sizes(self) -> range:
        return range(self.min_nodes, self.max_nodes + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateSet:
    """Every template of a job, planned once (Oobleck §4.1), plus what later steps need:
    the cluster shape, f, the micro-batch size and each layer's state bytes (parameters and
    optimizer state, what a layer copy moves)."""

    num_nodes: int
    gpus_per_node: int
    fault_tolerance: int
    micro_batch_size: int
    node_spec: NodeSpec
    templates: tuple[Template, ...]
    layer_state_bytes: tuple[int, ...]

    @property
    def min_nodes(self) -> int:
        """n0."""
        return self.node_spec.min_nodes

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(t.num_nodes for t in self.templates)

    @property
    def num_layers(self) -> int:
        return len(self.layer_state_bytes)

    def template(self, num_nodes: int) -> Template:
        """The template of `num_nodes` nodes; PlanInputError if there is none."""
        for candidate in self.templates:
            if candidate.num_nodes == num_nodes:
                return candidate
        raise errors.PlanInputError(
            f"no template of {num_nodes} nodes; templates have {_ranges(self.sizes)} nodes"
        )


def generate_templates(
    source: profile.Profile,
    *,
    num_nodes: int,
    gpus_per_node: int,
    fault_tolerance: int,
    memory_bytes: int | None = None,
) -> TemplateSet:
    """Node specification and GPU-stage mapping of every template (Oobleck §4.1).

    `memory_bytes` per GPU defaults to the profile's. Raises PlanInputError for out-of-range
    arguments and InfeasibleError when no template set satisfies f (the message says why).
    """
    _check_cluster(num_nodes, gpus_per_node, fault_tolerance)
    table = stage_table.build_table(source, gpus_per_node=gpus_per_node, memory_bytes=memory_bytes)
    search = stage_mapping.MappingSearch(table, gpus_per_node=gpus_per_node, max_nodes=num_nodes)
    spec = node_specification(search, num_nodes=num_nodes, fault_tolerance=fault_tolerance)
    # Largest first: its passes fill the cache that the smaller templates then mostly hit.
    mappings = {n: search.map(n) for n in reversed(spec.sizes)}
    return TemplateSet(
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        fault_tolerance=fault_tolerance,
        micro_batch_size=source.micro_batch_size,
        node_spec=spec,
        templates=tuple(Template(num_nodes=n, mapping=mappings[n]) for n in spec.sizes),
        layer_state_bytes=table.moved_bytes,
    )


def remap(
    template_set: TemplateSet,
    source: profile.Profile,
    counts: Mapping[int, int],
    memory_bytes: int | None = None,
) -> TemplateSet:
    """The template set with each size in `counts` re-mapped exactly for that many
    micro-batches (§4.1.2's T with N_b given rather than 4S); other templates unchanged.

    A mapping that fits at 4S fits at any N_b (at most S micro-batches are in flight), so the
    new optimum is never slower at its count than the old template. A new mapping with more
    stages than its count is dropped (the template stays): eq. 1-4 do not hold there. `source`
    and `memory_bytes` must be those the set was generated from.
    """
    table = stage_table.build_table(
        source, gpus_per_node=template_set.gpus_per_node, memory_bytes=memory_bytes
    )
    remapped = []
    for template in template_set.templates:
        count = counts.get(template.num_nodes)
        if count is None or template.mapping.planned_micro_batches == count:
            remapped.append(template)
            continue
        search = stage_mapping.MappingSearch(
            table,
            gpus_per_node=template_set.gpus_per_node,
            max_nodes=template.num_nodes,
            num_micro_batches=count,
        )
        mapping = search.map(template.num_nodes)
        # eq. 1-4's closed form holds for N_b >= S only: below, it undercuts the real time (it
        # can go negative) and would favour ever deeper pipelines, so such a mapping is not used
        fits_form = mapping.num_stages <= count
        new = Template(num_nodes=template.num_nodes, mapping=mapping)
        remapped.append(new if fits_form else template)
    return dataclasses.replace(template_set, templates=tuple(remapped))


def node_specification(
    search: stage_mapping.MappingSearch, *, num_nodes: int, fault_tolerance: int
) -> NodeSpec:
    """n0 and the template sizes n0..N - f*n0 (Oobleck §4.1.1; see the module docstring)."""
    feasible = search.feasible()
    fitting = [n for n in range(1, num_nodes + 1) if feasible[n]]
    if not fitting:
        raise errors.InfeasibleError(_nothing_fits(search, num_nodes))
    n0 = fitting[0]
    f = fault_tolerance
    if num_nodes < (f + 1) * n0:
        raise errors.InfeasibleError(
            f"fault tolerance {f} needs {f + 1} pipelines of at least n0 = {n0} nodes (the fewest "
            f"a pipeline of this model fits on), {(f + 1) * n0} nodes, but there are {num_nodes}; "
            f"lower the fault tolerance to {num_nodes // n0 - 1} or use {(f + 1) * n0} nodes"
        )
    top = num_nodes - f * n0
    last = n0
    while last < top and feasible[last + 1]:
        last += 1
    needed = min(2 * n0 - 1, top)
    if last < needed:
        raise errors.InfeasibleError(
            f"templates must cover {n0}..{needed} nodes (Oobleck App. A, B) but no pipeline of "
            f"this model fits on {last + 1} nodes ({search.why_infeasible(last + 1)})"
        )
    reason = (
        f"n0 = {n0}: the fewest nodes a pipeline fits on ({_gib(search.table.memory_bytes)} per "
        f"GPU); largest template {top} = N - f*n0 = {num_nodes} - {f}*{n0}, leaving room for "
        f"f = {f} more pipelines of n0 nodes (Oobleck §4.1.1)"
    )
    if last < top:
        reason += (
            f"; sizes stop at {last}: no pipeline fits on {last + 1} nodes "
            f"({search.why_infeasible(last + 1)}), and {n0}..{last} still covers every node "
            "count (App. A) and every merge (App. B)"
        )
    return NodeSpec(min_nodes=n0, max_nodes=last, reason=reason)


def _nothing_fits(search: stage_mapping.MappingSearch, num_nodes: int) -> str:
    table = search.table
    return (
        f"the model does not fit on up to {num_nodes} node(s) of {search.gpus_per_node} GPU(s) "
        f"with {_gib(table.memory_bytes)} each ({search.why_infeasible(num_nodes)})"
    )


def _check_cluster(num_nodes: int, gpus_per_node: int, fault_tolerance: int) -> None:
    if num_nodes < 1:
        raise errors.PlanInputError(f"number of nodes must be >= 1 (got {num_nodes})")
    if gpus_per_node < 1:
        raise errors.PlanInputError(f"GPUs per node must be >= 1 (got {gpus_per_node})")
    if fault_tolerance < 0:
        raise errors.PlanInputError(f"fault tolerance must be >= 0 (got {fault_tolerance})")


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.3g} GiB"


def _ranges(sizes: Sequence[int]) -> str:
    if not sizes:
        return "no"
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 1 else str(sizes[0])
