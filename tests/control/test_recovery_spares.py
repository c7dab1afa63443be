"""Recoveries and spare workers still setting up an older epoch, in simulated time.

Covers (planaria.control.recovery, `Handler._choose`): a spare still in its set-up of a given-up
scale-up is left out of a recovery that has a plan without it (its Configure would wait behind
that set-up and time the new epoch's rendezvous out), and a scale-up takes it in once the
set-up is over; when no plan fits without it, the recovery waits for that set-up to end and
plans with it, rather than suspending or opening an epoch that cannot form. A planned move
ahead of preemption notices leaves such a spare out too (`switches.Switches.evacuation`).

The scenario of both is chaos seed 10 of the pipeline config (docs/chaos.md, and
test_membership_changes.py): Configures that take longer than the switch's lead make the
first scale-up given up, while the newcomer, which accepted it, is in a cold set-up of 7 s;
two workers then die.
"""

from __future__ import annotations

import pytest

from planaria.control import settings, status
from planaria.wire import messages
from tests.control import scenarios

pytestmark = pytest.mark.asyncio


async def _deaths_during_a_given_up_set_up(job: settings.JobSettings) -> scenarios.Run:
    """Run `job` until worker 3 died, came back, accepted a scale-up that was given up, and
    workers 5 and 7 died while 3 still sets that scale-up's epoch up."""
    run = await _a_given_up_set_up(job)
    run.cluster.kill(5)
    run.cluster.kill(7)
    return run


async def _a_given_up_set_up(job: settings.JobSettings) -> scenarios.Run:
    """Run `job` until worker 3 died, came back and accepted a scale-up that was given up,
    whose epoch it still sets up."""
    run, given_up = await scenarios.given_up_scale_up(job)
    await run.until(lambda: (f"epoch-{given_up}", 8) in run.cluster.failed_epochs)
    newcomer = run.cluster.agent(3)
    assert (newcomer.epoch, newcomer.state) == (given_up, messages.AgentState.CONFIGURING)
    return run


def _job(mib: int | None = None, **changes: object) -> settings.JobSettings:
    """The job, its profile's steps as long as the fake agents' (`scenarios.paced`), so that
    the scale-up pays and is tried (`Planner.grow` weighs it); `mib`: device memory."""
    source = scenarios.small_profile() if mib is None else scenarios.small_profile(mib)
    return scenarios.job(
        steps=120,
        step_timeout_s=4.0,
        configure_timeout_s=5.0,
        profile=scenarios.paced(source),
        **changes,
    )


async def test_a_recovery_leaves_out_a_spare_still_setting_up_a_given_up_epoch() -> None:
    # The five survivors and the newcomer make three full pipelines, the adaptive policy's
    # choice when the newcomer is offered; but it would take the Configure up only once its
    # set-up ends: its peers' rendezvous (4 s) timed out and the same plan regrouped.
    run = await _deaths_during_a_given_up_set_up(_job())
    await run.until(lambda: len(run.controller.recoveries) == 2)
    recovered = run.controller.recoveries[1]
    assert recovered.failed == (5, 7) and recovered.kind != status.MoveKind.RESTART
    assert 3 not in run.cluster.sent[recovered.epoch][0].plan.workers
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 120
    plan = run.controller.plan
    assert plan is not None and sorted(plan.workers) == [0, 1, 2, 3, 4, 6]
    # one recovery for the deaths, no regroup after it, then the scale-up that takes 3 in
    assert [(r.failed, r.planned) for r in run.controller.recoveries] == [
        ((3,), False),
        ((5, 7), False),
        ((), True),
    ]
    assert sum(r.lost_steps for r in run.controller.recoveries) == 0
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_a_recovery_that_needs_a_spare_still_setting_up_waits_for_its_set_up() -> None:
    # 24 MiB per GPU and the dynamic policy: no plan on the five survivors, one on six. The
    # recovery waits for the newcomer's set-up to end and opens one epoch with it; offered at
    # once, the epoch's rendezvous timed out waiting for it and a regroup followed.
    job = _job(24, policy="dynamic")
    run = await _deaths_during_a_given_up_set_up(job)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 120
    phases = {published.phase for published in run.sink.published}
    assert status.Phase.SUSPENDED not in phases
    [_, recovered] = run.controller.recoveries
    assert recovered.failed == (5, 7) and recovered.lost_steps == 0
    assert sorted(run.cluster.sent[recovered.epoch][0].plan.workers) == [0, 1, 2, 3, 4, 6]
    assert sorted(run.cluster.sent) == [1, 2, 3, recovered.epoch]  # no epoch after it
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_a_move_ahead_of_preemption_leaves_out_a_spare_still_setting_up() -> None:
    # The same spare, and notices for workers 5 and 7 instead of their deaths: the planned
    # move away from them is planned without the spare (`Switches.evacuation`), as a recovery.
    run = await _a_given_up_set_up(_job())
    run.cluster.notice(5)
    run.cluster.notice(7)
    await run.until(lambda: any(r.planned and r.failed for r in run.controller.recoveries))
    [moved] = [r for r in run.controller.recoveries if r.planned and r.failed]
    assert moved.failed == (5, 7) and moved.lost_steps == 0
    assert 3 not in run.cluster.sent[moved.epoch][0].plan.workers
    run.cluster.kill(5)
    run.cluster.kill(7)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 120
    assert run.ranks_ok() == [] and run.cluster.violations == []
