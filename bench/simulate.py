"""Benchmark: every recovery policy over the papers' failure scenarios (planaria.sim).

1. Odyssey §V-B: 32 devices failing at 10% per device per hour for 9 hours, a 7B GPT
   (gpt3-6.7b) on A100-80GB, 20 seeds by default; the goals: Planaria >= 1.229x dynamic-only
   and >= 1.355x rerouting-only (Odyssey's figures), post-recovery >= 99% of the ideal, and
   the 6 policies x 20 seeds in < 60 s (timed, with the load average).
2. Oobleck Table 2: GPT-3 2.7B and 6.7B, 30 nodes, a failure every 6 h / 1 h / 10 min until 15
   remain (--oobleck-seeds, default 3); the paper's Oobleck/Varuna ratios beside ours.
3. Sensitivity of the Odyssey result to the fixed restart cost of a re-plan
   (`transfers.Overheads.restart_s`, measured at 0.02 s on CPU/gloo; not a measurement at
   cluster scale): the same traces with 10 s, 60 s and 300 s (--sensitivity-seeds, default 10).
4. Scale (#17 item 5, --scale alone): wall and CPU seconds per simulated hour and peak RSS of
   the 32-device `odyssey` scenario and of `scale-1024` (1,024 one-GPU nodes; `scale-1024x8`,
   1,024 nodes of 8 GPUs, too with --scale-x8), every policy over one seed of --scale-hours
   (default 2), each on a cold planner in a fresh process; with --before DIR (an older tree,
   e.g. `git archive e602b73 | tar -x -C DIR`) each scenario runs first with DIR/operator,
   DIR/protos and DIR/agent on PYTHONPATH, and both must give the same per-policy summaries
   (--before-timeout S stops an old run after S wall seconds and reports it unfinished: the
   tree before the seventh round does not finish `scale-1024x8`); and one fresh plan of 32
   nodes (batch 64 and 1024) by the exhaustive search `sim.fresh` replaced (the oracle of
   tests/sim/test_fresh.py) and by `sim.fresh`, after the same splits, with the ratio. Writes
   bench/results/simulate_scale.json.

Prints a table per study and writes bench/results/simulate.json.

    .venv/bin/python bench/simulate.py [--seeds N] [--oobleck-seeds N] [--sensitivity-seeds N]
                                       [--skip-oobleck] [--skip-sensitivity]
    .venv/bin/python -m bench.simulate --scale [--scale-hours H] [--scale-x8] [--before DIR]
                                       [--before-timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from planaria.contract import plan
from planaria.planner import candidates, policy, transfers
from planaria.sim import planning, report, scenarios, study

RESULTS = Path(__file__).parent / "results" / "simulate.json"
SCALE_RESULTS = Path(__file__).parent / "results" / "simulate_scale.json"
# Oobleck Table 2 (samples/s): (Oobleck, Varuna) per model and failure frequency.
OOBLECK_TABLE_2 = {
    "gpt3-2.7b": {"6h": (7.29, 7.27), "1h": (7.23, 6.41), "10m": (6.89, 0.36)},
    "gpt3-6.7b": {"6h": (4.33, 4.02), "1h": (4.22, 2.91), "10m": (3.55, 0.12)},
}


def _progress(done: study.Done) -> None:
    if done.runs * done.traces == done.trace * done.total:  # the trace's last policy
        print(f"  trace {done.trace}/{done.traces}, {done.elapsed_s:.1f} s", file=sys.stderr)


def one(
    name: str, seeds: int, model: str | None = None, planner: planning.Planner | None = None
) -> dict[str, object]:
    scenario = scenarios.named(name)
    load = os.getloadavg()[0]
    result = study.run(scenario, range(seeds), model=model, planner=planner, progress=_progress)
    summaries = report.summarise(result.runs, result.planner, result.num_nodes)
    print(
        f"\n{scenario.description}; {model or scenario.model}; {seeds} seeds; "
        f"{result.elapsed_s:.1f} s (load average {load:.2f} at start)"
    )
    print(report.table(summaries))
    return {
        "scenario": name,
        "model": model or scenario.model,
        "seeds": seeds,
        "elapsed_s": result.elapsed_s,
        "load_average": load,
        "policies": report.to_json(summaries),
        "planner": result.planner,
    }


def oobleck(seeds: int) -> list[dict[str, object]]:
    rows = []
    for model, paper in OOBLECK_TABLE_2.items():
        planner = planning.Planner(scenarios.named("oobleck-1h").job(model))
        for label, (ours_paper, varuna_paper) in paper.items():
            row = one(f"oobleck-{label}", seeds, model, planner)
            means = {p["policy"]: p["mean"] for p in row["policies"]}  # type: ignore[attr-defined]
            ratio = means["planaria"] / means["varuna"] if means["varuna"] else float("inf")
            print(
                f"Planaria / Varuna {ratio:.3f}; Oobleck / Varuna in Oobleck Table 2: "
                f"{ours_paper / varuna_paper:.3f}"
            )
            row["paper_oobleck_over_varuna"] = ours_paper / varuna_paper
            rows.append(row)
    return rows


def sensitivity(seeds: int, shared: planning.Planner) -> list[dict[str, object]]:
    rows = []
    for restart_s in (10.0, 60.0, 300.0):
        overheads = transfers.Overheads(restart_s=restart_s)
        settings = policy.PolicySettings(search=candidates.SearchSettings(overheads=overheads))
        planner = planning.Planner(shared.job, settings, shared.estimates)
        print(f"\nsensitivity: restart_s = {restart_s:g} s (assumed, not measured)", end="")
        row = one("odyssey", seeds, planner=planner)
        row["restart_s"] = restart_s
        rows.append(row)
    return rows


# One scale run in a fresh process (so --before's tree answers): every policy over seed 0 of
# the scenario for argv[2] simulated hours on a cold planner; prints its wall and CPU seconds
# (the process's: on a shared machine less sensitive to the load than wall) and summaries.
_SCALE_SCRIPT = """
import json, os, resource, sys, time
from planaria.sim import report, scenarios, study
scenario = scenarios.named(sys.argv[1]).with_horizon(float(sys.argv[2]) * scenarios.HOUR_S)
load = os.getloadavg()[0]
cpu = time.process_time()
result = study.run(scenario, [0])
cpu_s = time.process_time() - cpu
summaries = report.summarise(result.runs, result.planner, result.num_nodes)
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"elapsed_s": result.elapsed_s, "cpu_s": cpu_s, "load_average": load,
                  "events": len(result.traces[0].events), "policies": report.to_json(summaries),
                  "peak_rss_mb": rss_mb}))
