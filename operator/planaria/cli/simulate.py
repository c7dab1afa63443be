"""`planaria simulate`: every recovery policy over failure traces, side by side.

    planaria simulate (--scenario NAME | --trace FILE) [--model NAME] [--seeds K] --out DIR
                      [--json]

Runs `planaria.sim` for the named scenario's traces (seeds 0..K-1) or for a CSV trace
(`time,event,node`; the job is then --scenario's, default odyssey), prints the per-policy table
(or, with --json, the JSON summary) and writes DIR/summary.json and DIR/timeline.png (the
first trace). Progress goes to stderr. User errors are ValueErrors (SimulateCommandError here,
the simulator's and the planner's), printed by `planaria.cli.main` as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
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
        help=f"traces drawn with seeds 0..K-1 ({DEFAULT_SEEDS})",
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
        print(f"{scenario.description}; model {document['model']}; {len(result.traces)} trace(s)")
        print(report.table(summaries))
        print(f"wrote {args.out / 'summary.json'} and {args.out / 'timeline.png'}")
    return 0


def _inputs(args: argparse.Namespace) -> tuple[scenarios.Scenario, traces.Trace | None]:
    if args.scenario is None and args.trace is None:
        raise SimulateCommandError("give --scenario NAME or --trace FILE")
    if args.seeds < 1:
        raise SimulateCommandError(f"--seeds must be >= 1 (got {args.seeds})")
    scenario = scenarios.named(args.scenario or "odyssey")
    given = None
    if args.trace is not None:
        given = traces.read_csv(args.trace, scenario.num_nodes)
    return scenario, given


def _prepare(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise SimulateCommandError(f"--out {out} is a file; give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimulateCommandError(f"--out {out}: cannot create it ({exc.strerror})") from exc


def _progress(done: int, total: int, elapsed_s: float) -> None:
    print(f"simulate: trace {done}/{total} done, {elapsed_s:.1f} s", file=sys.stderr)
