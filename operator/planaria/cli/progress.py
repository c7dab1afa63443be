"""Live progress of a `planaria run` in the terminal: a `ports.StatusSink` over the job status.

Two renderings of the same `control.status.JobStatus`:
- live (a terminal, without --no-progress): a rich panel redrawn in place with the phase, a step
  bar, loss, samples/s, workers, the plan and the recoveries so far, the last one broken down;
- plain (not a terminal, or --no-progress): one line when the phase changes (and the
  controller's message under it while the job is Pending or Profiling: what it waits for; when
  it is Suspended or Failed: why), a line per
  recovery, and a step line at most every `every_s` seconds, so a log stays readable.

`line`, `recovery_line` and `panel` are pure, so both renderings are tested without a terminal.
A terminal that went away (a write fails: EIO after SIGHUP closed it, EPIPE) ends the rendering,
never the job: the run goes on to stop its agents and write its report.
"""

from __future__ import annotations

import time
from typing import IO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table

from planaria.control import status as statuses

# Phases whose plain line is followed by the controller's message: what the job waits for
# before it trains ("starting workers", "profiling tiny", "opening epoch 1: [5,3] initial"), or
# what stopped the training.
_EXPLAINED = (
    statuses.Phase.PENDING,
    statuses.Phase.PROFILING,
    statuses.Phase.SUSPENDED,
    statuses.Phase.FAILED,
)


def line(status: statuses.JobStatus, steps: int, elapsed_s: float) -> str:
    """One plain progress line."""
    loss = "-" if status.loss is None else f"{status.loss:.3f}"
    return (
        f"[{elapsed_s:7.1f}s] {status.phase.value:<10} step {status.step}/{steps}  "
        f"loss {loss}  {status.samples_per_s:.1f} samples/s  "
        f"workers {status.live_workers}/{status.total_workers}  plan {status.plan or '-'}  "
        f"recoveries {status.recoveries}"
    )


def recovery_line(recovery: statuses.Recovery, number: int) -> str:
    """One plain line per finished recovery: who, what, tier, seconds broken down, reason."""
    who = (
        f"worker {','.join(str(w) for w in recovery.failed)} lost" if recovery.failed else "planned"
    )
    return (
        f"recovery {number}: {who} -> {recovery.kind}, tier {recovery.tier.value}, "
        f"{recovery.total_s:.2f} s (detect {recovery.detect_s:.2f}, stop {recovery.stop_s:.2f}, "
        f"plan {recovery.plan_s:.2f}, "
        f"regroup {recovery.regroup_s:.2f}, transfer {recovery.transfer_s:.2f}, resume "
        f"{recovery.resume_s:.2f}), {recovery.lost_steps} steps lost, "
        f"{recovery.transferred_bytes / 1e6:.2f} MB moved; {recovery.reason}"
    )


def panel(status: statuses.JobStatus, steps: int, elapsed_s: float) -> RenderableType:
    """The live panel."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    loss = "-" if status.loss is None else f"{status.loss:.4f}"
    grid.add_row("step", f"{status.step} / {steps}")
    grid.add_row("loss", loss)
    grid.add_row("throughput", f"{status.samples_per_s:.1f} samples/s")
    grid.add_row(
        "workers", f"{status.live_workers} / {status.total_workers} (epoch {status.epoch})"
    )
    grid.add_row("plan", status.plan or "-")
    grid.add_row("recoveries", str(status.recoveries))
    if status.last_recovery is not None:
        grid.add_row("last", recovery_line(status.last_recovery, status.recoveries))
    if status.message:
        grid.add_row("", status.message)
    bar = ProgressBar(total=max(steps, 1), completed=min(status.step, steps), width=60)
    title = f"planaria run: {status.phase.value}  ({elapsed_s:.0f} s)"
    return Panel(Group(bar, grid), title=title, box=box.ROUNDED, expand=False)


class Progress:
    """A StatusSink that renders progress (module docstring); `close` ends the live panel."""

    def __init__(
        self, *, steps: int, live: bool, stream: IO[str] | None = None, every_s: float = 2.0
    ) -> None:
        self._steps = steps
        self._every_s = every_s
        self._started = time.monotonic()
        self._console = Console(file=stream, highlight=False, soft_wrap=True)
        self._live = Live(console=self._console, auto_refresh=False) if live else None
        self._phase: statuses.Phase | None = None
        self._recoveries = 0
        self._printed_at = float("-inf")
        self._gone = False  # the terminal went away: nothing more is drawn
        if self._live is not None:
            self._live.start()

    async def publish(self, status: statuses.JobStatus) -> None:
        if self._gone:
            return
        try:
            self._render(status)
        except OSError:
            self._gone = True

    def _render(self, status: statuses.JobStatus) -> None:
        elapsed = time.monotonic() - self._started
        recovered = status.recoveries > self._recoveries and status.last_recovery is not None
        if recovered and status.last_recovery is not None:
            # Above the live panel too: the history of recoveries stays on screen.
            self._echo(recovery_line(status.last_recovery, status.recoveries))
            self._recoveries = status.recoveries
        if self._live is not None:
            self._live.update(panel(status, self._steps, elapsed), refresh=True)
            return
        self._print_plain(status, elapsed, recovered)

    def _print_plain(self, status: statuses.JobStatus, elapsed: float, recovered: bool) -> None:
        entered = status.phase is not self._phase
        if recovered or entered or elapsed - self._printed_at >= self._every_s:
            self._echo(line(status, self._steps, elapsed))
            if entered and status.phase in _EXPLAINED and status.message:
                self._echo(f"  {status.message}")
            self._printed_at = elapsed
            self._phase = status.phase

    def _echo(self, text: str) -> None:
        self._console.print(text, markup=False)

    def close(self) -> None:
        if self._live is not None:
            try:
                self._live.stop()
            except OSError:
                self._gone = True
