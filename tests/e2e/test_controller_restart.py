"""`planaria run` killed with SIGKILL mid-recovery and run again: the new controller adopts the
agents the old one left running (planaria.cli.run, planaria.local.journal, the backend's adoption;
docs/local-mode.md "A controller killed and started again").

Covers, with real processes: a job run as `python -m planaria run` with a worker killed at step 3
(--fail); its controller SIGKILLed as soon as the journal holds the recovery's epoch (the first
without worker 1, after the record, while the Configures go out: mid-recovery); the same command
again says it adopts the journalled epoch from the agents still running, drops the --fail the old
process already fired, and ends Succeeded; the persistent checkpoint of the last step equals the
fault-free reference bitwise (exact reduction; tests/chaos/invariant.py compares); afterwards no
agent process of either controller remains (pids checked with their start times, and their
sessions), the job's /dev/shm stores and the journal are gone. Also, in process: a second controller
of a run directory is refused while the first holds its lock, naming its pid; a journal whose agents
are all gone starts the job over, saying so. A controller SIGKILLed in the middle of steady
training: the next resumes past the last step the first showed (the whole run's steps in metrics.csv
never go back: nothing trained again), the result is bitwise the reference, and summary.md lists
both controllers (RUN/progress.jsonl). SIGTERM mid-training (exit 143, no agent left), then the same
command: it starts over and says, on the console and in summary.md, the step the interrupted run
reached.

The test process makes itself a child subreaper while it runs: the old controller's agents are
re-parented to it, as they would be to init, and it reaps them (PID 1 of some sandboxes, this
one's included, reaps nobody, which would leave zombies that are no fault of the job's).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from planaria.agent.state import checkpoints
from planaria.cli import run
from planaria.control import ports, status
from planaria.local import adoption, journal
from planaria.spec import conversion, job_file
from tests.chaos import invariant, processes

STEPS = 12
KILL_WITHIN_S = 120.0
# A kill just after a Configure can leave an agent retrying the dead store for 2 x 60 s before
# it takes the next epoch (docs/local-mode.md): rare, bounded, and slow; the bound allows it.
SECOND_RUN_S = 240.0
# The jobs of these tests differ only in the lines after `seed` (JOB_TEXT's {rest}).
JOB_TEXT = """\
model: tiny
workers: 3
steps: {steps}
microBatchSize: 1
globalBatchSize: 4
optimizer: {{lr: 0.003, eps: 0.000001}}
data: {{corpusPaths: [{corpus}]}}
reduction: exact
faultTolerance: 1
timeouts: {{heartbeatSeconds: 3, stepSeconds: 10, configureSeconds: 20}}
{rest}"""
JOB = JOB_TEXT.replace(
    "{rest}",
    "seed: 5\nsnapshots: {{intervalSteps: 1, redundancy: xor}}\n"
    "checkpoints: {{dir: {checkpoints}, intervalSteps: 2}}\npolicy: dynamic\n",
)


@pytest.fixture
def subreaper() -> Iterator[None]:
    """This process as the child subreaper of its descendants while the test runs."""
    try:
        with processes.subreaper():
            yield
    except OSError as exc:
        pytest.skip(f"no child subreaper here: {exc}")


def _job_file(tmp_path: Path, corpus: Path) -> Path:
    path = tmp_path / "job.yaml"
    text = JOB.format(steps=STEPS, corpus=corpus, checkpoints=tmp_path / "checkpoints")
    path.write_text(text)
    return path


def _command(job_path: Path, out: Path, name: str, shm: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "planaria", "run", str(job_path), "--out", str(out)),
        *("--name", name, "--no-progress", "--fail", "step=3:worker=1"),
        *("--snapshot-base", str(shm)),
    ]


def _kill_mid_recovery(command: list[str], out: Path, name: str, log: Path) -> None:
    """Run `command` until its journal holds the recovery from worker 1's loss (an epoch
    without worker 1), then SIGKILL it. (On a loaded machine a regroup of all three workers
    can come first; the kill waits past it.)"""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as sink:
        first = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + KILL_WITHIN_S
        while 1 in _journalled_workers(out, name):
            assert first.poll() is None, f"it ended first: {log.read_text()}"
            assert time.monotonic() < deadline, f"no recovery epoch: {log.read_text()}"
            time.sleep(0.005)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()


def _journalled_workers(out: Path, name: str) -> set[int]:
    """The workers of the journalled epoch's plan; {1} before the journal is written."""
    try:
        record = journal.decode((out / journal.FILE_NAME).read_bytes(), "journal", name)
    except FileNotFoundError:
        return {1}
    return {int(w) for w in record.plan.workers}


def _agents(out: Path, recorder: processes.Recorder) -> set[int]:
    """Record the pids in the run's pid files; returns those whose process still runs."""
    found = {entry[0] for entry in adoption.running(out / "workers").values()}
    for path in (out / "workers").glob("worker-*.pid"):
        entry = adoption.read(path)
        if entry is not None:
            recorder.add([entry[0]])
    return found


