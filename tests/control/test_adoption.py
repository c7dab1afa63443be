"""A controller taking over a running job from its predecessor (an operator restarted mid-job).

Covers: the journal records every epoch before its Configures go out (with the plan, its kind,
the resume step and the planner's profile); a detached controller leaves the agents training;
a successor adopting the journalled epoch sends no Configure when every worker still runs in it
and the job succeeds without a lost step; a worker that died while no controller watched makes
the adopted epoch broken and the usual recovery follows, from the survivors' committed step
even when they stopped before the successor came (not from the record's resume step); agents
ahead of the journal (its write failed) are caught by the adopted epoch's bounded commit and
recovered in an epoch above theirs;
a predecessor stopped after journalling a recovery epoch but before its Configures went out:
the successor opens the same plan, copies and resume step again as the next epoch, at once (no
wait for a commit that cannot come), and the job succeeds; a journal that raises does not stop
the job.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from planaria.control import controller, epochs, ports, status
from planaria.wire import messages
from tests.control import fakes, scenarios

pytestmark = pytest.mark.asyncio


class ListJournal:
    """A `ports.Journal` keeping every record; `fail_from` makes records of that epoch on raise."""

    def __init__(self, fail_from: int | None = None, hold_at: int | None = None) -> None:
        self.records: list[ports.EpochRecord] = []
        self.fail_from = fail_from
        self.hold_at = hold_at  # the record of this epoch is kept, and then never returns
        self.sent_before: list[bool] = []
        self.cluster: fakes.FakeCluster | None = None

    async def record(self, entry: ports.EpochRecord) -> None:
        if self.cluster is not None:  # nothing of this epoch may have gone out yet
            self.sent_before.append(entry.epoch in self.cluster.sent)
        if self.fail_from is not None and entry.epoch >= self.fail_from:
            raise OSError("the API server is unreachable")
        self.records.append(entry)
        if entry.epoch == self.hold_at:
            await asyncio.Event().wait()  # the controller dies here: no Configure goes out


def _journalled(job: object, journal: ListJournal) -> scenarios.Run:
    run = scenarios.Run(job)  # type: ignore[arg-type]
    run.controller = controller.Controller(
        run.controller._job,
        run.cluster,
        clock=run.clock,
        sink=run.sink,
        journal=journal,
        executor=scenarios.INLINE,
    )
    journal.cluster = run.cluster
    return run


async def _detach_at(run: scenarios.Run, step: int) -> None:
    """Run until `step`, then stop the controller the way an operator restart does."""
    await run.until(lambda: run.step() >= step)
    run.controller.detach()
    assert run.task is not None
    run.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run.task


def _successor(run: scenarios.Run, record: ports.EpochRecord) -> scenarios.Run:
    """A new controller over the same cluster and clock, adopting `record`."""
    successor = scenarios.Run.__new__(scenarios.Run)
    successor.clock, successor.cluster, successor.task = run.clock, run.cluster, None
    successor.sink = scenarios.Sink()
    successor.controller = controller.Controller(
        run.controller._job,
        run.cluster,
        clock=run.clock,
        sink=successor.sink,
        adopt=record,
        executor=scenarios.INLINE,
    )
    return successor


async def test_every_epoch_is_journalled_before_its_configures() -> None:
    journal = ListJournal()
    run = _journalled(scenarios.job(steps=20), journal)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    (record,) = journal.records
    assert (record.epoch, record.kind, record.resume_step) == (1, "initial", 0)
    assert record.plan == run.controller.plan
    assert record.profile == run.controller.planner_profile
    assert journal.sent_before == [False]


async def test_a_detached_controller_leaves_the_agents_training() -> None:
    journal = ListJournal()
    run = _journalled(scenarios.job(steps=200), journal)
    await _detach_at(run, 10)
    step = max(a.step for a in run.cluster.agents.values())
    await scenarios.advance(1.0)
    agents = run.cluster.agents.values()
    assert all(a.state is messages.AgentState.RUNNING for a in agents)
    assert max(a.step for a in agents) > step
    assert not run.cluster.shut


async def test_a_successor_adopts_the_running_epoch_without_a_configure() -> None:
    journal = ListJournal()
    run = _journalled(scenarios.job(steps=60), journal)
    await _detach_at(run, 10)
    successor = _successor(run, journal.records[-1])
    final = await successor.finish()
    assert final.phase is status.Phase.SUCCEEDED
    assert (final.step, final.epoch, final.recoveries) == (60, 1, 0)
    assert sorted(run.cluster.sent) == [1]  # no Configure since the first epoch
    assert status.Phase.RUNNING in [s.phase for s in successor.sink.published]
    assert run.cluster.shut


async def test_a_worker_lost_between_controllers_is_recovered_after_adoption() -> None:
    journal = ListJournal()
    run = _journalled(scenarios.job(steps=60, policy="dynamic"), journal)
    await _detach_at(run, 10)
    run.cluster.kill(3)  # nobody watches: the event waits in the backend's queue
    successor = _successor(run, journal.records[-1])
    final = await successor.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    assert final.recoveries == 1 and final.last_recovery is not None
    assert final.last_recovery.failed == (3,)
    assert 3 not in run.cluster.sent[final.epoch][0].plan.workers


async def test_an_epoch_broken_while_no_controller_watched_resumes_where_the_survivors_are() -> (
    None
):
    journal = ListJournal()
    run = _journalled(scenarios.job(steps=60, policy="dynamic"), journal)
    await _detach_at(run, 10)
    run.cluster.kill(3)
    await scenarios.advance(3.0)  # the successor starts after the survivors stopped
    assert {a.heartbeat().state for w, a in run.cluster.agents.items() if w != 3} == {
        messages.AgentState.FAILED
    }
    successor = _successor(run, journal.records[-1])
    final = await successor.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    assert final.last_recovery is not None and final.last_recovery.failed == (3,)
    # Not opened again from the record's step 0: the survivors had committed step 10.
    assert all(c.resume_step >= 10 for e, sent in run.cluster.sent.items() if e > 1 for c in sent)
    assert final.recoveries == 1 and final.last_recovery.lost_steps <= 1


async def test_agents_ahead_of_the_journal_suspend_the_job_saying_why() -> None:
    journal = ListJournal(fail_from=2)  # epoch 2 opens, but is never journalled
    run = _journalled(scenarios.job(steps=80, policy="dynamic"), journal)
    await run.until(lambda: run.step() >= 5)
    run.cluster.kill(3)
    await run.until(lambda: run.controller.epoch == 2 and run.step() >= 15)
    assert [r.epoch for r in journal.records] == [1]
    await _detach_at(run, 15)
    successor = _successor(run, journal.records[-1])
    await successor.until(lambda: successor.controller.status.phase is status.Phase.SUSPENDED)
    assert "newer than the journalled epoch 1" in successor.controller.status.message
    suspended = scenarios.condition(successor.controller.status, status.ConditionType.SUSPENDED)
    assert suspended == ("True", "PlanUnknown")
    assert successor.controller._epochs.next_epoch == 3  # never stale for the agents


async def test_a_recovery_epoch_the_predecessor_never_sent_is_opened_again() -> None:
    journal = ListJournal(hold_at=2)
    run = _journalled(scenarios.job(steps=60, policy="dynamic"), journal)
    await run.until(lambda: run.step() >= 5)
    run.cluster.kill(2)  # its layers are copied from a replica: the epoch has transfers
    await run.until(lambda: len(journal.records) == 2)
    await _detach_at(run, 0)
    record = journal.records[-1]
    assert record.epoch == 2 and not record.planned and 2 not in run.cluster.sent
    assert record.transfers
    successor = _successor(run, record)
    adopted_at = run.clock.monotonic()
    final = await successor.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    assert 2 not in run.cluster.sent  # the recorded epoch opened again under the next number
    again = run.cluster.sent[3]
    assert {c.plan for c in again} == {record.plan}
    assert {c.resume_step for c in again} == {record.resume_step}
    assert {t for c in again for t in c.transfers} == set(record.transfers)
    assert final.epoch == 3 and final.recoveries == 0  # the predecessor's recovery, finished
    job = run.controller._job
    took = [s for s in successor.sink.published if s.phase is status.Phase.RUNNING]
    assert took and run.clock.monotonic() - adopted_at < job.configure_timeout_s + 60


async def test_a_failing_journal_is_retried_and_does_not_stop_the_job() -> None:
    journal = ListJournal(fail_from=1)
    run = _journalled(scenarios.job(steps=20), journal)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and journal.records == []
    assert len(journal.sent_before) == epochs.JOURNAL_ATTEMPTS
