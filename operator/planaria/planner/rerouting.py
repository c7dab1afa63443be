"""Data rerouting (ReCycle, Odyssey §II-C and §IV-A): keep the layout, send the failed stages'
micro-batches to their same-stage peers.

A stage with a failed worker loses all its workers (the survivors of a tensor-parallel stage
cannot run it alone) and becomes a hole. Every micro-batch of a hole is rerouted to a live stage
with the same layer range in another pipeline. Odyssey §IV-A spreads them evenly over the peers
to overlap them with bubbles; we give each micro-batch, in order, to the peer stage with the
least work so far (its own micro-batches plus those rerouted to it; ties: lowest pipeline), so
the extra load differs by at most one micro-batch between peers (Odyssey eq. 13's N_m F_i /
(N_dp - F_i) per peer). Reroutes of the old plan are recomputed from scratch: a peer that took
rerouted work may have failed itself.

Rerouting is impossible when a hole's layer range has no live stage left in any pipeline (every
replica with that range failed; Odyssey eq. 13: F_i = N_dp). `reroute` then raises
`errors.InfeasibleError` naming the stage; the candidate search reports it as the reason.

Not here: whether rerouting is worth it (`policy`), its step time (`estimator`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Collection

from planaria.contract import errors, plan


def reroute(old: plan.Plan, failed: Collection[plan.WorkerId]) -> plan.Plan:
    """`old` with every stage that lost a worker emptied and its micro-batches rerouted.

    Raises InfeasibleError when some emptied stage has no live same-range peer.
    """
    dead = set(failed)
    # every reroute is recomputed: a peer that took rerouted work may have failed itself
    pipelines = tuple(_without(p, dead) for p in old.pipelines)
    load, holders = _own_load(pipelines)
    reroutes: list[plan.Reroute] = []
    for p, pipeline in enumerate(pipelines):
        for s, stage in enumerate(pipeline.stages):
            if not stage.workers and pipeline.num_micro_batches:
                reroutes.extend(_spread(pipelines, p, s, load, holders, old, dead))
    return plan.Plan(
        pipelines=pipelines,
        micro_batch_size=old.micro_batch_size,
        gpus_per_node=old.gpus_per_node,
        reroutes=tuple(reroutes),
    )


def _without(pipeline: plan.Pipeline, dead: set[plan.WorkerId]) -> plan.Pipeline:
    """The pipeline with every stage that lost a worker emptied: the same objects where none
    did (stages are frozen; at 8,192 workers rebuilding them all was most of a reroute)."""
    # a tensor-parallel stage cannot run with a member missing: all of it is a hole
    if all(dead.isdisjoint(s.workers) for s in pipeline.stages):
        return pipeline
    stages = tuple(
        s
        if dead.isdisjoint(s.workers)
        else plan.Stage(layer_start=s.layer_start, layer_stop=s.layer_stop, workers=())
        for s in pipeline.stages
    )
    return plan.Pipeline(stages=stages, num_micro_batches=pipeline.num_micro_batches)


_Load = dict[tuple[int, int, int], int]
_Holders = dict[tuple[int, int], list[int]]


def _own_load(pipelines: tuple[plan.Pipeline, ...]) -> tuple[_Load, _Holders]:
    """(pipeline, first layer, stop layer) -> micro-batches its live stage of that range runs
    of its own; and per layer range, the pipelines with a live stage of it, in order."""
    load: _Load = {}
    holders: _Holders = defaultdict(list)
    for q, pipeline in enumerate(pipelines):
        for stage in pipeline.stages:
            if stage.workers:
                load[(q, stage.layer_start, stage.layer_stop)] = pipeline.num_micro_batches
                holders[(stage.layer_start, stage.layer_stop)].append(q)
    return load, holders


def _spread(
    pipelines: tuple[plan.Pipeline, ...],
    p: int,
    s: int,
    load: _Load,
    holders: _Holders,
    old: plan.Plan,
    dead: set[plan.WorkerId],
) -> list[plan.Reroute]:
    """Reroutes of every micro-batch of hole (p, s), each to the least-loaded live peer."""
    hole = pipelines[p].stages[s]
    start, stop = hole.layer_start, hole.layer_stop
    # (load, peer) of each peer in a heap: the least first, ties to the lowest pipeline, as a
    # min over them all gives, in log(peers) per micro-batch (~170 peers at 8,192 workers)
    least = [(load[(q, start, stop)], q) for q in holders.get((start, stop), ()) if q != p]
    if not least:
        raise errors.InfeasibleError(_impossible(old, p, s, dead))
    heapq.heapify(least)
    given: dict[int, list[int]] = defaultdict(list)
    for micro_batch in range(pipelines[p].num_micro_batches):
        # least loaded first: extra work per peer differs by at most one (Odyssey eq. 13)
        count, q = least[0]
        load[(q, start, stop)] = count + 1
        heapq.heapreplace(least, (count + 1, q))
        given[q].append(micro_batch)
    return [
        plan.Reroute(pipeline=p, stage=s, peer_pipeline=q, micro_batches=tuple(given[q]))
        for q in sorted(given)
    ]


def _impossible(old: plan.Plan, p: int, s: int, dead: set[plan.WorkerId]) -> str:
    stage = old.pipelines[p].stages[s]
    replicas = [
        (q, other.workers)
        for q, pipeline in enumerate(old.pipelines)
        for other in pipeline.stages
        if other.layers == stage.layers
    ]
    lost = ", ".join(
        f"pipeline {q} {'(already empty)' if not w else 'workers ' + str(list(w))}"
        for q, w in replicas
    )
    return (
        f"rerouting is impossible: stage layers [{stage.layer_start}, {stage.layer_stop}) lost "
        f"every replica ({lost}; failed now: {sorted(dead & set(old.workers))}), so no pipeline "
        "can run its micro-batches; re-plan instead"
    )
