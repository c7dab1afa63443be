"""timeline.png of a `planaria run`: throughput, loss, workers training; recoveries marked.

Three panels share the time axis (seconds since the run started). Every recovery is a shaded
band from the death (or the planned switch) to the first step of its new epoch, red for
failures and green for planned moves (scale-up, preemption), labelled with the failed workers,
the tier the costliest worker needed, and the seconds it took. Start-up (before the first
recorded step) and shutdown (after the last) are shaded grey: they lie outside the window
goodput is measured over (`planaria.cli.run_goodput`). Uses matplotlib's Agg backend
(no display needed); imported only when a report is written.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from planaria.cli import run_report  # noqa: E402
from planaria.control import status as statuses  # noqa: E402

FAILURE = "#d62728"
PLANNED = "#2ca02c"
LINE = "#1f77b4"
LABEL_ROWS = 3  # recovery labels stack this deep before reusing the top row
SMOOTHING = 5  # steps in the throughput's trailing median


def draw(history: run_report.History, path: Path) -> None:
    """Render the timeline of `history` to `path` (PNG)."""
    figure, axes = plt.subplots(
        3, 1, figsize=(11, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 3, 2]}
    )
    try:
        _plot_series(history, axes)
        rows = _label_rows(history)
        for recovery, row in zip(history.recoveries, rows, strict=True):
            _mark(history, recovery, axes, row)
        # Stacked labels need more headroom above the curve.
        axes[0].set_ylim(0, axes[0].get_ylim()[1] * (1 + 0.3 * max(rows, default=0)))
        _decorate(history, figure, axes)
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)


def _times(history: run_report.History) -> list[float]:
    return [r.at_s - history.started_s for r in history.steps]


def _plot_series(history: run_report.History, axes: Any) -> None:
    times = _times(history)
    # One segment per epoch: a line drawn across a recovery would invent steps that never ran.
    for epoch in sorted({r.epoch for r in history.steps}):
        points = [(t, r) for t, r in zip(times, history.steps, strict=True) if r.epoch == epoch]
        xs = [t for t, _ in points]
        rates = [r.samples_per_s for _, r in points]
        axes[0].plot(xs, rates, color=LINE, alpha=0.35, linewidth=0.8)
        axes[0].plot(xs, _rolling_median(rates, SMOOTHING), color=LINE, linewidth=1.8)
        losses = [(t, r.loss) for t, r in points if r.loss is not None]
        if losses:
            axes[1].plot(*zip(*losses, strict=True), color="#9467bd", linewidth=1.4)
    good = run_report.goodput(history)
    if good.fault_free_samples_per_s:
        axes[0].axhline(
            good.fault_free_samples_per_s,
            color="grey",
            linestyle=":",
            label=f"fault-free {good.fault_free_samples_per_s:.0f} samples/s "
            "(measured at full strength)",
        )
        axes[0].legend(loc="lower left", fontsize=8)
    # Headroom for the recovery labels; a one-step spike (a step timed across a gap in the
    # heartbeats) may leave the panel rather than flatten the rest.
    rates = sorted(r.samples_per_s for r in history.steps) or [1.0]
    typical = rates[int(0.95 * (len(rates) - 1))]
    axes[0].set_ylim(0, max(typical, good.fault_free_samples_per_s or 0.0, 1e-3) * 1.5)
    live = [r.live_workers for r in history.steps]
    if times:
        axes[2].step(times, live, where="post", color="#ff7f0e", linewidth=1.8)
    axes[2].set_ylim(0, history.final.total_workers + 1)


def _rolling_median(values: list[float], window: int) -> list[float]:
    """Trailing median over up to `window` values: per-step rates are noisy on a shared machine
    and a median ignores single-step spikes."""
    return [statistics.median(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _label_rows(history: run_report.History) -> list[int]:
    """A text row per recovery label: the next row down when it starts too close to the
    previous label to sit beside it (labels are about 8% of the axis wide)."""
    width_s = max(history.finished_s - history.started_s, 1e-3)
    rows, last_s, row = [], float("-inf"), 0
    for recovery in history.recoveries:
        start_s = recovery.started_s - history.started_s
        row = (row + 1) % LABEL_ROWS if start_s - last_s < 0.09 * width_s else 0
        rows.append(row)
        last_s = start_s
    return rows


def _mark(history: run_report.History, recovery: statuses.Recovery, axes: Any, row: int) -> None:
    start = recovery.started_s - history.started_s
    end = start + max(recovery.total_s, 0.05)
    color = FAILURE if recovery.failed else PLANNED
    for axis in axes:
        axis.axvspan(start, end, color=color, alpha=0.15, linewidth=0)
        axis.axvline(start, color=color, linestyle="--", linewidth=1.0)
    if recovery.failed:
        who = "w" + ",".join(str(w) for w in recovery.failed)
        label = f"{who} lost\n{recovery.kind}, {recovery.tier.value}\n{recovery.total_s:.1f} s"
    else:
        label = f"{recovery.kind}\n{recovery.tier.value}\n{recovery.total_s:.1f} s"
    axes[0].annotate(
        label,
        xy=(start, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(4, -4 - 34 * row),
        textcoords="offset points",
        va="top",
        fontsize=8,
        color=color,
        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.85, "linewidth": 0},
    )


def _decorate(history: run_report.History, figure: Any, axes: Any) -> None:
    final, good = history.final, run_report.goodput(history)
    trained = ""
    if good.training_samples_per_s is not None:
        trained = f"; goodput {good.training_samples_per_s:.0f} samples/s over the steps trained"
        if good.ratio is not None:
            trained += f" ({good.ratio:.0%} of fault-free)"
    figure.suptitle(
        f"{history.job}: {history.outcome} at step {final.step} in {good.wall_s:.0f} s, "
        f"{len(history.recoveries)} recoveries{trained}",
        fontsize=11,
    )
    if history.steps:
        end_s = good.wall_s - good.shutdown_s
        _outside(axes, 0, good.startup_s, "start-up: agents launch,\nprofile, first rendezvous")
        _outside(axes, end_s, good.wall_s, "shutdown")
    if history.adopted_at_s is not None:
        at = history.adopted_at_s - history.started_s
        for axis in axes:
            axis.axvline(at, color="black", linestyle=":", linewidth=1.2)
        axes[2].annotate(
            "controller\nadopted", xy=(at, 0.15), xycoords=("data", "axes fraction"), fontsize=8
        )
    _labels(axes, good.wall_s)
    figure.tight_layout()


def _outside(axes: Any, start_s: float, end_s: float, label: str) -> None:
    """Shade a stretch outside the training window (start-up, shutdown) and name it."""
    if end_s <= start_s:
        return
    for axis in axes:
        axis.axvspan(start_s, end_s, color="grey", alpha=0.08, linewidth=0)
    axes[2].annotate(
        label,
        xy=((start_s + end_s) / 2, 0.5),
        xycoords=("data", "axes fraction"),
        ha="center",
        va="center",
        fontsize=8,
        color="dimgrey",
    )


def _labels(axes: Any, wall_s: float) -> None:
    axes[0].set_ylabel("samples / s\n(thin: per step, bold: median of 5)")
    axes[1].set_ylabel("loss (nats/byte)")
    axes[2].set_ylabel("workers training")
    axes[2].set_xlabel(
        "seconds since start  (red: failure to first step of the new epoch; green: planned move)"
    )
    for axis in axes:
        axis.grid(True, alpha=0.3)
        axis.set_xlim(left=0, right=max(wall_s, 1e-3))
