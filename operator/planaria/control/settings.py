"""A job's settings as the controller core takes them: one frozen value, checked on construction.

`JobSettings` is what `planaria run` (local) and the Kubernetes adapter build from their own
documents (the job file, the CRD spec); the core never reads files or the environment. Values
are checked here so a bad one fails before any worker starts: a `ValueError` names the field and
says what to change.

Not here: the training settings' own checks (`planaria.wire.messages.TrainingSettings`), the
profile's (`planaria.contract.profile`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from planaria.contract import profile as profiles
from planaria.wire import messages


class Policy(StrEnum):
    """Which recovery candidates the controller may choose after a failure."""

    ADAPTIVE = "adaptive"  # every candidate, ranked by Odyssey eq. 8
    DYNAMIC = "dynamic"  # re-planning only: Oobleck's re-instantiation, no rerouting
    REROUTE = "reroute"  # rerouting only (ReCycle): the pipelines keep their shapes


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSettings:
    """One training job (docs/controller.md).

    `workers` worker processes (pods) at full strength, `gpus_per_node` of them per node;
    train steps 1..`steps`, then the job has Succeeded. `fault_tolerance` node failures the
    Oobleck templates must cover. `mtbf_s` is Odyssey eq. 8's expected time to the next failure
    (None: estimated from the failures observed, one hour until the first). Heartbeats every
    `heartbeat_interval_s`; an agent silent for `heartbeat_timeout_s` counts as failed;
    `step_timeout_s` bounds every collective of an epoch; `configure_timeout_s` every Configure.
    `profile` None: the controller asks one agent to profile the model (phase Profiling).
    `device_memory_bytes` caps the profile's device memory (the planner's per-worker budget).
    """

    name: str
    workers: int
    gpus_per_node: int = 1
    steps: int
    micro_batch_size: int
    training: messages.TrainingSettings
    fault_tolerance: int = 1
    policy: str = "adaptive"
    mtbf_s: float | None = None
    backend: messages.Backend = messages.Backend.GLOO
    heartbeat_interval_s: float = 0.1
    heartbeat_timeout_s: float = 3.0
    step_timeout_s: float = 10.0
    configure_timeout_s: float = 60.0
    profile: profiles.Profile | None = None
    device_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("job: name is empty; give the job a name")
        _check_count("workers", self.workers, 1)
        _check_count("gpus_per_node", self.gpus_per_node, 1)
        if self.workers % self.gpus_per_node:
            raise ValueError(
                f"job: workers {self.workers} is not a multiple of gpus_per_node "
                f"{self.gpus_per_node}; give whole nodes"
            )
        _check_count("steps", self.steps, 1)
        _check_count("micro_batch_size", self.micro_batch_size, 1)
        if self.training.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"job: global batch {self.training.global_batch_size} is not a multiple of "
                f"micro_batch_size {self.micro_batch_size}; make it one"
            )
        _check_count("fault_tolerance", self.fault_tolerance, 0)
        if self.device_memory_bytes is not None:
            _check_count("device_memory_bytes", self.device_memory_bytes, 1)
        if self.policy not in {p.value for p in Policy}:
            names = ", ".join(p.value for p in Policy)
            raise ValueError(f"job: policy is {self.policy!r}; give one of {names}")
        self._check_seconds()

    def _check_seconds(self) -> None:
        if self.mtbf_s is not None:
            _check_positive("mtbf_s", self.mtbf_s)
        for name in (
            "heartbeat_interval_s",
            "heartbeat_timeout_s",
            "step_timeout_s",
            "configure_timeout_s",
        ):
            _check_positive(name, getattr(self, name))
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"job: heartbeat_timeout_s {self.heartbeat_timeout_s} is not above "
                f"heartbeat_interval_s {self.heartbeat_interval_s}; make the timeout longer"
            )

    @property
    def num_nodes(self) -> int:
        """Nodes at full strength."""
        return self.workers // self.gpus_per_node

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per step (the global batch never changes with the plan)."""
        return self.training.global_batch_size // self.micro_batch_size


def _check_count(field: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"job: {field} is {value}; give a whole number >= {low}")


def _check_positive(field: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"job: {field} is {value}; give finite seconds > 0")
