"""The controller when membership changes beyond a single failure, in simulated time.

Covers: a JOINED worker scaled up at a future step boundary (live-replica copies, no lost steps),
and tried again when it came too late, once the newcomer's abandoned set-up of the given-up epoch
is over (chaos seed 10); a newcomer whose scale-up does not pay within the steps left stays a
spare, the planner asked once (again only when the live workers change); a preemption notice
answered ahead of the death (planned switch, no lost steps, the later death needs no recovery), and
the death coming before the switch (recovered from the plan the workers still hold, also when the
agents set the switch up short of its step); losing more workers than any plan needs -> Suspended
with the checkpoint step, then a resume from that checkpoint when workers return; workers a
recovery counted failed only because they stopped late (still blocked, heartbeating) -> Suspended,
then taken back as arrivals once they stop, and the job resumes and succeeds; a death while the
survivors still set the first epoch up, longer than that bound, waits for their set-up (no
suspension); a layer whose every replica is lost, which loses every member of its snapshot group
too -> Suspended at once, saying which layers and workers and that the checkpoint is next, and
resumed from the persistent checkpoint; two copies of a snapshot member (a holder's and its
mirror's) whose heartbeat digests disagree -> that snapshot is not resumed from: Suspended saying
which member disagrees on which workers, and resumed from the persistent checkpoint; two GPUs per
node under every policy (a death, then the worker's return).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable
from concurrent import futures
from typing import ParamSpec, TypeVar

import pytest

from planaria.contract import shapes, snapshot_placement
from planaria.control import executors, settings, status
from planaria.planner import accelerators, synthetic
from planaria.wire import messages
from tests.control import scenarios

pytestmark = pytest.mark.asyncio
P = ParamSpec("P")
T = TypeVar("T")
# Where a resume from a checkpoint step may find a layer: the agents take the cheapest tier, and
# host-memory snapshots of that step may still be there.
SNAPSHOT_TIERS = {
    messages.RecoveryTier.LOCAL_SNAPSHOT,
    messages.RecoveryTier.PEER_SNAPSHOT,
    messages.RecoveryTier.CHECKPOINT,
}


async def test_a_joined_worker_is_added_back_at_a_future_step_boundary() -> None:
    run = scenarios.Run(scenarios.job(steps=80))
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: len(run.controller.recoveries) == 1)
    shrunk = run.controller.plan
    assert shrunk is not None and len(shrunk.workers) < 8
    joined_at = run.step()
    run.cluster.join(3)
    await run.until(lambda: len(run.controller.recoveries) == 2)
    grown = run.controller.recoveries[1]
    assert grown.kind == "scale-up" and grown.failed == () and grown.lost_steps == 0
    assert grown.planned and not run.controller.recoveries[0].planned
    plan = run.controller.plan
    assert plan is not None and len(plan.workers) == 8 and 3 in plan.workers
    switch = run.cluster.sent[grown.epoch][0].resume_step
    assert switch > joined_at
    assert grown.tier in (messages.RecoveryTier.KEPT, messages.RecoveryTier.LIVE_REPLICA)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.plan.startswith("[2,2,2,2]")
    # the old epoch's steps up to the switch are recorded too: no gap in the history (records
    # sample the steps once a pass, so one may fall between two passes)
    after = [r.step for r in run.controller.steps if r.step > joined_at]
    assert after[-1] == 80 and max(b - a for a, b in itertools.pairwise(after)) <= 2
    assert run.ranks_ok() == [] and run.cluster.violations == []


class Asked(executors.Inline):
    """The virtual-time tests' executor (`executors.Inline`), keeping the name of every
    question it ran, in order."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> futures.Future[T]:
        self.names.append(getattr(fn, "__name__", repr(fn)))
        return super().submit(fn, *args, **kwargs)


