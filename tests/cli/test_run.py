"""`planaria run`'s composition, report, progress rendering and bad input (planaria.cli.run,
run_report, run_timeline, progress).

Covers: the report written from a synthetic history with two failures (metrics CSV/JSON rows
and times relative to the start, recoveries.json, summary.md's table and goodput against the
fault-free rate, a timeline PNG that is a real, non-trivial image); a history without
recoveries or full-strength steps; the report of a real controller run through two failures
(the controller's in-memory cluster, simulated time; its reasons' eq. 8 estimates labelled,
the measured rate beside them); `execute` running a job with an injector
beside it, then stopping the backend and writing the report; a real SIGINT during `execute`
(the run's interrupt handlers on this loop) cancelling the job, stopping the backend and writing
a report whose first line says it was interrupted, while a signal after the job ended leaves
its outcome; the summary's first line naming the outcome; progress that outlives its terminal
(failed writes end the rendering, not the run); plain progress lines (step lines
throttled, a line per phase change and per recovery) and the live panel rendered to text; bad
job files and options exit 2 with one line naming the field path, before any worker starts;
the demo job file is valid; every `planaria run` option is documented in docs/running.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import dataclasses
import io
import json
import os
import re
import signal
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from planaria.cli import main, progress, run, run_interrupts, run_report
from planaria.contract import plan as plans
from planaria.control import clock as clocks
from planaria.control import status as statuses
from planaria.spec import job_file
from planaria.wire import messages
from tests.control import fakes, scenarios

ROOT = Path(__file__).resolve().parents[2]
START = 1000.0  # the controller's clock at the start of the run


def _status(
    phase: statuses.Phase, step: int, live: int, recoveries: tuple[statuses.Recovery, ...] = ()
) -> statuses.JobStatus:
    return statuses.JobStatus(
        phase=phase,
        conditions=(),
        epoch=1 + len(recoveries),
        step=step,
        loss=None if step == 0 else 5.0 / (1 + step / 20),
        samples_per_s=40.0 * live / 8,
        live_workers=live,
        total_workers=8,
        plan="[2,2,2,2] initial" if live == 8 else "[2,2,2,1] dynamic",
        last_recovery=recoveries[-1] if recoveries else None,
        recoveries=len(recoveries),
        message="",
    )


def _recovery(at_s: float, worker: int, epoch: int, lost: int) -> statuses.Recovery:
    return statuses.Recovery(
        started_s=START + at_s,
        failed=(plans.WorkerId(worker),),
        epoch=epoch,
        tier=messages.RecoveryTier.LIVE_REPLICA,
        kind=statuses.MoveKind.DYNAMIC,
        reason="re-planning beats rerouting | by 3 s over the next hour",
        detect_s=0.3,
        stop_s=0.4,
        plan_s=0.05,
        regroup_s=0.6,
        transfer_s=0.2,
        resume_s=1.1,
        total_s=2.25,
        lost_steps=lost,
        transferred_bytes=1_500_000,
    )


def _history(recoveries: bool = True, full_strength: bool = True) -> run_report.History:
    records, t = [], 5.0
    failures = {40: 7, 80: 6} if recoveries else {}
    live = 8 if full_strength else 7
    for step in range(1, 121):
        if step in failures:
            live -= 1
            t += 2.5
        t += 0.8 * 8 / live
        loss = 5.0 / (1 + step / 20)
        records.append(
            statuses.StepRecord(
                at_s=START + t,
                step=step,
                loss=loss,
                samples_per_s=32 / (0.8 * 8 / live),
                live_workers=live,
                epoch=1 + sum(1 for s in failures if s <= step),
            )
        )
    made = (_recovery(38.0, 3, 2, 1), _recovery(75.0, 5, 3, 0)) if recoveries else ()
    return run_report.History(
        job="tiny-job",
        global_batch_size=32,
        final=_status(statuses.Phase.SUCCEEDED, 120, live, made),
        steps=tuple(records),
        recoveries=made,
        started_s=START,
        finished_s=START + t + 1.0,
    )


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_the_report_holds_metrics_recoveries_summary_and_a_timeline(tmp_path: Path) -> None:
    history = _history()
    paths = run_report.write_report(history, tmp_path / "report")
    names = sorted(p.name for p in paths)
    assert names == ["metrics.csv", "metrics.json", "recoveries.json", "summary.md", "timeline.png"]
    out = tmp_path / "report"
    with (out / "metrics.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 120 and tuple(rows[0]) == run_report.COLUMNS
    assert float(rows[0]["time_s"]) == pytest.approx(5.8)
    as_json = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert [r["step"] for r in as_json] == list(range(1, 121))
    assert {r["live_workers"] for r in as_json} == {8, 7, 6}
    recoveries = json.loads((out / "recoveries.json").read_text(encoding="utf-8"))
    assert [r["failed"] for r in recoveries] == [[3], [5]]
    assert recoveries[0]["started_s"] == pytest.approx(38.0)
    assert recoveries[0]["tier"] == "live_replica" and recoveries[0]["total_s"] == 2.25


def test_the_summary_tabulates_recoveries_and_goodput(tmp_path: Path) -> None:
    history = _history()
    text = run_report.summary(history)
    assert "**Succeeded** at step 120" in text
    table = [
        line for line in text.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")
    ]
    assert len(table) == 2
    assert (
        "| 38.0 | 3 | dynamic | live_replica | 0.30 | 0.40 | 0.05 | 0.60 | 0.20 | 1.10 | 2.25 | 1 "
        "| 1.50 |" in table[0]
    )
    assert (
        "re-planning beats rerouting / by 3 s" in table[0]
    )  # a | in a reason would split the cell
    good = run_report.goodput(history)
    assert good.fault_free_samples_per_s == pytest.approx(40.0)
    assert good.useful_samples == 120 * 32
    assert good.ratio is not None and 0.5 < good.ratio < 1.0
    assert f"**{good.ratio:.0%}**" in text


def test_a_run_without_failures_or_full_strength_says_so() -> None:
    history = _history(recoveries=False, full_strength=False)
    text = run_report.summary(history)
    assert "No failures: the job ran in one epoch." in text
    assert "fault-free: none measured" in text
    assert run_report.goodput(history).ratio is None


def test_the_timeline_is_a_real_picture(tmp_path: Path) -> None:
    path = run_report.write_timeline(_history(), tmp_path / "timeline.png")
    width, height = _png_size(path)
    assert width >= 1000 and height >= 700
    assert path.stat().st_size > 40_000  # three panels of lines and bands, not a blank canvas
    empty = run_report.write_timeline(_history(recoveries=False), tmp_path / "plain.png")
    assert path.stat().st_size != empty.stat().st_size


def test_plain_progress_prints_phase_changes_recoveries_and_throttled_steps() -> None:
    stream = io.StringIO()
    sink = progress.Progress(steps=120, live=False, stream=stream, every_s=3600.0)
    first = _recovery(38.0, 3, 2, 1)
    statuses_seen = [
        _status(statuses.Phase.PENDING, 0, 8),
        _status(statuses.Phase.RUNNING, 1, 8),
        _status(statuses.Phase.RUNNING, 2, 8),  # throttled: same phase, too soon
        _status(statuses.Phase.RUNNING, 41, 7, (first,)),
        _status(statuses.Phase.SUCCEEDED, 120, 7, (first,)),
    ]
    for status in statuses_seen:
        asyncio.run(sink.publish(status))
    sink.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5, lines
    assert "Pending" in lines[0] and "step 0/120" in lines[0]
    assert "step 1/120" in lines[1] and "workers 8/8" in lines[1] and "loss 4.762" in lines[1]
    assert lines[2].startswith("recovery 1: worker 3 lost -> dynamic, tier live_replica, 2.25 s")
    assert "1 steps lost" in lines[2] and "re-planning beats" in lines[2]
    assert "step 41/120" in lines[3] and "plan [2,2,2,1] dynamic" in lines[3]
    assert "Succeeded" in lines[4]


def test_the_live_panel_shows_step_plan_and_last_recovery() -> None:
    status = _status(statuses.Phase.RUNNING, 41, 7, (_recovery(38.0, 3, 2, 1),))
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(progress.panel(status, 120, 61.0))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "planaria run: Running" in text and "41 / 120" in text
    assert "[2,2,2,1] dynamic" in text and "7 / 8" in text
    assert "recovery 1: worker 3 lost" in text


def _run_cli(tmp_path: Path, text: str, *extra: str) -> tuple[int, str]:
    job = tmp_path / "job.yaml"
    job.write_text(text, encoding="utf-8")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main.main(["run", str(job), "--out", str(tmp_path / "out"), *extra])
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("text", "extra", "expected"),
    [
        ("workers: 0\n", (), r"job.yaml: workers: must be >= 1"),
        (
            "apiVersion: planaria.dev/v1alpha1\nkind: ResilientJob\nmetadata: {name: t}\n"
            "spec: {globalBatchSize: 30}\n",
            (),
            r"job.yaml: spec.globalBatchSize: 30 is not a multiple of microBatchSize 4",
        ),
        ("failures: [{step: 5, worker: 12}]\n", (), r"job.yaml: failures.0.worker: worker 12"),
        ("steps: 10\n", ("--workers", "0"), r"job.yaml: workers: must be >= 1"),
        ("steps: 10\n", ("--metrics-port", "70000"), r"--metrics-port 70000: give a port"),
    ],
    ids=[
        "bad field",
        "cross-field rule in a document",
        "failure of a missing worker",
        "bad override",
        "bad metrics port",
    ],
)
def test_bad_job_files_and_options_exit_2_with_the_field_path(
    tmp_path: Path, text: str, extra: tuple[str, ...], expected: str
) -> None:
    code, err = _run_cli(tmp_path, text, *extra)
    assert code == 2
    assert err.startswith("planaria: error: ") and expected in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_missing_job_file_exits_2(tmp_path: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main.main(["run", str(tmp_path / "absent.yaml")])
    assert code == 2 and "absent.yaml: no such file" in err.getvalue()


def test_the_demo_job_is_a_valid_resilient_job_with_two_failures() -> None:
    parsed = job_file.load_job(ROOT / "examples" / "tiny-job.yaml")
    assert parsed.document and parsed.name == "tiny-job"
    assert parsed.spec.model == "tiny" and parsed.spec.workers == 8
    assert len(parsed.spec.failures) == 2
    assert (ROOT / "scripts" / "demo.sh").stat().st_mode & 0o111


@pytest.mark.asyncio
async def test_a_report_from_a_controller_run_through_two_failures(tmp_path: Path) -> None:
    run = scenarios.Run(scenarios.job(steps=40))
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: run.step() >= 25)
    # a worker the running plan uses: the first recovery may leave one live worker idle
    assert run.controller.plan is not None
    second = max(int(w) for w in run.controller.plan.workers)
    run.cluster.kill(second)
    final = await run.finish()
    history = run_report.History(
        job="test",
        global_batch_size=16,
        final=final,
        steps=run.controller.steps,
        recoveries=run.controller.recoveries,
        started_s=0.0,
        finished_s=run.clock.monotonic(),
    )
    run_report.write_report(history, tmp_path)
    recoveries = json.loads((tmp_path / "recoveries.json").read_text(encoding="utf-8"))
    assert [r["failed"] for r in recoveries] == [[3], [second]]
    assert all(r["total_s"] > 0 for r in recoveries)
    rows = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    assert rows[-1]["step"] == 40 and {r["live_workers"] for r in rows} >= {8, 6}
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    rows_md = [line for line in summary.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert "**Succeeded** at step 40" in summary and len(rows_md) == 2
    assert rows_md[0].startswith("| 1 | 1.0 | 3 | ")
    # the controller's own reasons: the eq. 8 figure labelled, the epoch's measured rate beside
    estimate = re.compile(
        r"samples/s estimated by Odyssey eq\. 8 for one device per worker "
        r"\(measured [0-9.]+ samples/s\)"
    )
    assert all(estimate.search(row) for row in rows_md)
    assert (tmp_path / "timeline.png").stat().st_size > 30_000


def test_every_run_option_is_documented() -> None:
    docs = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    parser = main.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = [o for a in subparsers.choices["run"]._actions for o in a.option_strings]
    assert "--fail" in options
    for option in options:
        if option not in ("-h", "--help"):
            assert f"`{option}" in docs or f"{option} " in docs, option


@pytest.mark.asyncio
async def test_execute_runs_the_job_with_the_injector_and_writes_the_report(
    tmp_path: Path,
) -> None:
    clock = clocks.RealClock()
    cluster = fakes.FakeCluster(clock)
    stream = io.StringIO()
    sink = progress.Progress(steps=30, live=False, stream=stream, every_s=0.0)

    async def inject(status_of: Callable[[], statuses.JobStatus]) -> None:
        while status_of().step < 10:
            await clock.sleep(0.05)
        cluster.kill(3)
        await asyncio.Event().wait()  # an injector runs until cancelled

    task = asyncio.ensure_future(
        run.execute(
            scenarios.job(steps=30),
            cluster,
            clock=clock,
            sink=sink,
            out=tmp_path / "out",
            inject=inject,
            executor=scenarios.INLINE,
        )
    )
    while not task.done():
        assert clock.monotonic() < 120.0, "the job did not end"
        await scenarios.advance(0.05)
    assert task.result().phase is statuses.Phase.SUCCEEDED and cluster.shut
    recoveries = json.loads((tmp_path / "out" / "recoveries.json").read_text(encoding="utf-8"))
    assert [r["failed"] for r in recoveries] == [[3]]
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(run_report.REPORT_FILES)
    assert "recovery 1: worker 3 lost" in stream.getvalue()
    assert "Succeeded" in stream.getvalue().splitlines()[-1]


@pytest.mark.asyncio
async def test_execute_fails_the_job_with_the_cause_once_the_backend_gives_up_on_a_worker(
    tmp_path: Path,
) -> None:
    """`planaria run` hands `execute` the local backend's `gave_up`: once it answers (a worker
    that kept crashing), the job ends Failed with that one line, in the status, the Failed
    condition's reason and the summary's first line; the run stops instead of waiting."""
    clock = clocks.RealClock()
    cluster = fakes.FakeCluster(clock)
    sink = scenarios.Sink()
    cause = "worker 3's agent process 41 exited with exit code 3 after 5 restart(s)"
    started = asyncio.Event()

    async def gave_up() -> str:
        while not sink.published or sink.published[-1].step < 10:
            await clock.sleep(0.05)
        started.set()
        return cause

    task = asyncio.ensure_future(
        run.execute(
            scenarios.job(steps=60),
            cluster,
            clock=clock,
            sink=sink,
            out=tmp_path / "out",
            gave_up=gave_up,
            executor=scenarios.INLINE,
        )
    )
    while not task.done():
        assert clock.monotonic() < 120.0, "the job did not end"
        await scenarios.advance(0.05)
    final = task.result()
    assert started.is_set() and final.phase is statuses.Phase.FAILED
    assert final.message == cause and 10 <= final.step < 60 and cluster.shut
    failed = {c.type: c for c in final.conditions}["Failed"]
    assert (failed.status, failed.reason) == ("True", run.GAVE_UP_REASON)
    summary = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert summary.splitlines()[0].endswith(f"Failed at step {final.step}: {cause}")


def test_the_summary_says_how_often_snapshots_were_taken_against_the_interval() -> None:
    history = _history()
    assert "Host-memory snapshots" not in run_report.summary(history)  # none reported
    kept = dataclasses.replace(
        history,
        final=dataclasses.replace(history.final, snapshot_interval_steps=1.0),
        snapshot_every=1,
    )
    assert "Host-memory snapshots: every 1 step(s) asked, every 1 achieved in the last epoch." in (
        run_report.summary(kept)
    )
    stretched = dataclasses.replace(
        kept, final=dataclasses.replace(history.final, snapshot_interval_steps=2.5)
    )
    assert "every 2.5 achieved in the last epoch (the writers could not keep up" in (
        run_report.summary(stretched)
    )
    off = dataclasses.replace(stretched, snapshot_every=0)
    assert "Host-memory snapshots" not in run_report.summary(off)


def test_the_summary_says_in_its_first_line_how_the_run_ended() -> None:
    history = _history()
    assert run_report.summary(history).splitlines()[0] == (
        "# Run of job `tiny-job`: Succeeded at step 120"
    )
    stopped = dataclasses.replace(
        history, final=_status(statuses.Phase.RUNNING, 3, 8), interrupted_by="SIGTERM"
    )
    lines = run_report.summary(stopped).splitlines()
    assert lines[0] == "# Run of job `tiny-job`: Interrupted by SIGTERM at step 3"
    assert lines[2].startswith("**Interrupted by SIGTERM** at step 3 after ")
    assert lines[3].startswith("Stopped by SIGTERM while Running: the job did not finish")


async def _execute_until(
    tmp_path: Path, signal_at_step: int | None, steps: int = 30
) -> tuple[statuses.JobStatus, run_interrupts.Interrupts, fakes.FakeCluster]:
    """`execute` on the fake cluster with the run's interrupt handlers, SIGINT sent to this
    process once the job committed `signal_at_step` (never when None)."""
    clock, sink = clocks.RealClock(), scenarios.Sink()
    cluster = fakes.FakeCluster(clock)
    interrupts = run_interrupts.Interrupts()
    with interrupts.installed():
        task = asyncio.ensure_future(
            run.execute(
                scenarios.job(steps=steps),
                cluster,
                clock=clock,
                sink=sink,
                out=tmp_path / "out",
                interrupts=interrupts,
                executor=scenarios.INLINE,
            )
        )
        sent = False
        while not task.done():
            assert clock.monotonic() < 120.0, "the job did not end"
            step = sink.published[-1].step if sink.published else 0
            if signal_at_step is not None and not sent and step >= signal_at_step:
                os.kill(os.getpid(), signal.SIGINT)  # handled on this loop, not KeyboardInterrupt
                sent = True
            await scenarios.advance(0.05)
    return task.result(), interrupts, cluster


@pytest.mark.asyncio
async def test_a_signal_during_execute_stops_the_job_and_the_report_says_so(
    tmp_path: Path,
) -> None:
    final, interrupts, cluster = await _execute_until(tmp_path, signal_at_step=5)
    assert final.phase is statuses.Phase.RUNNING and 5 <= final.step < 30
    assert interrupts.interrupted(final.phase) is signal.SIGINT and cluster.shut
    assert run_interrupts.exit_status(signal.SIGINT) == 130
    first = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8").splitlines()[0]
    assert first == f"# Run of job `test`: Interrupted by SIGINT at step {final.step}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers removed


@pytest.mark.asyncio
async def test_a_job_that_ends_before_any_signal_keeps_its_outcome(tmp_path: Path) -> None:
    final, interrupts, _ = await _execute_until(tmp_path, signal_at_step=None, steps=8)
    assert final.phase is statuses.Phase.SUCCEEDED and interrupts.signum is None
    interrupts.signum = signal.SIGTERM  # as if one came while the agents were being stopped
    assert interrupts.interrupted(final.phase) is None


class _HungUp(io.StringIO):
    """A terminal closed under the run: every write fails as a hung-up tty's does (EIO)."""

    def write(self, text: str) -> int:
        raise OSError(5, "Input/output error")


@pytest.mark.parametrize("live", [False, True], ids=["plain lines", "the live panel"])
def test_a_terminal_that_went_away_ends_the_progress_not_the_job(live: bool) -> None:
    sink = progress.Progress(steps=30, live=live, stream=_HungUp(), every_s=0.0)
    for step in (1, 2):
        asyncio.run(sink.publish(_status(statuses.Phase.RUNNING, step, 8)))
    sink.close()
