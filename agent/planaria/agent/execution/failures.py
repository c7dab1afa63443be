"""How a step fails: bounded waits on torch.distributed work, and the errors they latch.

Every blocking wait of a step (a receive, a collective, a posted send's completion) waits at
most the epoch's timeout. Given `abandoned` (the runtime's "has this epoch failed elsewhere?",
a local flag its watcher sets: `planaria.agent.runtime.epoch_watch`), `Waits` polls
collectives (all-reduces and the commit barrier) instead of blocking, and gives one up once
the flag is set. gloo's point-to-point works complete only inside a blocking wait, so those
block; the watcher ends them by releasing the epoch's transport (`groups.Epoch.release`), and
the failure they raise then says the wait was abandoned. A failed torch.distributed call
becomes a `CommFailure`, which the executor turns into the `StepError` of its position
(`step_error`): a timeout when the wait outlived the epoch's timeout, a lost peer otherwise.

Not here: what a step runs (`executor`).

Errors (the executor's tree):

    ExecutorError
    ├── ExecutorInputError (ValueError)  schedule, configuration, layers and epoch do not fit
    └── StepError                        a step aborted on a communication failure (latched)
        ├── PeerLostError                a connection closed: the peer died or left the epoch
        └── StepTimeoutError             a wait outlived the epoch's timeout (a hung peer)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from planaria.agent.execution import groups
from planaria.contract import instructions, plan
from planaria.wire import messages

DETAIL_CHARS = 300  # how much of torch's error text an error message keeps
# Polled waits (given `abandoned`): first and longest sleep between polls, and how often the
# epoch's failure flag (a local event) is read.
POLL_START_S = 20e-6
POLL_MAX_S = 200e-6
CHECK_S = 0.02


class ExecutorError(Exception):
    """Base of the errors the executor raises on purpose."""


class ExecutorInputError(ExecutorError, ValueError):
    """The executor's inputs do not fit together; the message says what to change."""


class StepError(ExecutorError):
    """Step `step` aborted at instruction `index` (`instruction`); `peer` is the worker at the
    other end when the instruction names one. `kind` classifies it for the controller."""

    kind = messages.ErrorKind.INTERNAL

    def __init__(
        self,
        *,
        step: int,
        index: int,
        instruction: instructions.Instruction,
        peer: plan.WorkerId | None,
        detail: str,
    ) -> None:
        self.step, self.index, self.instruction, self.peer = step, index, instruction, peer
        with_peer = "" if peer is None else f" (peer worker {peer})"
        super().__init__(
            f"step {step} aborted at instruction #{index} {instruction}{with_peer}: {detail}"
        )

    def latched(self) -> messages.LatchedError:
        """This error as the agent reports it on its heartbeat stream."""
        return messages.LatchedError(
            kind=self.kind, message=str(self), step=self.step, peer_worker=self.peer
        )


class PeerLostError(StepError):
    """A peer's connection closed during the step (it died, or left the epoch after its own
    error)."""

    kind = messages.ErrorKind.PEER_LOST


class StepTimeoutError(StepError):
    """A blocking wait outlived the epoch's timeout: a peer hangs or is far too slow."""

    kind = messages.ErrorKind.TIMEOUT


class CommFailure(Exception):
    """A torch.distributed call failed; the executor turns it into a StepError with the
    position (`step_error`)."""

    def __init__(self, cause: RuntimeError, peer: plan.WorkerId | None, waited_s: float) -> None:
        super().__init__(str(cause))
        self.cause, self.peer, self.waited_s = cause, peer, waited_s


def step_error(
    failure: CommFailure, *, step: int, index: int, op: instructions.Instruction, timeout_s: float
) -> StepError:
    """The StepError of `failure` at instruction `index` of step `step`."""
    text = str(failure).strip()
    timed_out = "timed out" in text.lower() or failure.waited_s >= timeout_s
    kind = StepTimeoutError if timed_out else PeerLostError
    detail = text.splitlines()[0][:DETAIL_CHARS] if text else type(failure.cause).__name__
    return kind(step=step, index=index, instruction=op, peer=failure.peer, detail=detail)


class Waits:
    """Posts and awaits one epoch's non-blocking torch.distributed work; every failure is a
    CommFailure."""

    def __init__(self, epoch: groups.Epoch, abandoned: Callable[[], bool] | None) -> None:
        self.epoch, self.abandoned = epoch, abandoned

    def post(self, peer: plan.WorkerId | None, post: Callable[[], dist.Work | None]) -> dist.Work:
        """Post a non-blocking torch.distributed operation."""
        try:
            work = post()
        except RuntimeError as exc:
            raise self._failure(exc, peer, 0.0) from exc
        assert work is not None, "every rank of the epoch is a member of the world group"
        return work

    def wait(
        self, work: dist.Work, peer: plan.WorkerId | None, *, collective: bool = False
    ) -> None:
        """Wait for `work`; collectives are polled when `abandoned` is given (gloo's
        point-to-point works complete only inside wait(), so those always block)."""
        started = time.monotonic()
        try:
            if self.abandoned is None or not collective:
                work.wait(self.epoch.timeout)
            else:
                self._poll(work, started)
        except RuntimeError as exc:
            raise self._failure(exc, peer, time.monotonic() - started) from exc

    def _failure(self, exc: RuntimeError, peer: plan.WorkerId | None, waited: float) -> CommFailure:
        """`exc` as a CommFailure; one caused by this epoch's release (it failed elsewhere, or
        a Stop gave the step up) says so."""
        if self.abandoned is not None and self.abandoned():
            return CommFailure(RuntimeError(f"{self._abandoned_text()} ({exc})"), peer, waited)
        return CommFailure(exc, peer, waited)

    def _abandoned_text(self) -> str:
        return (
            f"epoch {self.epoch.number} was given up (a worker's step failed, or this worker was "
            "stopped); this wait was abandoned"
        )

    def _poll(self, work: dist.Work, started: float) -> None:
        """Wait for `work` by polling, so a wait can be abandoned when `abandoned()` says the
        epoch failed elsewhere: gloo may never fail a wait on a peer whose connection closed
        while idle, and an abort from another thread does not end a blocked wait. The poll
        backs off from POLL_START_S to POLL_MAX_S; `abandoned` is asked every CHECK_S."""
        delay, next_check = POLL_START_S, started + CHECK_S
        while not work.is_completed():
            now = time.monotonic()
            if now - started >= self.epoch.timeout_s:
                raise RuntimeError(f"timed out after {self.epoch.timeout_s} s")
            if now >= next_check:
                assert self.abandoned is not None
                if self.abandoned():
                    raise RuntimeError(self._abandoned_text())
                next_check = now + CHECK_S
            time.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)
        work.wait()  # completed: returns at once, or raises the operation's own error
