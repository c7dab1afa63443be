"""The controller against in-memory agents in simulated time (tests/control/fakes.py).

Covers: a job without failures (phases, ranks, stop and shutdown), profiling through an agent,
a first plan that cannot fit (Failed), a death recovered per policy (adaptive = the planner's
eq. 8 choice, dynamic = Oobleck's reinstantiation, reroute = ReCycle), deaths seen only as a
broken Watch or only as silence, a latched error of the worker's own, two deaths in quick
succession, a death during the reconfiguration (a new epoch), a Configure that never answers
(bounded, the worker left out), transfer sources inside the new plan, and the ports used only
through their Protocols.
"""

from __future__ import annotations

import dataclasses

import pytest

from planaria.contract import plan as plans
from planaria.control import clock, epochs, planning, ports, recovery, settings, status
from planaria.planner import candidates, policy, screening
from planaria.wire import messages
from tests.control import fakes, scenarios

pytestmark = pytest.mark.asyncio


def _sources_inside(run: scenarios.Run) -> bool:
    """Every transfer of every Configure has its sources and destination in that plan."""
    for configs in run.cluster.sent.values():
        for config in configs:
            members = set(config.plan.workers)
            for copy in config.transfers:
                if not {copy.destination, *copy.sources} <= members:
                    return False
    return True


async def test_a_job_without_failures_succeeds_in_one_epoch() -> None:
    run = scenarios.Run(scenarios.job(steps=30))
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    assert (final.step, final.epoch, final.recoveries) == (30, 1, 0)
    assert final.plan == "[2,2,2,2] initial"
    assert run.ranks_ok() == [] and run.cluster.violations == []
    assert run.cluster.shut
    assert all(a.state is messages.AgentState.STOPPED for a in run.cluster.agents.values())
    phases = [s.phase for s in run.sink.published]
    assert phases[0] is status.Phase.PENDING and status.Phase.RUNNING in phases
    assert [r.step for r in run.controller.steps] == sorted({r.step for r in run.controller.steps})
    assert final.samples_per_s == pytest.approx(16 / 0.1)
    config = run.cluster.sent[1][0]
    assert (config.resume_step, config.stop_step) == (0, 30)
    assert config.rendezvous.key_prefix == "epoch-1" and config.rendezvous.timeout_s == 2.0


async def test_without_a_profile_the_controller_asks_an_agent_then_opens_the_first_epoch() -> None:
    run = scenarios.Run(scenarios.job(steps=10, profile=None), profile=scenarios.small_profile())
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    published = [(s.phase, s.message, s.live_workers) for s in run.sink.published]
    assert published[:4] == [
        (status.Phase.PENDING, "starting workers", 0),  # before the agents start: at once
        (status.Phase.PENDING, "starting workers", 8),
        (status.Phase.PROFILING, "profiling small", 8),
        (status.Phase.PENDING, "opening epoch 1: [2,2,2,2] initial", 8),
    ]  # "Profiling" ends with the profile, not when the first epoch runs


async def test_the_jobs_device_memory_caps_the_profile_the_planner_uses() -> None:
    measured = scenarios.small_profile()
    need = sum(layer.state_bytes + layer.activation_bytes for layer in measured.layers)
    cap = int(need * 0.6)  # the whole model no longer fits one worker
    job = scenarios.job(steps=10, profile=None, device_memory_bytes=cap)
    run = scenarios.Run(job, profile=measured)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED, final.message
    used = run.controller.planner_profile
    assert used is not None and used.memory_bytes == cap
    assert used.layers == measured.layers  # only the budget changed


async def test_a_profile_longer_than_the_heartbeat_timeout_does_not_read_as_silence() -> None:
    job = scenarios.job(steps=10, profile=None)
    profile_s = 2.5  # past the heartbeat timeout (1 s), within the Configure bound (3 s)
    run = scenarios.Run(job, profile=scenarios.small_profile(), profile_s=profile_s)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED, final.message
    assert final.plan == "[2,2,2,2] initial"


