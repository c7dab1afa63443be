"""The report of `planaria plan`: the templates, the chosen plan and the plan after --failed,
each with the node failures it survives, as text for people (`render`) or as one JSON document
(`to_json`, format `planaria.plan-output`; every field documented in docs/planner.md).

Both forms read the same values: the planner's results and the `Guarantees` the command works
out (`planaria.cli.plan`). Nothing here parses options, reads files or plans; the recovery
policy's part of `--explain` is `planaria.cli.plan_explain`'s. Nothing here raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planaria.cli import tables
from planaria.contract import plan
from planaria.planner import instantiation, node_failures, reinstantiation, templates
from planaria.spec import job

OUTPUT_FORMAT = "planaria.plan-output"
OUTPUT_VERSION = 2  # 2: `nodeFailures` and `redundancy` (issue #20)


@dataclass(frozen=True, slots=True, kw_only=True)
class Guarantees:
    """The node failures the chosen plan, and the plan after --failed, survive without the
    persistent checkpoint under `redundancy` (`node_failures.tolerated_node_failures`)."""

    redundancy: job.Redundancy
    plan: node_failures.NodeTolerance
    after: node_failures.NodeTolerance | None


# -- text -------------------------------------------------------------------------------------


def render(
    template_set: templates.TemplateSet,
    choice: instantiation.PlanChoice,
    after: reinstantiation.Reinstantiation | None,
    failed: Sequence[int],
    guarantees: Guarantees,
) -> str:
    """The human-readable report: templates, the chosen plan, and the plan after failures,
    each with the node failures it survives."""
    sizes = template_set.sizes
    lines = [f"templates (Oobleck §4.1): n0 = {template_set.min_nodes}, sizes {_span(sizes)}"]
    lines.append(f"  {template_set.node_spec.reason}")
    header = ("nodes", "stages", "mapped for", "T", "stages: layers x GPUs, | between nodes")
    rows = [
        (
            str(t.num_nodes),
            str(t.num_stages),
            _planned(t),
            _seconds(t.iteration_time_s()),
            _layout(t),
        )
        for t in template_set.templates
    ]
    lines += tables.render(header, rows, right={0, 1, 3}, indent="  ")
    lines.append(
        f"plan (Oobleck §4.2): {choice.chosen.instantiation.describe()}, estimated "
        f"{choice.chosen.throughput:.4g} samples/s, "
        f"{choice.chosen.distribution.iteration_time_s:.4g} s per step"
    )
    if choice.runner_up is not None:
        lines.append(
            f"  runner-up: {choice.runner_up.instantiation.describe()}, estimated "
            f"{choice.runner_up.throughput:.4g} samples/s, "
            f"{choice.runner_up.distribution.iteration_time_s:.4g} s per step"
        )
    lines.append(f"  {choice.reason}")
    lines += _pipelines(choice.plan, choice.chosen.distribution.pipeline_times_s)
    lines.append(f"  {guarantee_line(guarantees.plan, guarantees.redundancy)}")
    if after is not None:
        lines.append(f"after nodes {','.join(map(str, failed))} fail (Oobleck §5.1): {after.path}")
        lines.append(f"  {after.reason}")
        lines += _pipelines(after.plan, after.chosen.distribution.pipeline_times_s)
        if guarantees.after is not None:
            lines.append(f"  {guarantee_line(guarantees.after, guarantees.redundancy)}")
    return "\n".join(lines)


def guarantee_line(tolerance: node_failures.NodeTolerance, redundancy: job.Redundancy) -> str:
    """One line: how many node failures the plan survives without the persistent checkpoint,
    with what, and a smallest set of nodes that it does not survive (docs/planner.md)."""
    n = tolerance.failures
    head = (
        f"survives any {n} node failure{'s' if n > 1 else ''}"
        if n
        else "does not survive every single node failure"
    )
    if tolerance.num_mirrored == tolerance.num_members:
        mirrors = "mirrored"
    elif tolerance.num_mirrored:
        mirrors = f"{tolerance.num_mirrored} of {tolerance.num_members} members mirrored"
    else:
        mirrors = "no mirrors"
    nodes = [int(n) for n in tolerance.smallest]
    replica, snapshot = tolerance.layer_without_replica, tolerance.layer_without_snapshot
    lost = (
        f"layer {replica}'s state"
        if replica == snapshot
        else f"every replica of layer {replica} and layer {snapshot}'s snapshot"
    )
    return (
        f"{head} without the checkpoint (live replicas, then host-memory snapshots, redundancy "
        f"{redundancy.value}, {mirrors}); node{'s' if len(nodes) > 1 else ''} "
        f"[{_runs(nodes)}] would lose {lost}"
    )


def _runs(ids: Sequence[int]) -> str:
    """Sorted ids with runs of three or more as first-last: 0-3, 6, 9 (1,024 ids fit a line)."""
    parts: list[str] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or ids[end] != ids[end - 1] + 1:
            run = ids[start:end]
            parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(i) for i in run]
            start = end
    return ", ".join(parts)


def _pipelines(result: plan.Plan, times: Sequence[float]) -> list[str]:
    """One row per pipeline, or per run of three or more neighbours alike (the same stage and
    micro-batch counts and time): 1,024 one-node pipelines are one row, "0-1023"."""
    header = ("pipeline", "nodes", "stages", "micro-batches", "time")
    runs: list[tuple[tuple[str, str, str], list[tuple[int, list[int]]]]] = []
    for index, (pipeline, time_s) in enumerate(zip(result.pipelines, times, strict=True)):
        key = (str(len(pipeline.stages)), str(pipeline.num_micro_batches), _seconds(time_s))
        if not runs or runs[-1][0] != key:
            runs.append((key, []))
        runs[-1][1].append((index, _nodes(result, pipeline)))
    rows: list[tuple[str, ...]] = []
    for key, members in runs:
        if len(members) >= 3:
            nodes = sorted(n for _, held in members for n in held)
            rows.append((_runs([i for i, _ in members]), _runs(nodes), *key))
        else:
            rows += [(str(i), ",".join(map(str, held)), *key) for i, held in members]
    return tables.render(header, rows, right={0, 2, 3, 4}, indent="  ")


def _planned(template: templates.Template) -> str:
    """The micro-batch count a template was mapped for: 4S (Oobleck's default) or the plan's."""
    count = template.mapping.planned_micro_batches
    return f"4S = {template.mapping.planning_micro_batches}" if count is None else str(count)


def _layout(template: templates.Template) -> str:
    nodes: list[list[str]] = [[] for _ in range(template.num_nodes)]
    for s in template.mapping.stages:
        nodes[s.node].append(f"[{s.layer_start},{s.layer_stop})x{s.num_gpus}")
    return " | ".join(" ".join(stages) for stages in nodes)


def _nodes(result: plan.Plan, pipeline: plan.Pipeline) -> list[int]:
    return list(dict.fromkeys(int(result.node_of(w)) for w in pipeline.workers))


def _span(sizes: Sequence[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 1 else str(sizes[0])


def _seconds(value: float) -> str:
    return f"{value:.4g} s"


# -- JSON (docs/planner.md) ------------------------------------------------------------------


def to_json(
    template_set: templates.TemplateSet,
    choice: instantiation.PlanChoice,
    after: reinstantiation.Reinstantiation | None,
    failed: Sequence[int],
    guarantees: Guarantees,
) -> dict[str, Any]:
    """The `--json` document (field by field in docs/planner.md)."""
    return {
        "format": OUTPUT_FORMAT,
        "version": OUTPUT_VERSION,
        "redundancy": guarantees.redundancy.value,
        "templates": {
            "minNodes": template_set.min_nodes,
            "sizes": list(template_set.sizes),
            "reason": template_set.node_spec.reason,
            "items": [_template_json(t) for t in template_set.templates],
        },
        "plan": {
            "instantiation": _instantiation_json(choice.chosen.instantiation),
            "throughputSamplesPerS": choice.chosen.throughput,
            "iterationTimeS": choice.chosen.distribution.iteration_time_s,
            "reason": choice.reason,
            "runnerUp": None
            if choice.runner_up is None
            else {
                "instantiation": _instantiation_json(choice.runner_up.instantiation),
                "throughputSamplesPerS": choice.runner_up.throughput,
            },
            **_plan_json(choice.plan, choice.chosen.distribution.pipeline_times_s),
            "nodeFailures": _tolerance_json(guarantees.plan),
        },
        "reinstantiation": None
        if after is None or guarantees.after is None
        else _after_json(after, failed, guarantees.after),
    }


def _template_json(template: templates.Template) -> dict[str, Any]:
    return {
        "nodes": template.num_nodes,
        "iterationTimeS": template.iteration_time_s(),
        "plannedMicroBatches": template.mapping.planning_micro_batches,
        "stages": [
            {
                "layers": [s.layer_start, s.layer_stop],
                "node": s.node,
                "gpus": list(range(s.gpu_start, s.gpu_start + s.num_gpus)),
                "timeS": s.time_s,
            }
            for s in template.mapping.stages
        ],
    }


def _instantiation_json(option: instantiation.Instantiation) -> list[dict[str, int]]:
    return [{"nodes": size, "count": count} for size, count in option.counts]


def _plan_json(result: plan.Plan, times: Sequence[float]) -> dict[str, Any]:
    return {
        "globalBatch": result.global_batch_size,
        "microBatchSize": result.micro_batch_size,
        "gpusPerNode": result.gpus_per_node,
        "pipelines": [
            {
                "nodes": _nodes(result, pipeline),
                "microBatches": pipeline.num_micro_batches,
                "timeS": time_s,
                "stages": [
                    {
                        "layers": [s.layer_start, s.layer_stop],
                        "workers": [int(w) for w in s.workers],
                    }
                    for s in pipeline.stages
                ],
            }
            for pipeline, time_s in zip(result.pipelines, times, strict=True)
        ],
    }


def _tolerance_json(tolerance: node_failures.NodeTolerance) -> dict[str, Any]:
    return {
        "tolerated": tolerance.failures,
        "smallestFatalNodes": [int(n) for n in tolerance.smallest],
        "layerWithoutReplica": tolerance.layer_without_replica,
        "layerWithoutSnapshot": tolerance.layer_without_snapshot,
        "members": tolerance.num_members,
        "mirroredMembers": tolerance.num_mirrored,
        "reason": tolerance.reason,
    }


def _after_json(
    after: reinstantiation.Reinstantiation,
    failed: Sequence[int],
    tolerance: node_failures.NodeTolerance,
) -> dict[str, Any]:
    chosen = after.chosen
    return {
        "failedNodes": list(failed),
        "path": str(after.path),
        "steps": list(chosen.steps),
        "reason": after.reason,
        "throughputSamplesPerS": chosen.throughput,
        "movedBytes": chosen.moved_bytes,
        "alternatives": [
            {
                "path": str(o.path),
                "throughputSamplesPerS": o.throughput,
                "movedBytes": o.moved_bytes,
            }
            for o in after.alternatives
        ],
        "plan": {
            **_plan_json(chosen.plan, chosen.distribution.pipeline_times_s),
            "nodeFailures": _tolerance_json(tolerance),
        },
    }
