"""RUN/progress.jsonl (planaria.cli.run_log): what a controller knows of the run's earlier ones.

Covers: a controller's start, each newer committed step (never a repeated or older one) and its
end are appended as lines and read back as one segment per controller, a torn last line (a
controller killed mid-write) ignored; an adopting controller's "before" is every segment of the
run it continues (back to the last controller that started the run), none of an older run; a
controller that starts over after a run that ended on its own lost nothing, after one that was
killed or interrupted it lost what that run reached, said in one sentence with the step; the
report puts the earlier controllers' steps first, lists the controllers and says what a
start-over lost.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from planaria.cli import run_log, run_report
from planaria.control import status as statuses
from tests.control import scenarios


def _status(step: int, epoch: int = 1) -> statuses.JobStatus:
    return statuses.JobStatus(
        phase=statuses.Phase.RUNNING,
        conditions=(),
        epoch=epoch,
        step=step,
        loss=2.5,
        samples_per_s=10.0,
        live_workers=3,
        total_workers=3,
        plan="[2,1] initial",
        last_recovery=None,
        recoveries=0,
        message="",
    )


class _Wall:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _controller(out: Path, steps: list[int], *, adopted: int | None, end: str | None) -> None:
    log = run_log.ProgressLog(out, adopted_epoch=adopted, wall=_Wall())
    for step in steps:
        asyncio.run(log.publish(_status(step)))
    if end is not None:
        log.end(end, steps[-1] if steps else 0)


def test_each_controller_is_read_back_as_a_segment_of_newer_steps(tmp_path: Path) -> None:
    _controller(tmp_path, [1, 1, 3, 2, 5], adopted=None, end=None)
    _controller(tmp_path, [7, 9], adopted=1, end="Succeeded")
    with open(tmp_path / run_log.FILE_NAME, "a") as log:
        log.write('{"step": {"wall_s": 3.0, "st')  # torn by a kill
    first, second = run_log.read(tmp_path)
    assert [r.step for r in first.steps] == [1, 3, 5] and first.ended is None
    assert first.adopted_epoch is None and second.adopted_epoch == 1
    assert [r.step for r in second.steps] == [7, 9] and second.ended == "Succeeded at step 9"
    assert first.describe().endswith("saw steps 1-5 committed; stopped without a report (killed)")


def test_an_adopting_controller_continues_only_the_last_run(tmp_path: Path) -> None:
    _controller(tmp_path, [1, 2], adopted=None, end="Succeeded")  # an older, finished run
    _controller(tmp_path, [1, 4], adopted=None, end=None)
    _controller(tmp_path, [6], adopted=2, end=None)
    before = run_log.before(run_log.read(tmp_path), adopting=True)
    assert [s.last_step for s in before.earlier] == [4, 6] and before.lost_line() is None


def test_starting_over_after_a_finished_run_loses_nothing(tmp_path: Path) -> None:
    _controller(tmp_path, [1, 2], adopted=None, end="Succeeded")
    assert run_log.before(run_log.read(tmp_path), adopting=False) == run_log.Before()
    assert run_log.before([], adopting=False).lost_line() is None


def test_starting_over_after_a_kill_or_an_interrupt_says_what_was_lost(tmp_path: Path) -> None:
    _controller(tmp_path, [1, 8], adopted=None, end=None)
    lost = run_log.before(run_log.read(tmp_path), adopting=False).lost_line()
    assert lost is not None and lost.startswith("started over: the previous run in this ")
    assert "reached step 8 (its controller stopped without a report" in lost
    assert lost.endswith("its 8 committed steps were trained again")
    _controller(tmp_path, [1, 3], adopted=None, end="Interrupted by SIGTERM")
    lost = run_log.before(run_log.read(tmp_path), adopting=False).lost_line()
    assert lost is not None and "reached step 3 (Interrupted by SIGTERM at step 3)" in lost


def test_the_report_lists_the_controllers_and_what_a_start_over_lost() -> None:
    settings = scenarios.job()
    record = statuses.StepRecord(
        at_s=5.0, step=4, loss=2.0, samples_per_s=8.0, live_workers=3, epoch=1
    )
    history = run_report.History(
        job="j",
        global_batch_size=settings.training.global_batch_size,
        final=_status(4),
        steps=(record,),
        recoveries=(),
        started_s=0.0,
        finished_s=6.0,
        controllers=("controller pid 7: started, saw steps 1-3 committed; killed", "this one"),
        lost="started over: the previous run in this directory reached step 9",
    )
    text = run_report.summary(history)
    assert "## Controllers\n\n1. controller pid 7: started" in text and "\n2. this one\n" in text
    assert "This run started over: the previous run in this directory reached step 9." in text
