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
    .venv/bin/python bench/policy.py --scale [--runs N] [--before DIR]
        (cold only, 32 / 256 / 1,024 workers: wall and CPU milliseconds per decision)

With --scale --before DIR (an older tree, e.g. `git archive 79253ef operator | tar -x -C DIR`),
each size runs in two fresh processes, the older planner (DIR/operator first on PYTHONPATH)
and this one, one after the other, and the two decisions are compared: the same choice, eq. 8
value, step estimate and peak memory, or the bench fails. CPU time is the figure to compare on a
shared machine (wall time counts the other work's share of the cores).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
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
    parser.add_argument("--before", metavar="DIR", help="with --scale: an older tree beside")
    parser.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(cold_decisions(*args.child)))
        return
    if args.scale:
        scale(min(args.runs, 3), args.before)
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


def scale(runs: int, before: str | None) -> None:
    """Cold decisions (fresh estimates each) as the cluster grows, in fresh processes: median
    wall and CPU ms, estimator runs; with `before`, the older planner beside and the same
    decision checked."""
    print(
        f"{'DP x PP':>8} {'workers':>7} {'planner':>7} {'wall ms (min..max)':>24} "
        f"{'CPU ms (min..max)':>24} {'E runs':>6}  choice"
    )
    report = []
    for dp, pp, m in SCALE_SIZES:
        trees = {"before": f"{before}/operator", "after": None} if before else {"after": None}
        found_by: dict[str, dict[str, object]] = {}
        for name, tree in trees.items():
            found = found_by[name] = _child(dp, pp, m, runs, tree)
            print(
                f"{f'{dp} x {pp}':>8} {dp * pp:>7} {name:>7} {_spread(found['wall_ms']):>24} "
                f"{_spread(found['cpu_ms']):>24} {found['estimator_runs']:>6}  {found['choice']}"
            )
        if before and found_by["before"]["decision"] != found_by["after"]["decision"]:
            raise SystemExit(f"the decisions differ at {dp} x {pp}: {found_by}")
        report.append({"pipelines": dp, "stages": pp, "micro_batches": m, **found_by})
    SCALE_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {"time_to_failure_s": HOUR_S, "load_average": os.getloadavg(), "sizes": report}
    SCALE_RESULTS.write_text(json.dumps(document, indent=2))
    print(f"wrote {SCALE_RESULTS}")


def _child(dp: int, pp: int, m: int, runs: int, tree: str | None) -> dict[str, object]:
    """`cold_decisions` in a fresh process, with `tree` first on the path when given."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
    argv = [sys.executable, __file__, "--child", str(dp), str(pp), str(m), str(runs)]
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def cold_decisions(dp: int, pp: int, m: int, runs: int) -> dict[str, object]:
    """`runs` cold decisions (a different worker failing each): wall and CPU ms, the median
    estimator runs, and the first decision's choice and numbers."""
    # scipy.optimize is imported by the first matching; not part of any decision's time
    from scipy import optimize  # noqa: F401

    prof = synthetic.synthesize(shapes.named("gpt3-2.7b"), accelerators.named("a100-40gb"), 1, 1)
    running = running_plan(dp, pp, m, prof.num_layers)
    wall, cpu, counts, decisions = [], [], [], []
    for i in range(runs):
        worker = (7 * i + 3) % len(running.workers)
        start_cpu = time.process_time()
        ms, n, decision, _ = decide(running, worker, screening.Estimates(prof))
        cpu.append((time.process_time() - start_cpu) * 1e3)
        wall.append(ms)
        counts.append(n)
        choice = decision.choice
        decisions.append(
            [choice.label, decision.value, choice.estimate.step_s, choice.estimate.peak_bytes]
        )
    return {
        "wall_ms": wall,
        "cpu_ms": cpu,
        "estimator_runs": statistics.median(counts),
        "choice": decisions[0][0],
        "decision": decisions,
    }


def _spread(values: object) -> str:
    assert isinstance(values, list)
    return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})"


if __name__ == "__main__":
    main()
