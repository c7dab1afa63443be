"""`planaria plan`: pipeline templates, the chosen instantiation and its batch distribution, and
optionally the plan after some nodes fail.

    planaria plan --profile FILE --nodes N --gpus-per-node M --fault-tolerance F
                  --global-batch B --micro-batch b [--gpu-memory-gib G] [--failed 3,7] [--json]
                  [--redundancy MODE] [--explain --mtbf DURATION]

Text output is for people; `--json` prints one JSON document whose fields are documented in
docs/planner.md (format `planaria.plan-output`, version 1). The planning itself is
`planaria.planner` (templates, instantiation, batching, reinstantiation); this module parses
options, loads the profile file and renders results. With --failed, `--explain` adds the recovery
policy's decision (Odyssey eq. 8, `planaria.planner.policy`, docs/policy.md): rerouting, the
DP/PP candidates and the reinstantiations above, ranked for a time to the next failure of
--mtbf seconds. Each plan is reported with its guarantee against node failures
(`planaria.planner.node_failures.tolerated_node_failures`) under the job's snapshot redundancy
(--redundancy, the job spec's `snapshots.redundancy`, with its default). Every user error
is a ValueError (PlanCommandError here, or the planner's and the profile file's), which
`planaria.cli.main` prints as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planaria.cli import plan_explain, tables
from planaria.contract import plan
from planaria.planner import instantiation, node_failures, reinstantiation, templates
from planaria.spec import job, profile_file

OUTPUT_FORMAT = "planaria.plan-output"
OUTPUT_VERSION = 2  # 2: `nodeFailures` and `redundancy` (issue #20)
GIB = 2**30
REDUNDANCY_DEFAULT = job.SnapshotSpec.model_fields["redundancy"].default  # the job spec's


class PlanCommandError(ValueError):
    """An option is malformed or inconsistent; the message names it and the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Guarantees:
    """The node failures the chosen plan, and the plan after --failed, survive without the
    persistent checkpoint under `redundancy` (`node_failures.tolerated_node_failures`)."""

    redundancy: job.Redundancy
    plan: node_failures.NodeTolerance
    after: node_failures.NodeTolerance | None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan pipeline templates, instantiate them on the nodes, split the batch",
        description="Generate pipeline templates from a profile (Oobleck §4.1), choose the "
        "highest-throughput instantiation on the nodes with its batch distribution (§4.2), "
        "and with --failed, reinstantiate after those nodes fail (§5.1).",
    )
    # Required options are argparse's: a missing one is reported with all the others missing.
    required = parser.add_argument_group("required options")
    required.add_argument(
        "--profile", required=True, metavar="FILE", help="profile file (planaria profile)"
    )
    required.add_argument("--nodes", required=True, metavar="N", help="nodes in the cluster, >= 1")
    required.add_argument("--gpus-per-node", required=True, metavar="M", help="GPUs per node, >= 1")
    required.add_argument(
        "--fault-tolerance",
        required=True,
        metavar="F",
        help="simultaneous pipeline failures to survive, >= 0",
    )
    required.add_argument(
        "--global-batch", required=True, metavar="B", help="global batch size (sequences)"
    )
    required.add_argument(
        "--micro-batch",
        required=True,
        metavar="b",
        help="micro-batch size; must equal the profile's",
    )
    parser.add_argument(
        "--gpu-memory-gib", metavar="G", help="memory per GPU in GiB (default: the profile's)"
    )
    parser.add_argument(
        "--failed", metavar="IDS", help="comma-separated node ids that fail, e.g. 3,7"
    )
    parser.add_argument(
        "--redundancy",
        metavar="MODE",
        default=REDUNDANCY_DEFAULT.value,
        help="the job's snapshot redundancy (snapshots.redundancy): "
        f"{', '.join(r.value for r in job.Redundancy)}; none keeps no mirrors; sets the node "
        f"failures each plan survives (default: {REDUNDANCY_DEFAULT.value})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    plan_explain.add_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    profile_path: str = args.profile
    num_nodes = _whole(args.nodes, "--nodes", minimum=1)
    gpus = _whole(args.gpus_per_node, "--gpus-per-node", minimum=1)
    f = _whole(args.fault_tolerance, "--fault-tolerance", minimum=0)
    global_batch = _whole(args.global_batch, "--global-batch", minimum=1)
    micro_batch = _whole(args.micro_batch, "--micro-batch", minimum=1)
    memory = _memory(args.gpu_memory_gib)
    failed = _failed(args.failed, num_nodes)
    redundancy = _redundancy(args.redundancy)
    mtbf_s = plan_explain.mtbf(args.explain, args.mtbf, failed)
    left = plan_explain.steps_left(args.explain, args.steps_left)
    source = profile_file.load_profile(profile_path)
    if micro_batch != source.micro_batch_size:
        raise PlanCommandError(
            f"--micro-batch {micro_batch} does not match the profile's micro-batch size "
            f"{source.micro_batch_size}; pass --micro-batch {source.micro_batch_size} or "
            f"profile again with --micro-batch {micro_batch}"
        )
    template_set = templates.generate_templates(
        source, num_nodes=num_nodes, gpus_per_node=gpus, fault_tolerance=f, memory_bytes=memory
    )
    # the sizes the plan uses, mapped for the micro-batches they run rather than 4S (§4.1.2)
    template_set = instantiation.fit_templates(template_set, source, global_batch, memory)
    choice = instantiation.choose_plan(template_set, list(range(num_nodes)), global_batch)
    after = reinstantiation.reinstantiate(choice.plan, template_set, failed) if failed else None
    guarantees = _guarantees(redundancy, choice.plan, None if after is None else after.plan)
    decided = None
    if after is not None and mtbf_s is not None:
        decided = plan_explain.decide(source, memory, choice.plan, after, failed, mtbf_s, left)
    if args.json:
        document = to_json(template_set, choice, after, failed, guarantees)
        if decided is not None:
            document["recoveryPolicy"] = plan_explain.to_json(*decided)
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(render(template_set, choice, after, failed, guarantees))
        if decided is not None:
            print(plan_explain.render(decided[1]))
    return 0


# -- options ------------------------------------------------------------------------------


def _whole(text: str, flag: str, *, minimum: int) -> int:
    try:
        number = int(text)
    except ValueError:
        raise PlanCommandError(f"{flag} must be a whole number (got {text!r})") from None
    if number < minimum:
        raise PlanCommandError(f"{flag} must be >= {minimum} (got {number})")
    return number


def _memory(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        gib = float(value)
    except ValueError:
        raise PlanCommandError(f"--gpu-memory-gib must be a number (got {value!r})") from None
    if not (math.isfinite(gib) and gib > 0):
        raise PlanCommandError(f"--gpu-memory-gib must be > 0 (got {value})")
    return max(1, int(gib * GIB))


def _redundancy(value: str) -> job.Redundancy:
    try:
        return job.Redundancy(value)
    except ValueError:
        names = ", ".join(r.value for r in job.Redundancy)
        raise PlanCommandError(f"--redundancy must be one of {names} (got {value!r})") from None


def _guarantees(
    redundancy: job.Redundancy, chosen: plan.Plan, after: plan.Plan | None
) -> Guarantees:
    protected = redundancy is not job.Redundancy.NONE  # only then mirrors and tolerated losses

    def tolerance(result: plan.Plan) -> node_failures.NodeTolerance:
        return node_failures.tolerated_node_failures(result, protected=protected)

    return Guarantees(
        redundancy=redundancy,
        plan=tolerance(chosen),
        after=None if after is None else tolerance(after),
    )


def _failed(value: str | None, num_nodes: int) -> list[int]:
    if value is None:
        return []
    ids = []
    for part in value.split(","):
        try:
            node = int(part)
        except ValueError:
            raise PlanCommandError(
                f"--failed takes comma-separated node ids like 3,7 (got {value!r})"
            ) from None
        if not 0 <= node < num_nodes:
            raise PlanCommandError(f"--failed: node {node} is not in 0..{num_nodes - 1}")
        if node in ids:
            raise PlanCommandError(f"--failed: node {node} is given twice")
        ids.append(node)
    return ids


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
    header = ("pipeline", "nodes", "stages", "micro-batches", "time")
    rows = []
    for index, (pipeline, time_s) in enumerate(zip(result.pipelines, times, strict=True)):
        nodes = _nodes(result, pipeline)
        rows.append(
            (
                str(index),
                ",".join(map(str, nodes)),
                str(len(pipeline.stages)),
                str(pipeline.num_micro_batches),
                _seconds(time_s),
            )
        )
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
