"""`planaria plan`: pipeline templates, the chosen instantiation and its batch distribution, and
optionally the plan after some nodes fail.

    planaria plan --profile FILE --nodes N --gpus-per-node M --fault-tolerance F
                  --global-batch B --micro-batch b [--gpu-memory-gib G] [--failed 3,7] [--json]
                  [--redundancy MODE] [--explain --mtbf DURATION]

This module is the command: its options, their parsing, and the run from the profile file to
the planner and out. The planning itself is `planaria.planner` (templates, instantiation,
batching, reinstantiation); the report, as text for people or with `--json` as one JSON
document (format `planaria.plan-output`, fields in docs/planner.md), is
`planaria.cli.plan_report`. With --failed, `--explain` adds the recovery policy's decision
(Odyssey eq. 8, `planaria.planner.policy`, docs/policy.md; `planaria.cli.plan_explain`):
rerouting, the DP/PP candidates and the reinstantiations above, ranked for a time to the next
failure of --mtbf seconds. Each plan is reported with its guarantee against node failures
(`planaria.planner.node_failures.tolerated_node_failures`) under the job's snapshot redundancy
(--redundancy, the job spec's `snapshots.redundancy`, with its default).

Errors: every user error is a ValueError, which `planaria.cli.main` prints as one line with exit
status 2:

    ValueError
    ├── PlanCommandError   here: an option malformed or inconsistent
    └── the planner's and the profile file's own (`planaria.spec.profile_file`)
"""

from __future__ import annotations

import argparse
import json
import math

from planaria.cli import plan_explain, plan_report
from planaria.contract import plan
from planaria.planner import instantiation, node_failures, reinstantiation, templates
from planaria.spec import job, profile_file

GIB = 2**30
REDUNDANCY_DEFAULT = job.SnapshotSpec.model_fields["redundancy"].default  # the job spec's


class PlanCommandError(ValueError):
    """An option is malformed or inconsistent; the message names it and the fix."""


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
        document = plan_report.to_json(template_set, choice, after, failed, guarantees)
        if decided is not None:
            document["recoveryPolicy"] = plan_explain.to_json(*decided)
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(plan_report.render(template_set, choice, after, failed, guarantees))
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
) -> plan_report.Guarantees:
    protected = redundancy is not job.Redundancy.NONE  # only then mirrors and tolerated losses

    def tolerance(result: plan.Plan) -> node_failures.NodeTolerance:
        return node_failures.tolerated_node_failures(result, protected=protected)

    return plan_report.Guarantees(
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
