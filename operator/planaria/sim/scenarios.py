"""Named scenarios: the papers' failure setups with a model, cluster and batch.

- `odyssey` (Odyssey §V-B): 32 devices, one per node, each failing at 10% per hour, 9 hours, no
  re-joins; a 7B GPT (`gpt3-6.7b`: Llama-2 7B's shape at sequence 4096 does not fit 80 GB
  without activation recomputation, which the synthetic profile does not model) on A100-80GB,
  micro-batch 1, global batch 64 (Odyssey §V-A: batch 16 to 64, micro-batch 1).
- `oobleck-6h`, `oobleck-1h`, `oobleck-10m` (Oobleck §7.2, Table 2): 30 nodes of one GPU, one
  failure every 6 h / 1 h / 10 min on average, until 15 nodes remain; GPT-3 2.7B (or 6.7B
  with --model), micro-batch 2, global batch 1024 (Oobleck Table 1). Oobleck used A40s with
  activation checkpointing; without recomputation these models do not fit 48 GB, so A100-80GB.
- `spot-ec2`, `spot-gcp` (Oobleck §7.3): 30 nodes, a preemption every 7.7 / 10.3 min on
  average with additions at the same rate, 12 hours; the model as the Oobleck scenarios.

Eq. 8's expected time to the next failure is the scenario's own rate: per device times live
devices, or the cluster's mean gap.

Each scenario's `horizon_s` is its paper's (9 h, 12 h; infinite for the Oobleck scenarios, whose
traces end at the last failure) and `with_horizon` replaces it (`planaria simulate --hours`).
Descriptions leave the horizon out: the caller states the traces' own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from planaria.contract import shapes
from planaria.planner import accelerators, synthetic
from planaria.sim import errors, planning, traces

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A named setup: `trace(seed, horizon_s)` draws its failures until `horizon_s` seconds
    (infinite: until the scenario's failure floor); `time_to_failure(live nodes)` is eq. 8's
    T_next."""

    name: str
    description: str
    model: str
    accelerator: str
    num_nodes: int
    micro_batch_size: int
    global_batch: int
    horizon_s: float
    trace: Callable[[int, float], traces.Trace]
    time_to_failure: Callable[[int], float]
    gpus_per_node: int = 1

    def draw(self, seed: int) -> traces.Trace:
        """The trace of `seed` over this scenario's horizon."""
        return self.trace(seed, self.horizon_s)

    def with_horizon(self, horizon_s: float) -> Scenario:
        """This scenario simulated for `horizon_s` seconds; raises SimInputError unless > 0."""
        if not (math.isfinite(horizon_s) and horizon_s > 0):
            raise errors.SimInputError(f"the horizon is {horizon_s:g} s; give hours > 0")
        return dataclasses.replace(self, horizon_s=horizon_s)

    def job(self, model: str | None = None) -> planning.Job:
        """The job: a synthetic profile of `model` (default: the scenario's) on its accelerator."""
        shape = shapes.named(model or self.model)
        prof = synthetic.synthesize(
            shape, accelerators.named(self.accelerator), self.micro_batch_size, 1
        )
        return planning.Job(
            profile=prof, global_batch=self.global_batch, gpus_per_node=self.gpus_per_node
        )


def _odyssey() -> Scenario:
    rate = 0.1  # per device per hour (Odyssey §V-B)
    return Scenario(
        name="odyssey",
        description="Odyssey §V-B: 32 devices, 10%/device/hour",
        model="gpt3-6.7b",
        accelerator="a100-80gb",
        num_nodes=32,
        micro_batch_size=1,
        global_batch=64,
        horizon_s=9 * HOUR_S,
        trace=lambda seed, horizon_s: traces.per_device(32, rate, horizon_s, seed),
        time_to_failure=lambda live: HOUR_S / (rate * max(live, 1)),
    )


def _scale(num_nodes: int, gpus_per_node: int) -> Scenario:
    rate = 0.01  # per node per hour: about 10 failures an hour at 1,024 nodes
    suffix = "" if gpus_per_node == 1 else f"x{gpus_per_node}"
    return Scenario(
        name=f"scale-{num_nodes}{suffix}",
        description=f"scale (#17): {num_nodes} nodes x {gpus_per_node} GPU(s), 1%/node/hour",
        model="gpt3-6.7b",
        accelerator="a100-80gb",
        num_nodes=num_nodes,
        micro_batch_size=1,
        global_batch=1024,
        horizon_s=9 * HOUR_S,
        trace=lambda seed, horizon_s: traces.per_device(num_nodes, rate, horizon_s, seed),
        time_to_failure=lambda live: HOUR_S / (rate * max(live, 1)),
        gpus_per_node=gpus_per_node,
    )


def _oobleck(label: str, mtbf_s: float) -> Scenario:
    return Scenario(
        name=f"oobleck-{label}",
        description=f"Oobleck §7.2: 30 nodes, a failure every {label}, until 15 remain",
        model="gpt3-2.7b",
        accelerator="a100-80gb",
        num_nodes=30,
        micro_batch_size=2,
        global_batch=1024,
        horizon_s=math.inf,
        trace=lambda seed, horizon_s: traces.per_cluster(30, mtbf_s, 15, seed, horizon_s),
        time_to_failure=lambda live: mtbf_s,
    )


def _spot(label: str, mtbf_s: float) -> Scenario:
    return Scenario(
        name=f"spot-{label}",
        description=f"Oobleck §7.3: 30 nodes, {label} preemptions every {mtbf_s / 60:.1f} min "
        "and additions",
        model="gpt3-2.7b",
        accelerator="a100-80gb",
        num_nodes=30,
        micro_batch_size=2,
        global_batch=1024,
        horizon_s=12 * HOUR_S,
        trace=lambda seed, horizon_s: traces.spot(30, mtbf_s, horizon_s, seed),
        time_to_failure=lambda live: mtbf_s,
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _odyssey(),
        _oobleck("6h", 6 * HOUR_S),
        _oobleck("1h", HOUR_S),
        _oobleck("10m", 600.0),
        _spot("ec2", 7.7 * 60),
        _spot("gcp", 10.3 * 60),
        _scale(1024, 1),
        _scale(1024, 8),
    )
}


def named(name: str) -> Scenario:
    """The scenario registered under `name`; raises SimInputError listing the known ones."""
    try:
        return SCENARIOS[name]
    except KeyError:
        known = ", ".join(SCENARIOS)
        raise errors.SimInputError(f"unknown scenario {name!r}; choose one of {known}") from None
