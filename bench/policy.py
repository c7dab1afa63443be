"""Benchmark: planning latency of one failure decision (candidate search + eq. 8 policy).

A GPT-3 2.7B synthetic profile (34 planner layers, A100-40GB, one GPU per node) trained by a
symmetric plan of DP pipelines x PP stages (8 x 4 = 32 workers by default, running split
[8, 9, 8, 9]) with M micro-batches per pipeline; one worker fails (a different one each run)
and `policy.decide` chooses for a time to the next failure of 1 hour. Two cases:

- cold: a fresh `screening.Estimates` per decision (every layer split and pipeline screen is
  estimated during the decision);
- warm: `candidates.prepare` ran after the plan was adopted (Odyssey §IV-C: the search overlaps
  with training), so the decision only binds survivors, reroutes and estimates whole plans.

Prints per size the median / min / max milliseconds over the runs and the median estimator runs
(schedules compiled and replayed) per decision, cold and warm, the time `prepare` took, the
candidates ranked, how many have whole-plan estimates, and the choice; writes
bench/results/policy.json. With --profile, cProfile's top functions (by own time) over cold
decisions.

    .venv/bin/python bench/policy.py [--runs N] [--profile]
    .venv/bin/python bench/policy.py --scale [--runs N]   (cold only, 32 / 256 / 1,024 workers)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path

from planaria.contract import plan, shapes
from planaria.planner import accelerators, candidates, distribution, policy, screening, synthetic

RESULTS = Path(__file__).parent / "results" / "policy.json"
SIZES = [(8, 4, 8), (8, 4, 16), (16, 4, 8)]  # (pipelines, stages, micro-batches per pipeline)
# --scale: cold decisions only, one GPU per node (#17 asks <= 1 s at 1,024 nodes x 8 GPUs).
SCALE_SIZES = [(8, 4, 8), (64, 4, 16), (128, 8, 8)]
SCALE_RESULTS = Path(__file__).parent / "results" / "policy-scale.json"
HOUR_S = 3600.0


def running_plan(dp: int, pp: int, micro_batches: int, num_layers: int) -> plan.Plan:
    counts = tuple(
        (i + 1) * num_layers // pp - i * num_layers // pp for i in range(pp)
    )  # [8, 9, 8, 9] for 34 layers in 4 stages
    pipelines = tuple(
        distribution.pipeline_of(
            counts, [plan.WorkerId(p * pp + s) for s in range(pp)], micro_batches
        )
        for p in range(dp)
    )
    return plan.Plan(pipelines=pipelines, micro_batch_size=1)


def decide(
    running: plan.Plan, worker: int, estimates: screening.Estimates
) -> tuple[float, int, policy.Decision, policy.Reason]:
    """Milliseconds, estimator runs, and the decision when `worker` fails."""
    failure = candidates.Failure(running=running, failed=frozenset({plan.WorkerId(worker)}))
    runs = estimates.computed
    start = time.perf_counter()
    decision, reason = policy.decide(failure, estimates, HOUR_S, policy.PolicySettings())
    return (time.perf_counter() - start) * 1e3, estimates.computed - runs, decision, reason


def measure(dp: int, pp: int, micro_batches: int, runs: int) -> dict[str, object]:
    prof = synthetic.synthesize(shapes.named("gpt3-2.7b"), accelerators.named("a100-40gb"), 1, 1)
    running = running_plan(dp, pp, micro_batches, prof.num_layers)
    victims = [(7 * i + 3) % len(running.workers) for i in range(runs)]
    cold = [decide(running, w, screening.Estimates(prof)) for w in victims]
    warm_estimates = screening.Estimates(prof)
    start = time.perf_counter()
    candidates.prepare(running, warm_estimates, candidates.SearchSettings())
    prepare_ms = (time.perf_counter() - start) * 1e3
    warm = [decide(running, w, warm_estimates) for w in victims]
    _, _, decision, reason = cold[0]
    return {
        "workers": len(running.workers),
        "micro_batches": running.num_micro_batches,
        "cold_ms": [ms for ms, _, _, _ in cold],
        "warm_ms": [ms for ms, _, _, _ in warm],
        "cold_estimator_runs": statistics.median(n for _, n, _, _ in cold),
        "warm_estimator_runs": statistics.median(n for _, n, _, _ in warm),
        "prepare_ms": prepare_ms,
        "candidates": len(reason.ranked),
        "rejected": len(reason.rejected),
        "whole_estimates": sum(r.exact for r in reason.ranked),
        "choice": decision.choice.label,
        "choice_kind": str(decision.choice.kind),
    }


def profile_one(runs: int) -> None:
    prof = synthetic.synthesize(shapes.named("gpt3-2.7b"), accelerators.named("a100-40gb"), 1, 1)
    running = running_plan(*SIZES[0], prof.num_layers)
    profiler = cProfile.Profile()
    profiler.enable()
    for worker in range(runs):
        decide(running, worker, screening.Estimates(prof))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--profile", action="store_true", help="cProfile cold decisions")
    parser.add_argument(
        "--scale", action="store_true", help="cold decisions at 32, 256 and 1,024 workers only"
    )
    args = parser.parse_args()
    if args.scale:
        scale(min(args.runs, 3))
        return
    print(
        f"{'DP x PP':>8} {'workers':>7} {'M':>4} {'cold ms (min..max)':>22} {'E runs':>6} "
        f"{'warm ms (min..max)':>22} {'E runs':>6} {'prepare ms':>10} {'cands':>5} "
        f"{'whole':>5}  choice"
    )
    report = []
    for dp, pp, m in SIZES:
        row = measure(dp, pp, m, args.runs)
        report.append({"pipelines": dp, "stages": pp, "micro_batches_per_pipeline": m, **row})
        print(
            f"{f'{dp} x {pp}':>8} {row['workers']:>7} {row['micro_batches']:>4} "
            f"{_spread(row['cold_ms']):>22} {row['cold_estimator_runs']:>6} "
            f"{_spread(row['warm_ms']):>22} {row['warm_estimator_runs']:>6} "
            f"{row['prepare_ms']:>10.1f} {row['candidates']:>5} {row['whole_estimates']:>5}  "
            f"{row['choice']}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"time_to_failure_s": HOUR_S, "sizes": report}, indent=2))
    print(f"wrote {RESULTS}")
    if args.profile:
        profile_one(args.runs)


def scale(runs: int) -> None:
    """Cold decisions (fresh estimates each) as the cluster grows: median ms, estimator runs."""
    prof = synthetic.synthesize(shapes.named("gpt3-2.7b"), accelerators.named("a100-40gb"), 1, 1)
    print(f"{'DP x PP':>8} {'workers':>7} {'cold ms (min..max)':>22} {'E runs':>6}  choice")
    report = []
    for dp, pp, m in SCALE_SIZES:
        running = running_plan(dp, pp, m, prof.num_layers)
        victims = [(7 * i + 3) % len(running.workers) for i in range(runs)]
        cold = [decide(running, w, screening.Estimates(prof)) for w in victims]
        row = {
            "pipelines": dp,
            "stages": pp,
            "workers": len(running.workers),
            "cold_ms": [ms for ms, _, _, _ in cold],
            "cold_estimator_runs": statistics.median(n for _, n, _, _ in cold),
            "choice": cold[0][2].choice.label,
        }
        report.append(row)
        print(
            f"{f'{dp} x {pp}':>8} {row['workers']:>7} {_spread(row['cold_ms']):>22} "
            f"{row['cold_estimator_runs']:>6}  {row['choice']}"
        )
    SCALE_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    SCALE_RESULTS.write_text(json.dumps({"time_to_failure_s": HOUR_S, "sizes": report}, indent=2))
    print(f"wrote {SCALE_RESULTS}")


def _spread(values: object) -> str:
    assert isinstance(values, list)
    return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})"


if __name__ == "__main__":
    main()