def _run_again(command: list[str], log: Path) -> tuple[int, str]:
    """Run `command` to its end (Ctrl-C past SECOND_RUN_S); its exit status and output."""
    with open(log, "wb") as sink:
        second = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        code = second.wait(SECOND_RUN_S)
    except subprocess.TimeoutExpired:
        second.send_signal(signal.SIGINT)  # it stops its agents and writes its report
        code = second.wait(60.0)
    return code, log.read_text()


@pytest.mark.usefixtures("subreaper")
def test_a_controller_killed_mid_recovery_is_adopted_by_the_next_and_the_job_ends_exact(
    tmp_path: Path, corpus: Path, shm: Path
) -> None:
    name, out = f"restart-{uuid.uuid4().hex[:8]}", tmp_path / "run"
    job_path = _job_file(tmp_path, corpus)
    command = _command(job_path, out, name, shm)
    recorder = processes.Recorder()
    try:
        _kill_mid_recovery(command, out, name, tmp_path / "first.log")
        assert _agents(out, recorder), "the SIGKILLed controller left no agent running"
        code, said = _run_again(command, tmp_path / "second.log")
        _agents(out, recorder)
    finally:
        processes.reap(set(recorder.started))
        leaked = recorder.leaked()
        processes.kill(leaked)
    assert code == 0, said
    adopting = re.search(r"adopting epoch (\d+) from a previous controller \((\d) agents", said)
    assert adopting is not None and int(adopting[1]) >= 2 and int(adopting[2]) >= 1, said
    assert "1 failure(s) at or before step" in said, said
    assert f"Succeeded at step {STEPS}" in said, said
    settings = conversion.to_settings(job_file.load_job(job_path).spec, name, str(corpus))
    problems: list[str] = []
    states = checkpoints.load_checkpoint(tmp_path / "checkpoints", STEPS)
    differing = invariant.compare(states, settings, STEPS, problems)
    assert not problems and differing == 0, problems
    assert leaked == () and not (shm / name).exists()
    assert not (out / journal.FILE_NAME).exists()


def test_a_second_controller_of_a_run_is_refused_while_the_first_holds_it(
    tmp_path: Path,
) -> None:
    refused = pytest.raises(run.RunCommandError, match=f"pid {os.getpid()}.*another --out")
    with run._run_lock(tmp_path), refused, run._run_lock(tmp_path):
        pass
    with run._run_lock(tmp_path):  # released with its holder
        assert (tmp_path / run.LOCK_FILE).read_text() == f"{os.getpid()}\n"


@pytest.mark.asyncio
async def test_a_journal_whose_agents_are_gone_starts_the_job_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _record()
    await journal.FileJournal(tmp_path, "over").record(record)
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "worker-0.pid").write_text("999999999 1\n")  # long gone
    backend, adopt = await run._backend("over", tmp_path, record)
    try:
        assert adopt is None and backend.alive() == ()
    finally:
        await backend.shutdown()
    assert "none of its agents runs: starting the job over" in capsys.readouterr().out


def _record() -> ports.EpochRecord:
    from planaria.contract import plan
    from planaria.control import planning
    from tests.control import scenarios

    settings = scenarios.job()
    assert settings.profile is not None
    move = planning.Planner(settings.profile, settings).best(
        frozenset(plan.WorkerId(w) for w in range(8)), status.MoveKind.INITIAL
    )
    return ports.EpochRecord(
        epoch=2,
        plan=move.plan,
        kind=status.MoveKind.DYNAMIC,
        resume_step=7,
        profile=settings.profile,
    )


# A steady job for the kill in the middle of training: long enough that the kill lands well
# before the end, short enough for CI (tiny model, one snapshot and a checkpoint at the end).
STEADY_STEPS = 240
KILL_AFTER_STEP = 25
SIGTERM_STEPS = 80
STEADY = JOB_TEXT.replace(
    "{rest}",
    "seed: 7\nsnapshots: {{intervalSteps: 1, redundancy: copy}}\n"
    "checkpoints: {{dir: {checkpoints}, intervalSteps: {steps}}}\n",
)
PROGRESS = re.compile(r"Running +step (\d+)/")


