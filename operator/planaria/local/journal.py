"""`FileJournal`: the epoch a `planaria run` controller opened last, in its run directory, so that
a controller started again after a crash (SIGKILL, a lost terminal) adopts the agents that still
run (`ports.Journal`, `Controller(adopt=...)`; docs/local-mode.md).

    journal = FileJournal(run_dir, job="tiny")
    await journal.record(entry)          # before the epoch's Configures go out
    entry = journal.read()               # the next controller: the EpochRecord, or None

`<run_dir>/journal.json` holds one JSON object (the same content as the operator's state
ConfigMap, `planaria.kube.journal`):

    format, version        "planaria-journal", 1
    job                    the job's name (a run directory holds one job's agents)
    epoch, kind, resumeStep  the record's scalars
    profile                the planner's profile as its file's text (`profile_file`)
    plan                   the plan, `planaria.v1.Plan` serialized (`planner_codec`), base64

A record replaces the file atomically (a temporary file written, fsynced, renamed over it, the
folder fsynced), mode 0600: a reader sees the old record or the new one, never a torn one.

Errors: `JournalCorrupt` (a ValueError) for a file that does not decode: the message names the
file and says to delete it to start the job over; `JournalOfAnotherJob` (a ValueError) for
another job's record: the message names both jobs and what to give instead. I/O failures are
OSErrors (the controller logs a failed record and goes on, ports.Journal).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any

from google.protobuf import message as protobuf

from planaria.control import ports
from planaria.spec import profile_file
from planaria.v1 import agent_pb2
from planaria.wire import errors as wire_errors
from planaria.wire import planner_codec

FILE_NAME = "journal.json"
FORMAT = "planaria-journal"
VERSION = 1
FILE_MODE = 0o600


class JournalCorrupt(ValueError):
    """The journal file does not hold a readable epoch record; names the file and the fix."""


class JournalOfAnotherJob(ValueError):
    """The journal file records another job's epoch; names both jobs and the fix."""


def encode(entry: ports.EpochRecord, job: str) -> bytes:
    """The journal file's bytes for `entry`, an epoch of job `job`."""
    plan = planner_codec.encode_plan(entry.plan).SerializeToString()
    document = {
        "format": FORMAT,
        "version": VERSION,
        "job": job,
        "epoch": entry.epoch,
        "kind": entry.kind,
        "resumeStep": entry.resume_step,
        "profile": profile_file.render_profile(entry.profile),
        "plan": base64.b64encode(plan).decode("ascii"),
    }
    return json.dumps(document, indent=1).encode()


def decode(data: bytes, source: str, job: str) -> ports.EpochRecord:
    """The record of job `job` in a journal file's bytes; JournalCorrupt names `source` when it
    is bad, JournalOfAnotherJob when it is another job's."""
    fix = "delete it to start the job over"
    try:
        document: dict[str, Any] = json.loads(data)
        if document.get("format") != FORMAT or document.get("version") != VERSION:
            raise JournalCorrupt(f"{source}: not a {FORMAT} version {VERSION} file; {fix}")
        if document["job"] != job:
            raise JournalOfAnotherJob(
                f"{source} records job {document['job']!r}, not {job!r}: give --name "
                f"{document['job']} to continue it, or another --out"
            )
        message = agent_pb2.Plan.FromString(base64.b64decode(document["plan"], validate=True))
        return ports.EpochRecord(
            epoch=int(document["epoch"]),
            plan=planner_codec.decode_plan(message),
            kind=str(document["kind"]),
            resume_step=int(document["resumeStep"]),
            profile=profile_file.parse_profile(document["profile"], source=f"{source} profile"),
        )
    except (JournalCorrupt, JournalOfAnotherJob):
        raise
    except KeyError as exc:
        raise JournalCorrupt(f"{source}: no key {exc}; {fix}") from exc
    except (
        ValueError,  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        TypeError,
        AttributeError,  # a JSON document that is not an object
        binascii.Error,
        protobuf.DecodeError,
        wire_errors.WireError,
    ) as exc:
        raise JournalCorrupt(f"{source}: {exc}; {fix}") from exc


class FileJournal:
    """`ports.Journal` over `<run_dir>/journal.json` (module docstring)."""

    def __init__(self, run_dir: Path, job: str) -> None:
        self.path = run_dir / FILE_NAME
        self.job = job

    async def record(self, entry: ports.EpochRecord) -> None:
        """Replace the record atomically (off the event loop: fsync may take a while)."""
        await asyncio.to_thread(_write_atomically, self.path, encode(entry, self.job))

    def read(self) -> ports.EpochRecord | None:
        """The last record, or None when the run has none (JournalCorrupt when unreadable)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return decode(data, str(self.path), self.job)

    def remove(self) -> None:
        """Forget the record (the job ended and its agents are stopped: nothing to adopt)."""
        self.path.unlink(missing_ok=True)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, rename it over `path` and
    fsync the folder, so the rename itself survives a crash of the machine."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.unlink(missing_ok=True)  # a crashed writer's: O_CREAT keeps an old file's mode
    descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
