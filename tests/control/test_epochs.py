"""Opening an epoch and reading its setups (planaria.control.epochs).

Covers: one Configure per plan worker with ranks in worker-id order, the world size, the key
prefix "epoch-E", the job's backend and step timeout, the resume and stop steps, and each
worker given only the transfers it takes part in (hypothesis over plans); the costliest tier
of a set and the combined setup report (slowest regroup and transfer, bytes summed: history).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.control import (
    clock,
    epochs,
    history,
    planning,
    ports,
    status,
)
from planaria.wire import messages
from tests import strategies
from tests.control import scenarios

STORE = ports.StoreAddress(host="10.0.0.1", port=29400)


@given(data=st.data(), plan=strategies.running_plans(max_workers=6))
def test_configs_rank_the_plans_workers_by_id(data: st.DataObject, plan: plans.Plan) -> None:
    job = scenarios.job(
        training=scenarios.training(global_batch_size=plan.global_batch_size),
        micro_batch_size=plan.micro_batch_size,
    )
    copies: list[plans.LayerTransfer] = []
    for _ in range(data.draw(st.integers(min_value=0, max_value=6))):
        layer = data.draw(st.integers(min_value=0, max_value=plan.num_layers - 1))
        holders = [
            w for p in plan.pipelines for s in p.stages if layer in s.layers for w in s.workers
        ]
        destination = data.draw(st.sampled_from(holders))
        others = [w for w in plan.workers if w != destination]
        if others and (layer, destination) not in {(c.layer, c.destination) for c in copies}:
            # several sources, in any order: a worker may take part in many copies both ways
            sources = data.draw(st.lists(st.sampled_from(others), min_size=1, unique=True))
            copies.append(
                plans.LayerTransfer(layer=layer, destination=destination, sources=tuple(sources))
            )
    configs = epochs.configs(
        epoch=3, plan=plan, transfers=copies, resume_step=7, job=job, store=STORE
    )
    assert sorted(configs) == sorted(plan.workers)
    for worker, config in configs.items():
        rv = config.rendezvous
        assert rv.rank == sorted(plan.workers).index(worker)
        assert rv.world_size == len(plan.workers) and rv.key_prefix == "epoch-3"
        assert (rv.store_host, rv.store_port) == (STORE.host, STORE.port)
        assert rv.timeout_s == job.step_timeout_s and rv.backend is job.backend
        assert (config.epoch, config.resume_step, config.stop_step) == (3, 7, job.steps)
        # the oracle: the filter `configs` used before it indexed the copies by worker
        mine = [c for c in copies if worker == c.destination or worker in c.sources]
        assert list(config.transfers) == mine


def test_the_costliest_tier_follows_tier_order() -> None:
    tiers = messages.RecoveryTier
    assert (
        history.costliest([tiers.KEPT, tiers.PEER_SNAPSHOT, tiers.LIVE_REPLICA])
        is tiers.PEER_SNAPSHOT
    )
    assert history.costliest([tiers.CHECKPOINT, tiers.LOCAL_SNAPSHOT]) is tiers.CHECKPOINT
    assert history.costliest([]) is tiers.KEPT


def test_combined_setups_take_the_slowest_parts_and_sum_the_bytes() -> None:
    def setup(
        tier: messages.RecoveryTier, regroup: float, transfer: float, load: float, got: int
    ) -> messages.EpochSetup:
        return messages.EpochSetup(
            epoch=2,
            tier=tier,
            regroup_s=regroup,
            transfer_s=transfer,
            load_s=load,
            received_bytes=got,
        )

    combined = history.combine(
        {
            plans.WorkerId(0): setup(messages.RecoveryTier.KEPT, 0.5, 0.0, 0.0, 0),
            plans.WorkerId(1): setup(messages.RecoveryTier.LIVE_REPLICA, 0.2, 1.5, 0.0, 100),
            plans.WorkerId(2): setup(messages.RecoveryTier.LOCAL_SNAPSHOT, 0.1, 0.0, 0.7, 30),
        }
    )
    assert combined == history.Setups(
        tier=messages.RecoveryTier.LOCAL_SNAPSHOT, regroup_s=0.5, transfer_s=1.5, received_bytes=130
    )


@pytest.mark.asyncio
async def test_commit_takes_in_queued_heartbeats_before_judging_silence() -> None:
    """The controller's own work can hold its loop past the heartbeat timeout (the search
    ahead, Odyssey §IV-C, right after the Configures went out; a slow Configure round): the
    heartbeats that queued meanwhile are news, not silence. The commit takes them in before it
    asks who is gone, so the epoch commits instead of giving its workers up."""
    job = scenarios.job()
    assert job.profile is not None
    time = clock.RealClock()
    built = scenarios.parts(job, time)
    roster, lines, driver = built.roster, built.lines, built.driver
    workers = [plans.WorkerId(w) for w in range(job.workers)]
    await lines.start(workers)
    move = planning.Planner(job.profile, job).best(frozenset(workers), status.MoveKind.INITIAL)
    assert await driver.configure(move, 0, planned=False, profile=job.profile)
    # nothing taken in for twice the timeout, while the agents beat on into the queue
    await scenarios.advance(2 * job.heartbeat_timeout_s)
    assert roster.gone(workers, time.monotonic()) == set(workers)  # as the roster last heard
    assert await driver.commit()
    assert not roster.gone(workers, time.monotonic())
    await lines.release()
