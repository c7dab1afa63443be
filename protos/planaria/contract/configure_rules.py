"""The rules both planes apply to a Configure: whether an agent accepts it and when it takes it
up, and the rank every worker of an epoch gets.

One source of truth (STYLE.md rule 29): the agent runtime judges every Configure with `judge`
and takes a held one up when `due` says so; the controller hands out `ranks`, and the agent
forms its groups and checks its schedule by the same; the controller tests' fake agent judges
with `judge` too, and tests/contract runs one suite against it and the real runtime.

Acceptance (docs/controller.md, "Configure"), checked in this order, the first failing rule
giving the refusal:

    WRONG_WORKER      the Configure names another worker than the agent's
    STALE_EPOCH       its epoch is not newer than the agent's newest (current or held) epoch;
                      a re-sent Configure is therefore refused and changes nothing
    STOPPING          the agent is stopping or stopped
    PROFILING         the agent is measuring a profile
    WRONG_DEVICE      its settings ask for another device than the agent runs on
    SWITCH_NOT_AHEAD  the agent is RUNNING and the Configure resumes at or before its
                      committed step (a running agent accepts only a planned switch)

An accepted Configure is taken up AT_ONCE by an agent that is not running, and AT_STEP
(`resume_step`) by a running one: it trains on to that step, then sets the new epoch up.

Ranks: an epoch's process group is exactly its plan's workers, each ranked by its position in
worker-id order. The epoch's key prefix in the rendezvous store is the other value both sides
derive alike; it lives with the store's other keys (`planaria.contract.rendezvous.key_prefix`).

Pure: plain values in, plain values out, no I/O, no torch, no wire messages (the callers map
their messages to an `Offer` and a `Receiver`). Not here: applying a Configure (the agent's
runtime), building one (planaria.control.epochs), the other commands' rules (the agent's
`runtime.acceptance`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from planaria.contract import plan


class Refusal(enum.StrEnum):
    """Why an agent refuses a Configure (module docstring, in the order they are checked)."""

    WRONG_WORKER = "wrong-worker"
    STALE_EPOCH = "stale-epoch"
    STOPPING = "stopping"
    PROFILING = "profiling"
    WRONG_DEVICE = "wrong-device"
    SWITCH_NOT_AHEAD = "switch-not-ahead"


class Timing(enum.StrEnum):
    """When an accepted Configure is taken up."""

    AT_ONCE = "at-once"  # the agent is not running: it sets the epoch up now
    AT_STEP = "at-step"  # a planned switch: once the agent has committed `resume_step`


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """What the rules read of a Configure. `device` is the settings' device ("cpu", "cuda")."""

    epoch: int
    worker: plan.WorkerId
    resume_step: int
    device: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Receiver:
    """What the rules read of the agent a Configure reaches, taken at one instant.

    `newest_epoch`: the newest of the epoch it runs in and the one it holds to take up (0 when
    never configured). `running_step`: its committed step while RUNNING, None in any other
    state (a paused, failed or finished agent takes a Configure up at once)."""

    worker: plan.WorkerId
    device: str
    newest_epoch: int
    running_step: int | None
    stopping: bool = False
    profiling: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The decision and its reason: `refusal` None means accepted (then `timing` says when
    it is taken up and `reason` is ""); otherwise `reason` says what to do instead."""

    refusal: Refusal | None
    timing: Timing | None
    reason: str

    @property
    def accepted(self) -> bool:
        return self.refusal is None


def judge(offer: Offer, receiver: Receiver) -> Verdict:
    """Whether `receiver` accepts `offer`, and when it takes it up (module docstring)."""
    found = _first_refusal(offer, receiver)
    if found is not None:
        refusal, reason = found
        return Verdict(refusal=refusal, timing=None, reason=reason)
    timing = Timing.AT_ONCE if receiver.running_step is None else Timing.AT_STEP
    return Verdict(refusal=None, timing=timing, reason="")


def _first_refusal(offer: Offer, receiver: Receiver) -> tuple[Refusal, str] | None:
    if offer.worker != receiver.worker:
        return Refusal.WRONG_WORKER, (
            f"this agent is worker {receiver.worker}, not {offer.worker}; send it to its own agent"
        )
    if offer.epoch <= receiver.newest_epoch:
        return Refusal.STALE_EPOCH, (
            f"epoch {offer.epoch} is stale: this agent is at epoch {receiver.newest_epoch}"
        )
    if receiver.stopping:
        return Refusal.STOPPING, "the agent is stopping; start a new agent"
    if receiver.profiling:
        return Refusal.PROFILING, "the agent is profiling; configure it when the profile is done"
    if offer.device != receiver.device:
        return Refusal.WRONG_DEVICE, (
            f"settings ask for device {offer.device} but this agent runs on "
            f"{receiver.device}; start the agent with --device {offer.device}"
        )
    step = receiver.running_step
    if step is not None and offer.resume_step <= step:
        return Refusal.SWITCH_NOT_AHEAD, (
            f"running at step {step}; a running agent switches only at a later "
            f"step (resume_step {offer.resume_step} <= {step})"
        )
    return None


def due(resume_step: int, running_step: int | None) -> bool:
    """Whether an accepted Configure resuming at `resume_step` is to be taken up now by an
    agent whose committed step is `running_step` while RUNNING (None: not running)."""
    return running_step is None or running_step >= resume_step


def ranks(workers: Iterable[plan.WorkerId]) -> dict[plan.WorkerId, int]:
    """Rank of every worker of an epoch in its process group: its position in worker-id order.
    ValueError when a worker appears twice (a plan never holds one twice)."""
    ordered = sorted(workers)
    if len(set(ordered)) != len(ordered):
        raise ValueError(f"workers {ordered} repeat an id; an epoch ranks distinct workers")
    return {worker: rank for rank, worker in enumerate(ordered)}
