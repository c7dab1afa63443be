"""Planning latency against Oobleck's Table 3, and the complete template set of the largest cell.

    .venv/bin/python bench/planner.py [--repeats R] [--out bench/results/planner.json]

Each cell of Table 3 (layers 24/32/64/96 x nodes 8/16/24 x GPUs per node 1/4/8) plans one
template of N nodes, as the paper does (§7.4.1): the stage table is built from the profile and
the exact GPU-stage mapping of `planaria.planner.stage_mapping` is solved; the time is the median
(and the best) of R wall-clock runs on fresh objects, after one warm-up run, with the median CPU
time beside it. The load average
is recorded: other processes on a shared machine inflate wall-clock times. Then the whole
template set of the largest cell (96 layers, 24 nodes, 8 GPUs, f = 0: every size 1..24, node
specification included) is planned once with `planaria.planner.templates.generate_templates`.

Profiles: synthetic (planaria.planner.synthetic) GPT-3-like layers of GPT-3 2.7B's width
(d_model 2560, 32 heads, sequence 2048, vocabulary 50257), L blocks plus embedding and head,
micro-batch 1, on A100 80GB nodes with 1, 4 or 8 GPUs (datasheet numbers; see the profile
format docs). The paper's times are from its own profiles on its own machine; ours are from
this machine, so the comparison is of orders of magnitude, not a controlled experiment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planaria.planner import (
    accelerators,
    profile,
    shapes,
    stage_mapping,
    stage_table,
    synthetic,
    templates,
)

LAYERS = (24, 32, 64, 96)
NODES = (8, 16, 24)
GPUS = (1, 4, 8)
# Oobleck Table 3 (seconds): (nodes, GPUs per node) -> times for 24, 32, 64, 96 layers.
PAPER_S = {
    (8, 1): (0.28, 0.71, 9.65, 68.50),
    (8, 4): (0.41, 1.15, 11.58, 74.56),
    (8, 8): (0.54, 1.50, 20.98, 109.76),
    (16, 1): (3.37, 7.45, 66.35, 540.36),
    (16, 4): (4.56, 10.41, 108.10, 649.67),
    (16, 8): (4.90, 11.78, 176.04, 1213.63),
    (24, 1): (11.35, 30.11, 262.47, 1477.54),
    (24, 4): (14.78, 45.80, 472.53, 2153.84),
    (24, 8): (15.59, 49.25, 520.08, 3297.92),
}
GOAL_SPEEDUP = 20
FULL_SET_GOAL_S = 60.0


def gpt3_like(num_layers: int, gpus_per_node: int) -> profile.Profile:
    shape = shapes.ModelShape(
        name=f"gpt3-like-{num_layers}",
        num_layers=num_layers,
        d_model=2560,
        num_heads=32,
        seq_len=2048,
        vocab_size=50257,
    )
    return synthetic.synthesize(shape, accelerators.named("a100-80gb"), 1, gpus_per_node)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One cell of Table 3: our median seconds, the paper's, and what the plan found."""

    layers: int
    nodes: int
    gpus_per_node: int
    seconds: float
    paper_seconds: float
    best_seconds: float
    cpu_seconds: float
    stages: int
    iteration_time_s: float
    candidate_caps: int

    @property
    def speedup(self) -> float:
        return self.paper_seconds / self.seconds


def plan_one_template(source: profile.Profile, nodes: int, gpus: int) -> tuple[float, float, Cell]:
    """Wall and CPU seconds to plan the N-node template (stage table + exact mapping), and
    the cell."""
    start, start_cpu = time.perf_counter(), time.process_time()
    table = stage_table.build_table(source, gpus_per_node=gpus)
    search = stage_mapping.MappingSearch(table, gpus_per_node=gpus, max_nodes=nodes)
    mapping = search.map(nodes)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    num_layers = source.num_layers - 2  # blocks, without the embedding and the head
    paper = _paper_seconds(num_layers, nodes, gpus)
    return (
        elapsed,
        cpu,
        Cell(
            layers=num_layers,
            nodes=nodes,
            gpus_per_node=gpus,
            seconds=elapsed,
            paper_seconds=paper,
            best_seconds=elapsed,
            cpu_seconds=cpu,
            stages=mapping.num_stages,
            iteration_time_s=mapping.iteration_time_s(),
            candidate_caps=len(search.caps),
        ),
    )


def _paper_seconds(num_layers: int, nodes: int, gpus: int) -> float:
    times = PAPER_S.get((nodes, gpus))
    if times is None or num_layers not in LAYERS:
        return math.nan
    return times[LAYERS.index(num_layers)]


