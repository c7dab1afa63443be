"""Benchmark: compile, check and time schedules of symmetric plans with one failed stage.

For N_dp pipelines of N_pp one-layer stages with N_m micro-batches each, pipeline 0 loses its
middle stage and its micro-batches go round-robin to the peers. Prints, per size: instructions,
seconds to compile / check / estimate, the estimated step with Tf = 1 s, Tb = 2 s and free
links, and Odyssey eq. 12 with the per-peer share rounded up (the estimate must equal it when
N_m >= N_pp). Writes bench/results/schedule.json.

    .venv/bin/python bench/schedule.py
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from planaria.contract import plan, profile, schedule
from planaria.planner import deadlock, estimator

SIZES = [(2, 4, 8), (4, 8, 32), (8, 8, 64), (8, 16, 64), (16, 16, 128), (16, 32, 128)]
FREE = profile.LinkProfile(bandwidth_bytes_per_s=1e30, latency_s=0.0)
RESULTS = Path(__file__).parent / "results" / "schedule.json"


def failed_plan(num_pipelines: int, num_stages: int, num_micro_batches: int) -> plan.Plan:
    """Pipeline 0 lost stage num_stages // 2; round-robin reroutes to the other pipelines."""
    lost = num_stages // 2
    pipelines = []
    for p in range(num_pipelines):
        stages = tuple(
            plan.Stage(
                layer_start=s,
                layer_stop=s + 1,
                workers=() if (p, s) == (0, lost) else (plan.WorkerId(p * num_stages + s),),
            )
            for s in range(num_stages)
        )
        pipelines.append(plan.Pipeline(stages=stages, num_micro_batches=num_micro_batches))
    peers = num_pipelines - 1
    reroutes = tuple(
        plan.Reroute(
            pipeline=0,
            stage=lost,
            peer_pipeline=q,
            micro_batches=tuple(range(q - 1, num_micro_batches, peers)),
        )
        for q in range(1, num_pipelines)
    )
    return plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1, reroutes=reroutes)


def uniform(num_layers: int) -> profile.Profile:
    layer = profile.LayerProfile(
        name="block",
        forward_s=(1.0,),
        backward_s=(2.0,),
        parameter_bytes=0,
        gradient_bytes=0,
        optimizer_bytes=0,
        activation_bytes=0,
        output_bytes=0,
    )
    return profile.Profile(
        model="bench",
        accelerator="bench",
        micro_batch_size=1,
        memory_bytes=1,
        layers=(layer,) * num_layers,
        intra_node=FREE,
        inter_node=FREE,
    )


def measure(num_pipelines: int, num_stages: int, num_micro_batches: int) -> dict[str, float]:
    p = failed_plan(num_pipelines, num_stages, num_micro_batches)
    started = time.perf_counter()
    sched = schedule.compile_schedule(p)
    compiled = time.perf_counter()
    deadlock.check_schedule(sched)
    checked = time.perf_counter()
    step = estimator.estimate_step(sched, uniform(num_stages)).step_s
    estimated = time.perf_counter()
    share = math.ceil(num_micro_batches / (num_pipelines - 1))
    return {
        "pipelines": num_pipelines,
        "stages": num_stages,
        "micro_batches": num_micro_batches,
        "instructions": sum(len(s.instructions) for s in sched.streams),
        "compile_s": compiled - started,
        "check_s": checked - compiled,
        "estimate_s": estimated - checked,
        "step_s": step,
        "eq12_s": (num_stages + num_micro_batches - 1 + share) * 3.0,
    }


def main() -> None:
    rows = [measure(*size) for size in SIZES]
    header = "N_dp N_pp  N_m  instructions  compile_s  check_s  estimate_s   step_s   eq12_s"
    print(header)
    for r in rows:
        print(
            f"{r['pipelines']:4} {r['stages']:4} {r['micro_batches']:4} {r['instructions']:13} "
            f"{r['compile_s']:10.3f} {r['check_s']:8.3f} {r['estimate_s']:11.3f} "
            f"{r['step_s']:8.1f} {r['eq12_s']:8.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
