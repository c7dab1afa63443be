"""Where a layer's snapshot pieces live: its sharding group and the group's mirrors (issue #20).

REFT §4.2 shards a layer's snapshot over its data-parallel replicas, the workers that hold it
(the sharding group, member k = the k-th holder in worker-id order): each member stores its
shard and a copy or an XOR parity, so the group survives `tolerated_losses` lost members. Alone,
that protects nothing when every replica of the layer is lost: the members die with them.

So every member's files are also kept by a mirror: a worker that does not hold the layer, on a
node that hosts none of the layer's holders (REFT's groups over other nodes' host memory). The
rule, the same on every agent and in the controller, from the plan alone:

    free(L)      the plan's nodes hosting no holder of layer L, in node order
    mirror(L, k) for k < |free(L)|: on node free(L)[(L * m + k) mod |free(L)|], the worker
                 at index (L + k) mod (its workers on that node), where m = the group's size;
                 no mirror for k >= |free(L)| (too few other nodes)

The mirrors of one layer are on distinct nodes (k < |free| gives distinct residues), none on a
holder's node; the rotation by L spreads the layers of a stage over the other nodes. A mirror
stores member k's files byte for byte (same names, same checksums), so a member is lost only
when its holder and its mirror are both lost.

The guarantee (property-tested in tests/contract/test_snapshot_placement.py): layer L is
rebuildable from the survivors' snapshots exactly when at most t = `tolerated_losses` of its
members lost both holder and mirror. Every lost member takes its mirror's node, a node of no
holder and of no other mirror of L, and its holder's node: so, when every member has a mirror
and L's holders sit on distinct nodes (Oobleck's f + 1 pipelines), losing L takes at least
2(t + 1) nodes, and any 2t + 1 node failures leave every layer rebuildable, however many of a
layer's replicas they take (all of them included). Without mirrors (too few nodes, or a plan
on one node) the group is its holders alone, as REFT's: t failures.

Mirrors are kept only with redundancy (COPY, XOR, RECOMPUTE): a job that chose NONE asked for
no copies, and its groups are its holders alone.

Costs: every member's files are stored twice (host memory per worker about doubles: a worker
mirrors about as many bytes as it snapshots of its own layers), and each snapshot sends them
once over the network (`planaria.agent.recovery.snapshot_mirrors`).

Nothing here does I/O; `protected` says whether the job's redundancy mode is not NONE (the
contract cannot name the wire's enum).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from planaria.contract import plan as plans


def sharding_groups(plan: plans.Plan) -> dict[int, tuple[plans.WorkerId, ...]]:
    """Layer -> the workers holding it in `plan`, in worker-id order (member k = k-th)."""
    groups: dict[int, set[plans.WorkerId]] = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            for layer in stage.layers:
                groups.setdefault(layer, set()).update(stage.workers)
    return {layer: tuple(sorted(workers)) for layer, workers in sorted(groups.items())}


def tolerated_losses(*, protected: bool, group_size: int) -> int:
    """Members of a group that may be lost with the layer still rebuildable: 1 with copy,
    parity or recompute redundancy (`protected`) in a group of two or more, else 0."""
    return 1 if protected and group_size >= 2 else 0


def mirrors(plan: plans.Plan) -> dict[int, tuple[plans.WorkerId | None, ...]]:
    """Layer -> the mirror of each member of its sharding group (None: no node left for it),
    by the module docstring's rule."""
    on_node: dict[plans.NodeId, list[plans.WorkerId]] = {}
    for worker in sorted(plan.workers):
        on_node.setdefault(plan.node_of(worker), []).append(worker)
    nodes = sorted(on_node)
    placed = {}
    for layer, group in sharding_groups(plan).items():
        held_on = {plan.node_of(w) for w in group}
        free = [n for n in nodes if n not in held_on]
        m = len(group)
        chosen: list[plans.WorkerId | None] = []
        for k in range(m):
            if k >= len(free):
                chosen.append(None)
                continue
            workers = on_node[free[(layer * m + k) % len(free)]]
            chosen.append(workers[(layer + k) % len(workers)])
        placed[layer] = tuple(chosen)
    return placed


def mirrored_by(plan: plans.Plan, worker: plans.WorkerId) -> dict[int, int]:
    """Layer -> the member of its group whose files `worker` mirrors (at most one per layer)."""
    return {
        layer: members.index(worker)
        for layer, members in mirrors(plan).items()
        if worker in members
    }


def lost_members(
    plan: plans.Plan, failed: Collection[plans.WorkerId], *, protected: bool
) -> dict[int, tuple[int, ...]]:
    """Layer -> the members of its group whose holder and mirror (if any) both failed; with no
    redundancy (`protected` false) there are no mirrors, and a member is lost with its holder."""
    placed = mirrors(plan)
    lost = {}
    for layer, group in sharding_groups(plan).items():
        gone = tuple(
            k
            for k, holder in enumerate(group)
            if holder in failed
            and (not protected or placed[layer][k] is None or placed[layer][k] in failed)
        )
        if gone:
            lost[layer] = gone
    return lost


def beyond_redundancy(
    plan: plans.Plan, failed: Collection[plans.WorkerId], *, protected: bool
) -> dict[int, tuple[int, ...]]:
    """Layer -> its lost members, for every layer whose snapshot cannot be rebuilt from the
    survivors of `failed`: more members lost (holder and mirror) than the group tolerates."""
    groups = sharding_groups(plan)
    return {
        layer: gone
        for layer, gone in lost_members(plan, failed, protected=protected).items()
        if len(gone) > tolerated_losses(protected=protected, group_size=len(groups[layer]))
    }


def member_workers(
    plan: plans.Plan, lost: Mapping[int, tuple[int, ...]], *, protected: bool
) -> tuple[plans.WorkerId, ...]:
    """The failed workers behind `lost` members: their holders and (with redundancy) their
    mirrors, sorted."""
    groups, placed = sharding_groups(plan), mirrors(plan)
    workers: set[plans.WorkerId] = set()
    for layer, members in lost.items():
        for k in members:
            workers.add(groups[layer][k])
            mirror = placed[layer][k]
            if mirror is not None and protected:
                workers.add(mirror)
    return tuple(sorted(workers))