async def test_a_first_plan_that_cannot_fit_fails_the_job_with_the_planners_reason() -> None:
    run = scenarios.Run(scenarios.job(workers=3))
    final = await run.finish()
    assert final.phase is status.Phase.FAILED
    assert "use 4 nodes" in final.message
    assert run.cluster.shut


def _expected_adaptive(job: settings.JobSettings, running: plans.Plan, steps_left: int) -> str:
    """The planner's own eq. 8 choice for worker 3 failing with `steps_left` steps to train
    (what the controller must adopt)."""
    assert job.profile is not None
    planner = planning.Planner(job.profile, job)
    given = planner._oobleck_layouts(running, frozenset({plans.WorkerId(3)}))
    decision, _ = policy.decide(
        candidates.Failure(running=running, failed=frozenset({plans.WorkerId(3)})),
        screening.Estimates(job.profile),
        recovery.DEFAULT_TIME_TO_FAILURE_S,
        policy.PolicySettings(),
        given=given,
        steps_left=steps_left,
    )
    return str(decision.choice.kind)


@pytest.mark.parametrize(
    "policy_name, expected_kind",
    [("adaptive", None), ("dynamic", "dynamic"), ("reroute", "reroute")],
    ids=["adaptive takes the eq. 8 choice", "dynamic re-instantiates", "reroute reroutes"],
)
async def test_a_death_is_recovered_with_the_policys_choice(
    policy_name: str, expected_kind: str | None
) -> None:
    job = scenarios.job(policy=policy_name)
    run = scenarios.Run(job)
    await run.until(lambda: run.step() >= 10)
    first_plan = run.controller.plan
    assert first_plan is not None
    killed_at = run.step()
    run.cluster.kill(3)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    [recovery] = run.controller.recoveries
    if expected_kind is None:  # the steps left bound eq. 8 (a step or two lost changes nothing)
        expected_kind = _expected_adaptive(job, first_plan, job.steps - killed_at)
        expected_kind = "dynamic" if expected_kind == "given" else expected_kind
    assert recovery.kind == expected_kind
    assert recovery.failed == (3,) and recovery.epoch == 2
    assert recovery.total_s >= recovery.resume_s > 0
    assert recovery.lost_steps <= 1
    assert 3 not in (run.controller.plan.workers if run.controller.plan else ())
    assert run.ranks_ok() == [] and run.cluster.violations == [] and _sources_inside(run)
    if expected_kind == "reroute":
        assert recovery.tier is messages.RecoveryTier.KEPT and recovery.transferred_bytes == 0


async def test_a_death_seen_only_as_a_broken_watch_stream_is_recovered() -> None:
    run = scenarios.Run(scenarios.job())
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(5, report=False)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    assert run.controller.recoveries[0].failed == (5,)
    assert [prefix for prefix, _ in run.cluster.failed_epochs] == ["epoch-1"]


async def test_a_silent_agent_is_treated_as_failed_after_the_heartbeat_timeout() -> None:
    job = scenarios.job()
    run = scenarios.Run(job)
    await run.until(lambda: run.step() >= 10)
    hung_at = run.clock.monotonic()
    first_plan = run.controller.plan
    assert first_plan is not None
    run.cluster.hang(6)
    bound = job.step_timeout_s + job.heartbeat_timeout_s + 1  # the settle wait's bound
    await run.until(lambda: run.controller.epoch == 2, limit_s=bound)
    assert run.clock.monotonic() - hung_at >= job.heartbeat_timeout_s
    # the hung worker's epoch was flagged failed: the survivors stop waiting for it at once
    assert run.cluster.failed_epochs[0] == ("epoch-1", len(first_plan.workers))
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    assert run.controller.recoveries[0].failed == (6,)


async def test_a_worker_latching_its_own_error_is_replaced() -> None:
    run = scenarios.Run(scenarios.job())
    await run.until(lambda: run.step() >= 10)
    run.cluster.agent(2).latch(messages.ErrorKind.OUT_OF_MEMORY, "CUDA out of memory")
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    assert run.controller.recoveries[0].failed == (2,)
    assert 2 not in (run.controller.plan.workers if run.controller.plan else ())


