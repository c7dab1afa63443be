"""`planaria simulate`: every recovery policy over failure traces, side by side.

    planaria simulate (--scenario NAME | --trace FILE) [--model NAME] [--seeds K] [--hours H]
                      --out DIR [--json]

Runs `planaria.sim` for the named scenario's traces (seeds 0..K-1) or for a CSV trace
(`time,event,node`; the job and its cluster are then --scenario's, default odyssey), prints the
per-policy table (or, with --json, the JSON summary) and writes DIR/summary.json and
DIR/timeline.png (the first trace). The horizon is --hours, else the scenario's (9 h for
odyssey, 12 h for spot-*; the oobleck-* traces and a trace file with their job end at their
last failure), and the first line of the table states it. An empty trace is a fault-free run of
the horizon. Progress goes to stderr. User errors are ValueErrors (SimulateCommandError here,
the simulator's and the planner's), printed by `planaria.cli.main` as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from planaria.sim import report, scenarios, study, traces

DEFAULT_SEEDS = 5


class SimulateCommandError(ValueError):
    """An option out of range or a bad output folder; names the option."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate hours of training under failures, every recovery policy side by side",
        description="Event-driven simulation of one job under failure traces with Planaria's "
        "adaptive policy, dynamic-only (Oobleck), rerouting-only (ReCycle), Bamboo, Varuna and "
        "the ideal bound; step times from the planner's estimator.",
    )
    parser.add_argument(
        "--scenario",
        metavar="NAME",
        help=f"named scenario: {', '.join(scenarios.SCENARIOS)} (with --trace: the job only)",
    )
    parser.add_argument("--trace", type=Path, metavar="FILE", help="CSV trace time,event,node")
    parser.add_argument("--model", metavar="NAME", help="named model (default: the scenario's)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=DEFAULT_SEEDS,
        metavar="K",
        help="traces drawn with seeds 0..K-1",
    )
    parser.add_argument(
        "--hours",
        type=float,
        metavar="H",
        help="hours simulated (default: the scenario's: 9 for odyssey, 12 for spot-*, until the "
        "last failure for oobleck-*)",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
    parser.add_argument("--json", action="store_true", help="print the JSON summary, no table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    scenario, given = _inputs(args)
    _prepare(args.out)
    result = study.run(
        scenario, range(args.seeds), model=args.model, given=given, progress=_progress
    )
    summaries = report.summarise(result.runs, result.planner, result.num_nodes)
    document = {
        "scenario": scenario.name,
        "model": args.model or scenario.model,
        "trace": None if given is None else str(args.trace),
        "horizon_s": _horizon_s(result.traces),
        "seeds": len(result.traces),
        "elapsed_s": result.elapsed_s,
        "policies": report.to_json(summaries),
        "runs": {name: [report.run_json(r) for r in runs] for name, runs in result.runs.items()},
    }
    (args.out / "summary.json").write_text(json.dumps(document, indent=2))
    first = {name: runs[0] for name, runs in result.runs.items()}
    failures = [e.time_s for e in result.traces[0].events if e.kind is traces.Kind.FAIL]
    title = f"{scenario.name}, {document['model']}, first trace"
    report.timeline_png(first, failures, args.out / "timeline.png", title)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(f"{_source(scenario, args.trace, result.traces)}; model {document['model']}")
        print(report.table(summaries))
        print(f"wrote {args.out / 'summary.json'} and {args.out / 'timeline.png'}")
    return 0


def _inputs(args: argparse.Namespace) -> tuple[scenarios.Scenario, traces.Trace | None]:
    if args.scenario is None and args.trace is None:
        raise SimulateCommandError("give --scenario NAME or --trace FILE")
    if args.seeds < 1:
        raise SimulateCommandError(f"--seeds must be >= 1 (got {args.seeds})")
    scenario = scenarios.named(args.scenario or "odyssey")
    if args.hours is not None:
        if not (math.isfinite(args.hours) and args.hours > 0):
            raise SimulateCommandError(f"--hours must be > 0 (got {args.hours:g})")
        scenario = scenario.with_horizon(args.hours * scenarios.HOUR_S)
    given = None
    if args.trace is not None:
        given = traces.read_csv(args.trace, scenario.num_nodes, scenario.horizon_s)
    return scenario, given


def _horizon_s(drawn: Sequence[traces.Trace]) -> float | None:
    """The horizon all traces share, or None where each ends at its own last failure."""
    horizons = {t.horizon_s for t in drawn}
    return horizons.pop() if len(horizons) == 1 else None


def _source(scenario: scenarios.Scenario, trace: Path | None, drawn: Sequence[traces.Trace]) -> str:
    """The table's first line: where the failures come from and the horizon simulated."""
    shared = _horizon_s(drawn)
    if shared is not None:
        horizon = f"horizon {shared / scenarios.HOUR_S:.4g} h"
    else:
        hours = [t.horizon_s / scenarios.HOUR_S for t in drawn]
        horizon = f"horizon {min(hours):.3g} to {max(hours):.3g} h (each trace's last failure)"
    if trace is None:
        return f"{scenario.description}; {horizon}; {len(drawn)} trace(s)"
    events = len(drawn[0].events)
    return (
        f"trace {trace}: {events} event(s) on the {scenario.num_nodes} nodes of {scenario.name}"
        f"; {horizon}"
    )


def _prepare(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise SimulateCommandError(f"--out {out} is a file; give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimulateCommandError(f"--out {out}: cannot create it ({exc.strerror})") from exc


def _progress(done: study.Done) -> None:
    print(
        f"simulate: trace {done.trace}/{done.traces}, {done.policy} done "
        f"({done.runs}/{done.total} runs, {done.elapsed_s:.1f} s)",
        file=sys.stderr,
    )
