"""The state ConfigMap's encoding (`planaria.kube.journal`): an epoch record round-trips.

Covered: encode -> decode gives back an equal EpochRecord (epoch, kind, planned, resume step,
the plan and the layer copies from their protobuf bytes, the profile from its JSON text); the
whole ConfigMap is owned by the job and named for it; a ConfigMap missing a key or holding a bad
plan, copy or flag fails with a JournalError that names the ConfigMap and the way out.
"""

from __future__ import annotations

import base64
import dataclasses

import pytest

from planaria.kube import constants, journal, pods
from tests.control import scenarios

OWNER = pods.Owner(name="tiny", namespace="ml", uid="u-1")


def test_an_epoch_record_round_trips_through_the_configmap() -> None:
    entry = scenarios.epoch_record()
    body = journal.configmap(OWNER, entry)
    assert body["metadata"]["name"] == constants.state_configmap_name("tiny")
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    back = journal.decode(body)
    assert back == entry
    assert back.plan == entry.plan and back.profile == entry.profile
    assert back.transfers == entry.transfers and back.planned


def test_a_record_without_copies_round_trips() -> None:
    entry = dataclasses.replace(scenarios.epoch_record(), transfers=(), planned=False)
    assert journal.decode(journal.configmap(OWNER, entry)) == entry


def test_a_configmap_without_the_plan_names_what_is_missing() -> None:
    body = journal.configmap(OWNER, scenarios.epoch_record())
    del body["data"]["plan"]
    with pytest.raises(journal.JournalError, match="tiny-state: no text field 'plan'"):
        journal.decode(body)


def test_a_configmap_with_a_bad_plan_says_to_start_over() -> None:
    body = journal.configmap(OWNER, scenarios.epoch_record())
    body["data"]["plan"] = base64.b64encode(b"\x08\x00\xff").decode()
    with pytest.raises(journal.JournalError, match="delete it to start the job over"):
        journal.decode(body)


@pytest.mark.parametrize(
    ("field", "value"),
    [("transfers", "not base64!"), ("transfers", base64.b64encode(b"\xff\xff").decode())],
)
def test_a_configmap_with_a_bad_copy_says_to_start_over(field: str, value: str) -> None:
    body = journal.configmap(OWNER, scenarios.epoch_record())
    body["data"][field] = value
    with pytest.raises(journal.JournalError, match="tiny-state: .*delete it to start the job over"):
        journal.decode(body)


def test_a_configmap_with_a_bad_planned_flag_names_it() -> None:
    body = journal.configmap(OWNER, scenarios.epoch_record())
    body["data"]["planned"] = "yes"
    with pytest.raises(journal.JournalError, match="planned must be true or false"):
        journal.decode(body)
