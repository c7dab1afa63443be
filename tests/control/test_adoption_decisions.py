"""How a successor takes its predecessor's epoch over, decided purely (planaria.control.adoption;
the take-overs end to end are in test_adoption.py).

Covers: agents in an epoch newer than the record mean a plan nobody knows (suspend); live
workers not training in a recorded epoch that never committed a step mean it was still opening
(open it again, unless it was a planned switch, whose workers train on in the old epoch);
otherwise the epoch is adopted (one that trained and broke since is then recovered);
opening again uses the record's plan, copies, kind and resume step.
"""

from __future__ import annotations

import dataclasses

import pytest

from planaria.contract import plan as plans
from planaria.control import adoption
from tests.control import scenarios

W = plans.WorkerId
HOW = adoption.Takeover


@pytest.mark.parametrize(
    ("newest", "unsettled", "planned", "trained", "expected", "words"),
    [
        (4, set(), False, True, HOW.UNKNOWN_PLAN, "the agents run epoch 4, newer than"),
        (4, {1}, True, False, HOW.UNKNOWN_PLAN, "their plan is unknown"),
        (3, {1}, False, False, HOW.REOPEN, "stopped while opening epoch 3"),
        (3, {1}, False, True, HOW.ADOPT, "adopting epoch 3"),
        (2, {1}, True, False, HOW.ADOPT, "adopting epoch 3"),
        (3, set(), False, True, HOW.ADOPT, "adopting epoch 3"),
    ],
    ids=[
        "agents ahead of the record",
        "agents ahead of a planned record",
        "a worker not training in an epoch that never trained",
        "workers stopped in an epoch that trained (recovered once adopted)",
        "a planned switch not reached yet",
        "every worker training in it",
    ],
)
def test_the_takeover_follows_where_the_agents_are(
    newest: int,
    unsettled: set[int],
    planned: bool,
    trained: bool,
    expected: adoption.Takeover,
    words: str,
) -> None:
    record = dataclasses.replace(scenarios.epoch_record(3), planned=planned)
    workers = {W(w) for w in unsettled}
    how, why = adoption.decide(record, newest=newest, unsettled=workers, trained=trained)
    assert how is expected and words in why


def test_opening_again_keeps_the_recorded_plan_copies_and_kind() -> None:
    record = scenarios.epoch_record(3)
    move = adoption.reopening(record, "the previous controller stopped")
    assert (move.plan, move.transfers, move.kind) == (record.plan, record.transfers, record.kind)
    assert move.reason == "the previous controller stopped"
