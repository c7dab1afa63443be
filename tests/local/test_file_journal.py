"""The run directory's journal (`planaria.local.journal.FileJournal`).

Covered: a record written and read back is equal (epoch, kind, resume step, plan, profile, the
layer copies, the planned flag); a second record replaces the first; the file is 0600 and no
temporary file is left beside it; no file reads as None and `remove` forgets the record; a
truncated file, a file of another format, one missing a field, one with a bad plan and one
with a bad epoch each fail with JournalCorrupt naming the file and the way out; another job's
record fails with JournalOfAnotherJob naming both jobs.
"""

from __future__ import annotations

import dataclasses
import json
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from planaria.control import status
from planaria.local import journal
from tests.control import scenarios


@pytest.mark.asyncio
async def test_a_record_round_trips_and_a_later_one_replaces_it(tmp_path: Path) -> None:
    log = journal.FileJournal(tmp_path, "tiny")
    assert log.read() is None
    first = scenarios.epoch_record()
    await log.record(first)
    back = log.read()
    assert back == first and back is not None and back.plan == first.plan
    assert back.transfers == first.transfers and back.planned
    later = dataclasses.replace(
        first, epoch=4, kind=status.MoveKind.REROUTE, resume_step=57, planned=False
    )
    await log.record(later)
    assert log.read() == later
    assert [p.name for p in tmp_path.iterdir()] == [journal.FILE_NAME]  # no temporary left
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600
    log.remove()
    assert log.read() is None and not log.path.exists()


def _damaged(change: Callable[[dict[str, object]], object]) -> bytes:
    """A valid record's file with `change` applied to its JSON object."""
    document = json.loads(journal.encode(scenarios.epoch_record(), "tiny"))
    change(document)
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(
            journal.encode(scenarios.epoch_record(), "tiny")[:40], "Unterminated", id="truncated"
        ),
        pytest.param(_damaged(lambda d: d.update(format="x")), "not a planaria-journal", id="x"),
        pytest.param(
            _damaged(lambda d: d.pop("profile")), "no text field 'profile'", id="no profile"
        ),
        pytest.param(_damaged(lambda d: d.update(plan="CAD/")), "journal.json", id="a bad plan"),
        pytest.param(_damaged(lambda d: d.update(epoch="x")), "invalid literal", id="bad epoch"),
    ],
)
def test_a_corrupt_file_names_itself_and_the_way_out(
    tmp_path: Path, data: bytes, message: str
) -> None:
    path = tmp_path / journal.FILE_NAME
    path.write_bytes(data)
    with pytest.raises(journal.JournalCorrupt, match=message) as caught:
        journal.FileJournal(tmp_path, "tiny").read()
    assert str(path) in str(caught.value) and "delete it to start the job over" in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.asyncio
async def test_another_jobs_record_names_both_jobs(tmp_path: Path) -> None:
    await journal.FileJournal(tmp_path, "tiny").record(scenarios.epoch_record())
    with pytest.raises(journal.JournalOfAnotherJob, match="job 'tiny', not 'other': give --name"):
        journal.FileJournal(tmp_path, "other").read()
