"""The job's state ConfigMap: the epoch the controller opened last, so that an operator restarted
mid-job adopts the running agents (`ports.Journal`, `Controller(adopt=...)`).

    journal = ConfigMapJournal(api, owner)
    await journal.record(entry)           # before the epoch's Configures go out
    entry = await journal.read()          # after a restart: the EpochRecord, or None

The ConfigMap `constants.state_configmap_name(job)`, owned by the job, holds the record's text
fields in `data` (`planaria.spec.epoch_record`: epoch, kind, planned, resumeStep, profile, plan,
transfers), the same fields as `planaria run`'s journal file.

`encode` and `decode` are the pure halves (dict in, record out), tested without an API.

Errors: `JournalError` (a ValueError) for a ConfigMap that does not decode (the message names
the key); API failures are `planaria.kube.api.KubeError`s (the controller logs a failed record
and goes on, ports.Journal).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planaria.control import ports
from planaria.kube import api, constants, pods
from planaria.spec import epoch_record

Json = dict[str, Any]


class JournalError(ValueError):
    """The state ConfigMap does not hold a readable epoch record; names the key at fault."""


def encode(entry: ports.EpochRecord) -> dict[str, str]:
    """The ConfigMap's `data` for `entry`."""
    return epoch_record.encode(entry)


def decode(body: Mapping[str, Any]) -> ports.EpochRecord:
    """The record in a state ConfigMap's body; JournalError when a key is missing or bad."""
    name = (body.get("metadata") or {}).get("name", "the state ConfigMap")
    try:
        return epoch_record.decode(body.get("data") or {}, name)
    except epoch_record.EpochRecordError as exc:
        raise JournalError(str(exc)) from exc


def configmap(owner: pods.Owner, entry: ports.EpochRecord) -> Json:
    """The whole state ConfigMap of `owner` holding `entry`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": pods.metadata(owner, constants.state_configmap_name(owner.name)),
        "data": encode(entry),
    }


class ConfigMapJournal:
    """`ports.Journal` over the job's state ConfigMap (module docstring)."""

    def __init__(self, client: api.Api, owner: pods.Owner) -> None:
        self._api = client
        self._owner = owner
        self._name = constants.state_configmap_name(owner.name)

    async def record(self, entry: ports.EpochRecord) -> None:
        """Replace the record (merge patch); create the ConfigMap the first time."""
        try:
            await self._api.patch(
                api.CONFIGMAPS, self._owner.namespace, self._name, {"data": encode(entry)}
            )
        except api.NotFound:
            body = configmap(self._owner, entry)
            await self._api.create(api.CONFIGMAPS, self._owner.namespace, body)

    async def read(self) -> ports.EpochRecord | None:
        """The last record, or None when the job has none yet."""
        try:
            body = await self._api.get(api.CONFIGMAPS, self._owner.namespace, self._name)
        except api.NotFound:
            return None
        return decode(body)
