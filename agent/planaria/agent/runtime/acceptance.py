"""Which commands an agent accepts in which state, and how it classes its own errors.

Pure rules over what the runtime shows (`Published`, what the heartbeat reports), so they read
the same for every command and can be tested without a training thread. A Configure is judged
by the contract's rules, which the controller's side shares
(`planaria.contract.configure_rules`, module docstring): `offer` is what they read of a
Configure; the runtime says what they read of the agent (a `configure_rules.Receiver`). Pause,
resume, snapshots and loads name the agent's current epoch and need one of a few states
(`epoch_refusal`). A refusal is a sentence that says what to do instead; "" accepts.

`own_error` classes an error of the worker's own, not a peer's (docs/agent.md, "Errors").

Not here: applying a command (`runtime`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from planaria.agent.training import data
from planaria.contract import configure_rules
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


def offer(config: messages.WorkerConfig) -> configure_rules.Offer:
    """What the contract's rules read of `config`."""
    return configure_rules.Offer(
        epoch=config.epoch,
        worker=config.worker,
        resume_step=config.resume_step,
        device=str(config.settings.device),
    )


def configure_verdict(
    config: messages.WorkerConfig, agent: configure_rules.Receiver
) -> configure_rules.Verdict:
    """Whether `agent` accepts `config`, when it takes it up, or why it refuses it."""
    return configure_rules.judge(offer(config), agent)


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
