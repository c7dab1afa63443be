"""Job settings (planaria.control.settings): defaults, and every bad value refused with a
ValueError that names the field and what to change."""

from __future__ import annotations

import dataclasses

import pytest

from planaria.control import settings
from tests.control import scenarios


def test_defaults_and_derived_counts() -> None:
    job = scenarios.job(workers=8, gpus_per_node=2)
    assert (job.num_nodes, job.num_micro_batches) == (4, 8)
    bare = settings.JobSettings(
        name="j", workers=2, steps=1, micro_batch_size=1, training=scenarios.training()
    )
    assert (bare.policy, bare.fault_tolerance, bare.gpus_per_node, bare.profile) == (
        "adaptive",
        1,
        1,
        None,
    )


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"name": ""}, "name is empty"),
        ({"workers": 0}, "workers is 0"),
        ({"workers": 5, "gpus_per_node": 2}, "whole nodes"),
        ({"steps": 0}, "steps is 0"),
        ({"micro_batch_size": 3}, "multiple of micro_batch_size 3"),
        ({"fault_tolerance": -1}, "fault_tolerance is -1"),
        ({"policy": "fastest"}, "adaptive, dynamic, reroute"),
        ({"mtbf_s": 0.0}, "mtbf_s is 0.0"),
        ({"step_timeout_s": float("inf")}, "step_timeout_s is inf"),
        ({"heartbeat_timeout_s": 0.05}, "make the timeout longer"),
    ],
    ids=lambda v: str(v),
)
def test_bad_values_name_the_field_and_the_fix(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        dataclasses.replace(scenarios.job(), **changes)  # type: ignore[arg-type]


def test_every_policy_name_is_accepted() -> None:
    for name in settings.Policy:
        assert scenarios.job(policy=name.value).policy == name.value