async def test_a_configure_that_never_answers_is_bounded_and_that_worker_left_out() -> None:
    job = scenarios.job()
    run = scenarios.Run(job)
    await run.until(lambda: run.step() >= 10)
    run.cluster.agent(5).stalls = True
    run.cluster.kill(3)
    await run.until(lambda: run.controller.epoch >= 3, limit_s=job.configure_timeout_s + 5)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    plan = run.controller.plan
    assert plan is not None and not {3, 5} & set(plan.workers)
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_two_deaths_in_quick_succession_end_in_a_plan_without_both() -> None:
    run = scenarios.Run(scenarios.job())
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(1)
    await scenarios.advance(0.15)
    run.cluster.kill(4)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    plan = run.controller.plan
    assert plan is not None and not {1, 4} & set(plan.workers)
    assert {1, 4} <= {w for r in run.controller.recoveries for w in r.failed}
    assert run.ranks_ok() == [] and run.cluster.violations == [] and _sources_inside(run)


async def test_a_death_during_the_reconfiguration_opens_another_epoch() -> None:
    run = scenarios.Run(scenarios.job())
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: run.controller.epoch == 2)
    plan = run.controller.plan
    assert plan is not None
    victim = max(plan.workers)
    run.cluster.kill(victim)  # before the new epoch's group has stepped
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    assert run.controller.epoch >= 3
    last = run.controller.plan
    assert last is not None and not {3, victim} & set(last.workers)
    failed = {w for r in run.controller.recoveries for w in r.failed}
    assert {3, victim} <= failed
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_status_reports_recovering_and_degraded_while_short_of_workers() -> None:
    run = scenarios.Run(scenarios.job())
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: run.controller.recoveries != ())
    published = [s.phase for s in run.sink.published]
    assert status.Phase.RECOVERING in published
    now = run.controller.status
    degraded = {c.type: c for c in now.conditions}["Degraded"]
    assert degraded.status == "True" and now.live_workers < now.total_workers
    assert now.last_recovery is not None and now.recoveries == 1
    await run.finish()


async def test_the_fakes_implement_the_ports() -> None:
    """The controller is driven only through the Protocols: the fakes satisfy them."""
    virtual = clock.RealClock()
    cluster = fakes.FakeCluster(virtual)
    agent = fakes.FakeAgent(cluster=cluster, id=plans.WorkerId(0))
    backend: ports.Backend = cluster
    port: ports.Agent = agent
    ticking: ports.Clock = virtual
    assert backend.store.port > 0 and port.worker == 0 and ticking.monotonic() == 0.0
    assert dataclasses.is_dataclass(agent)


async def test_every_worker_silent_for_a_while_then_back_goes_on_in_the_same_epoch() -> None:
    # A stalled machine: all agents stop beating and stepping past the heartbeat timeout
    # (1 s), then carry on; their group never broke (chaos seed 2, kind stall).
    run = scenarios.Run(scenarios.job(steps=40))
    await run.until(lambda: run.step() >= 5)
    for agent in run.cluster.agents.values():
        agent.hung = True
    await run.until(lambda: run.controller.status.phase is status.Phase.SUSPENDED, limit_s=10)
    suspended = scenarios.condition(run.controller.status, status.ConditionType.SUSPENDED)
    assert suspended == ("True", "WorkersLost")  # every worker silent: none survived
    await scenarios.advance(0.5)
    for agent in run.cluster.agents.values():
        agent.hung = False
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED, final.message
    assert final.step == 40 and final.epoch == 1


async def test_a_worker_back_from_silence_is_taken_in_again() -> None:
    # 400 steps: the scale-up back to 8 workers pays after 240 steps left (1 ms steps)
    run = scenarios.Run(scenarios.job(steps=400, policy="dynamic"))
    await run.until(lambda: run.step() >= 5)
    run.cluster.hang(3)
    await run.until(lambda: run.controller.epoch == 2 and run.step() >= 10)
    assert 3 not in run.cluster.sent[2][0].plan.workers
    agent = run.cluster.agent(3)
    agent.hung = False
    agent.latch(messages.ErrorKind.PEER_LOST, "its old group broke while it was stopped")
    await run.until(lambda: 3 in run.cluster.sent[run.controller.epoch][0].plan.workers)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.live_workers == 8


