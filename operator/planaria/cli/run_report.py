"""The report of a `planaria run`: metrics, recoveries, a summary table and a timeline figure.

    DIR/metrics.csv, metrics.json   one row per committed step (time since start, step, loss,
                                    samples/s, live workers, epoch)
    DIR/recoveries.json             one object per recovery (`control.status.Recovery`)
    DIR/summary.md                  outcome, recoveries table, goodput vs the fault-free estimate
    DIR/timeline.png                throughput, loss and live workers over time, failures marked

Everything is drawn from the controller's history (`Controller.steps`, `.recoveries`, the final
status), with the steps of earlier controllers of the same run (`planaria.cli.run_log`) before
its own: a pure function of a `History`, so the report of any run, real or synthetic, is tested
without workers. Times in the files are seconds since the run started (`History.started_s` on
the controller's clock). matplotlib (Agg) is imported inside `write_timeline`, so importing
this module stays cheap.

Goodput (the report's one number) is measured over the steps actually trained, first recorded
step to last, against the rate measured at full strength over the same run
(`planaria.cli.run_goodput` defines both); the ratio is the share of fault-free throughput the
failures left. Each recovery's reason quotes the planner's Odyssey eq. 8 estimate: the report
labels it an estimate for one device per worker and puts the epoch's measured rate beside it.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planaria.cli import run_goodput
from planaria.control import status as statuses

COLUMNS = ("time_s", "step", "loss", "samples_per_s", "live_workers", "epoch")
REPORT_FILES = ("summary.md", "timeline.png", "metrics.csv", "metrics.json", "recoveries.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """What a run leaves behind: the job, its final status, the controller's step and recovery
    records, the run's start and end on the controller's clock, and the name of the signal that
    ended it before the job did (None when the job ended on its own)."""

    job: str
    global_batch_size: int
    final: statuses.JobStatus
    steps: tuple[statuses.StepRecord, ...]
    recoveries: tuple[statuses.Recovery, ...]
    started_s: float
    finished_s: float
    interrupted_by: str | None = None
    # Earlier controllers of the run (planaria.cli.run_log): one line each, this one's last;
    # when this controller adopted, the moment it did (on its clock), and when it started the
    # job over, what that lost.
    controllers: tuple[str, ...] = ()
    adopted_at_s: float | None = None
    lost: str | None = None
    snapshot_every: int = 0  # the job's snapshot interval in steps (0: no periodic snapshots)

    @property
    def outcome(self) -> str:
        """`Succeeded`, `Failed`, or `Interrupted by SIGTERM` (the phase is then the one the
        job was stopped in)."""
        if self.interrupted_by is None:
            return self.final.phase.value
        return f"Interrupted by {self.interrupted_by}"

    @property
    def ending(self) -> str:
        """How the run ended, as the summary's first line and the console's last say it."""
        return ending(self.outcome, self.final)


def ending(outcome: str, final: statuses.JobStatus) -> str:
    """`outcome` at the final step; a failed job's with its cause (the controller's message,
    which names the workers and what they latched)."""
    said = f"{outcome} at step {final.step}"
    if outcome == statuses.Phase.FAILED.value and final.message:
        said += f": {final.message}"
    return said


Goodput = run_goodput.Goodput


def goodput(history: History) -> run_goodput.Goodput:
    """The run's goodput, measured over the steps it trained (`run_goodput.measure`)."""
    return run_goodput.measure(
        history.steps,
        global_batch_size=history.global_batch_size,
        total_workers=history.final.total_workers,
        final_step=history.final.step,
        started_s=history.started_s,
        finished_s=history.finished_s,
    )


def measured_after(history: History, recovery: statuses.Recovery) -> float | None:
    """Samples/s measured over the steps of the epoch `recovery` opened (None: under two)."""
    return run_goodput.epoch_rate(history.steps, recovery.epoch, history.global_batch_size)


def final_workers(history: History) -> int:
    """Workers training at the last committed step (the final status, written after the
    workers are stopped, says 0)."""
    return history.steps[-1].live_workers if history.steps else history.final.live_workers


def write_report(history: History, out: Path) -> tuple[Path, ...]:
    """Write the report files into `out` (created if needed); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows = metric_rows(history)
    paths = (
        _write_csv(out / "metrics.csv", rows),
        _write_json(out / "metrics.json", rows),
        _write_json(out / "recoveries.json", recovery_rows(history)),
        _write_text(out / "summary.md", summary(history)),
        write_timeline(history, out / "timeline.png"),
    )
    return paths


def metric_rows(history: History) -> list[dict[str, Any]]:
    """One dict per step record, times relative to the start."""
    return [
        {
            "time_s": round(r.at_s - history.started_s, 4),
            "step": r.step,
            "loss": r.loss,
            "samples_per_s": round(r.samples_per_s, 4),
            "live_workers": r.live_workers,
            "epoch": r.epoch,
        }
        for r in history.steps
    ]


def recovery_rows(history: History) -> list[dict[str, Any]]:
    """One dict per recovery, its start relative to the run's start."""
    rows = []
    for recovery in history.recoveries:
        row = dataclasses.asdict(recovery)
        row["started_s"] = round(recovery.started_s - history.started_s, 4)
        row["failed"] = list(recovery.failed)
        row["tier"] = recovery.tier.value
        row["estimated_samples_per_s"] = run_goodput.estimated_samples_per_s(recovery.reason)
        row["measured_samples_per_s"] = measured_after(history, recovery)
        rows.append(row)
    return rows


