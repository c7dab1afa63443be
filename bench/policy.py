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
    .venv/bin/python bench/policy.py --cluster [--runs N] [--before DIR] [--timeout S]
            [--before-max-nodes N]
        (the controller's first plan and cold adaptive recoveries at 64 and 1,024 nodes x 8
        GPUs, gpt3-6.7b and llama2-7b, f = 1..3; #17's targets)

With --scale --before DIR (an older tree, e.g. `git archive 79253ef operator | tar -x -C DIR`),
each size runs in two fresh processes, the older planner (DIR/operator first on PYTHONPATH)
and this one, one after the other, and the two decisions are compared: the same choice, eq. 8
value, step estimate and peak memory, or the bench fails. CPU time is the figure to compare on a
shared machine (wall time counts the other work's share of the cores).

--cluster: as the controller plans a job (`control.planning.Planner`, adaptive policy) of N
nodes x 8 GPUs on the synthetic bf16 profile of `planaria profile --synthetic MODEL
--accelerator a100-80gb --micro-batch 1`, global batch 1024, micro-batch 1, fault tolerance f:
the first plan (templates fitted to the job, then `best` over every worker: seconds), then per
run a fresh Planner (so the estimates are cold) and one worker failing: `recover` (Odyssey eq. 8
over rerouting, the DP/PP candidates and Oobleck's reinstantiations: the controller's adaptive
decision) and `policy.decide` alone (no Oobleck layouts), wall and CPU ms, and the process's
peak RSS. With --before, cases of at most --before-max-nodes nodes (default 128) also run on
the older tree (d1a710b and older solve an inner matching per pair of nodes at 1,024 x 8, a
million per candidate, and do not finish in minutes; e602b73 and later do: give 1024); the two
must give the same move (kind, reason, plan, copies) and `policy.decide` the same rendered
reason (every candidate ranked with its numbers, every rejection), or the bench fails.
Writes bench/results/policy-cluster.json.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

from planaria.contract import plan, profile, shapes
from planaria.control import planning, settings
from planaria.control import status as statuses
from planaria.planner import accelerators, candidates, distribution, policy, screening, synthetic
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "policy.json"
SIZES = [(8, 4, 8), (8, 4, 16), (16, 4, 8)]  # (pipelines, stages, micro-batches per pipeline)
# --scale: cold decisions only, one GPU per node (#17 asks <= 1 s at 1,024 nodes x 8 GPUs).
SCALE_SIZES = [(8, 4, 8), (64, 4, 16), (128, 8, 8)]
SCALE_RESULTS = Path(__file__).parent / "results" / "policy-scale.json"
# --cluster: (nodes, GPUs per node, fault tolerance, model), #17's 1,024 x 8 cases and one the
# older tree can still answer
CLUSTER_CASES = [(64, 8, 1, "gpt3-6.7b")] + [
    (1024, 8, f, model) for model in ("gpt3-6.7b", "llama2-7b") for f in (1, 2, 3)
]
CLUSTER_BEFORE_MAX_NODES = 128
CLUSTER_RESULTS = Path(__file__).parent / "results" / "policy-cluster.json"
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
    parser.add_argument(
        "--cluster", action="store_true", help="the controller at 64 and 1,024 nodes x 8 GPUs"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per child, seconds")
    parser.add_argument(
        "--before-max-nodes",
        type=int,
        default=CLUSTER_BEFORE_MAX_NODES,
        help="with --cluster --before: the largest case (nodes) the older tree runs",
    )
    parser.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cluster-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(cold_decisions(*args.child)))
        return
    if args.cluster_child:
        nodes, gpus, f, model, runs = args.cluster_child
        print(json.dumps(cluster_decisions(int(nodes), int(gpus), int(f), model, int(runs))))
        return
    if args.cluster:
        cluster(min(args.runs, 3), args.before, args.timeout, args.before_max_nodes)
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


def cluster(runs: int, before: str | None, timeout_s: float, before_max_nodes: int) -> None:
    """Each --cluster case in fresh processes (the older tree's first when asked), a row each."""
    print(
        f"{'case':>26} {'planner':>7} {'first plan s':>12} {'recover CPU ms':>22} "
        f"{'decide CPU ms':>22} {'recover wall ms':>22} {'RSS MiB':>7}  choice"
    )
    report = []
    for nodes, gpus, f, model in CLUSTER_CASES:
        name = f"{model} {nodes} x {gpus} f={f}"
        trees: dict[str, str | None] = {"after": None}
        if before and nodes <= before_max_nodes:
            trees = {"before": f"{before}/operator", "after": None}
        found_by: dict[str, dict[str, object]] = {}
        for label, tree in trees.items():
            argv = ["--cluster-child", str(nodes), str(gpus), str(f), model, str(runs)]
            found = found_by[label] = _run_child(argv, tree, timeout_s)
            if "error" in found:
                print(f"{name:>26} {label:>7} {found['error']}")
                continue
            print(
                f"{name:>26} {label:>7} {found['first_plan_s']:>12.2f} "
                f"{_spread(found['recover_cpu_ms']):>22} {_spread(found['decide_cpu_ms']):>22} "
                f"{_spread(found['recover_wall_ms']):>22} {found['peak_rss_mib']:>7.0f}  "
                f"{found['choice']}"
            )
        if "before" in found_by and any(
            found_by["before"].get(key) != found_by["after"].get(key)
            for key in ("moves", "decide_reasons")
        ):
            raise SystemExit(f"the moves or decide's reasons differ at {name}: {found_by}")
        report.append({"case": name, **found_by})
    CLUSTER_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {"time_to_failure_s": HOUR_S, "load_average": os.getloadavg(), "cases": report}
    CLUSTER_RESULTS.write_text(json.dumps(document, indent=2))
    print(f"wrote {CLUSTER_RESULTS}")


def _run_child(argv: list[str], tree: str | None, timeout_s: float) -> dict[str, object]:
    """This script with `argv` in a fresh process (`tree` first on the path when given); its
    JSON answer, or {"error": ...} when it ran past `timeout_s`."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
    try:
        done = subprocess.run(
            [sys.executable, __file__, *argv],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout_s:.0f} s"}
    result: dict[str, object] = json.loads(done.stdout)
    return result


def cluster_decisions(nodes: int, gpus: int, f: int, model: str, runs: int) -> dict[str, object]:
    """The controller's first plan for the job, then `runs` cold recoveries (a fresh Planner
    each, a different worker failing) and as many cold `policy.decide` calls."""
    import resource

    from scipy import optimize  # noqa: F401  (imported by the first matching; not timed)

    source = synthetic.synthesize(shapes.named(model), accelerators.named("a100-80gb"), 1, gpus)
    job = _cluster_job(source, nodes, gpus, f)
    workers = [plan.WorkerId(w) for w in range(nodes * gpus)]
    start = time.perf_counter()
    running = planning.Planner(source, job).best(workers, statuses.MoveKind.INITIAL).plan
    first_plan_s = time.perf_counter() - start
    recover_wall, recover_cpu, decide_cpu, moves, reasons = [], [], [], [], []
    for i in range(runs):
        worker = plan.WorkerId((7919 * i + 3) % len(workers))
        planner = planning.Planner(source, job)
        wall, cpu = time.perf_counter(), time.process_time()
        move = planner.recover(running, [worker], [], HOUR_S)
        recover_cpu.append((time.process_time() - cpu) * 1e3)
        recover_wall.append((time.perf_counter() - wall) * 1e3)
        moves.append([str(move.kind), move.reason, _digest(move.plan), _digest(move.transfers)])
        failure = candidates.Failure(running=running, failed=frozenset({worker}))
        estimates = screening.Estimates(source)
        cpu = time.process_time()
        _, reason = policy.decide(failure, estimates, HOUR_S, policy.PolicySettings())
        decide_cpu.append((time.process_time() - cpu) * 1e3)
        reasons.append(_digest(policy.render_reason(reason)))
    return {
        "first_plan_s": first_plan_s,
        "recover_wall_ms": recover_wall,
        "recover_cpu_ms": recover_cpu,
        "decide_cpu_ms": decide_cpu,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "choice": moves[0][1].split(";")[0],
        "moves": moves,
        "decide_reasons": reasons,
    }


def _cluster_job(source: profile.Profile, nodes: int, gpus: int, f: int) -> settings.JobSettings:
    training = messages.TrainingSettings(
        model="bench",
        seed=0,
        optimizer=messages.OptimizerSettings(lr=1e-4),
        global_batch_size=1024,
        data=messages.DataSettings(corpus_paths=("corpus.txt",)),
        device=messages.Device.CUDA,
        snapshot_interval_steps=1,
        redundancy=messages.RedundancyMode.XOR,
        precision=source.precision,
    )
    return settings.JobSettings(
        name="bench",
        workers=nodes * gpus,
        gpus_per_node=gpus,
        steps=1,
        micro_batch_size=1,
        fault_tolerance=f,
        training=training,
        profile=source,
        policy="adaptive",
    )


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _spread(values: object) -> str:
    assert isinstance(values, list)
    return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})"


if __name__ == "__main__":
    main()
