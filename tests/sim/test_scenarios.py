"""Named scenarios (planaria.sim.scenarios).

Covers: each scenario draws traces over its paper's horizon (9 h for odyssey, 12 h for the spot
scenarios, the last failure for the Oobleck ones) and no description claims a horizon;
`with_horizon` replaces it for every kind, the same seed drawing the same failures up to the
shorter horizon; a horizon that is not a positive number is an error that says what to give;
the scale scenarios (#17 item 5) have 1,024 nodes of 1 or 8 GPUs and about 10 failures an hour.
"""

from __future__ import annotations

import math

import pytest

from planaria.sim import errors, scenarios


@pytest.mark.parametrize(
    ("name", "hours"),
    [("odyssey", 9.0), ("spot-ec2", 12.0), ("oobleck-1h", math.inf)],
    ids=["odyssey runs 9 h", "spot runs 12 h", "oobleck runs until its last failure"],
)
def test_a_scenario_draws_its_papers_horizon(name: str, hours: float) -> None:
    scenario = scenarios.named(name)
    assert scenario.horizon_s == hours * scenarios.HOUR_S
    trace = scenario.draw(0)
    expected = trace.events[-1].time_s if math.isinf(hours) else hours * scenarios.HOUR_S
    assert trace.horizon_s == expected
    assert " h" not in scenario.description and "12h" not in scenario.description


@pytest.mark.parametrize("name", ["odyssey", "spot-gcp", "oobleck-10m"])
def test_with_horizon_draws_the_same_failures_until_the_new_horizon(name: str) -> None:
    scenario = scenarios.named(name)
    short = scenario.with_horizon(1800.0)
    assert short.horizon_s == 1800.0 and short.name == scenario.name
    trace, full = short.draw(3), scenario.draw(3)
    assert trace.horizon_s == 1800.0
    assert trace.events == tuple(e for e in full.events if e.time_s <= 1800.0)


@pytest.mark.parametrize("horizon_s", [0.0, -1.0, math.nan, math.inf])
def test_a_horizon_must_be_positive_seconds(horizon_s: float) -> None:
    with pytest.raises(errors.SimInputError, match="give hours > 0"):
        scenarios.named("odyssey").with_horizon(horizon_s)


@pytest.mark.parametrize(
    ("name", "gpus"), [("scale-1024", 1), ("scale-1024x8", 8)], ids=["1 GPU", "8 GPUs"]
)
def test_the_scale_scenarios_have_1024_nodes_failing_about_ten_times_an_hour(
    name: str, gpus: int
) -> None:
    scenario = scenarios.named(name)
    assert scenario.num_nodes == 1024 and scenario.gpus_per_node == gpus
    assert scenario.job().gpus_per_node == gpus and scenario.job().num_micro_batches == 1024
    first_hour = [e for e in scenario.draw(0).events if e.time_s <= scenarios.HOUR_S]
    assert 3 <= len(first_hour) <= 20  # Poisson, mean 1024 x (1 - exp(-0.01)) = 10.2
