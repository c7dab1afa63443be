"""The `--explain` part of `planaria plan`: the recovery policy's decision after --failed nodes.

    planaria plan ... --failed 3,7 --explain --mtbf DURATION [--json]

Ranks rerouting, the DP/PP candidates and the reinstantiations `planaria plan` printed by
Odyssey eq. 8 for a time to the next failure of --mtbf (`planaria.planner.policy`), and
renders the reason as text or as the `recoveryPolicy` member of the `--json` document (fields in
docs/policy.md). Option errors are `ExplainError`s (a ValueError): `planaria.cli.main` prints
them as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from planaria.contract import plan, profile
from planaria.planner import candidates, policy, reinstantiation, screening
from planaria.spec import durations


class ExplainError(ValueError):
    """--explain or --mtbf is missing, malformed or given without what it needs."""


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--explain",
        action="store_true",
        help="with --failed: choose between rerouting and re-planning (Odyssey eq. 8) and say why",
    )
    parser.add_argument(
        "--mtbf",
        metavar="DURATION",
        help="with --explain: the job's mean time between failures (seconds, or e.g. 1h, 90m)",
    )
    parser.add_argument(
        "--steps-left",
        metavar="N",
        help="with --explain: steps the job still trains after the failure (default: more "
        "than fit before the next failure); near the end they bound eq. 8's horizon",
    )


def render(reason: policy.Reason) -> str:
    """The text block printed after `planaria plan`'s report."""
    header = f"recovery policy (Odyssey eq. 8), next failure in {reason.time_to_failure_s:g} s:"
    return header + "\n" + policy.render_reason(reason)


def mtbf(explain: bool, value: str | None, failed: Sequence[int]) -> float | None:
    """--mtbf in seconds when --explain is given (both need --failed); None otherwise."""
    if not explain:
        if value is not None:
            raise ExplainError("--mtbf is used only with --explain; add --explain")
        return None
    if not failed:
        raise ExplainError("--explain explains recovering from --failed; give --failed too")
    if value is None:
        raise ExplainError(
            "--explain needs --mtbf DURATION, the job's mean time between failures (e.g. 1h)"
        )
    try:
        seconds = durations.parse(value)
    except durations.DurationError:
        raise ExplainError(
            f"--mtbf must be a duration (got {value!r}); write {durations.FORMS}"
        ) from None
    if seconds == 0:
        raise ExplainError(f"--mtbf must be > 0 seconds (got {value})")
    return seconds


def steps_left(explain: bool, value: str | None) -> int | None:
    """--steps-left as a whole number >= 1 (only with --explain); None when not given."""
    if value is None:
        return None
    if not explain:
        raise ExplainError("--steps-left is used only with --explain; add --explain")
    try:
        steps = int(value)
    except ValueError:
        raise ExplainError(f"--steps-left must be a whole number >= 1 (got {value!r})") from None
    if steps < 1:
        raise ExplainError(f"--steps-left must be >= 1 (got {value})")
    return steps


def decide(
    source: profile.Profile,
    memory: int | None,
    running: plan.Plan,
    after: reinstantiation.Reinstantiation,
    failed: Sequence[int],
    mtbf_s: float,
    left: int | None = None,
) -> tuple[policy.Decision, policy.Reason]:
    """Rerouting, the DP/PP candidates and the reinstantiations, ranked by eq. 8."""
    dead = frozenset(w for w in running.workers if running.node_of(w) in failed)
    layouts = [after.chosen.plan, *(o.plan for o in after.alternatives)]
    return policy.decide(
        candidates.Failure(running=running, failed=dead),
        screening.Estimates(source, memory),
        mtbf_s,
        policy.PolicySettings(),
        given=layouts,
        steps_left=left,
    )


def to_json(decision: policy.Decision, reason: policy.Reason) -> dict[str, Any]:
    """The `recoveryPolicy` member of the `--json` document (docs/policy.md)."""
    window = reason.window
    return {
        "timeToFailureS": reason.time_to_failure_s,
        "stepsLeft": reason.steps_left,
        "choice": {"kind": str(decision.choice.kind), "label": decision.choice.label},
        "ranked": [
            {
                "kind": str(row.kind),
                "label": row.label,
                "stepS": row.step_s,
                "transitionS": row.transition_s,
                "movedBytes": row.moved_bytes,
                "peakBytes": row.peak_bytes,
                "samplesPerS": row.value,
                "wholePlanEstimate": row.exact,
            }
            for row in reason.ranked
        ],
        "breakEvenS": None if reason.break_even is None else reason.break_even.time_to_failure_s,
        "window": {
            "fromS": window.from_s,
            "untilS": None if math.isinf(window.until_s) else window.until_s,
        },
        "rejected": [
            {"kind": str(r.kind), "label": r.label, "why": r.why} for r in reason.rejected
        ],
        "plan": _decided_plan_json(decision.choice),
    }


def _decided_plan_json(choice: candidates.Candidate) -> dict[str, Any]:
    return {
        "pipelines": [
            {
                "microBatches": p.num_micro_batches,
                "stages": [
                    {
                        "layers": [s.layer_start, s.layer_stop],
                        "workers": [int(w) for w in s.workers],
                    }
                    for s in p.stages
                ],
            }
            for p in choice.plan.pipelines
        ],
        "reroutes": [
            {
                "pipeline": r.pipeline,
                "stage": r.stage,
                "peerPipeline": r.peer_pipeline,
                "microBatches": list(r.micro_batches),
            }
            for r in choice.plan.reroutes
        ],
        "transfers": [
            {"layer": t.layer, "destination": int(t.destination), "sources": list(t.sources)}
            for t in choice.transition.transfers
        ],
        "restores": [
            {"layer": r.layer, "destination": int(r.destination)}
            for r in choice.transition.restores
        ],
    }
