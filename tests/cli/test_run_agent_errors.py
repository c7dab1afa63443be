"""`planaria run` whose agents fail on the job's data (the real command in a subprocess), and the
progress lines and report that say why.

Covers: a corpus path that does not exist, an empty file and an empty directory (each a
`data.corpusPaths` every agent latches INVALID_DATA for when it sets up epoch 1) end the run
Failed, exit 1, within the bound; the plain progress says why under the Failed line, the last
console line says Failed with the cause (the path and what is wrong with it) and where the
report is, summary.md's first line says the same; nothing is left behind: no agent process of
the job, no snapshot store under --snapshot-base, no traceback. As pure functions: the plain
progress prints the message under a Suspended or Failed line only, and a failed run's summary
names the cause in its first line, an interrupted one's does not. The bound is a test timeout,
not a performance claim (the run is killed past it): the agents' start (torch's import on 2
shared cores) takes most of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from planaria.cli import progress, run_report
from planaria.control import status as statuses
from tests.chaos import processes

BOUND_S = 90.0
COMMAND = (sys.executable, "-m", "planaria", "run")
CAUSE = "workers 0,1: the job's data cannot be read: corpus path '/x' does not exist"
JOB = "workers: 2\nsteps: 4\nmicroBatchSize: 1\nglobalBatchSize: 2\ndata: {{corpusPaths: [{}]}}\n"


def _missing(folder: Path) -> tuple[Path, str]:
    path = folder / "no-such-corpus"
    return path, f"corpus path '{path}' does not exist; name a file or directory"


def _empty_file(folder: Path) -> tuple[Path, str]:
    path = folder / "empty.txt"
    path.write_bytes(b"")
    return path, f"corpus '{path}' is empty: no non-empty files"


def _empty_directory(folder: Path) -> tuple[Path, str]:
    path = folder / "empty"
    path.mkdir()
    return path, f"corpus '{path}' is empty: no non-empty files"


@pytest.mark.parametrize(
    "corpus",
    [_missing, _empty_file, _empty_directory],
    ids=[
        "a corpus path that does not exist fails the run with its cause",
        "an empty corpus file fails the run with its cause",
        "an empty corpus directory fails the run with its cause",
    ],
)
def test_a_corpus_the_agents_cannot_read_fails_the_run_and_says_why(
    tmp_path: Path, corpus: Callable[[Path], tuple[Path, str]]
) -> None:
    path, problem = corpus(tmp_path)
    (tmp_path / "job.yaml").write_text(JOB.format(f"'{path}'"), encoding="utf-8")
    name, out, shm = f"data-{uuid.uuid4().hex[:8]}", tmp_path / "out", tmp_path / "shm"
    argv = [*COMMAND, "job.yaml", "--name", name, "--no-progress", "--out", str(out)]
    argv += ["--snapshot-base", str(shm)]
    try:
        done = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, timeout=BOUND_S, check=False
        )
    finally:
        left = processes.agents_of(name)
        processes.kill(left)  # what a failed run left, so it does not outlive the test
    assert done.returncode == 1, done.stdout + done.stderr
    cause = f"workers 0,1: the job's data cannot be read: {problem}"
    lines = done.stdout.splitlines()
    failed = next(i for i, line in enumerate(lines) if "] Failed " in line)
    assert lines[failed + 1].startswith(f"  {cause}"), lines
    assert lines[-1].startswith(f"planaria run: Failed at step 0: {cause}"), lines[-1]
    assert lines[-1].endswith(
        f"; report in {out}/ (summary.md, timeline.png, metrics.csv, metrics.json, recoveries.json)"
    )
    first = (out / "summary.md").read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(f"# Run of job `{name}`: Failed at step 0: {cause}"), first
    assert not any("lost" in line for line in lines)
    assert left == [] and not (shm / name).exists()
    assert "Traceback" not in done.stderr


def _status(phase: statuses.Phase, message: str) -> statuses.JobStatus:
    view = statuses.View(
        phase=phase,
        epoch=1,
        step=0,
        loss=None,
        samples_per_s=0.0,
        live_workers=2,
        total_workers=2,
        plan=None,
        plan_kind=statuses.MoveKind.INITIAL,
        recoveries=(),
        message=message,
    )
    return statuses.compute(view)


def test_plain_progress_says_what_it_waits_for_and_why_it_stopped() -> None:
    stream = io.StringIO()
    sink = progress.Progress(steps=4, live=False, stream=stream, every_s=3600.0)
    for phase, message in [
        (statuses.Phase.PENDING, "starting workers"),
        (statuses.Phase.PROFILING, "profiling tiny"),
        (statuses.Phase.RUNNING, "training"),  # no message under a training line
        (statuses.Phase.SUSPENDED, "suspended: every worker of the plan is lost; ..."),
        (statuses.Phase.FAILED, CAUSE),
        (statuses.Phase.FAILED, CAUSE),  # the same phase again: throttled
    ]:
        asyncio.run(sink.publish(_status(phase, message)))
    sink.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 9, lines
    assert [lines[i].split()[2] for i in (0, 2, 4, 5, 7)] == [
        "Pending",
        "Profiling",
        "Running",
        "Suspended",
        "Failed",
    ]
    assert [lines[i] for i in (1, 3, 6, 8)] == [
        "  starting workers",
        "  profiling tiny",
        "  suspended: every worker of the plan is lost; ...",
        f"  {CAUSE}",
    ]


def test_the_summary_of_a_failed_run_names_the_cause_in_its_first_line() -> None:
    history = run_report.History(
        job="tiny",
        global_batch_size=2,
        final=_status(statuses.Phase.FAILED, CAUSE),
        steps=(),
        recoveries=(),
        started_s=0.0,
        finished_s=5.0,
    )
    first = run_report.summary(history).splitlines()[0]
    assert first == f"# Run of job `tiny`: Failed at step 0: {CAUSE}"
    interrupted = dataclasses.replace(history, interrupted_by="SIGTERM")
    assert interrupted.ending == "Interrupted by SIGTERM at step 0"
