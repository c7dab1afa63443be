"""An epoch record as text fields: what both journals store (`ports.EpochRecord`).

The operator's state ConfigMap (`planaria.kube.journal`, its `data`) and `planaria run`'s
journal file (`planaria.local.journal`, a JSON object) hold the same fields, all strings:

    epoch, resumeStep   the record's numbers, in decimal
    kind                how the plan was made ("initial", "dynamic", "resume", ...)
    planned             "true" for a planned switch (running agents move at `resumeStep`),
                        "false" for an epoch opened after a failure, at the start or a resume
    profile             the planner's profile as its file's text (`profile_file`)
    plan                the plan, `planaria.v1.Plan` serialized (`planner_codec`), base64
    transfers           the epoch's layer copies, one base64 `planaria.v1.LayerTransfer` per
                        line (empty: none)

With the plan and the transfers a successor controller can open the recorded epoch again,
word for word, when its predecessor died before every Configure went out.

Errors: `EpochRecordError` (a ValueError) for fields that do not decode: names the source and
the field, and says to delete the journal to start the job over.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from google.protobuf import message as protobuf

from planaria.control import ports
from planaria.control import status as statuses
from planaria.spec import profile_file
from planaria.v1 import agent_pb2
from planaria.wire import errors as wire_errors
from planaria.wire import planner_codec

FIELDS = ("epoch", "kind", "planned", "resumeStep", "profile", "plan", "transfers")
_FIX = "delete it to start the job over"


class EpochRecordError(ValueError):
    """Journal fields that do not decode; names the source and the field at fault."""


def encode(entry: ports.EpochRecord) -> dict[str, str]:
    """The text fields of `entry` (module docstring)."""
    plan = planner_codec.encode_plan(entry.plan).SerializeToString()
    transfers = (planner_codec.encode_transfer(t).SerializeToString() for t in entry.transfers)
    return {
        "epoch": str(entry.epoch),
        "kind": entry.kind,
        "planned": "true" if entry.planned else "false",
        "resumeStep": str(entry.resume_step),
        "profile": profile_file.render_profile(entry.profile),
        "plan": _text(plan),
        "transfers": "\n".join(_text(t) for t in transfers),
    }


def decode(fields: Mapping[str, object], source: str) -> ports.EpochRecord:
    """The record in `fields`; EpochRecordError naming `source` when one is missing or bad."""
    missing = [f for f in FIELDS if not isinstance(fields.get(f), str)]
    if missing:
        raise EpochRecordError(f"{source}: no text field {missing[0]!r}; {_FIX}")
    text = {f: str(fields[f]) for f in FIELDS}
    if text["planned"] not in ("true", "false"):
        raise EpochRecordError(f"{source}: planned must be true or false; {_FIX}")
    try:
        plan = agent_pb2.Plan.FromString(_bytes(text["plan"]))
        transfers = [
            agent_pb2.LayerTransfer.FromString(_bytes(line))
            for line in text["transfers"].splitlines()
            if line
        ]
        return ports.EpochRecord(
            epoch=int(text["epoch"]),
            plan=planner_codec.decode_plan(plan),
            kind=statuses.MoveKind(text["kind"]),
            resume_step=int(text["resumeStep"]),
            profile=profile_file.parse_profile(text["profile"], source=f"{source} profile"),
            transfers=tuple(planner_codec.decode_transfer(t) for t in transfers),
            planned=text["planned"] == "true",
        )
    except (ValueError, binascii.Error, protobuf.DecodeError, wire_errors.WireError) as exc:
        raise EpochRecordError(f"{source}: {exc}; {_FIX}") from exc


def _text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _bytes(text: str) -> bytes:
    return base64.b64decode(text, validate=True)