async def test_a_scale_up_that_does_not_pay_leaves_the_plan_and_is_asked_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Steps of about 1 ms (the synthetic profile): back to 8 workers repays its 40 ms
    # transition only with 240 steps left, and some 60 are. The newcomer stays a spare, and
    # the planner is asked again only when the live workers change (it left and came back).
    asked = Asked()
    run = scenarios.Run(scenarios.job(steps=80, policy="dynamic"), executor=asked)
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: len(run.controller.recoveries) == 1)
    shrunk, epoch = run.controller.plan, run.controller.epoch
    assert shrunk is not None and 3 not in shrunk.workers
    with caplog.at_level(logging.INFO, logger="planaria.control.switches"):
        run.cluster.join(3)
        await run.until(lambda: "grow" in asked.names)
        await scenarios.advance(2.0)  # 20 passes of the controller, 20 steps
    assert asked.names.count("grow") == 1
    assert (run.controller.plan, run.controller.epoch) == (shrunk, epoch)
    assert "workers [3] stay spares: declined, the running plan finishes sooner" in caplog.text
    assert run.controller.status.phase is status.Phase.RUNNING
    run.cluster.kill(3)  # a spare's death: no recovery, but the live workers change
    await scenarios.advance(2.0)
    run.cluster.join(3)
    final = await run.finish()
    assert asked.names.count("grow") == 2  # once more, declined again (fewer steps left)
    assert final.phase is status.Phase.SUCCEEDED and final.step == 80 and final.epoch == epoch
    assert [r.kind for r in run.controller.recoveries] == ["dynamic"]
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_a_scale_up_whose_newcomer_fails_its_set_up_is_tried_again() -> None:
    # Chaos seeds 29 and 48 of the pipeline config (docs/chaos.md): the returned worker's
    # cold first set-up outlasted its senders' timeout, before a step of the switch's epoch
    # was committed. The old plan is back from the switch step, with no step lost, and the
    # newcomer, a spare again, is scaled up anew; before, it stayed a spare to the job's end.
    run = scenarios.Run(scenarios.job(steps=80), setup_s=0.5)
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: len(run.controller.recoveries) == 1)
    shrunk = run.controller.plan
    run.cluster.join(3)
    await run.until(lambda: run.controller.epoch == 3)  # the scale-up is configured, not made
    step = run.cluster.sent[3][0].resume_step
    joined = [run.cluster.agent(w) for w in run.cluster.sent[3][0].plan.workers]
    # every worker sets the switch's epoch up (the others at its step): the newcomer's copy
    # fails before a step is committed in it
    configuring = messages.AgentState.CONFIGURING
    await run.until(lambda: all(a.epoch == 3 and a.state is configuring for a in joined))
    assert {a.step for a in joined if a.id != 3} == {step}
    run.cluster.fail_set_up(3, messages.ErrorKind.PEER_LOST, "layer copy timed out")
    await run.until(lambda: run.controller.epoch == 5)
    regrouped = run.cluster.sent[4][0]
    assert regrouped.plan == shrunk and regrouped.resume_step == step
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 80
    assert final.plan.startswith("[2,2,2,2]") and final.live_workers == 8
    assert [r.kind for r in run.controller.recoveries][1:] == ["restart", "scale-up"]
    assert sum(r.lost_steps for r in run.controller.recoveries) == 0
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_a_late_scale_up_is_tried_again_once_its_newcomer_left_the_given_up_epoch() -> None:
    # Chaos seed 10 of the pipeline config (docs/chaos.md): the first scale-up reached the
    # running workers past its switch step and was given up; the newcomer, which had accepted
    # it, waited in that epoch's rendezvous (after its cold first set-up) until its timeout,
    # and an agent takes a Configure up only once its set-up under way ends. The retry's
    # rendezvous timed out waiting for it: a recovery without the newcomer. The retry now
    # waits until the newcomer's heartbeat shows that set-up over.
    job = scenarios.job(steps=120, step_timeout_s=4.0, configure_timeout_s=5.0)
    # Configures take 1.5 s: past the first switch's lead (1 s), short of the retry's (2 s)
    run, given_up = await scenarios.given_up_scale_up(job)
    await run.until(lambda: run.controller.epoch == given_up + 1)
    assert 3 in {c.worker for c in run.cluster.sent[given_up]}  # it accepted the given-up one
    # flagged failed: the newcomer leaves it once its (cold) set-up is done, not a timeout later
    assert (f"epoch-{given_up}", 8) in run.cluster.failed_epochs
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 120
    assert final.plan.startswith("[2,2,2,2]") and final.live_workers == 8
    grown = run.controller.recoveries[1:]
    assert [(r.kind, r.planned, r.failed) for r in grown] == [("scale-up", True, ())]
    assert sum(r.lost_steps for r in run.controller.recoveries) == 0
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_a_preemption_notice_moves_the_job_before_the_worker_goes() -> None:
    run = scenarios.Run(scenarios.job(steps=80))
    await run.until(lambda: run.step() >= 10)
    noticed_at = run.step()
    run.cluster.notice(5)
    await run.until(lambda: len(run.controller.recoveries) == 1)
    [moved] = run.controller.recoveries
    assert moved.failed == (5,) and moved.lost_steps == 0 and moved.planned
    assert run.cluster.sent[moved.epoch][0].resume_step > noticed_at
    plan = run.controller.plan
    assert plan is not None and 5 not in plan.workers
    run.cluster.kill(5)  # the preemption itself: nothing left to recover
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    assert len(run.controller.recoveries) == 1
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_a_worker_dying_before_the_planned_switch_is_recovered_from_the_old_plan() -> None:
    run = scenarios.Run(scenarios.job(steps=80))
    await run.until(lambda: run.step() >= 10)
    run.cluster.notice(5)
    await run.until(lambda: run.controller.epoch == 2)  # the switch is configured, not made
    run.cluster.kill(5)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 80
    [recovered] = run.controller.recoveries
    assert recovered.failed == (5,)
    assert recovered.tier is not messages.RecoveryTier.CHECKPOINT
    assert run.ranks_ok() == [] and run.cluster.violations == []


