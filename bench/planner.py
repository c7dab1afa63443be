"""Planning latency against Oobleck's Table 3, and the complete template set of the largest cell.

    .venv/bin/python bench/planner.py [--repeats R] [--out bench/results/planner.json]
    .venv/bin/python bench/planner.py --scale [--before DIR] [--out FILE]   (cluster scale)

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

--scale: planning at cluster scale (#17): `planaria plan`, the plan choice alone, and the
controller's first plan, at 32 to 1,024 nodes, with an older tree's figures beside them;
writes bench/results/planner-scale.json.

Profile: `planaria profile --synthetic gpt3-6.7b --accelerator a100-80gb --micro-batch 1` (34
planner layers, 8 GPUs per node unless the case says 1), global batch 1024, micro-batch 1.

- cli: `planaria plan` as a user runs it, in a fresh process: wall-clock seconds and peak RSS
  (GNU time's %M), exit status; "refused" when it exits 2 (a planner error).
- choice: `instantiation.choose_plan` alone on 4S templates (median of R runs). Before: eq. 5's
  enumeration with every instantiation's exact batch distribution, ranked (the old
  choose_plan, kept as the tests' oracle); refused past its 200,000 limit.
- controller: `control.planning.Planner` made for the job plus its first `best` plan over every
  worker (templates, fit to the batch, choice), cold, in a fresh process (so --before applies too;
  its seconds exclude interpreter start-up).

With --before DIR (an older checkout, e.g. `git archive d35ef6c operator | tar -x -C DIR`),
the cli cases also run with PYTHONPATH=DIR/operator, so the old planner and CLI answer. Wall
clock on a shared 2-core machine: the load average is recorded; compare columns of one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planaria.contract import errors, profile, shapes
from planaria.planner import (
    accelerators,
    instantiation,
    stage_mapping,
    stage_table,
    synthetic,
    templates,
)
from planaria.spec import profile_file

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
    parser.add_argument("--out", default=None, help="JSON results (default per mode)")
    parser.add_argument(
        "--scale",
        action="store_true",
        help="planning at cluster scale instead (#17, the scale section below)",
    )
    parser.add_argument(
        "--before", metavar="DIR", help="with --scale: an older tree to run the CLI cases with"
    )
    args = parser.parse_args()
    if args.scale:
        scale_main(
            args.before, args.out or "bench/results/planner-scale.json", min(args.repeats, 3)
        )
        return
    args.out = args.out or "bench/results/planner.json"
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


# -- cluster scale (#17) ------------------------------------------------------------

SCALE_BATCH = 1024
# (nodes, GPUs per node, fault tolerance) of the cli cases, as the issue tried them.
CLI_CASES = ((32, 8, 1), (64, 8, 1), (48, 1, 1), (1024, 8, 1), (1024, 8, 2), (1024, 8, 3))
CHOICE_CASES = ((32, 8, 1), (64, 8, 1), (48, 1, 1), (1024, 8, 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One command or call: seconds, peak RSS in MiB (cli only), and what it answered."""

    seconds: float | None
    peak_rss_mib: float | None
    outcome: str


def write_profile(directory: Path, gpus: int) -> Path:
    path = directory / f"gpt3-6.7b-{gpus}.json"
    command = [
        *_planaria(),
        "profile",
        "--synthetic",
        "gpt3-6.7b",
        "--accelerator",
        "a100-80gb",
        "--micro-batch",
        "1",
        "--gpus-per-node",
        str(gpus),
        "--out",
        str(path),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return path


def _planaria() -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from planaria.cli import main; sys.exit(main.main())",
    ]


