"""Which commands an agent accepts in which state, and how it classes its own errors.

Pure rules over what the runtime shows (`Published`, what the heartbeat reports), so they read
the same for every command and can be tested without a training thread. Configure acceptance
(interfaces.md): the epoch must be newer than the agent's current (and pending) one, the worker
must be this agent's, the device the agent's; a stopping or profiling agent refuses, and a
RUNNING one accepts only a switch at a later step. Pause, resume, snapshots and loads name the
agent's current epoch and need one of a few states (`epoch_refusal`). A refusal is a sentence
that says what to do instead; "" accepts.

`own_error` classes an error of the worker's own, not a peer's (docs/agent.md, "Errors").

Not here: applying a command (`runtime`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from planaria.agent.training import data
from planaria.contract import plan
from planaria.wire import messages

State = messages.AgentState


@dataclass(slots=True, kw_only=True)
class Published:
    """What the heartbeat shows; written by the training thread under the runtime's lock."""

    state: messages.AgentState = State.IDLE
    epoch: int = 0
    step: int = 0
    loss: float | None = None
    global_batch: int = 0
    timings: messages.Timings = messages.Timings()
    errors: tuple[messages.LatchedError, ...] = ()
    setup: messages.EpochSetup | None = None
    checkpoint_step: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Situation:
    """What the Configure rule reads of an agent, taken under the runtime's lock."""

    worker: plan.WorkerId
    device: str
    shown: Published
    newest_epoch: int  # the newest of the current and the pending configuration's epochs
    stopping: bool
    profiling: bool


def configure_refusal(config: messages.WorkerConfig, situation: Situation) -> str:
    """Why `config` is refused, or "" when it is accepted."""
    shown = situation.shown
    if config.worker != situation.worker:
        return (
            f"this agent is worker {situation.worker}, not {config.worker}; "
            "send it to its own agent"
        )
    if config.epoch <= situation.newest_epoch:
        return f"epoch {config.epoch} is stale: this agent is at epoch {situation.newest_epoch}"
    if situation.stopping:
        return "the agent is stopping; start a new agent"
    if situation.profiling:
        return "the agent is profiling; configure it when the profile is done"
    if str(config.settings.device) != situation.device:
        return (
            f"settings ask for device {config.settings.device} but this agent runs on "
            f"{situation.device}; start the agent with --device {config.settings.device}"
        )
    if shown.state is State.RUNNING and config.resume_step <= shown.step:
        return (
            f"running at step {shown.step}; a running agent switches only at a later "
            f"step (resume_step {config.resume_step} <= {shown.step})"
        )
    return ""


def epoch_refusal(shown: Published, epoch: int, states: tuple[messages.AgentState, ...]) -> str:
    """Why a command for `epoch` that needs one of `states` is refused, or ""."""
    if epoch != shown.epoch:
        return f"epoch {epoch} is not the agent's epoch {shown.epoch}"
    if shown.state not in states:
        wanted = ", ".join(s.value for s in states)
        return f"the agent is {shown.state.value}; this needs it {wanted}"
    return ""


def own_error(exc: Exception, *, setting_up: bool) -> tuple[messages.ErrorKind, str]:
    """The kind and message to latch for `exc`, an error of this worker's own, not a peer's
    (docs/agent.md, "Errors"): a corpus that cannot be read (INVALID_DATA, in the data
    module's words, which say what to change), memory that ran out (OUT_OF_MEMORY), a set-up
    that cannot use the settings or the plan (INVALID_CONFIG: our input errors are
    ValueErrors; a step's ValueError is not one), anything else a bug or a broken device
    (INTERNAL). All but INVALID_DATA say where they were raised."""
    if isinstance(exc, data.CorpusError):
        return messages.ErrorKind.INVALID_DATA, str(exc)
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return messages.ErrorKind.OUT_OF_MEMORY, described(exc)
    if setting_up and isinstance(exc, ValueError):
        return messages.ErrorKind.INVALID_CONFIG, described(exc)
    return messages.ErrorKind.INTERNAL, described(exc)


def described(exc: BaseException) -> str:
    """An unexpected error with where it was raised (internal errors are bugs)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