async def test_a_switch_set_up_short_of_its_step_is_recovered_from_the_previous_plan() -> None:
    # agents that keep an accepted switch after their step fails set it up anyway, at a step
    # they never reached: SNAPSHOT_UNAVAILABLE; the controller falls back to what they hold
    run = scenarios.Run(scenarios.job(steps=80), drop_pending_on_failure=False)
    await run.until(lambda: run.step() >= 10)
    run.cluster.notice(5)
    await run.until(lambda: run.controller.epoch == 2)
    run.cluster.kill(5)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 80
    [recovered] = run.controller.recoveries
    assert recovered.failed == (5,) and recovered.kind != "resume" and not recovered.planned
    assert run.ranks_ok() == [] and run.cluster.violations == []


def _checkpointed_job(**changes: object) -> settings.JobSettings:
    training = scenarios.training(
        snapshot_interval_steps=5, checkpoint_dir="/ckpt", checkpoint_interval_steps=10
    )
    return scenarios.job(training=training, **changes)


async def test_too_few_workers_suspend_the_job_until_workers_return() -> None:
    # 20 MiB per GPU: [4,4] on 8 workers, and no template plan on fewer than 6 (adaptive
    # would still find one pipeline of 5: Oobleck's dynamic policy keeps f + 1 pipelines)
    run = scenarios.Run(_checkpointed_job(profile=scenarios.small_profile(24), policy="dynamic"))
    await run.until(lambda: run.step() >= 23)
    for worker in (0, 1, 2):
        run.cluster.kill(worker)
    await run.until(lambda: run.controller.status.phase is status.Phase.SUSPENDED)
    suspended = run.controller.status
    assert suspended.checkpoint_step == 20
    assert "checkpoint is step 20" in suspended.message and "6 workers" in suspended.message
    assert {c.type: c.status for c in suspended.conditions}["Suspended"] == "True"
    await scenarios.advance(5.0)  # waiting is not a hang: still suspended, still publishing
    assert run.controller.status.phase is status.Phase.SUSPENDED
    run.cluster.join(0)
    run.cluster.join(1)
    await run.until(lambda: run.controller.status.phase is status.Phase.RUNNING)
    resumed = run.controller.recoveries[-1]
    assert resumed.kind == "resume" and resumed.tier in SNAPSHOT_TIERS
    assert run.cluster.sent[resumed.epoch][0].resume_step == 20
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60