async def test_a_planned_switch_that_comes_too_late_is_tried_again_not_blamed() -> None:
    # A loaded machine: a Configure takes 1.2 s to reach an agent, longer than the first
    # switch's lead (1 s), so the agents have passed its step and refuse it (chaos, returns).
    run = scenarios.Run(
        scenarios.job(steps=300, policy="dynamic", step_timeout_s=6.0), configure_delay_s=1.2
    )
    await run.until(lambda: run.step() >= 5)
    run.cluster.kill(3)
    await run.until(lambda: run.controller.epoch == 2 and run.step() >= 10)
    run.cluster.join(3)
    final = await run.finish(limit_s=200)
    assert final.phase is status.Phase.SUCCEEDED, final.message
    assert final.live_workers == 8 and final.recoveries == 2
    assert run.controller._switches.lead_scale >= 2  # tried again with a longer lead
    switches = sorted(run.cluster.sent)[2:]  # the scale-up's tries: all but the last refused
    assert len(switches) >= 2 and switches[-1] == final.epoch


async def test_a_stall_that_ends_worker_by_worker_heals_the_same_epoch() -> None:
    # The agents come back one at a time; the first to return must not trigger a resume epoch
    # that the others, training on in their epoch, would refuse (chaos seed 7, kind stall).
    run = scenarios.Run(scenarios.job(steps=60))
    await run.until(lambda: run.step() >= 5)
    for agent in run.cluster.agents.values():
        agent.hung = True
    await run.until(lambda: run.controller.status.phase is status.Phase.SUSPENDED, limit_s=10)
    for agent in run.cluster.agents.values():
        agent.hung = False
        await scenarios.advance(0.15)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED, final.message
    assert final.step == 60 and final.epoch == 1


async def test_a_job_ends_on_the_old_plan_after_a_late_switch_with_no_time_to_retry() -> None:
    # Chaos pipeline seed 6 (docs/chaos.md): a scale-up came too late near the end (its
    # Configure slower than its lead), and the workers that refused it had finished the job in
    # their older epoch by the time the refusals were read: those are late refusals too. The
    # switch is given up (they stay in their epoch under the switch's epoch number) and no
    # retry fits in the steps left; their FINISHED heartbeats of the older epoch end the job.
    # Before: counted faulty, and Suspended with the job's last step done (or, given up but
    # never seen finished, a hang).
    # Steps as slow as the fake agents' (`scenarios.paced`): the scale-up pays within the
    # 15 steps left (with 1 ms steps it would need 240, and is declined: no switch at all).
    paced = scenarios.paced(scenarios.small_profile())
    job = scenarios.job(steps=60, policy="dynamic", step_timeout_s=6.0, profile=paced)
    run = scenarios.Run(job, configure_delay_s=1.2)
    await run.until(lambda: run.step() >= 5)
    run.cluster.kill(3)
    await run.until(lambda: run.controller.epoch == 2 and run.step() >= 45)
    run.cluster.join(3)
    final = await run.finish(limit_s=100)
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60, final.message
    assert run.controller._switches.lead_scale >= 2  # the switch came too late


async def test_an_epoch_whose_commit_gave_up_while_it_was_healthy_still_shows_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As when the event loop was held past the heartbeat timeout: the first commit finds every
    # worker silent and returns False, though the workers go on training in the epoch.
    commit = epochs.Driver.commit
    calls: list[int] = []

    async def gives_up_once(self: epochs.Driver) -> bool:
        calls.append(self.epoch)
        return False if len(calls) == 1 else await commit(self)

    monkeypatch.setattr(epochs.Driver, "commit", gives_up_once)
    run = scenarios.Run(scenarios.job(steps=30))
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED, final.message
    assert (final.epoch, final.recoveries) == (1, 0)
    phases = [s.phase for s in run.sink.published]
    assert status.Phase.RUNNING in phases, phases  # not Pending until the end
    running = [s for s in run.sink.published if s.phase is status.Phase.RUNNING]
    assert running[0].message == "epoch 1 running: [2,2,2,2] initial"