"""


def _scale_run(
    name: str, hours: float, before: str | None, timeout_s: float | None = None
) -> dict[str, Any] | None:
    """`_SCALE_SCRIPT` with this tree, or with `before`'s folders of the `planaria` namespace
    first on the path (the planner's types live in protos/, `planaria.contract`); None when it
    runs past `timeout_s` wall seconds (then it is killed)."""
    env = dict(os.environ)
    if before is not None:
        folders = [f"{before}/{name}" for name in ("operator", "protos", "agent")]
        env["PYTHONPATH"] = os.pathsep.join(f for f in folders if os.path.isdir(f))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SCALE_SCRIPT, name, str(hours)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None
    row: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return row


def scale(
    hours: float, names: list[str], before: str | None, before_timeout_s: float | None = None
) -> dict[str, object]:
    """Each scenario in a fresh process, after `before`'s tree in another when given (then
    both must give the same summaries: the same plans, steps and pauses); an old run past
    `before_timeout_s` wall seconds is stopped and reported as not finished."""
    rows = []
    for name in names:
        scenario = scenarios.named(name).with_horizon(hours * scenarios.HOUR_S)
        old = None if before is None else _scale_run(name, hours, before, before_timeout_s)
        new = _scale_run(name, hours, None)
        assert new is not None  # no timeout
        if old is not None:
            assert old["policies"] == new["policies"], f"{name}: results differ from --before"
        rows.append(
            {
                "scenario": name,
                "nodes": scenario.num_nodes,
                "gpus_per_node": scenario.gpus_per_node,
                "hours": hours,
                "events": new["events"],
                "elapsed_s": new["elapsed_s"],
                "s_per_simulated_hour": new["elapsed_s"] / hours,
                "cpu_s": new["cpu_s"],
                "load_average": new["load_average"],
                "peak_rss_mb": new.get("peak_rss_mb"),
                "before_elapsed_s": None if old is None else old["elapsed_s"],
                "before_cpu_s": None if old is None else old["cpu_s"],
                "before_load_average": None if old is None else old["load_average"],
                "before_peak_rss_mb": None if old is None else old.get("peak_rss_mb"),
                "before_unfinished_after_s": (
                    before_timeout_s if before is not None and old is None else None
                ),
            }
        )
    _scale_table(rows, hours, before)
    return {"runs": rows, "fresh_32": _fresh_old_vs_new(32)}


def _scale_table(rows: list[dict[str, Any]], hours: float, before: str | None) -> None:
    """Wall and CPU seconds per simulated hour, before (--before's tree) and after, the ratios
    to the odyssey scenario (the first row) of the same tree and of the old tree, and the peak
    RSS; "unfinished" where the old tree ran past --before-timeout."""
    print(f"\nscale: every policy, 1 seed, {hours:g} simulated hours, cold planners")
    for unit, after_key, before_key in (
        ("wall", "elapsed_s", "before_elapsed_s"),
        ("CPU", "cpu_s", "before_cpu_s"),
    ):
        base = rows[0][after_key] / hours
        old_base = None if rows[0][before_key] is None else rows[0][before_key] / hours
        print(
            f"\n| scenario | nodes x GPUs | events | {unit} s per simulated hour before | after "
            "| after vs odyssey after | after vs odyssey before | load before / after "
            "| peak RSS MB before / after |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            after = row[after_key] / hours
            print(
                f"| {row['scenario']} | {row['nodes']} x {row['gpus_per_node']} | "
                f"{row['events']} | {_before(row, before_key, before, hours)} | {after:.2f} | "
                f"{after / base:.2f}x | "
                f"{'-' if old_base is None else f'{after / old_base:.2f}x'} | "
                f"{_before(row, 'before_load_average', before)} / {row['load_average']:.1f} | "
                f"{_before(row, 'before_peak_rss_mb', before)} / {row['peak_rss_mb']:.0f} |"
            )


def _before(row: dict[str, Any], key: str, before: str | None, hours: float = 1.0) -> str:
    """The old tree's figure of `key` (per simulated hour when `hours` is given), "-" without
    --before, "unfinished after S s" when it ran past --before-timeout."""
    if before is None:
        return "-"
    if row["before_unfinished_after_s"] is not None:
        return f"unfinished after {row['before_unfinished_after_s']:.0f} s"
    return f"{row[key] / hours:.2f}" if key != "before_peak_rss_mb" else f"{row[key]:.0f}"


def _fresh_old_vs_new(num_nodes: int) -> list[dict[str, object]]:
    """One fresh plan of `num_nodes` by the exhaustive search and by `sim.fresh`, for the
    odyssey job (batch 64) and the scale job (batch 1024), each on its own planner whose best
    split per depth (the same for both searches) is made first and timed apart."""
    from tests.sim import test_fresh  # the oracle; needs `python -m bench.simulate`

    rows: list[dict[str, object]] = []
    workers = [plan.WorkerId(w) for w in range(num_nodes)]
    for name in ("odyssey", "scale-1024"):
        job = scenarios.named(name).job()
        timed = {}
        for search in ("exhaustive", "fresh"):
            planner = planning.Planner(job)
            started = time.perf_counter()
            for depth in range(1, min(num_nodes, job.profile.num_layers) + 1):
                planner._split(depth)
            split_s = time.perf_counter() - started
            started = time.perf_counter()
            if search == "exhaustive":
                found = test_fresh._old_fresh(planner, workers, False, None)
            else:
                found = planner.fresh(workers)
            timed[search] = (time.perf_counter() - started, split_s, found)
        assert timed["fresh"][2] == timed["exhaustive"][2], "sim.fresh must return the same plan"
        old_s, new_s = timed["exhaustive"][0], timed["fresh"][0]
        print(
            f"\nfresh plan of {num_nodes} nodes, {name} job (batch {job.global_batch}): splits "
            f"{timed['fresh'][1]:.1f} s, then exhaustive {old_s:.2f} s, sim.fresh {new_s:.2f} s "
            f"({old_s / new_s:.1f}x), the same plan"
        )
        rows.append(
            {
                "nodes": num_nodes,
                "job": name,
                "global_batch": job.global_batch,
                "splits_s": timed["fresh"][1],
                "exhaustive_s": old_s,
                "fresh_s": new_s,
                "ratio": old_s / new_s,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", action="store_true", help="only the scale study (4)")
    parser.add_argument("--scale-hours", type=float, default=2.0)
    parser.add_argument("--scale-x8", action="store_true", help="also scale-1024x8")
    parser.add_argument(
        "--before-timeout",
        type=float,
        metavar="S",
        help="with --before: stop an old run after S wall seconds (reported as unfinished)",
    )
    parser.add_argument(
        "--before", metavar="DIR", help="with --scale: an older tree to time (and compare) too"
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--oobleck-seeds", type=int, default=3)
    parser.add_argument("--sensitivity-seeds", type=int, default=10)
    parser.add_argument("--skip-oobleck", action="store_true")
    parser.add_argument("--skip-sensitivity", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.scale:
        names = ["odyssey", "scale-1024"] + (["scale-1024x8"] if args.scale_x8 else [])
        scaled = scale(args.scale_hours, names, args.before, args.before_timeout)
        SCALE_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        SCALE_RESULTS.write_text(json.dumps(scaled, indent=2))
        print(f"\nwrote {SCALE_RESULTS} ({time.perf_counter() - started:.0f} s in all)")
        return
    odyssey = one("odyssey", args.seeds)
    shared = odyssey.pop("planner")
    assert isinstance(shared, planning.Planner)
    results: dict[str, object] = {"odyssey": odyssey}
    if not args.skip_oobleck:
        results["oobleck_table_2"] = [_plain(r) for r in oobleck(args.oobleck_seeds)]
    if not args.skip_sensitivity:
        results["restart_sensitivity"] = [
            _plain(r) for r in sensitivity(args.sensitivity_seeds, shared)
        ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {RESULTS} ({time.perf_counter() - started:.0f} s in all)")


def _plain(row: dict[str, object]) -> dict[str, object]:
    row.pop("planner", None)
    return row


if __name__ == "__main__":
    main()