async def test_workers_that_stopped_too_late_for_a_recovery_are_taken_back_once_stopped() -> None:
    # 20 MiB per GPU: no template plan on fewer than 6 workers. Five workers keep running past
    # the settle bound (step + heartbeat timeouts, 3 s) after worker 7 dies: the recovery
    # counts them failed, two survivors hold no plan, and the job is Suspended with 7 live.
    run = scenarios.Run(_checkpointed_job(profile=scenarios.small_profile(24), policy="dynamic"))
    await run.until(lambda: run.step() >= 23)
    for worker in range(5):
        run.cluster.slow(worker, 6.0)
    run.cluster.kill(7)
    await run.until(lambda: run.controller.status.phase is status.Phase.SUSPENDED)
    assert "no plan for the 2 surviving workers" in run.controller.status.message
    await run.until(lambda: run.controller.status.phase is status.Phase.RUNNING)
    resumed = run.controller.recoveries[-1]
    assert resumed.kind == "resume" and 7 not in run.cluster.sent[resumed.epoch][0].plan.workers
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60


async def test_a_death_during_a_slow_first_set_up_waits_for_the_survivors_to_set_up() -> None:
    # Chaos seed 29 of the pipeline config (docs/chaos.md): a worker killed while the first
    # epoch is set up. An agent notices a lost peer only once its own set-up ends (its watcher
    # starts then), and a cold set-up on a loaded machine takes longer than the settle bound
    # for running workers (step + heartbeat timeouts, 3 s here). The epoch's commit gives a
    # set-up a Configure and a step timeout (5 s): the recovery waits as long for workers still
    # setting up, so the survivors are survivors, not given up on and Suspended.
    run = scenarios.Run(scenarios.job(), setup_s=4.0)
    await run.until(lambda: len(run.cluster.sent.get(1, [])) == 8, tick_s=0.001)
    run.cluster.kill(7)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    phases = {published.phase for published in run.sink.published}
    assert status.Phase.SUSPENDED not in phases
    [recovered, *_] = run.controller.recoveries
    assert recovered.failed == (7,) and recovered.kind != status.MoveKind.RESUME, recovered
    assert set(run.cluster.sent[recovered.epoch][0].plan.workers) == set(range(7))


def _redundant_job(redundancy: messages.RedundancyMode) -> settings.JobSettings:
    training = scenarios.training(
        snapshot_interval_steps=5,
        checkpoint_dir="/ckpt",
        checkpoint_interval_steps=10,
        redundancy=redundancy,
    )
    return scenarios.job(training=training)


async def test_a_layer_lost_with_every_replica_comes_back_from_its_mirrors() -> None:
    # Issue #20: every member of a layer's sharding group is mirrored on a node that does not
    # hold the layer (snapshot_placement), so losing every replica of a stage leaves its
    # snapshot in the survivors' stores: no suspension, the snapshot tier serves.
    run = scenarios.Run(_redundant_job(messages.RedundancyMode.XOR))
    await run.until(lambda: run.step() >= 26)
    for worker in (0, 2, 4, 6):  # the first stage of every pipeline
        run.cluster.kill(worker)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    recovered = [r for r in run.controller.recoveries if set(r.failed) >= {0, 2, 4, 6}]
    # a mirror the new plan gives the layer reads it from its own store, the others from it
    snapshot_tiers = {messages.RecoveryTier.LOCAL_SNAPSHOT, messages.RecoveryTier.PEER_SNAPSHOT}
    assert recovered and recovered[0].tier in snapshot_tiers, recovered
    assert run.cluster.sent[recovered[0].epoch][0].resume_step == 25  # the snapshot, no further
    assert all(r.tier is not messages.RecoveryTier.CHECKPOINT for r in run.controller.recoveries)


async def test_a_layer_lost_with_every_replica_and_no_redundancy_resumes_from_the_checkpoint() -> (
    None
):
    # Without redundancy (NONE: no copies, no mirrors) the group is the holders alone: losing
    # every replica of a layer is beyond it; the controller says so at once, and the checkpoint
    # is the tier. Snapshots every 5 steps, checkpoints every 10: the checkpoint of step 20.
    run = scenarios.Run(_redundant_job(messages.RedundancyMode.NONE), peer_snapshots=False)
    await run.until(lambda: run.step() >= 26)
    assert run.step() < 30
    for worker in (0, 2, 4, 6):
        run.cluster.kill(worker)
    await run.until(lambda: run.controller.status.phase is status.Phase.SUSPENDED)
    message = run.controller.status.message
    assert "lost their snapshot members on workers [0, 2, 4, 6]" in message, message
    assert (
        "redundancy 'none'" in message and "the persistent checkpoint is the next tier" in message
    )
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    resumed = run.controller.recoveries[-1]
    assert resumed.kind == "resume" and resumed.tier is messages.RecoveryTier.CHECKPOINT
    assert run.cluster.sent[resumed.epoch][0].resume_step == 20


