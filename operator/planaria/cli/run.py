"""`planaria run`: train a job with local worker processes through injected failures.

    planaria run JOB.yaml [--out DIR] [--fail step=40:worker=3]... [--fail time=90s:worker=random]
                 [--mtbf 60s] [--workers N] [--steps N] [--seed N] [--name NAME]
                 [--no-progress] [--metrics-port P] [--snapshot-base DIR]

The local composition root (docs/running.md): the job file (`planaria.spec.job_file`) becomes
the controller's `JobSettings`; the local backend (`planaria.local.backend`) runs one agent
process per worker and hosts the epochs' rendezvous store; the fault injector
(`planaria.local.faults`) kills workers as the file's `failures` and the `--fail` / `--mtbf`
flags ask; the controller core (`planaria.control.controller`) drives the job on the real clock
and publishes its status to the terminal (`planaria.cli.progress`) and, with --metrics-port, to
Prometheus; the report (`planaria.cli.run_report`) is written to --out when the job ends, also
after a failure or a signal. Every option is checked before anything starts
(`planaria.cli.run_checks`), so a refused command leaves nothing behind. SIGINT (Ctrl-C),
SIGTERM and SIGHUP stop the run alike (`planaria.cli.run_interrupts`): the agents are stopped,
the snapshot stores removed and the report, marked interrupted, written; a second signal kills
the agents at once.

A controller killed with SIGKILL leaves its agents training (docs/local-mode.md, "A controller
killed and started again"). Each epoch is journalled in --out (`planaria.local.journal`) before
its agents hear of it, and `--out/controller.lock` (an flock the kernel releases when its holder
dies) keeps a second controller off a run that has one. The same command run again adopts the
agents the journal's epoch left running and continues the job; with a journal but no running
agent it starts the job over, saying so.

Exit status: 0 Succeeded, 1 Failed, 2 a bad job file or option (a ValueError, printed as one
line by `planaria.cli.main`), 128 + the signal's number when a signal ended the run: 130
SIGINT, 143 SIGTERM, 129 SIGHUP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planaria.cli import progress, run_checks, run_interrupts, run_log, run_report
from planaria.contract import plan
from planaria.control import clock, ports
from planaria.control import controller as controllers
from planaria.control import metrics as job_metrics
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.spec import conversion, job_file

if TYPE_CHECKING:  # torch and processes: imported when a job runs (_run_job)
    from planaria.local import backend as local_backend
    from planaria.local import faults

EXIT_FAILED = 1
LOCK_FILE = "controller.lock"
RunCommandError = run_checks.RunCommandError


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
    parser.add_argument(
        "--snapshot-base",
        metavar="DIR",
        help="folder of the agents' host-memory snapshot stores (default /dev/shm/planaria)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    loaded = job_file.load_job(args.job, overrides=_overrides(args))
    name = args.name or loaded.name
    live = not args.no_progress and sys.stdout.isatty()
    options = run_checks.options(args, loaded, name, live=live)  # before anything starts
    settings = conversion.to_settings(loaded.spec, name, _corpus_default())
    # The controller and the backend log what they work around (a refused Configure, a worker
    # left out); say whose line it is.
    logging.basicConfig(format="planaria run: %(name)s: %(message)s", level=logging.WARNING)
    options.out.mkdir(parents=True, exist_ok=True)
    with _run_lock(options.out):
        return asyncio.run(_run_job(settings, options))


@contextlib.contextmanager
def _run_lock(out: Path) -> Iterator[None]:
    """Hold `out/controller.lock` while the run lasts: one controller per run directory. The
    kernel releases an flock when its holder dies, SIGKILL included, so a lock is never stale;
    the descriptor is not inherited by the agents (Python opens it close-on-exec)."""
    path = out / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise RunCommandError(
            f"{path}: cannot open the run's lock ({exc.strerror}); give another --out"
        ) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "?"
            raise RunCommandError(
                f"{out}: another `planaria run` (pid {holder}) controls this run; wait for it "
                "to end or give another --out"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    values = {"workers": args.workers, "steps": args.steps, "seed": args.seed}
    return {key: value for key, value in values.items() if value is not None}


def _corpus_default() -> str:
    from planaria.agent.training import data  # torch-heavy: only when a job is run

    return str(data.default_corpus_root())


class _Sinks:
    """Publishes every status to several sinks (the terminal, Prometheus)."""

    def __init__(self, sinks: Sequence[ports.StatusSink]) -> None:
        self._sinks = tuple(sinks)

    async def publish(self, status: statuses.JobStatus) -> None:
        for sink in self._sinks:
            await sink.publish(status)


async def _run_job(settings: job_settings.JobSettings, options: run_checks.Options) -> int:
    """Compose the local backend, the fault injector and the sinks, and run the job; returns
    the exit status."""
    interrupts = run_interrupts.Interrupts()
    with interrupts.installed():
        final = await _compose(settings, options, interrupts)
    where = f"report in {options.out}/ ({', '.join(run_report.REPORT_FILES)})"
    signum = interrupts.interrupted(final.phase)
    outcome = final.phase.value if signum is None else f"Interrupted by {signum.name}"
    _say(f"planaria run: {run_report.ending(outcome, final)}; {where}")
    if signum is not None:
        return run_interrupts.exit_status(signum)
    return 0 if final.phase is statuses.Phase.SUCCEEDED else EXIT_FAILED


def _say(text: str) -> None:
    """Print `text` on stdout. A terminal gone (closed after SIGHUP: EIO; a closed pipe) costs
    only the line: stdout then points at /dev/null, so the interpreter's last flush of what is
    left in its buffer cannot fail and change the exit status either."""
    try:
        print(text, flush=True)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


async def _compose(
    settings: job_settings.JobSettings,
    options: run_checks.Options,
    interrupts: run_interrupts.Interrupts,
) -> statuses.JobStatus:
    """The job run on the local backend with the injector and the sinks; its final status."""
    from planaria.local import faults  # processes: only when a job runs
    from planaria.local import journal as local_journal

    journal = local_journal.FileJournal(options.out, settings.name)
    backend, adopted = await _backend(
        settings.name,
        options.out,
        journal.read(),
        snapshot_base=options.snapshot_base,
        on_backend=lambda made: interrupts.on_force(made.kill_all),
        device=(settings.training.device.value, options.gpus),
    )
    failures = list(options.failures)
    if adopted is not None:
        failures = _not_yet_due(failures, adopted.resume_step)
    injector = faults.Injector(backend, failures, mtbf=options.mtbf_s, seed=settings.training.seed)
    before = run_log.before(run_log.read(options.out), adopting=adopted is not None)
    if before.lost_line():
        print(f"planaria run: {before.lost_line()}")
    log = run_log.ProgressLog(options.out, adopted_epoch=adopted.epoch if adopted else None)
    terminal = progress.Progress(steps=settings.steps, live=options.live)
    sinks: list[ports.StatusSink] = [terminal, log]
    server = None
    if options.metrics_port is not None:
        metrics = job_metrics.MetricsSink(settings.name)
        server = job_metrics.serve(metrics, options.metrics_port)
        sinks.append(metrics)
    try:
        final = await execute(
            settings,
            backend,
            clock=clock.RealClock(),
            sink=_Sinks(sinks),
            out=options.out,
            inject=injector.run,
            journal=journal,
            adopt=adopted,
            interrupts=interrupts,
            before=before,
            log=log,
            gave_up=backend.gave_up,
        )
        if interrupts.interrupted(final.phase) is None:
            journal.remove()  # every agent is stopped: nothing is left to adopt
    finally:
        terminal.close()  # before any line of ours, or the live panel is drawn again below it
        if server is not None:
            server.shutdown()
    return final


async def _backend(
    job_name: str,
    out: Path,
    record: ports.EpochRecord | None,
    snapshot_base: Path | None = None,
    on_backend: Callable[[local_backend.LocalBackend], None] = lambda made: None,
    device: tuple[str, Mapping[plan.WorkerId, str]] = ("cpu", {}),
) -> tuple[local_backend.LocalBackend, ports.EpochRecord | None]:
    """The run's backend, and the journalled epoch to adopt when a previous controller of `out`
    left agents of it running (module docstring); otherwise a fresh backend and None, after
    stopping any agent left without a journal (its controller died before the first epoch).
    `on_backend` is told of every backend made (a forced stop kills their agents). `device`:
    the job's device and each worker's GPU (`planaria.local.devices`); restarted workers start
    on it too."""
    from planaria.local import adoption, devices, launching
    from planaria.local import backend as local_backend

    base = snapshot_base or launching.DEFAULT_SNAPSHOT_BASE
    agent_args, placement = devices.launch(*device)

    def made(*, adopt: bool = False) -> local_backend.LocalBackend:
        backend = local_backend.LocalBackend(
            job=job_name,
            run_dir=out,
            snapshot_base=base,
            agent_args=agent_args,
            placement=placement,
            adopt=adopt,
        )
        on_backend(backend)
        return backend

    if not adoption.running(out / "workers"):
        if record is not None:
            print(
                f"planaria run: {out} holds epoch {record.epoch} of a previous controller, but "
                "none of its agents runs: starting the job over"
            )
        return made(), None
    previous = made(adopt=True)
    taken = previous.adopt()
    if record is not None and taken:
        print(
            f"planaria run: adopting epoch {record.epoch} from a previous controller "
            f"({len(taken)} agents still running)"
        )
        return previous, record
    print(
        f"planaria run: stopping {len(taken)} agents a previous controller left without a "
        "journalled epoch; starting the job over"
    )
    await previous.shutdown()
    return made(), None


def _not_yet_due(failures: list[faults.Failure], resume_step: int) -> list[faults.Failure]:
    """The failures an adopting run still injects: step triggers at or before the adopted
    epoch's resume step were its predecessor's to fire (time triggers and --mtbf count from
    this process's start)."""
    kept = [f for f in failures if f.step is None or f.step > resume_step]
    if len(kept) < len(failures):
        print(
            f"planaria run: {len(failures) - len(kept)} failure(s) at or before step "
            f"{resume_step} were the previous controller's; not injected again"
        )
    return kept


Inject = Callable[[Callable[[], statuses.JobStatus]], Awaitable[None]]
GAVE_UP_REASON = "WorkerCrashLoop"  # the Failed condition's reason when a worker keeps exiting


async def execute(
    settings: job_settings.JobSettings,
    backend: ports.Backend,
    *,
    clock: ports.Clock,
    sink: ports.StatusSink,
    out: Path,
    inject: Inject | None = None,
    journal: ports.Journal | None = None,
    adopt: ports.EpochRecord | None = None,
    interrupts: run_interrupts.Interrupts | None = None,
    before: run_log.Before | None = None,
    log: run_log.ProgressLog | None = None,
    gave_up: Callable[[], Awaitable[str]] | None = None,
    executor: futures.Executor | None = None,
) -> statuses.JobStatus:
    """Run the job on `backend` to its end, with `inject` (given a way to read the job's status)
    running alongside, then write the report to `out`; returns the final status. The report is
    written also after an error or an interrupt, once every worker is stopped. `journal` records
    every epoch; `adopt` continues a previous controller's epoch (its agents still run);
    `interrupts` may cancel the job (run_interrupts): the status is then the one it was
    cancelled in, and the report says which signal ended it. `before`: what earlier controllers
    of the run did (the report covers them too); `log` is told how the run ended, once the
    report is written. `gave_up` returns once the backend gives up restarting a worker, with
    why: the job then ends Failed with that cause (`planaria.local.restarts`). `executor` runs
    the planner (None: a thread of its own; the virtual-time tests give `executors.Inline()`)."""
    controller = controllers.Controller(
        settings, backend, clock=clock, sink=sink, journal=journal, adopt=adopt, executor=executor
    )
    started, started_wall = clock.monotonic(), time.time()
    driving = asyncio.ensure_future(_drive(controller, inject, gave_up))
    if interrupts is not None:
        interrupts.guard(driving)
    try:
        await driving
    except asyncio.CancelledError:
        # An interrupt cancelled the job (not this task's caller): the stop and report follow.
        if interrupts is None or interrupts.signum is None or _cancelling():
            raise
    finally:
        ended = clock.monotonic()  # the workers' shutdown is not part of the run
        await backend.shutdown()
        signum = interrupts.interrupted(controller.status.phase) if interrupts else None
        adopted = adopt.epoch if adopt is not None else None
        history = _history(
            settings, controller, (started, started_wall), ended, signum, (before, adopted)
        )
        run_report.write_report(history, out)
        if log is not None:
            log.end(history.outcome, controller.status.step)
    return controller.status


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (by its caller)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _history(
    settings: job_settings.JobSettings,
    controller: controllers.Controller,
    started: tuple[float, float],
    finished_s: float,
    interrupted_by: signal.Signals | None,
    taken_over: tuple[run_log.Before | None, int | None],
) -> run_report.History:
    """The run's history for its report: the controller's, after the earlier controllers' steps
    (`before.earlier`, moved from the wall clock onto the controller's: `started` is the run's
    start on both), on one time axis from the first controller's start; `taken_over` adds the
    epoch this controller adopted (None: it started the job)."""
    started_s, started_wall = started
    before, adopted = taken_over
    earlier = before.earlier if before is not None else ()
    moved = [
        dataclasses.replace(r, at_s=started_s + (r.at_s - started_wall))
        for segment in earlier
        for r in segment.steps
    ]
    first_s = started_s + min((s.started_wall_s - started_wall for s in earlier), default=0.0)
    this = "this controller: " + (f"adopted epoch {adopted}" if adopted else "started the job")
    if controller.steps:
        this += f", saw steps {controller.steps[0].step}-{controller.steps[-1].step} committed"
    return run_report.History(
        job=settings.name,
        global_batch_size=settings.training.global_batch_size,
        final=controller.status,
        steps=(*[r for r in moved if r.at_s < started_s], *controller.steps),
        recoveries=controller.recoveries,
        started_s=min(first_s, started_s),
        finished_s=finished_s,
        interrupted_by=interrupted_by.name if interrupted_by else None,
        controllers=(*(s.describe() for s in earlier), this) if earlier else (),
        adopted_at_s=started_s if adopted else None,
        lost=before.lost_line() if before is not None else None,
        snapshot_every=settings.training.snapshot_interval_steps,
    )


async def _drive(
    controller: controllers.Controller,
    inject: Inject | None,
    gave_up: Callable[[], Awaitable[str]] | None = None,
) -> None:
    """The controller's run, with the injector watching its status alongside, and the job
    failed once the backend gives up on a worker."""
    beside: list[asyncio.Future[None]] = []
    if inject is not None:
        beside.append(asyncio.ensure_future(inject(lambda: controller.status)))
    if gave_up is not None:
        beside.append(asyncio.ensure_future(_fail_on(controller, gave_up)))
    try:
        await controller.run()
    finally:
        for task in beside:
            task.cancel()
        for task in beside:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _fail_on(
    controller: controllers.Controller, gave_up: Callable[[], Awaitable[str]]
) -> None:
    controller.fail(GAVE_UP_REASON, await gave_up())
