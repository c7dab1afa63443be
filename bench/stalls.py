"""Unexplained stalls: the largest step gap with no failure next to it, over several runs of a job.

    .venv/bin/python bench/stalls.py [--runs 10] [--job examples/tiny-job.yaml]
                                     [--out bench/results/stalls.json] [--keep DIR]
                                     [-- extra run flags]

Each run is `planaria run JOB --no-progress` (the README's main job by default, failures and all)
in a directory of its own. From its report: metrics.csv (a row per controller pass that saw a
new committed step: time_s, step) and recoveries.json (each recovery's start and total). A row's
step time is its time since the previous row divided by the steps it advanced. Rows whose
interval touches a recovery window (from `heartbeatSeconds` before the recovery started, since
detection takes up to that, to its end plus one median step) are next to a failure and are left
out; so is the first row (start-up). Per run: the largest remaining step time, the median, their
ratio, and at which step and second it happened. Goal (issue #18): ratio <= 5 on every run.

A table on stdout and the JSON at --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Run:
    """One run's step gaps."""

    run: int
    exit_code: int
    wall_s: float
    rows: int
    median_step_s: float
    largest_step_s: float
    ratio: float
    at_step: int
    at_s: float
    recoveries: int


def _windows(recoveries: list[dict[str, float]], detect_s: float) -> list[tuple[float, float]]:
    return [(r["started_s"] - detect_s, r["started_s"] + r["total_s"]) for r in recoveries]


def gaps(
    rows: list[tuple[float, int]], windows: list[tuple[float, float]]
) -> tuple[float, float, int, float]:
    """(median step s, largest step s outside the windows, its step, its end time) of the
    (time_s, step) rows (module docstring)."""
    steps = [
        ((t1 - t0) / (s1 - s0), t0, t1, s1)
        for (t0, s0), (t1, s1) in zip(rows, rows[1:], strict=False)
        if s1 > s0
    ]
    if not steps:
        return 0.0, 0.0, 0, 0.0
    median = statistics.median(each for each, *_ in steps)
    quiet = [
        (each, s1, t1)
        for each, t0, t1, s1 in steps
        if not any(t0 < end + median and t1 > start for start, end in windows)
    ]
    if not quiet:
        return median, 0.0, 0, 0.0
    largest, step, at = max(quiet)
    return median, largest, step, at


def _one(index: int, job: Path, extra: list[str], folder: Path) -> Run:
    out = folder / f"run-{index}"
    name = f"stalls-{uuid.uuid4().hex[:6]}"
    command = [sys.executable, "-m", "planaria", "run", str(job), "--out", str(out)]
    command += ["--name", name, "--no-progress", *extra]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    with open(out / "metrics.csv", newline="") as source:
        rows = [(float(r["time_s"]), int(r["step"])) for r in csv.DictReader(source)]
    recoveries = json.loads((out / "recoveries.json").read_text())
    spec = yaml.safe_load(job.read_text())
    spec = spec.get("spec", spec)
    detect_s = float(spec.get("timeouts", {}).get("heartbeatSeconds", 3.0))
    median, largest, step, at = gaps(rows[1:], _windows(recoveries, detect_s))
    return Run(
        run=index,
        exit_code=done.returncode,
        wall_s=round(wall, 1),
        rows=len(rows),
        median_step_s=round(median, 4),
        largest_step_s=round(largest, 3),
        ratio=round(largest / median, 1) if median else 0.0,
        at_step=step,
        at_s=round(at, 1),
        recoveries=len(recoveries),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--job", type=Path, default=ROOT / "examples" / "tiny-job.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "stalls.json")
    parser.add_argument("--keep", type=Path, help="keep each run's directory under this folder")
    parser.add_argument("extra", nargs="*", help="more `planaria run` flags, after --")
    args = parser.parse_args()
    runs: list[Run] = []
    print("| run | exit | wall s | median step s | largest quiet step s | ratio | at step | at s |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="planaria-stalls-") as scratch:
        folder = args.keep or Path(scratch)
        for index in range(args.runs):
            each = _one(index, args.job, args.extra, folder)
            runs.append(each)
            print(
                f"| {each.run} | {each.exit_code} | {each.wall_s} | {each.median_step_s} | "
                f"{each.largest_step_s} | {each.ratio} | {each.at_step} | {each.at_s} |",
                flush=True,
            )
    worst = max((r.ratio for r in runs), default=0.0)
    print(f"worst ratio over {len(runs)} runs: {worst} (goal <= 5)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"job": str(args.job), "runs": [asdict(r) for r in runs], "worst_ratio": worst}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
