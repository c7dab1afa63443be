"""`planaria run`: train a job with local worker processes through injected failures.

    planaria run JOB.yaml [--out DIR] [--fail step=40:worker=3]... [--fail time=90s:worker=random]
                 [--mtbf 60s] [--workers N] [--steps N] [--seed N] [--name NAME]
                 [--no-progress] [--metrics-port P]

The local composition root (docs/running.md): the job file (`planaria.spec.job_file`) becomes
the controller's `JobSettings`; the local backend (`planaria.local.backend`) runs one agent
process per worker and hosts the epochs' rendezvous store; the fault injector
(`planaria.local.faults`) kills workers as the file's `failures` and the `--fail` / `--mtbf`
flags ask; the controller core (`planaria.control.controller`) drives the job on the real clock
and publishes its status to the terminal (`planaria.cli.progress`) and, with --metrics-port, to
Prometheus; the report (`planaria.cli.run_report`) is written to --out when the job ends, also
after Ctrl-C or a failure.

Exit status: 0 Succeeded, 1 Failed, 2 a bad job file or option (a ValueError, printed as one
line by `planaria.cli.main`), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planaria.cli import progress, run_report
from planaria.control import clock, ports
from planaria.control import controller as controllers
from planaria.control import metrics as job_metrics
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.spec import job, job_file

EXIT_FAILED = 1


class RunCommandError(ValueError):
    """An option of `planaria run` out of range; names the option and the fix."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="train a job with local worker processes through injected failures",
        description="Run JOB.yaml (a ResilientJob spec) with one local agent process per "
        "worker, inject failures, show progress, and write a report (docs/running.md).",
    )
    parser.add_argument("job", metavar="JOB.yaml", help="the job file (bare spec or ResilientJob)")
    parser.add_argument("--out", metavar="DIR", help="report directory (default: runs/<job>)")
    parser.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a failure: step=40:worker=3 or time=90s:worker=random (repeatable)",
    )
    parser.add_argument(
        "--mtbf", metavar="DURATION", help="also kill random workers, e.g. every 60s on average"
    )
    for flag, text in (("--workers", "workers"), ("--steps", "train steps"), ("--seed", "seed")):
        parser.add_argument(flag, type=int, metavar="N", help=f"override the file's {text}")
    parser.add_argument("--name", help="job name (default: metadata.name or the file's name)")
    parser.add_argument(
        "--no-progress", action="store_true", help="plain progress lines instead of the panel"
    )
    parser.add_argument(
        "--metrics-port", type=int, metavar="P", help="serve Prometheus metrics on port P"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    loaded = job_file.load_job(args.job, overrides=_overrides(args))
    name = args.name or loaded.name
    settings = job.to_settings(loaded.spec, name, _corpus_default())
    failures = [*(_failure_text(f) for f in loaded.spec.failures), *args.fail]
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise RunCommandError(f"--metrics-port {args.metrics_port}: give a port in [0, 65535]")
    out = Path(args.out) if args.out else Path("runs") / name
    live = not args.no_progress and sys.stdout.isatty()
    # The controller and the backend log what they work around (a refused Configure, a worker
    # left out); say whose line it is.
    logging.basicConfig(format="planaria run: %(name)s: %(message)s", level=logging.WARNING)
    options = _Options(failures=tuple(failures), mtbf=args.mtbf, out=out, live=live)
    return asyncio.run(_run_job(settings, options, args.metrics_port))


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    values = {"workers": args.workers, "steps": args.steps, "seed": args.seed}
    return {key: value for key, value in values.items() if value is not None}


def _corpus_default() -> str:
    from planaria.agent import data  # torch-heavy: only when a job is run

    return str(data.default_corpus_root())


def _failure_text(failure: job.FailureSpec) -> str:
    """A spec failure in the --fail syntax, so both go through one parser."""
    trigger = f"step={failure.step}" if failure.step is not None else f"time={failure.time_s}s"
    rejoin = "" if failure.rejoin_seconds is None else f":rejoin={failure.rejoin_seconds}s"
    return f"{trigger}:worker={failure.worker}{rejoin}"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Options:
    """What the run needs besides the settings."""

    failures: tuple[str, ...]
    mtbf: str | None
    out: Path
    live: bool


class _Sinks:
    """Publishes every status to several sinks (the terminal, Prometheus)."""

    def __init__(self, sinks: Sequence[ports.StatusSink]) -> None:
        self._sinks = tuple(sinks)

    async def publish(self, status: object) -> None:
        for sink in self._sinks:
            await sink.publish(status)


async def _run_job(
    settings: job_settings.JobSettings, options: _Options, metrics_port: int | None
) -> int:
    """Compose the local backend, the fault injector and the sinks, and run the job."""
    from planaria.local import backend as local_backend  # processes: only when a job runs
    from planaria.local import faults

    failures = [faults.parse_failure(text) for text in options.failures]
    mtbf = faults.parse_mtbf(options.mtbf) if options.mtbf else None
    options.out.mkdir(parents=True, exist_ok=True)
    backend = local_backend.LocalBackend(job=settings.name, run_dir=options.out)
    injector = faults.Injector(backend, failures, mtbf=mtbf, seed=settings.training.seed)
    terminal = progress.Progress(steps=settings.steps, live=options.live)
    sinks: list[ports.StatusSink] = [terminal]
    server = None
    if metrics_port is not None:
        metrics = job_metrics.MetricsSink(settings.name)
        server = job_metrics.serve(metrics, metrics_port)
        sinks.append(metrics)
    try:
        final = await execute(
            settings,
            backend,
            clock=clock.RealClock(),
            sink=_Sinks(sinks),
            out=options.out,
            inject=injector.run,
        )
    finally:
        terminal.close()  # before any line of ours, or the live panel is drawn again below it
        if server is not None:
            server.shutdown()
    names = ", ".join(run_report.REPORT_FILES)
    where = f"report in {options.out}/ ({names})"
    print(f"planaria run: {final.phase.value} at step {final.step}; {where}")
    return 0 if final.phase is statuses.Phase.SUCCEEDED else EXIT_FAILED


Inject = Callable[[Callable[[], statuses.JobStatus]], Awaitable[None]]


async def execute(
    settings: job_settings.JobSettings,
    backend: ports.Backend,
    *,
    clock: ports.Clock,
    sink: ports.StatusSink,
    out: Path,
    inject: Inject | None = None,
) -> statuses.JobStatus:
    """Run the job on `backend` to its end, with `inject` (given a way to read the job's status)
    running alongside, then write the report to `out`; returns the final status. The report is
    written also after Ctrl-C or an error, once every worker is stopped."""
    controller = controllers.Controller(settings, backend, clock=clock, sink=sink)
    started = clock.monotonic()
    try:
        await _drive(controller, inject)
    finally:
        ended = clock.monotonic()  # the workers' shutdown is not part of the run
        await backend.shutdown()
        _report(settings, controller, out, started, ended)
    return controller.status


def _report(
    settings: job_settings.JobSettings,
    controller: controllers.Controller,
    out: Path,
    started_s: float,
    finished_s: float,
) -> None:
    final = controller.status
    history = run_report.History(
        job=settings.name,
        global_batch_size=settings.training.global_batch_size,
        final=final,
        steps=controller.steps,
        recoveries=controller.recoveries,
        started_s=started_s,
        finished_s=finished_s,
    )
    run_report.write_report(history, out)


async def _drive(controller: controllers.Controller, inject: Inject | None) -> None:
    """The controller's run, with the injector watching its status alongside."""
    if inject is None:
        await controller.run()
        return
    injecting = asyncio.ensure_future(inject(lambda: controller.status))
    try:
        await controller.run()
    finally:
        injecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await injecting
