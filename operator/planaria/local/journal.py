"""`FileJournal`: the epoch a `planaria run` controller opened last, in its run directory, so that
a controller started again after a crash (SIGKILL, a lost terminal) adopts the agents that still
run (`ports.Journal`, `Controller(adopt=...)`; docs/local-mode.md).

    journal = FileJournal(run_dir, job="tiny")
    await journal.record(entry)          # before the epoch's Configures go out
    entry = journal.read()               # the next controller: the EpochRecord, or None

`<run_dir>/journal.json` holds one JSON object: `format` "planaria-journal", `version` 1, `job`
(the job's name: a run directory holds one job's agents) and the record's text fields, the same
as the operator's state ConfigMap holds (`planaria.spec.epoch_record`: epoch, kind, planned,
resumeStep, profile, plan, transfers), so a successor can open the epoch again word for word.

A record replaces the file atomically (a temporary file written, fsynced, renamed over it, the
folder fsynced), mode 0600: a reader sees the old record or the new one, never a torn one.

Errors: `JournalCorrupt` (a ValueError) for a file that does not decode: the message names the
file and says to delete it to start the job over; `JournalOfAnotherJob` (a ValueError) for
another job's record: the message names both jobs and what to give instead. I/O failures are
OSErrors (the controller logs a failed record and goes on, ports.Journal).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from planaria.control import ports
from planaria.spec import epoch_record

FILE_NAME = "journal.json"
FORMAT = "planaria-journal"
VERSION = 1
FILE_MODE = 0o600
FIX = "delete it to start the job over"


class JournalCorrupt(ValueError):
    """The journal file does not hold a readable epoch record; names the file and the fix."""


class JournalOfAnotherJob(ValueError):
    """The journal file records another job's epoch; names both jobs and the fix."""


def encode(entry: ports.EpochRecord, job: str) -> bytes:
    """The journal file's bytes for `entry`, an epoch of job `job`."""
    document = {"format": FORMAT, "version": VERSION, "job": job, **epoch_record.encode(entry)}
    return json.dumps(document, indent=1).encode()


def decode(data: bytes, source: str, job: str) -> ports.EpochRecord:
    """The record of job `job` in a journal file's bytes; JournalCorrupt names `source` when it
    is bad, JournalOfAnotherJob when it is another job's."""
    try:
        document = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise JournalCorrupt(f"{source}: {exc}; {FIX}") from exc
    header = (document.get("format"), document.get("version")) if isinstance(document, dict) else ()
    if header != (FORMAT, VERSION):
        raise JournalCorrupt(f"{source}: not a {FORMAT} version {VERSION} file; {FIX}")
    if document.get("job") != job:
        raise JournalOfAnotherJob(
            f"{source} records job {document.get('job')!r}, not {job!r}: give --name "
            f"{document.get('job')} to continue it, or another --out"
        )
    try:
        return epoch_record.decode(document, source)
    except epoch_record.EpochRecordError as exc:
        raise JournalCorrupt(str(exc)) from exc


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