async def test_two_copies_of_a_snapshot_member_that_disagree_send_the_job_to_the_checkpoint() -> (
    None
):
    # Issue #20: a member's holder and its mirror keep the same files, so the heartbeats'
    # member digests must agree. [4,4] (24 MiB per GPU), XOR, snapshots every 5 steps and
    # checkpoints every 10: the first stage of both pipelines is lost at step 26-29, so the
    # next plan needs the snapshot of step 25; one surviving mirror of a surviving holder's
    # member reports another digest: the controller does not resume from that snapshot but
    # suspends, saying which member disagrees where, and resumes from the checkpoint of 20.
    job = _redundant_job(messages.RedundancyMode.XOR)
    job = dataclasses.replace(job, profile=scenarios.small_profile(24), policy="dynamic")
    run = scenarios.Run(job, report_held=True)
    await run.until(lambda: run.step() >= 26)
    assert run.step() < 30
    plan = run.controller.plan
    assert plan is not None and plan.pipelines[0].stages[0].workers == (0,), plan
    lost = [w for p in plan.pipelines for w in p.stages[0].workers]
    groups, mirrors = snapshot_placement.sharding_groups(plan), snapshot_placement.mirrors(plan)
    layer, member, mirror = next(
        (layer, k, m)
        for layer, group in groups.items()
        for k, (holder, m) in enumerate(zip(group, mirrors[layer], strict=True))
        if holder not in lost and m is not None and m not in lost
    )
    run.cluster.damage(mirror, layer, member)
    for worker in lost:
        run.cluster.kill(worker)
    await run.until(lambda: run.controller.status.phase is status.Phase.SUSPENDED)
    message = run.controller.status.message
    holder = groups[layer][member]
    assert f"the snapshot of step 25 disagrees: layer {layer} member {member} has " in message
    assert f"on workers [{holder}]" in message and f"on workers [{mirror}]" in message, message
    assert "it is not resumed from, the persistent checkpoint is the next tier" in message
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED and final.step == 60
    resumed = run.controller.recoveries[-1]
    assert resumed.kind == "resume" and resumed.tier in SNAPSHOT_TIERS
    assert run.cluster.sent[resumed.epoch][0].resume_step == 20  # the checkpoint's step
    assert all(run.cluster.sent[r.epoch][0].resume_step != 25 for r in run.controller.recoveries)


@pytest.mark.parametrize("policy_name", ["adaptive", "dynamic", "reroute"])
async def test_with_two_gpus_per_node_a_death_and_the_return_are_handled(policy_name: str) -> None:
    source = synthetic.synthesize(
        shapes.named("small"), accelerators.named("a100-80gb"), 2, 2, synthetic.Precision.FP32
    )
    # steps as slow as the fake agents' (`scenarios.paced`): the return's scale-up pays within
    # the 30 steps left (with 1 ms steps, dynamic's would need 453 and is declined)
    two_gpus = scenarios.paced(dataclasses.replace(source, memory_bytes=30 * scenarios.MIB))
    run = scenarios.Run(scenarios.job(gpus_per_node=2, profile=two_gpus, policy=policy_name))
    await run.until(lambda: run.step() >= 10)
    run.cluster.kill(3)
    await run.until(lambda: run.step() >= 30)
    run.cluster.join(3)
    final = await run.finish()
    assert final.phase is status.Phase.SUCCEEDED
    kinds = [r.kind for r in run.controller.recoveries]
    assert kinds[-1] == "scale-up" and len(kinds) == 2
    plan = run.controller.plan
    assert plan is not None and sorted(plan.workers) == list(range(8))
    assert all(len({w // 2 for w in s.workers}) == 1 for p in plan.pipelines for s in p.stages)
    assert run.ranks_ok() == [] and run.cluster.violations == []
