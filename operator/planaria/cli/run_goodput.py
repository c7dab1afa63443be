"""Goodput and throughput of a `planaria run`, measured over the steps actually trained.

Every figure is a count of samples over the time the controller saw them take, from its step
records (`control.status.StepRecord`: the clock time each newer committed step was seen):

    training window  first recorded step .. last recorded step: start-up before it (agents
                     launching, profiling, the first rendezvous) and shutdown after it
                     (stopping the agents, 3-5 s) are excluded; failures, recoveries and
                     retrained steps inside it are counted as the time they took
    goodput          (last step - first step) x global batch / window seconds; a step trained
                     again after a rollback counts once (progress, not work)
    fault-free       samples / seconds summed over consecutive records of one epoch that both
                     ran at full strength (the same measure, failure-free stretches only)
    epoch rate       samples / seconds between an epoch's first and last record: what a
                     recovery's plan delivered, set beside the planner's estimate

A rate over no time (one record, no two consecutive records at full strength) is None, never
a guess. Before this module (issue #18 item 3) the window ran to the end of shutdown and the
fault-free figure was a median of per-record rates, so a run without failures reported 21-40%.

The planner's reasons quote Odyssey eq. 8's samples/s, computed from the profile, which times
one worker alone on its device; local runs share a few CPU cores among all workers, so the
estimate can be several times the measured rate. `labelled_reason` says so in the reason and
puts the measured rate beside it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from planaria.control import status as statuses

# The controller's wording (`planaria.control.planning`):
# "<value> samples/s estimated by Odyssey eq. 8 for one device per worker".
_ESTIMATE = re.compile(
    r"(?P<value>[0-9][0-9.]*(?:e[+-]?[0-9]+)?) samples/s estimated by Odyssey eq\. 8 "
    r"for one device per worker"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """A run's goodput (module docstring); seconds are durations, rates samples/s, and the
    training figures None when fewer than two steps were recorded."""

    wall_s: float
    useful_samples: int
    samples_per_s: float  # useful samples over the whole wall time
    startup_s: float  # start to the first recorded step (the whole run when none)
    shutdown_s: float  # last recorded step to the end
    first_step: int | None
    last_step: int | None
    training_s: float
    training_samples_per_s: float | None
    fault_free_samples_per_s: float | None
    fault_free_s: float  # seconds measured at full strength

    @property
    def ratio(self) -> float | None:
        """Training goodput as a share of the fault-free rate."""
        if not self.fault_free_samples_per_s or self.training_samples_per_s is None:
            return None
        return self.training_samples_per_s / self.fault_free_samples_per_s


def measure(
    steps: Sequence[statuses.StepRecord],
    *,
    global_batch_size: int,
    total_workers: int,
    final_step: int,
    started_s: float,
    finished_s: float,
) -> Goodput:
    """The goodput of a run whose controller recorded `steps` (module docstring)."""
    wall_s = max(finished_s - started_s, 1e-9)
    first, last = (steps[0], steps[-1]) if steps else (None, None)
    training_s = last.at_s - first.at_s if first and last else 0.0
    trained = (last.step - first.step) * global_batch_size if first and last else 0
    full_samples, full_s = _full_strength(steps, global_batch_size, total_workers)
    return Goodput(
        wall_s=wall_s,
        useful_samples=final_step * global_batch_size,
        samples_per_s=final_step * global_batch_size / wall_s,
        startup_s=first.at_s - started_s if first else wall_s,
        shutdown_s=finished_s - last.at_s if last else 0.0,
        first_step=first.step if first else None,
        last_step=last.step if last else None,
        training_s=training_s,
        training_samples_per_s=trained / training_s if training_s > 0 else None,
        fault_free_samples_per_s=full_samples / full_s if full_s > 0 else None,
        fault_free_s=full_s,
    )


def _full_strength(
    steps: Sequence[statuses.StepRecord], global_batch_size: int, total_workers: int
) -> tuple[int, float]:
    """Samples and seconds between consecutive records of one epoch, both at full strength."""
    samples, seconds = 0, 0.0
    for before, after in zip(steps, steps[1:], strict=False):
        same_epoch = before.epoch == after.epoch and after.step > before.step
        full = min(before.live_workers, after.live_workers) >= total_workers
        if same_epoch and full and after.at_s > before.at_s:
            samples += (after.step - before.step) * global_batch_size
            seconds += after.at_s - before.at_s
    return samples, seconds


def epoch_rate(
    steps: Sequence[statuses.StepRecord], epoch: int, global_batch_size: int
) -> float | None:
    """Samples/s over `epoch`'s recorded steps, first to last (None with fewer than two)."""
    mine = [r for r in steps if r.epoch == epoch]
    if len(mine) < 2 or mine[-1].at_s <= mine[0].at_s:
        return None
    return (mine[-1].step - mine[0].step) * global_batch_size / (mine[-1].at_s - mine[0].at_s)


def estimated_samples_per_s(reason: str) -> float | None:
    """The Odyssey eq. 8 estimate a planner's reason quotes, or None when it quotes none."""
    match = _ESTIMATE.search(reason)
    return float(match.group("value")) if match else None


def labelled_reason(reason: str, measured: float | None) -> str:
    """`reason` with its eq. 8 figure labelled an estimate for one device per worker and the
    measured rate of the epoch it chose beside it ("not measured" when none)."""
    seen = "not measured" if measured is None else f"measured {measured:.4g} samples/s"
    return _ESTIMATE.sub(lambda m: f"{m[0]} ({seen})", reason)
