"""Benchmark: the controller's decision time after a death (`Recovery.plan_s`), per policy.

`planaria.control.planning.Planner.recover` is what the controller runs between noticing a
death and sending the Configures: for `adaptive`, Odyssey eq. 8 over rerouting, the DP/PP
candidates and Oobleck's reinstantiations (given layouts), plus min-cost binding and transfer
restriction; for `dynamic`, Oobleck's reinstantiation and the binding; for `reroute`, ReCycle's
layout. Jobs: the `small` model (10 planner layers) at 30 MiB per GPU on 8 workers (the
controller tests' job, [2,2,2,2]) and GPT-3 2.7B (34 layers, A100-40GB) on 32 workers, one GPU
per node, fault tolerance 1. Each run fails a different worker of the templates' best plan.

- cold: a fresh Planner per decision (templates built outside the timing);
- warm: `Planner.prepare(plan)` ran first (the controller does it after every epoch opens).

Prints median / min / max milliseconds per (job, policy, cold|warm) and writes
bench/results/controller.json.

    .venv/bin/python bench/controller.py [--runs N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from planaria.contract import plan as plans
from planaria.contract import profile, shapes
from planaria.control import planning, settings, status
from planaria.planner import accelerators, synthetic
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "controller.json"
HOUR_S = 3600.0


def _job(
    name: str, workers: int, batch: int, source: profile.Profile, policy: str
) -> settings.JobSettings:
    training = messages.TrainingSettings(
        model=name,
        seed=1,
        optimizer=messages.OptimizerSettings(lr=1e-3),
        global_batch_size=batch,
        data=messages.DataSettings(corpus_paths=("corpus.txt",)),
        device=messages.Device.CPU,
        snapshot_interval_steps=1,
        redundancy=messages.RedundancyMode.XOR,
    )
    return settings.JobSettings(
        name=name,
        workers=workers,
        steps=100,
        micro_batch_size=source.micro_batch_size,
        training=training,
        policy=policy,
        profile=source,
    )


def _jobs() -> list[tuple[str, int, int, profile.Profile]]:
    small = synthetic.synthesize(shapes.named("small"), accelerators.named("a100-80gb"), 2, 1)
    gpt = synthetic.synthesize(shapes.named("gpt3-2.7b"), accelerators.named("a100-40gb"), 1, 1)
    return [
        ("small", 8, 16, dataclasses.replace(small, memory_bytes=30 * 2**20)),
        ("gpt3-2.7b", 32, 256, gpt),
    ]


def _time(planner: planning.Planner, running: plans.Plan, worker: plans.WorkerId) -> float:
    start = time.perf_counter()
    planner.recover(running, {worker}, set(), HOUR_S)
    return (time.perf_counter() - start) * 1e3


def measure(runs: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, workers, batch, source in _jobs():
        for policy in settings.Policy:
            job = _job(name, workers, batch, source, policy.value)
            running = (
                planning.Planner(source, job)
                .best([plans.WorkerId(w) for w in range(workers)], status.MoveKind.INITIAL)
                .plan
            )
            victims = [running.workers[(i * 7) % len(running.workers)] for i in range(runs)]
            cold = [_time(planning.Planner(source, job), running, w) for w in victims]
            warm_planner = planning.Planner(source, job)
            warm_planner.prepare(running)
            warm = [_time(warm_planner, running, w) for w in victims]
            for case, values in (("cold", cold), ("warm", warm)):
                rows.append(
                    {
                        "job": name,
                        "workers": workers,
                        "plan": [len(p.workers) for p in running.pipelines],
                        "policy": policy.value,
                        "case": case,
                        "median_ms": statistics.median(values),
                        "min_ms": min(values),
                        "max_ms": max(values),
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="decisions per case (default 5)")
    args = parser.parse_args()
    rows = measure(args.runs)
    head = ("job", "workers", "policy", "case", "median ms", "min", "max")
    print("{:<10} {:>7} {:<9} {:<5} {:>10} {:>8} {:>8}".format(*head))
    for r in rows:
        print(
            f"{r['job']:<10} {r['workers']:>7} {r['policy']:<9} {r['case']:<5} "
            f"{r['median_ms']:>10.1f} {r['min_ms']:>8.1f} {r['max_ms']:>8.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"time_to_failure_s": HOUR_S, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