def run_cli(profile_path: Path, case: tuple[int, int, int], python_path: str | None) -> Run:
    nodes, gpus, f = case
    command = [
        *_planaria(),
        "plan",
        "--profile",
        str(profile_path),
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(gpus),
        "--fault-tolerance",
        str(f),
        "--global-batch",
        str(SCALE_BATCH),
        "--micro-batch",
        "1",
    ]
    env = dict(os.environ)
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    start = time.perf_counter()
    # GNU time reports the child's peak RSS (kB) on the last line of stderr
    done = subprocess.run(
        ["/usr/bin/time", "-f", "peak-rss-kb %M", *command],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    *rest, last = done.stderr.strip().splitlines() or [""]
    rss = int(last.split()[1]) / 1024 if last.startswith("peak-rss-kb") else None
    if done.returncode == 0:
        line = next((x for x in done.stdout.splitlines() if x.startswith("plan (")), "planned")
        return Run(seconds=seconds, peak_rss_mib=rss, outcome=line.split(": ", 1)[-1])
    return Run(seconds=seconds, peak_rss_mib=rss, outcome="refused: " + " ".join(rest)[-160:])


def time_choice(profile_path: Path, case: tuple[int, int, int], repeats: int) -> dict[str, Run]:
    nodes, gpus, f = case
    source = profile_file.load_profile(profile_path)
    template_set = templates.generate_templates(
        source, num_nodes=nodes, gpus_per_node=gpus, fault_tolerance=f
    )
    after = _median(repeats, lambda: instantiation.choose_plan(template_set, range(nodes), 1024))
    return {"before": _enumerated(template_set, nodes), "after": after}


def _median(repeats: int, call: Any) -> Run:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    assert isinstance(result, instantiation.PlanChoice)
    return Run(
        seconds=statistics.median(times),
        peak_rss_mib=None,
        outcome=result.chosen.instantiation.describe(),
    )


def _enumerated(template_set: templates.TemplateSet, nodes: int) -> Run:
    """The old choose_plan's work: list eq. 5, distribute the batch on each, rank."""
    start = time.perf_counter()
    try:
        options = instantiation.enumerate_instantiations(
            template_set.sizes, nodes, template_set.fault_tolerance
        )
    except errors.InfeasibleError as exc:
        return Run(seconds=None, peak_rss_mib=None, outcome=f"refused: {str(exc)[:60]}...")
    ranked = instantiation.rank(
        [instantiation.evaluate(o, template_set, SCALE_BATCH) for o in options]
    )
    return Run(
        seconds=time.perf_counter() - start,
        peak_rss_mib=None,
        outcome=ranked[0].instantiation.describe(),
    )


# The controller's first plan, run in a fresh interpreter so that an older tree can answer too.
_CONTROLLER_SCRIPT = """
import json, sys, time
from planaria.control import planning, settings
from planaria.contract import plan
from planaria.spec import profile_file
from planaria.wire import messages
path, nodes, gpus, f, batch = sys.argv[1], *map(int, sys.argv[2:])
source = profile_file.load_profile(path)
training = messages.TrainingSettings(
    model="gpt3-6.7b", seed=0, optimizer=messages.OptimizerSettings(lr=1e-4),
    global_batch_size=batch, data=messages.DataSettings(corpus_paths=("corpus.txt",)),
    device=messages.Device.CUDA, snapshot_interval_steps=1,
    redundancy=messages.RedundancyMode.XOR)
job = settings.JobSettings(name="bench", workers=nodes * gpus, gpus_per_node=gpus, steps=1,
    micro_batch_size=1, fault_tolerance=f, training=training, profile=source)
start = time.perf_counter()
try:
    workers = [plan.WorkerId(w) for w in range(nodes * gpus)]
    move = planning.Planner(source, job).best(workers, "start")
    outcome = move.reason.split(";")[0]
except ValueError as exc:
    outcome = "refused: " + str(exc)[:120]
print(json.dumps({"seconds": time.perf_counter() - start, "outcome": outcome}))
"""


def time_controller(profile_path: Path, case: tuple[int, int, int], python_path: str | None) -> Run:
    """Planner for the job plus its first plan over every worker, cold, in a fresh process."""
    env = dict(os.environ)
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    args = [str(profile_path), *map(str, case), str(SCALE_BATCH)]
    done = subprocess.run(
        [sys.executable, "-c", _CONTROLLER_SCRIPT, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return Run(seconds=answer["seconds"], peak_rss_mib=None, outcome=answer["outcome"])


def _cell(run: Run | None) -> str:
    if run is None:
        return "-"
    if run.outcome.startswith("refused"):
        return "refused"
    text = f"{run.seconds:.2f} s" if run.seconds is not None else "?"
    return text + (f", {run.peak_rss_mib:.0f} MiB" if run.peak_rss_mib is not None else "")


def scale_main(before: str | None, out: str, repeats: int) -> None:
    rows: list[tuple[str, str, str, str]] = []
    document: dict[str, Any] = {
        "benchmark": "planner-scale",
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "loadAverageStart": os.getloadavg(),
        },
        "globalBatch": SCALE_BATCH,
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        paths = {g: write_profile(Path(scratch), g) for g in (1, 8)}
        for case in CLI_CASES:
            old = None if before is None else run_cli(paths[case[1]], case, f"{before}/operator")
            new = run_cli(paths[case[1]], case, None)
            name = f"planaria plan {case[0]}x{case[1]} f={case[2]}"
            rows.append((name, _cell(old), _cell(new), new.outcome))
            document["cases"].append(_entry(name, old, new))
        for case in CHOICE_CASES:
            runs = time_choice(paths[case[1]], case, repeats)
            name = f"choose_plan {case[0]}x{case[1]} f={case[2]}"
            rows.append((name, _cell(runs["before"]), _cell(runs["after"]), runs["after"].outcome))
            document["cases"].append(_entry(name, runs["before"], runs["after"]))
        for case in ((32, 8, 1), (1024, 8, 1)):
            old = None if before is None else time_controller(paths[8], case, f"{before}/operator")
            new = time_controller(paths[8], case, None)
            name = f"controller first plan {case[0]}x{case[1]} f={case[2]}"
            rows.append((name, _cell(old), _cell(new), new.outcome))
            document["cases"].append(_entry(name, old, new))
    document["machine"]["loadAverageEnd"] = os.getloadavg()
    print(_table(rows))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")


def _entry(name: str, before: Run | None, after: Run) -> dict[str, Any]:
    return {
        "case": name,
        "before": None if before is None else asdict(before),
        "after": asdict(after),
    }


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("case", "before", "after", "result (after)")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = []
    for row in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:3], widths, strict=True)]
        lines.append("  ".join([*cells, row[3][:90]]))
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
