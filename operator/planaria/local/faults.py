"""Failure injection for local runs: parse the `--fail` / `--mtbf` syntax, kill workers on time.

    --fail step=40:worker=3            SIGKILL worker 3 once the job has committed step 40
    --fail time=90s:worker=random      SIGKILL a random live worker 90 s into the run
    --fail step=20:worker=1:rejoin=5s  ... and start it again 5 s later (a returning worker)
    --fail step=40                     a random live worker, as the job file's default
    --mtbf 60s                         SIGKILL random live workers at exponential intervals
                                       with mean 60 s (seeded: the same run kills the same way)

Durations are `planaria.spec.durations`' grammar, as in a job file: `90`, `90s`, `1.5m`, `2h`,
`1m30s`; a `time` may be 0 (at the start), `rejoin` and `--mtbf` must be above 0. `parse_failures`
checks each `--fail` against the job with the job file's own rule
(`planaria.spec.consistency.failure_problems`: a worker the job has, a step before its last),
so a flag and a file entry are refused alike; `from_spec` takes a job file's entry (already
checked) as it is.
`Injector.run` is an asyncio task beside the controller: it reads the job's status (a callable the
runner gives it) every poll, fires each failure once when its step is committed or its time has
passed, and ends when the job ends or is cancelled. A failure whose worker is not running when it
fires is skipped (logged): the worker is already gone. Exponential inter-arrival times model
failures as a Poisson process, the assumption behind Odyssey eq. 8's mean time to the next failure.

Errors: `FaultSyntaxError` (a ValueError) names the bad part of the text, or the worker or step
the job lacks, and the fix.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from planaria.contract import plan
from planaria.control import status as statuses
from planaria.spec import consistency, durations, job

LOG = logging.getLogger(__name__)
POLL_S = 0.05
_TERMINAL = frozenset({statuses.Phase.SUCCEEDED, statuses.Phase.FAILED})
SYNTAX = "step=N[:worker=W|random][:rejoin=S] or time=S[:worker=W|random][:rejoin=S]"


class FaultSyntaxError(ValueError):
    """A failure or MTBF text that does not parse, or a failure the job cannot reach; says
    which part and what to write instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """Kill `worker` (None: a random live one) once step `step` is committed or `time_s`
    seconds into the run (exactly one of them), and restart it after `rejoin_after_s`."""

    step: int | None = None
    time_s: float | None = None
    worker: plan.WorkerId | None = None
    rejoin_after_s: float | None = None

    def __post_init__(self) -> None:
        if (self.step is None) == (self.time_s is None):
            raise FaultSyntaxError(f"failure: give exactly one trigger ({SYNTAX})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Injected:
    """One kill the injector made (for the report and the tests)."""

    at_s: float
    step: int
    worker: plan.WorkerId
    cause: str


class Target(Protocol):
    """What the injector acts on (`planaria.local.backend.LocalBackend`)."""

    def alive(self) -> tuple[plan.WorkerId, ...]: ...

    def kill(self, worker: plan.WorkerId, signum: int = signal.SIGKILL) -> None: ...

    async def restart(self, worker: plan.WorkerId) -> None: ...


def parse_duration(text: str, what: str, *, positive: bool = True) -> float:
    """Seconds in `text` (`planaria.spec.durations`), above 0 when `positive`; FaultSyntaxError
    naming `what` otherwise."""
    try:
        value = durations.parse(text)
    except durations.DurationError as exc:
        raise FaultSyntaxError(f"{what} is {text!r}; write {durations.FORMS}") from exc
    if positive and value == 0:
        raise FaultSyntaxError(f"{what} is {text!r}; give seconds > 0 such as 90s, 1.5m or 2h")
    return value


def parse_mtbf(text: str) -> float:
    """`--mtbf 60s` -> 60.0."""
    return parse_duration(text, "--mtbf")


def parse_failures(texts: Sequence[str], *, workers: int, steps: int) -> list[Failure]:
    """Every `--fail` text parsed and checked against a job of `workers` and `steps` by the
    job file's rule (module docstring); the first problem raises FaultSyntaxError."""
    failures = []
    for text in texts:
        failure = parse_failure(text)
        problems = consistency.failure_problems(
            step=failure.step, worker=failure.worker, workers=workers, steps=steps
        )
        if problems:
            raise FaultSyntaxError(f"--fail {text!r}: {problems[0][1]}")
        failures.append(failure)
    return failures


def from_spec(failure: job.FailureSpec) -> Failure:
    """A job file's failure entry (checked with the file) as the injector's `Failure`."""
    return Failure(
        step=failure.step,
        time_s=failure.time_s,
        worker=plan.WorkerId(failure.worker) if isinstance(failure.worker, int) else None,
        rejoin_after_s=failure.rejoin_seconds,
    )


def parse_failure(text: str) -> Failure:
    """`step=40:worker=3`, `time=90s:worker=random`, with an optional `:rejoin=5s`; no worker
    is a random one, as in the job file. Syntax only: `parse_failures` checks the job too."""
    fields: dict[str, str] = {}
    for part in text.split(":"):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise FaultSyntaxError(
                f"--fail {text!r}: part {part!r} is not key=value; write {SYNTAX}"
            )
        if key in fields:
            raise FaultSyntaxError(f"--fail {text!r}: {key} is given twice; give it once")
        fields[key] = value.strip()
    unknown = sorted(set(fields) - {"step", "time", "worker", "rejoin"})
    if unknown:
        raise FaultSyntaxError(f"--fail {text!r}: unknown key {unknown[0]!r}; write {SYNTAX}")
    return _failure(text, fields)


def _failure(text: str, fields: dict[str, str]) -> Failure:
    if ("step" in fields) == ("time" in fields):
        raise FaultSyntaxError(f"--fail {text!r}: give exactly one of step=N or time=S")
    rejoin = fields.get("rejoin")
    return Failure(
        step=_count(text, "step", fields["step"], 1) if "step" in fields else None,
        time_s=parse_duration(fields["time"], f"--fail {text!r}: time", positive=False)
        if "time" in fields
        else None,
        worker=_worker(text, fields.get("worker", "random")),
        rejoin_after_s=parse_duration(rejoin, f"--fail {text!r}: rejoin") if rejoin else None,
    )


def _count(text: str, key: str, value: str, low: int) -> int:
    if not re.fullmatch(r"[0-9]+", value) or int(value) < low:
        raise FaultSyntaxError(f"--fail {text!r}: {key} is {value!r}; give a whole number >= {low}")
    return int(value)


def _worker(text: str, value: str) -> plan.WorkerId | None:
    if value == "random":
        return None
    return plan.WorkerId(_count(text, "worker", value, 0))


class Injector:
    """Kills workers of `target` as `failures` and the MTBF clock say (module docstring)."""

    def __init__(
        self,
        target: Target,
        failures: Sequence[Failure],
        *,
        mtbf: float | None = None,
        seed: int = 0,
        rejoin_after_s: float | None = None,
        poll_s: float = POLL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._target = target
        self._pending = list(failures)
        self._mtbf = mtbf
        self._random = random.Random(seed)
        self._mtbf_rejoin_s = rejoin_after_s
        self._poll_s = poll_s
        self._monotonic = monotonic
        self._rejoins: set[asyncio.Task[None]] = set()
        self.injected: list[Injected] = []

    async def run(self, status: Callable[[], statuses.JobStatus]) -> None:
        """Fire the failures as the job goes, until it ends (or this task is cancelled)."""
        started = self._monotonic()
        next_mtbf = self._draw(started)
        try:
            while status().phase not in _TERMINAL:
                now, current = self._monotonic() - started, status()
                for failure in [f for f in self._pending if _due(f, now, current.step)]:
                    self._pending.remove(failure)
                    self._fire(failure.worker, failure.rejoin_after_s, now, current.step, "fail")
                if next_mtbf is not None and self._monotonic() >= next_mtbf:
                    self._fire(None, self._mtbf_rejoin_s, now, current.step, "mtbf")
                    next_mtbf = self._draw(self._monotonic())
                await asyncio.sleep(self._poll_s)
        finally:
            for task in self._rejoins:
                task.cancel()
            await asyncio.gather(*self._rejoins, return_exceptions=True)

    def _draw(self, now: float) -> float | None:
        """The next MTBF failure's time: exponential with mean `mtbf` (a Poisson process)."""
        return None if self._mtbf is None else now + self._random.expovariate(1.0 / self._mtbf)

    def _fire(
        self,
        worker: plan.WorkerId | None,
        rejoin_s: float | None,
        now: float,
        step: int,
        cause: str,
    ) -> None:
        live = self._target.alive()
        if worker is None and live:
            worker = self._random.choice(live)
        if worker is None or worker not in live:
            LOG.warning("%s failure at %.1f s: worker %s does not run; skipped", cause, now, worker)
            return
        LOG.info("%s failure at %.1f s, step %d: SIGKILL worker %d", cause, now, step, worker)
        self._target.kill(worker, signal.SIGKILL)
        self.injected.append(Injected(at_s=now, step=step, worker=worker, cause=cause))
        if rejoin_s is not None:
            task = asyncio.ensure_future(self._rejoin(worker, rejoin_s))
            self._rejoins.add(task)
            task.add_done_callback(self._rejoins.discard)

    async def _rejoin(self, worker: plan.WorkerId, after_s: float) -> None:
        await asyncio.sleep(after_s)
        while worker in self._target.alive():  # SIGKILL is delivered, the exit not yet seen
            await asyncio.sleep(self._poll_s)
        try:
            await self._target.restart(worker)
        except Exception as exc:  # a process boundary: the job goes on without the worker
            LOG.warning("worker %d did not rejoin: %s", worker, exc)


def _due(failure: Failure, now_s: float, step: int) -> bool:
    if failure.step is not None:
        return step >= failure.step
    return failure.time_s is not None and now_s >= failure.time_s
