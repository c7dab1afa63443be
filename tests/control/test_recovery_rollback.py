"""Roll-back after a death inside the commit barrier, in simulated time (planaria.control.recovery).

A worker that dies inside step c + 1's commit barrier can leave some survivors at c + 1 and
the others at c (docs/executor.md); the ones ahead must roll back to a snapshot. Their own
snapshot of c need not exist: it fails when its mirror swap meets the dead worker (or it was
skipped because a writer was busy at barrier c, or c is not a snapshot step), and the store
then holds c - 1 only (tests/agent/test_snapshot_pipeline.py shows the agent's side).

Covers: the resume step of such a roll-back is a snapshot every survivor reports holding
complete (`SnapshotState.held`), never merely the survivors' oldest step (the e2e flake of
tests/e2e/test_pipeline_release.py: resumed at c, no tier held it, Suspended for good);
without any snapshot every survivor holds, the job restarts from step 0 (the seed) rather than
sit Suspended; a restore that fails anyway (a snapshot reported held that cannot be read)
falls back to an older snapshot every survivor holds, else to step 0, with the reason in the
recovery record and never a silent suspension.
"""

from __future__ import annotations

import pytest

from planaria.contract import plan as plans
from planaria.control import status
from planaria.wire import messages
from tests.control import fakes, scenarios

pytestmark = pytest.mark.asyncio
W = plans.WorkerId
SPLIT_AT = 10  # the step every survivor committed; the ones ahead committed 11
DEAD = 1  # stage 1 of the first pipeline
AHEAD = (0, 2, 4, 6)  # every holder of stage 0 passed the barrier of step 11
BEHIND = (3, 5, 7)


def _split_barrier(
    cluster: fakes.FakeCluster, *, ahead_holds: str = "older", behind_holds: str = "both"
) -> None:
    """Once step SPLIT_AT is committed: DEAD dies inside step SPLIT_AT + 1's commit barrier,
    which AHEAD passed (they commit it) and BEHIND did not. The ahead workers' snapshot of
    SPLIT_AT failed (its mirror swap met the dead worker) and the one of SPLIT_AT + 1 was
    skipped, so their stores hold what `ahead_holds` says: "older" (SPLIT_AT - 1 only, what the
    agent's store keeps), "broken" (SPLIT_AT reported held but unreadable, then SPLIT_AT - 1)
    or "nothing". The behind workers' snapshot of SPLIT_AT holds their own members only (the
    ahead workers' members never reached them as mirrors); `behind_holds` "both" keeps their
    SPLIT_AT - 1 too, "latest" only SPLIT_AT."""

    def split(step: int) -> None:
        if step != SPLIT_AT:
            return
        cluster.on_step = None
        cluster.kill(DEAD)
        for worker in map(W, AHEAD):
            cluster.agents[worker].step = SPLIT_AT + 1
            older = cluster.shm_previous.pop(worker)
            cluster.members.pop((worker, SPLIT_AT), None)
            if ahead_holds == "older":
                cluster.shm[worker] = older
            elif ahead_holds == "broken":
                cluster.shm[worker], cluster.shm_previous[worker] = (SPLIT_AT, frozenset()), older
            else:
                cluster.shm.pop(worker)
                cluster.members.pop((worker, SPLIT_AT - 1), None)
        for worker in map(W, BEHIND):
            agent = cluster.agents[worker]
            cluster.shm[worker] = (SPLIT_AT, agent.held)
            cluster.members[worker, SPLIT_AT] = frozenset(
                m for m in cluster.members[worker, SPLIT_AT] if m[0] in agent.held
            )
            if behind_holds == "latest":
                cluster.shm_previous.pop(worker)
                cluster.members.pop((worker, SPLIT_AT - 1), None)

    cluster.on_step = split


def _run() -> scenarios.Run:
    return scenarios.Run(scenarios.job(steps=40), report_held=True)


async def _started(run: scenarios.Run) -> None:
    await run.until(lambda: run.controller.plan is not None)
    running = run.controller.plan
    assert running is not None
    stages = [[int(w) for w in s.workers] for p in running.pipelines for s in p.stages]
    assert sorted(map(tuple, stages)) == [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)]
    firsts = {int(p.stages[0].workers[0]) for p in running.pipelines}
    assert firsts == set(AHEAD) and DEAD not in firsts, running


def _resumes(run: scenarios.Run) -> list[int]:
    return [configs[0].resume_step for _, configs in sorted(run.cluster.sent.items())]


async def test_a_roll_back_resumes_at_a_snapshot_every_survivor_holds() -> None:
    run = _run()
    _split_barrier(run.cluster)
    await _started(run)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 40, final.message
    # resumed at SPLIT_AT - 1, the newest step every survivor holds; never at SPLIT_AT, which
    # no store of a stage-0 layer holds
    assert _resumes(run)[1:] == [SPLIT_AT - 1], _resumes(run)
    [recovered] = run.controller.recoveries
    assert recovered.failed == (DEAD,) and recovered.lost_steps == 2
    assert f"a survivor ahead of step {SPLIT_AT} holds no snapshot of it" in recovered.reason
    assert recovered.tier in {
        messages.RecoveryTier.LOCAL_SNAPSHOT,
        messages.RecoveryTier.PEER_SNAPSHOT,
    }
    assert run.cluster.violations == [] and run.ranks_ok() == []


async def test_a_roll_back_with_no_snapshot_every_survivor_holds_restarts_from_step_zero() -> None:
    run = _run()
    _split_barrier(run.cluster, ahead_holds="nothing", behind_holds="latest")
    await _started(run)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 40, final.message
    assert _resumes(run)[1:] == [0], _resumes(run)
    [recovered] = run.controller.recoveries
    assert recovered.tier is messages.RecoveryTier.INITIAL
    assert "step 0" in recovered.reason and "no persistent checkpoint" in recovered.reason
    assert recovered.lost_steps == SPLIT_AT + 1


async def test_a_restore_that_fails_falls_back_to_an_older_snapshot_every_survivor_holds() -> None:
    # The ahead workers report SPLIT_AT held but cannot read it (a damaged store): the resume
    # at SPLIT_AT fails with SNAPSHOT_UNAVAILABLE, and the controller takes the next option.
    run = _run()
    _split_barrier(run.cluster, ahead_holds="broken")
    await _started(run)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 40, final.message
    assert _resumes(run)[1:] == [SPLIT_AT, SPLIT_AT - 1], _resumes(run)
    assert f"the restore of step {SPLIT_AT} failed" in run.controller.recoveries[-1].reason
    assert all(p is not status.Phase.SUSPENDED for p in _phases(run))


async def test_a_restore_that_fails_with_nothing_older_restarts_from_step_zero() -> None:
    run = _run()
    _split_barrier(run.cluster, ahead_holds="broken", behind_holds="latest")
    await _started(run)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 40, final.message
    assert _resumes(run)[1:] == [SPLIT_AT, 0], _resumes(run)
    assert "restarts from step 0" in run.controller.recoveries[-1].reason
    assert all(p is not status.Phase.SUSPENDED for p in _phases(run))


def _phases(run: scenarios.Run) -> list[status.Phase]:
    return [s.phase for s in run.sink.published]
