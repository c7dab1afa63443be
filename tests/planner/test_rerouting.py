"""Data rerouting (planaria.planner.rerouting): failed stages' micro-batches on same-stage peers.

Covers: a failed worker's stage becomes a hole whose micro-batches go to every live peer with the
same layers, spread evenly (hand example with three peers); a tensor-parallel stage with one
failed member is emptied whole; old reroutes are recomputed when a peer that took them fails;
rerouting is impossible when a stage lost every replica, and the message names the stage and
its failed workers; hypothesis: every rerouted plan compiles, keeps every micro-batch exactly
once per stage, and no peer's load exceeds another's by more than one micro-batch beyond their
own counts' difference; `reroute` gives the plan of its old form (every stage rebuilt, each
micro-batch's peer a keyed minimum over all pipelines), kept here as the oracle.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, schedule
from planaria.contract import plan as plans
from planaria.planner import rerouting
from tests import strategies

W = plans.WorkerId


def symmetric(dp: int, cuts: tuple[int, ...], num_layers: int, micro_batches: int) -> plans.Plan:
    pipelines, worker = [], 0
    bounds = [0, *cuts, num_layers]
    for _ in range(dp):
        stages = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            stages.append(plans.Stage(layer_start=a, layer_stop=b, workers=(W(worker),)))
            worker += 1
        pipelines.append(plans.Pipeline(stages=tuple(stages), num_micro_batches=micro_batches))
    return plans.Plan(pipelines=tuple(pipelines), micro_batch_size=1)


def test_a_failed_stage_is_spread_evenly_over_its_three_peers() -> None:
    old = symmetric(4, (2,), 4, 6)  # worker 3 runs pipeline 1's second stage
    new = rerouting.reroute(old, {W(3)})
    assert new.pipelines[1].stages[1].workers == ()
    given_to = {r.peer_pipeline: r.micro_batches for r in new.reroutes}
    assert given_to == {0: (0, 3), 2: (1, 4), 3: (2, 5)}
    assert all((r.pipeline, r.stage) == (1, 1) for r in new.reroutes)


def test_a_tensor_parallel_stage_with_one_failed_member_is_emptied_whole() -> None:
    stage = plans.Stage(layer_start=0, layer_stop=2, workers=(W(0), W(1)))
    peer = plans.Stage(layer_start=0, layer_stop=2, workers=(W(2), W(3)))
    old = plans.Plan(
        pipelines=(
            plans.Pipeline(stages=(stage,), num_micro_batches=2),
            plans.Pipeline(stages=(peer,), num_micro_batches=2),
        ),
        micro_batch_size=1,
        gpus_per_node=2,
    )
    new = rerouting.reroute(old, {W(1)})
    assert new.pipelines[0].stages[0].workers == ()
    assert [(r.peer_pipeline, r.micro_batches) for r in new.reroutes] == [(1, (0, 1))]


def test_reroutes_to_a_peer_that_fails_are_recomputed() -> None:
    first = rerouting.reroute(symmetric(3, (1,), 2, 2), {W(1)})  # pipeline 0's stage 1 -> 1, 2
    second = rerouting.reroute(first, {W(3)})  # pipeline 1's stage 1 fails as well
    moved = {(r.pipeline, r.peer_pipeline): r.micro_batches for r in second.reroutes}
    assert moved == {(0, 2): (0, 1), (1, 2): (0, 1)}


def test_rerouting_is_impossible_when_a_stage_lost_every_replica() -> None:
    old = symmetric(2, (1,), 2, 2)
    with pytest.raises(errors.InfeasibleError) as caught:
        rerouting.reroute(old, {W(1), W(3)})
    message = str(caught.value)
    assert "rerouting is impossible" in message
    assert "stage layers [1, 2) lost every replica" in message
    assert "failed now: [1, 3]" in message


def test_a_peer_with_different_cuts_cannot_take_the_work() -> None:
    pipelines = (
        plans.Pipeline(
            stages=(
                plans.Stage(layer_start=0, layer_stop=1, workers=(W(0),)),
                plans.Stage(layer_start=1, layer_stop=3, workers=(W(1),)),
            ),
            num_micro_batches=1,
        ),
        plans.Pipeline(
            stages=(
                plans.Stage(layer_start=0, layer_stop=2, workers=(W(2),)),
                plans.Stage(layer_start=2, layer_stop=3, workers=(W(3),)),
            ),
            num_micro_batches=1,
        ),
    )
    old = plans.Plan(pipelines=pipelines, micro_batch_size=1)
    with pytest.raises(errors.InfeasibleError, match=r"\[1, 3\) lost every replica"):
        rerouting.reroute(old, {W(1)})


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_rerouted_plans_compile_and_spread_the_work_evenly(data: st.DataObject) -> None:
    dp = data.draw(st.integers(min_value=2, max_value=4))
    old = data.draw(strategies.shaped_plans((data.draw(st.integers(1, 3)),) * dp))
    failed = data.draw(strategies.failed_workers(old))
    try:
        new = rerouting.reroute(old, failed)
    except errors.InfeasibleError:
        return
    schedule.compile_schedule(new)
    for p, pipeline in enumerate(new.pipelines):
        for s, stage in enumerate(pipeline.stages):
            if stage.workers:
                continue
            taken = [
                m for r in new.reroutes if (r.pipeline, r.stage) == (p, s) for m in r.micro_batches
            ]
            assert sorted(taken) == list(range(pipeline.num_micro_batches))
    for layers in {stage.layers for pipeline in new.pipelines for stage in pipeline.stages}:
        extra: collections.Counter[int] = collections.Counter()
        for r in new.reroutes:
            if new.pipelines[r.pipeline].stages[r.stage].layers == layers:
                extra[r.peer_pipeline] += len(r.micro_batches)
        loads = [
            pipeline.num_micro_batches + extra[q]
            for q, pipeline in enumerate(new.pipelines)
            for stage in pipeline.stages
            if stage.layers == layers and stage.workers
        ]
        if extra and loads:
            # greedy least-loaded: a peer that took extra work ends at most 1 above the least
            takers = [new.pipelines[q].num_micro_batches + n for q, n in extra.items() if n]
            assert max(takers) <= min(loads) + 1


# --- the oracle: `reroute` before it kept the stages that lost no worker --------------------


def _old_reroute(old: plans.Plan, failed: set[plans.WorkerId]) -> plans.Plan:
    """Every stage rebuilt, loads keyed by layer ranges, peers chosen by a keyed minimum."""
    pipelines = tuple(
        plans.Pipeline(
            stages=tuple(
                plans.Stage(
                    layer_start=s.layer_start,
                    layer_stop=s.layer_stop,
                    workers=() if failed & set(s.workers) else s.workers,
                )
                for s in p.stages
            ),
            num_micro_batches=p.num_micro_batches,
        )
        for p in old.pipelines
    )
    load = {
        (q, stage.layers): pipeline.num_micro_batches
        for q, pipeline in enumerate(pipelines)
        for stage in pipeline.stages
        if stage.workers
    }
    reroutes = []
    for p, pipeline in enumerate(pipelines):
        for s, stage in enumerate(pipeline.stages):
            if stage.workers or not pipeline.num_micro_batches:
                continue
            peers = [q for q in range(len(pipelines)) if q != p and (q, stage.layers) in load]
            if not peers:
                raise errors.InfeasibleError("no peer")
            given: dict[int, list[int]] = collections.defaultdict(list)
            for micro_batch in range(pipeline.num_micro_batches):
                q = min(peers, key=lambda peer: (load[(peer, stage.layers)], peer))  # noqa: B023
                load[(q, stage.layers)] += 1
                given[q].append(micro_batch)
            reroutes += [
                plans.Reroute(pipeline=p, stage=s, peer_pipeline=q, micro_batches=tuple(given[q]))
                for q in sorted(given)
            ]
    return plans.Plan(
        pipelines=pipelines,
        micro_batch_size=old.micro_batch_size,
        gpus_per_node=old.gpus_per_node,
        reroutes=tuple(reroutes),
    )


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_reroute_is_the_old_reroute(data: st.DataObject) -> None:
    # same-range peers of uneven loads, stages of several workers, earlier reroutes
    old = data.draw(strategies.running_plans(max_workers=16, max_pipelines=6))
    if data.draw(st.booleans()):
        dp = data.draw(st.integers(min_value=2, max_value=5))
        old = data.draw(strategies.shaped_plans((data.draw(st.integers(1, 3)),) * dp))
    failed = set(data.draw(strategies.failed_workers(old)))
    try:
        expected = _old_reroute(old, failed)
    except errors.InfeasibleError:
        with pytest.raises(errors.InfeasibleError):
            rerouting.reroute(old, failed)
        return
    found = rerouting.reroute(old, failed)
    assert found == expected
    again = set(data.draw(strategies.failed_workers(found))) if found.workers else set()
    try:
        expected = _old_reroute(found, failed | again)
    except errors.InfeasibleError:
        return
    assert rerouting.reroute(found, failed | again) == expected
