"""RUN/progress.jsonl: every controller's committed steps, appended as they happen, so that the
report of a run covers each controller it had and says what a start-over lost.

A controller killed with SIGKILL writes no report; the next `planaria run` of the directory
either adopts its epoch (its agents still run) or starts the job over. Either way the new
controller's report is only as truthful as what it knows of its predecessors: this log is that
knowledge. One JSON object per line, appended and flushed as each happens:

    {"start": {"pid": P, "wall_s": T, "adopted_epoch": E or null}}   a controller began
    {"step": {"wall_s": T, "step": N, "loss": L, "samples_per_s": R, "live_workers": W,
              "epoch": E}}                                           a newer committed step
    {"end": {"wall_s": T, "outcome": "Succeeded", "step": N}}        its report was written

A start without `adopted_epoch` begins a new run; one with it continues the run before it.
`history(out, adopting=...)` reads what came before this controller: the segments of the run it
continues (when adopting) and, when it starts over, what the unfinished run before it had
reached and lost. A torn last line (a controller killed mid-write) is ignored. Times are wall
clock (`time.time()`), the one clock two processes share.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planaria.control import status as statuses

FILE_NAME = "progress.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """One controller's share of a run: who, when it began, whether it adopted an epoch, its
    committed steps (`at_s` on the wall clock) and how it ended (None: no report, it was
    killed)."""

    pid: int
    started_wall_s: float
    adopted_epoch: int | None
    steps: tuple[statuses.StepRecord, ...]
    ended: str | None

    @property
    def last_step(self) -> int:
        """The newest step it saw committed (0: none)."""
        return self.steps[-1].step if self.steps else 0

    def describe(self) -> str:
        """One line for the report: who, what it trained, how it ended."""
        began = f"adopted epoch {self.adopted_epoch}" if self.adopted_epoch else "started"
        if self.steps:
            trained = f"saw steps {self.steps[0].step}-{self.last_step} committed"
        else:
            trained = "saw no step committed"
        ended = self.ended or "stopped without a report (killed)"
        return f"controller pid {self.pid}: {began}, {trained}; {ended}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Before:
    """What came before this controller: the earlier segments of the run it continues, and,
    when it starts over, the unfinished run before it (None when there was none)."""

    earlier: tuple[Segment, ...] = ()
    abandoned: tuple[Segment, ...] = ()

    def lost_line(self) -> str | None:
        """What a start-over lost, in one sentence (None when nothing was lost)."""
        if not self.abandoned:
            return None
        last = self.abandoned[-1]
        reached = max(s.last_step for s in self.abandoned)
        how = last.ended or "its controller stopped without a report and no agent of it was left"
        return (
            f"started over: the previous run in this directory reached step {reached} "
            f"({how}); its {reached} committed steps were trained again"
        )


def read(out: Path) -> list[Segment]:
    """Every segment the log in `out` holds, oldest first ([] without a log)."""
    try:
        lines = (out / FILE_NAME).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    segments: list[dict[str, Any]] = []
    for line in lines:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            _take(segments, json.loads(line))
    return [_segment(s) for s in segments]


def _take(segments: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    if "start" in entry:
        start = entry["start"]
        segments.append({**start, "steps": [], "ended": None})
    elif segments and "step" in entry:
        segments[-1]["steps"].append(statuses.StepRecord(**_step(entry["step"])))
    elif segments and "end" in entry:
        end = entry["end"]
        segments[-1]["ended"] = f"{end['outcome']} at step {end['step']}"


def _step(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "at_s": float(row["wall_s"]),
        "step": int(row["step"]),
        "loss": None if row["loss"] is None else float(row["loss"]),
        "samples_per_s": float(row["samples_per_s"]),
        "live_workers": int(row["live_workers"]),
        "epoch": int(row["epoch"]),
    }


def _segment(raw: dict[str, Any]) -> Segment:
    return Segment(
        pid=int(raw["pid"]),
        started_wall_s=float(raw["wall_s"]),
        adopted_epoch=None if raw["adopted_epoch"] is None else int(raw["adopted_epoch"]),
        steps=tuple(raw["steps"]),
        ended=raw["ended"],
    )


def before(segments: list[Segment], *, adopting: bool) -> Before:
    """What came before a controller that adopts (or starts over) after `segments`."""
    runs: list[list[Segment]] = []
    for segment in segments:
        if segment.adopted_epoch is None or not runs:
            runs.append([])
        runs[-1].append(segment)
    if not runs:
        return Before()
    last = tuple(runs[-1])
    if adopting:
        return Before(earlier=last)
    finished = last[-1].ended is not None and not last[-1].ended.startswith("Interrupted")
    return Before() if finished else Before(abandoned=last)


class ProgressLog:
    """Appends this controller's start, committed steps and end to RUN/progress.jsonl; a
    status sink (`publish`) beside the terminal's."""

    def __init__(
        self, out: Path, *, adopted_epoch: int | None, wall: Callable[[], float] = time.time
    ) -> None:
        self._path = out / FILE_NAME
        self._wall = wall
        self._last_step = 0
        start = {"pid": os.getpid(), "wall_s": wall(), "adopted_epoch": adopted_epoch}
        self._append({"start": start})

    async def publish(self, status: statuses.JobStatus) -> None:
        """Log a newer committed step."""
        if status.step <= self._last_step:
            return
        self._last_step = status.step
        row = {
            "wall_s": self._wall(),
            "step": status.step,
            "loss": status.loss,
            "samples_per_s": status.samples_per_s,
            "live_workers": status.live_workers,
            "epoch": status.epoch,
        }
        self._append({"step": row})

    def end(self, outcome: str, step: int) -> None:
        """The run's report is written: say how it ended."""
        self._append({"end": {"wall_s": self._wall(), "outcome": outcome, "step": step}})

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self._path, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")