def summary(history: History) -> str:
    """summary.md: outcome (in the first line too), recoveries, goodput."""
    final, good = history.final, goodput(history)
    lines = [
        f"# Run of job `{history.job}`: {history.ending}",
        "",
        f"**{history.outcome}** at step {final.step} after {good.wall_s:.1f} s "
        f"(epoch {final.epoch}, plan `{final.plan or '-'}`, "
        f"{final_workers(history)} of {final.total_workers} workers training at the end).",
    ]
    if history.interrupted_by is not None:
        lines.append(
            f"Stopped by {history.interrupted_by} while {final.phase.value}: the job did not "
            "finish; its agents were stopped and its snapshot stores removed."
        )
    if final.message:
        lines.append(f"Last message: {final.message}")
    if history.lost:
        lines.append(f"This run {history.lost}.")
    if (snapshots := snapshot_line(history)) is not None:
        lines.append(snapshots)
    if history.controllers:
        lines += ["", "## Controllers", ""]
        lines += [f"{i}. {line}" for i, line in enumerate(history.controllers, start=1)]
        lines.append(
            "\nThe steps and times above and below cover every controller of the run, on one "
            "time axis from the first one's start (RUN/progress.jsonl)."
        )
    lines += ["", "## Recoveries", "", *_recovery_table(history), "", "## Goodput", ""]
    lines += _goodput_lines(good, history)
    return "\n".join(lines) + "\n"


def snapshot_line(history: History) -> str | None:
    """How often host-memory snapshots were taken in the last epoch against the job's
    interval (None without periodic snapshots or before two were begun)."""
    achieved, every = history.final.snapshot_interval_steps, history.snapshot_every
    if every <= 0 or achieved is None:
        return None
    line = (
        f"Host-memory snapshots: every {every} step(s) asked, every {achieved:.3g} achieved in "
        "the last epoch"
    )
    if achieved > every * 1.001:
        return line + " (the writers could not keep up: training skipped snapshots, not waited)."
    return line + "."


_HEADER = (
    "| # | at s | failed | kind | tier | detect s | stop s | plan s | regroup s | transfer s "
    "| resume s "
    "| total s | lost steps | moved MB | measured samples/s | reason |"
)
_RATES_NOTE = (
    "*measured samples/s*: over the steps of the epoch the recovery opened, first to last. "
    "A reason's Odyssey eq. 8 figure is the planner's estimate from the profile, which times one "
    "worker alone on its device; where workers share devices (local runs on a few CPU cores) "
    "the measured rate is lower."
)


def _recovery_table(history: History) -> list[str]:
    if not history.recoveries:
        return ["No failures: the job ran in one epoch."]
    rows = [_HEADER, "|" + "---|" * 16]
    for i, r in enumerate(history.recoveries, start=1):
        failed = ",".join(str(w) for w in r.failed) or "-"
        seconds = (r.detect_s, r.stop_s, r.plan_s, r.regroup_s, r.transfer_s, r.resume_s, r.total_s)
        cells = [str(i), f"{r.started_s - history.started_s:.1f}", failed, r.kind, r.tier.value]
        cells += [f"{s:.2f}" for s in seconds]
        measured = measured_after(history, r)
        cells += [str(r.lost_steps), f"{r.transferred_bytes / 1e6:.2f}", _rate(measured)]
        cells.append(_cell(run_goodput.labelled_reason(r.reason, measured)))
        rows.append("| " + " | ".join(cells) + " |")
    return [*rows, "", _RATES_NOTE]


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ") or "-"


def _goodput_lines(good: run_goodput.Goodput, history: History) -> list[str]:
    lines = [
        f"- useful samples: {good.useful_samples} ({history.final.step} steps x "
        f"{history.global_batch_size})",
        f"- wall time: {good.wall_s:.1f} s (start-up {good.startup_s:.1f} s, training "
        f"{good.training_s:.1f} s, shutdown {good.shutdown_s:.1f} s); over all of it "
        f"{good.samples_per_s:.1f} samples/s",
    ]
    if good.training_samples_per_s is None:
        return [*lines, "- goodput: none (fewer than two steps recorded)"]
    lost = sum(r.lost_steps for r in history.recoveries)
    lines.append(
        f"- goodput: {good.training_samples_per_s:.1f} samples/s over the steps trained, "
        f"step {good.first_step} to {good.last_step} in {good.training_s:.1f} s (failures and "
        f"recoveries inside counted; {lost} committed steps trained again)"
    )
    if good.fault_free_samples_per_s is None or good.ratio is None:
        return [*lines, "- fault-free: none measured (no two consecutive steps at full strength)"]
    lines += [
        f"- fault-free: {good.fault_free_samples_per_s:.1f} samples/s measured over "
        f"{good.fault_free_s:.1f} s of steps at full strength",
        f"- goodput / fault-free: **{good.ratio:.0%}**",
    ]
    if good.ratio > 1:
        lines.append(f"  ({_ABOVE_FAULT_FREE})")
    return lines


# Measured on the 2-core machine: 8 workers at 152 samples/s, the same steps on 6 at 194.
_ABOVE_FAULT_FREE = (
    "above 100%: steps ran faster after workers were lost than at full strength, as when "
    "workers share CPU cores and fewer processes contend less, or the first steps warmed up"
)


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return path


def _write_json(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(list(rows), indent=1) + "\n", encoding="utf-8")
    return path


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def write_timeline(history: History, path: Path) -> Path:
    """timeline.png (see planaria.cli.run_timeline)."""
    from planaria.cli import run_timeline  # matplotlib is heavy: only when a report is written

    run_timeline.draw(history, path)
    return path
