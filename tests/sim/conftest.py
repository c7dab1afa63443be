"""Fixtures shared by the simulator tests: a tiny job whose planner is reused per module."""

from __future__ import annotations

import math

import pytest

from planaria.contract import shapes
from planaria.planner import accelerators, synthetic
from planaria.sim import planning, scenarios, traces

NUM_NODES = 8


def tiny_scenario(trace: traces.Trace | None = None) -> scenarios.Scenario:
    """`tiny` (6 planner layers) on 8 one-GPU A100-80GB nodes, batch 16 of micro-batch 1,
    failures per device at 0.5/hour over 4 hours (or the given trace)."""
    return scenarios.Scenario(
        name="tiny-test",
        description="tiny test scenario",
        model="tiny",
        accelerator="a100-80gb",
        num_nodes=NUM_NODES,
        micro_batch_size=1,
        global_batch=16,
        horizon_s=4 * 3600.0,
        trace=lambda seed, horizon_s: trace or traces.per_device(NUM_NODES, 0.5, horizon_s, seed),
        time_to_failure=lambda live: 3600.0 / (0.5 * max(live, 1)),
    )


def tiny_job() -> planning.Job:
    prof = synthetic.synthesize(shapes.named("tiny"), accelerators.named("a100-80gb"), 1, 1)
    return planning.Job(profile=prof, global_batch=16)


@pytest.fixture(scope="module")
def planner() -> planning.Planner:
    return planning.Planner(tiny_job())


def never(num_live: int) -> float:
    """No failure is expected: eq. 8's T_next and Young's checkpoint interval are infinite."""
    return math.inf