def measure_cell(num_layers: int, nodes: int, gpus: int, repeats: int) -> Cell:
    source = gpt3_like(num_layers, gpus)
    runs = [plan_one_template(source, nodes, gpus) for _ in range(repeats)]
    times = [elapsed for elapsed, _, _ in runs]
    cpu = statistics.median(cpu for _, cpu, _ in runs)
    first = runs[0][2]
    return Cell(
        **{
            **asdict(first),
            "seconds": statistics.median(times),
            "best_seconds": min(times),
            "cpu_seconds": cpu,
        }
    )


def full_template_set() -> dict[str, Any]:
    source = gpt3_like(96, 8)
    start = time.perf_counter()
    result = templates.generate_templates(source, num_nodes=24, gpus_per_node=8, fault_tolerance=0)
    seconds = time.perf_counter() - start
    return {
        "layers": 96,
        "nodes": 24,
        "gpusPerNode": 8,
        "faultTolerance": 0,
        "sizes": list(result.sizes),
        "seconds": seconds,
        "goalSeconds": FULL_SET_GOAL_S,
    }


def growth(cells: list[Cell]) -> list[str]:
    """How time grows along each axis, next to the paper's growth and its O((L-n) L^3 n M)."""
    at = {(c.layers, c.nodes, c.gpus_per_node): c for c in cells}
    lines = []
    for name, first, last, model in (
        ("layers 24 -> 96", (24, 16, 4), (96, 16, 4), (96 - 16) * 96**3 / ((24 - 16) * 24**3)),
        ("nodes 8 -> 24", (64, 8, 4), (64, 24, 4), (64 - 24) * 24 / ((64 - 8) * 8)),
        ("GPUs 1 -> 8", (64, 16, 1), (64, 16, 8), 8.0),
    ):
        ours = at[last].seconds / at[first].seconds
        paper = at[last].paper_seconds / at[first].paper_seconds
        lines.append(
            f"{name:<16} ours x{ours:7.2f}   paper x{paper:7.2f}   O((L-n)L^3 nM) x{model:8.1f}"
        )
    return lines


def run_grid(repeats: int) -> list[Cell]:
    """Every cell of Table 3, printed as it is measured."""
    plan_one_template(gpt3_like(8, 2), 2, 2)  # warm-up: imports, numpy's first calls
    print(
        f"{'layers':>6} {'nodes':>5} {'GPUs':>4} {'median s':>9} {'best s':>9} {'CPU s':>9} "
        f"{'paper s':>9} {'speedup':>8}"
    )
    cells = []
    for nodes in NODES:
        for gpus in GPUS:
            for num_layers in LAYERS:
                cell = measure_cell(num_layers, nodes, gpus, repeats)
                cells.append(cell)
                flag = "" if cell.speedup >= GOAL_SPEEDUP else f"  < {GOAL_SPEEDUP}x"
                print(
                    f"{num_layers:>6} {nodes:>5} {gpus:>4} {cell.seconds:>9.4f} "
                    f"{cell.best_seconds:>9.4f} {cell.cpu_seconds:>9.4f} "
                    f"{cell.paper_seconds:>9.2f} "
                    f"{cell.speedup:>7.0f}x{flag}",
                    flush=True,
                )
    return cells


def summarize(cells: list[Cell]) -> dict[str, float]:
    speedups = [c.speedup for c in cells]
    summary = {
        "minSpeedup": min(speedups),
        "geomeanSpeedup": math.exp(sum(map(math.log, speedups)) / len(speedups)),
        "cellsBelowGoal": sum(s < GOAL_SPEEDUP for s in speedups),
    }
    print(
        f"speedup min {summary['minSpeedup']:.0f}x, geometric mean "
        f"{summary['geomeanSpeedup']:.0f}x, {summary['cellsBelowGoal']} of {len(cells)} cells "
        f"below {GOAL_SPEEDUP}x"
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per cell (median)")
    parser.add_argument("--out", default="bench/results/planner.json", help="JSON results")
    args = parser.parse_args()
    cells = run_grid(args.repeats)
    full = full_template_set()
    print(
        f"complete template set, 96 layers / 24 nodes / 8 GPUs / f = 0 (sizes "
        f"{full['sizes'][0]}..{full['sizes'][-1]}): {full['seconds']:.2f} s "
        f"(goal < {FULL_SET_GOAL_S:.0f} s)"
    )
    lines = growth(cells)
    print("\n".join(lines))
    document = {
        "benchmark": "planner",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadAverage": os.getloadavg(),
        },
        "repeats": args.repeats,
        "cells": [{**asdict(c), "speedup": c.speedup} for c in cells],
        "fullTemplateSet": full,
        "growth": lines,
        "summary": summarize(cells),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