def _kill_while_training(command: list[str], log: Path) -> int:
    """Run `command` until its progress shows step KILL_AFTER_STEP or later committed, then
    SIGKILL it; returns the last step it showed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as sink:
        first = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    shown = 0
    try:
        deadline = time.monotonic() + KILL_WITHIN_S
        while shown < KILL_AFTER_STEP:
            assert first.poll() is None, f"it ended first: {log.read_text()}"
            assert time.monotonic() < deadline, f"no progress: {log.read_text()}"
            time.sleep(0.05)
            shown = max((int(m) for m in PROGRESS.findall(log.read_text())), default=0)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    return shown


@pytest.mark.usefixtures("subreaper")
def test_a_controller_killed_while_training_is_adopted_without_losing_progress(
    tmp_path: Path, corpus: Path, shm: Path
) -> None:
    """#19: the successor resumes from the step the agents committed, not from step 0, and the
    job still ends equal to the fault-free reference, bit for bit."""
    name, out = f"steady-{uuid.uuid4().hex[:8]}", tmp_path / "run"
    job_path, command = _steady(tmp_path, corpus, shm, name)
    recorder = processes.Recorder()
    try:
        shown = _kill_while_training(command, tmp_path / "first.log")
        assert _agents(out, recorder), "the SIGKILLed controller left no agent running"
        code, said = _run_again(command, tmp_path / "second.log")
        _agents(out, recorder)
    finally:
        processes.reap(set(recorder.started))
        leaked = recorder.leaked()
        processes.kill(leaked)
    assert code == 0, said
    # Epoch 1 unless the first controller regrouped before its kill (a heartbeat lost on a
    # loaded machine): the epoch the agents run is adopted, whichever it is.
    assert re.search(r"adopting epoch \d+ from a previous controller \(3 agents", said), said
    assert f"Succeeded at step {STEADY_STEPS}" in said, said
    trained = [int(row.split(",")[1]) for row in (out / "metrics.csv").read_text().split()[1:]]
    # The whole run's steps, the first controller's included, never go back: none trained again.
    assert trained and trained[0] <= shown and trained == sorted(trained), (shown, trained, said)
    settings = conversion.to_settings(job_file.load_job(job_path).spec, name, str(corpus))
    problems: list[str] = []
    states = checkpoints.load_checkpoint(tmp_path / "checkpoints", STEADY_STEPS)
    assert invariant.compare(states, settings, STEADY_STEPS, problems) == 0 and not problems
    assert leaked == () and not (shm / name).exists()
    summary = (out / "summary.md").read_text()  # the report covers both controllers
    assert (
        "stopped without a report (killed)" in summary and "2. this controller: adopted" in summary
    )


def _committed(out: Path) -> int:
    """The newest step the run log (RUN/progress.jsonl) records as committed (0 before any)."""
    try:
        lines = (out / "progress.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = (json.loads(line).get("step") for line in lines[:-1])  # the last may be half-written
    return max((step["step"] for step in steps if step is not None), default=0)


def _steady(
    tmp_path: Path, corpus: Path, shm: Path, name: str, steps: int = STEADY_STEPS
) -> tuple[Path, list[str]]:
    job_path = tmp_path / "job.yaml"
    text = STEADY.format(steps=steps, corpus=corpus, checkpoints=tmp_path / "checkpoints")
    job_path.write_text(text)
    command = [
        *(sys.executable, "-m", "planaria", "run", str(job_path), "--out", str(tmp_path / "run")),
        *("--name", name, "--no-progress", "--snapshot-base", str(shm)),
    ]
    return job_path, command


@pytest.mark.usefixtures("subreaper")
def test_a_run_stopped_by_sigterm_then_run_again_starts_over_and_says_what_it_lost(
    tmp_path: Path, corpus: Path, shm: Path
) -> None:
    """#19: SIGTERM stops the agents (nothing left to adopt); the same command again starts the
    job over, says so on the console and in its report, with the step the first run reached."""
    name, out = f"sigterm-{uuid.uuid4().hex[:8]}", tmp_path / "run"
    # Long enough that the first run is still training when the signal comes (it is sent once
    # step 5 is committed), short enough that the second run, from step 0, is not most of the
    # test. The run log has every committed step as it happens; the plain console prints a line
    # every few seconds, and 40 steps could end before one showed step 5 (an idle machine).
    _, command = _steady(tmp_path, corpus, shm, name, steps=SIGTERM_STEPS)
    recorder = processes.Recorder()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        log = tmp_path / "first.log"
        with open(log, "wb") as sink:
            first = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + KILL_WITHIN_S
        while _committed(out) < 5:
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        _agents(out, recorder)
        first.send_signal(signal.SIGTERM)
        assert first.wait(60.0) == 143, log.read_text()
        assert not _agents(out, recorder), "SIGTERM left agents running"
        code, said = _run_again(command, tmp_path / "second.log")
        _agents(out, recorder)
    finally:
        processes.reap(set(recorder.started))
        leaked = recorder.leaked()
        processes.kill(leaked)
    assert code == 0 and leaked == (), said
    assert "adopting" not in said
    lost = re.search(r"started over: the previous run in this directory reached step (\d+)", said)
    assert lost is not None and int(lost[1]) >= 5, said
    assert "(Interrupted by SIGTERM at step" in said
    assert f"This run {lost[0]}" in (out / "summary.md").read_text()
