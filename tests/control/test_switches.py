"""Planned switches, their pure parts (planaria.control.switches).

Covers: the switch step leads the current step by the lead time in steps (at least
MIN_LEAD_STEPS times the lead scale), never beyond half a step timeout of lead time, and is
None when the job's last step comes first; a longer lead never switches earlier; which refusals
of a switch only came too late (the agent still trains in an older epoch past the switch step).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.control import switches
from planaria.wire import messages

W = plans.WorkerId
RUNNING, PAUSED = messages.AgentState.RUNNING, messages.AgentState.PAUSED


def _beat(worker: int, epoch: int, state: messages.AgentState, step: int) -> messages.Heartbeat:
    return messages.Heartbeat(
        worker=W(worker),
        epoch=epoch,
        state=state,
        last_committed_step=step,
        loss=None,
        samples_processed=0,
        timings=messages.Timings(),
        snapshot=messages.SnapshotState(latest_step=None, held_bytes=0),
    )


@pytest.mark.parametrize(
    ("step_s", "lead_scale", "expected"),
    [
        (0.0, 1, 12),  # no step time known yet: the least lead
        (0.1, 1, 20),  # 1 s of steps
        (0.1, 2, 30),  # twice the lead, capped at half the 4 s step timeout
        (2.0, 4, 18),  # slow steps: the least lead, scaled
    ],
    ids=["unknown step time", "fast steps", "after a late switch", "slow steps"],
)
def test_the_switch_leads_by_a_second_of_steps_or_the_least_lead(
    step_s: float, lead_scale: int, expected: int
) -> None:
    step = switches.switch_step(
        current=10, step_s=step_s, lead_scale=lead_scale, step_timeout_s=4.0, steps=100
    )
    assert step == expected


def test_no_switch_when_the_job_ends_first() -> None:
    step = switches.switch_step(current=58, step_s=0.0, lead_scale=1, step_timeout_s=4.0, steps=60)
    assert step is None


@given(
    current=st.integers(0, 1000),
    step_s=st.just(0.0) | st.floats(1e-3, 10.0),  # measured step times: none yet, or real
    lead_scale=st.integers(1, switches.MAX_LEAD_SCALE),
    step_timeout_s=st.floats(0.1, 60.0),
    steps=st.integers(1, 2000),
)
def test_a_switch_is_ahead_within_the_job_and_a_longer_lead_never_earlier(
    current: int, step_s: float, lead_scale: int, step_timeout_s: float, steps: int
) -> None:
    def lead(scale: int, last: int) -> int | None:
        return switches.switch_step(
            current=current,
            step_s=step_s,
            lead_scale=scale,
            step_timeout_s=step_timeout_s,
            steps=last,
        )

    step = lead(lead_scale, steps)
    if step is None:
        return
    assert current + switches.MIN_LEAD_STEPS * lead_scale <= step < steps
    longer = lead(lead_scale + 1, 10**9)
    assert longer is not None and longer >= step


def test_only_refusals_of_agents_already_past_the_switch_came_too_late() -> None:
    beats = {
        W(0): _beat(0, 3, RUNNING, 21),  # trains on in epoch 3, past step 20: too late
        W(1): _beat(1, 3, RUNNING, 19),  # still before the switch: a real refusal
        W(2): _beat(2, 3, PAUSED, 25),  # stopped: a real refusal
        W(3): _beat(3, 4, RUNNING, 25),  # already in the switch's epoch
    }
    refused = {W(0), W(1), W(2), W(3), W(4)}  # 4 never reported
    assert switches.late_refusals(refused, beats, epoch=4, switch=20) == {W(0)}
