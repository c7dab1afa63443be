"""The job's state ConfigMap: the epoch the controller opened last, so that an operator restarted
mid-job adopts the running agents (`ports.Journal`, `Controller(adopt=...)`).

    journal = ConfigMapJournal(api, owner)
    await journal.record(entry)           # before the epoch's Configures go out
    entry = await journal.read()          # after a restart: the EpochRecord, or None

The ConfigMap `constants.state_configmap_name(job)`, owned by the job, holds:

    data.epoch, data.kind, data.resumeStep   the record's scalars, as text
    data.profile                            the planner's profile (`profile_file.render_profile`)
    binaryData.plan                         the plan, `planaria.v1.Plan` serialized
                                            (`planner_codec.encode_plan`)

`encode` and `decode` are the pure halves (dict in, record out), tested without an API.

Errors: `JournalError` (a ValueError) for a ConfigMap that does not decode (the message names
the key); API failures are `planaria.kube.api.KubeError`s (the controller logs a failed record
and goes on, ports.Journal).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from google.protobuf import message as protobuf

from planaria.control import ports
from planaria.kube import api, constants, pods
from planaria.spec import profile_file
from planaria.v1 import agent_pb2
from planaria.wire import errors as wire_errors
from planaria.wire import planner_codec

Json = dict[str, Any]


class JournalError(ValueError):
    """The state ConfigMap does not hold a readable epoch record; names the key at fault."""


def encode(entry: ports.EpochRecord) -> tuple[dict[str, str], dict[str, str]]:
    """The ConfigMap's `data` and `binaryData` (base64) for `entry`."""
    data = {
        "epoch": str(entry.epoch),
        "kind": entry.kind,
        "resumeStep": str(entry.resume_step),
        "profile": profile_file.render_profile(entry.profile),
    }
    plan = planner_codec.encode_plan(entry.plan).SerializeToString()
    return data, {"plan": base64.b64encode(plan).decode("ascii")}


def decode(body: Mapping[str, Any]) -> ports.EpochRecord:
    """The record in a state ConfigMap's body; JournalError when a key is missing or bad."""
    name = (body.get("metadata") or {}).get("name", "the state ConfigMap")
    data: Mapping[str, str] = body.get("data") or {}
    binary: Mapping[str, str] = body.get("binaryData") or {}
    try:
        message = agent_pb2.Plan.FromString(base64.b64decode(binary["plan"]))
        return ports.EpochRecord(
            epoch=int(data["epoch"]),
            plan=planner_codec.decode_plan(message),
            kind=data["kind"],
            resume_step=int(data["resumeStep"]),
            profile=profile_file.parse_profile(data["profile"], source=f"{name} profile"),
        )
    except KeyError as exc:
        raise JournalError(f"{name}: no key {exc}; delete it to start the job over") from exc
    except (ValueError, binascii.Error, protobuf.DecodeError, wire_errors.WireError) as exc:
        raise JournalError(f"{name}: {exc}; delete it to start the job over") from exc


def configmap(owner: pods.Owner, entry: ports.EpochRecord) -> Json:
    """The whole state ConfigMap of `owner` holding `entry`."""
    data, binary = encode(entry)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": pods.metadata(owner, constants.state_configmap_name(owner.name)),
        "data": data,
        "binaryData": binary,
    }


class ConfigMapJournal:
    """`ports.Journal` over the job's state ConfigMap (module docstring)."""

    def __init__(self, client: api.Api, owner: pods.Owner) -> None:
        self._api = client
        self._owner = owner
        self._name = constants.state_configmap_name(owner.name)

    async def record(self, entry: ports.EpochRecord) -> None:
        """Replace the record (merge patch); create the ConfigMap the first time."""
        data, binary = encode(entry)
        try:
            await self._api.patch(
                api.CONFIGMAPS,
                self._owner.namespace,
                self._name,
                {"data": data, "binaryData": binary},
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
