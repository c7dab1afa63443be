"""A chaos trial's seeded fault schedule: the job it runs and the faults it injects, drawn up front.

    schedule = draw(seed=7, shape=SHAPES[Config.PIPELINE])

The seed draws everything about the faults (`draw`): the kind (`Kind`), the snapshot redundancy,
the moment of the first fault (a point of the training run counted in steps; seconds after
Profiling begins for `Kind.EARLY`, after the first epoch's set-up begins for `Kind.RETURNS`),
the victims in order, the gaps between faults, a returning worker's pause and how long a
partition lasts; a job of several policies draws its policy on a stream of its own. So a seed
replays the same schedule, and adding a kind drawn last (stall, partition) left every other
seed's as it was. `Shape` is the job (`SHAPES` by `Config`) and the trial's bounds.

Not here: injecting the faults (`faults`), running a trial and its invariant (`trials`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from enum import StrEnum

from planaria.contract import plan
from planaria.wire import messages

W = plan.WorkerId


class Kind(StrEnum):
    """The fault a trial injects."""

    KILL = "kill"  # one SIGKILL
    DOUBLE = "double"  # two SIGKILLs of distinct workers within MAX_GAP_S
    TRIPLE = "triple"  # three: more than the fault tolerance, often Suspended
    HANG = "hang"  # SIGSTOP: only the heartbeat timeout can tell
    RETURNS = "returns"  # SIGKILL, then the worker starts again (a scale-up)
    EARLY = "early"  # SIGKILL while an agent profiles or the first epoch is set up
    # Every worker SIGSTOPped past the heartbeat timeout, then SIGCONT (a paused machine);
    # drawn apart from the others (STALL_SHARE of the seeds).
    STALL = "stall"
    # One worker's traffic dropped both ways (`netns`) for `Draw.cut_s`, then let through: it
    # ran all along and comes back in a stale epoch. Drawn apart too (PARTITION_SHARE).
    PARTITION = "partition"
    # `planaria run` itself SIGKILLed and run again (tests/chaos/controller_kill.py, its own
    # harness); only with `bench.chaos --kind controller`: a trial starts two controllers.
    CONTROLLER = "controller"


class Config(StrEnum):
    """The job a trial runs (`SHAPES`)."""

    DATA = "data"  # 4 workers, the tiny model fits one: pure data parallelism, `dynamic`
    # 6 workers whose devices hold 85 % of the model: two pipelines of 3 stages (the demo's
    # kind of plan), the policy drawn from adaptive, reroute and dynamic.
    PIPELINE = "pipeline"
    # The demo's own job (examples/tiny-job.yaml): 8 workers of 5 MiB, micro-batches of 4 in a
    # global batch of 16, pipelines of 5 + 3 stages, `adaptive`; a second loss suspends.
    DEMO = "demo"


KINDS = tuple(k for k in Kind if k not in (Kind.STALL, Kind.PARTITION, Kind.CONTROLLER))
STALL_SHARE = 1 / 7
PARTITION_SHARE = 1 / 7  # of the seeds not stalled
KEPT_CUT_SHARE = 1 / 4  # of the partitions: never healed, the job ends around the lost worker
MAX_CUT_EXTRA_S = 3.0  # a healed cut lasts the heartbeat timeout + up to this
MAX_GAP_S = 1.5
_FAULTS = {
    Kind.KILL: 1,
    Kind.DOUBLE: 2,
    Kind.TRIPLE: 3,
    Kind.HANG: 1,
    Kind.RETURNS: 1,
    Kind.EARLY: 1,
}
# From Profiling, whose ~1-2 s are followed by the first epoch's set-up (seconds on 2 cores);
# from the first epoch's set-up for a returning worker (`faults.TRIGGERS`).
DELAY_S = {Kind.EARLY: 3.0, Kind.RETURNS: 2.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """The job every trial runs, and the trial's bounds. Heartbeat and step timeouts are small
    so a stopped worker is caught within seconds; a Suspended job is ended once it stayed so
    for `suspended_s` (longer than a stall's pause, from which the job should come back)."""

    config: Config = Config.DATA
    workers: int = 4
    steps: int = 12
    global_batch_size: int = 4
    micro_batch_size: int = 1
    model: str = "tiny"
    returns_model: str = "small"
    # Steps of a `Kind.RETURNS` trial (None: `steps`): enough that the restarted worker serves
    # again, and is taken back by a scale-up, before the job ends.
    returns_steps: int | None = None
    fault_tolerance: int = 1
    heartbeat_timeout_s: float = 1.5
    step_timeout_s: float = 4.0
    bound_s: float = 120.0
    suspended_s: float = 4.0
    stop_grace_s: float = 2.0
    # Each worker's device memory as a share of the model's layers (state + activations),
    # given as the job's `device_memory_bytes`; None: the profile's, the model fits one worker.
    device_memory_share: float | None = None
    device_memory_bytes: int | None = None  # the same in bytes (the demo's deviceMemory)
    policies: tuple[str, ...] = ("dynamic",)  # one is drawn per seed (`draw`)


def steps(shape: Shape, kind: Kind) -> int:
    """The steps a trial of `kind` trains."""
    if kind is Kind.RETURNS and shape.returns_steps is not None:
        return shape.returns_steps
    return shape.steps


SHAPES = {
    Config.DATA: Shape(),
    Config.PIPELINE: Shape(
        config=Config.PIPELINE,
        workers=6,
        steps=20,
        device_memory_share=0.85,
        policies=("adaptive", "reroute", "dynamic"),
    ),
    Config.DEMO: Shape(
        config=Config.DEMO,
        workers=8,
        steps=16,
        global_batch_size=16,
        micro_batch_size=4,
        device_memory_bytes=5 * 2**20,
        returns_model="tiny",  # the small model does not fit 5 MiB devices; these steps are slow
        # fast tiny steps: at 16 a returned worker's agent served after the job had ended
        returns_steps=64,
        # The demo's timeouts: with the others' 1.5 s, a cold first epoch of 8 agents on 2
        # loaded cores lost a heartbeat past the timeout and regrouped (`restart`) at step 0.
        heartbeat_timeout_s=3.0,
        step_timeout_s=10.0,
        policies=("adaptive",),
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Draw:
    """Everything a seed decides (module docstring)."""

    seed: int
    kind: Kind
    redundancy: messages.RedundancyMode
    at: float  # in [0, 1): where in its window the first fault lands (`_Trial._first_moment`)
    victims: tuple[plan.WorkerId, ...]
    gaps_s: tuple[float, ...]
    rejoin_s: float
    cut_s: float = 0.0  # `Kind.PARTITION`: how long the cut lasts; math.inf: to the end
    policy: str = "dynamic"  # the job's recovery policy, one of `Shape.policies`


def draw(seed: int, shape: Shape = Shape(), kind: Kind | None = None) -> Draw:
    """The seed's fault schedule (module docstring); the same seed, the same schedule. `kind`
    replaces the drawn kind (the rest is drawn as without it). The policy (when `shape` has
    several) comes from a stream of its own: a seed's faults do not depend on its policy."""
    rng = random.Random(seed)
    policies = shape.policies
    policy = policies[0] if len(policies) == 1 else random.Random(f"policy-{seed}").choice(policies)
    drawn = rng.choice(KINDS)
    chosen = kind or drawn
    workers = [W(w) for w in range(shape.workers)]
    schedule = Draw(
        seed=seed,
        kind=chosen,
        redundancy=rng.choice((messages.RedundancyMode.XOR, messages.RedundancyMode.COPY)),
        at=rng.random(),
        victims=tuple(rng.sample(workers, _FAULTS.get(chosen, len(workers)))),  # STALL: all
        gaps_s=tuple(rng.uniform(0.0, MAX_GAP_S) for _ in range(2)),
        rejoin_s=rng.uniform(0.0, 0.5),
        policy=policy,
    )
    # Drawn last, so that adding the stall left every other seed's schedule as it was.
    if kind is None and rng.random() < STALL_SHARE:
        everyone = tuple(rng.sample(workers, len(workers)))
        return dataclasses.replace(schedule, kind=Kind.STALL, victims=everyone)
    # Then the partition, after everything else for the same reason.
    if chosen is Kind.PARTITION or (kind is None and rng.random() < PARTITION_SHARE):
        kept = rng.random() < KEPT_CUT_SHARE
        cut_s = shape.heartbeat_timeout_s + rng.uniform(0.0, MAX_CUT_EXTRA_S)
        victim = (rng.choice(workers),)
        return dataclasses.replace(
            schedule, kind=Kind.PARTITION, victims=victim, cut_s=math.inf if kept else cut_s
        )
    return schedule
