"""Where snapshot pieces live (planaria.contract.snapshot_placement), as properties.

Covers, over drawn plans (one or several GPUs per node, stages of several workers): a layer's
sharding group is its holders in id order; every member gets a mirror exactly when enough nodes
host none of the layer's holders, the mirrors of one layer sit on distinct nodes, none on a
holder's node, and the rule is deterministic; `mirrored_by` inverts it; over drawn failure sets,
`lost_members` counts a member lost exactly when its holder and its mirror both failed (an
oracle that pools the survivors' stores; without redundancy nothing is mirrored), and the
guarantee: losing every holder of a layer while at most t of its mirrors leaves it rebuildable
(`beyond_redundancy` empty for it).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from planaria.contract import plan as plans
from planaria.contract import snapshot_placement as placement
from tests import strategies


def _holders(p: plans.Plan, layer: int) -> list[plans.WorkerId]:
    return sorted(
        {w for q in p.pipelines for s in q.stages if layer in s.layers for w in s.workers}
    )


@given(p=strategies.plans())
def test_every_member_has_a_mirror_on_its_own_node_of_no_holder_when_nodes_allow(
    p: plans.Plan,
) -> None:
    mirrors = placement.mirrors(p)
    groups = placement.sharding_groups(p)
    nodes = {p.node_of(w) for w in p.workers}
    assert mirrors == placement.mirrors(p)  # deterministic
    for layer, group in groups.items():
        assert list(group) == _holders(p, layer)
        held_on = {p.node_of(w) for w in group}
        free = len(nodes - held_on)
        placed = mirrors[layer]
        assert len(placed) == len(group)
        assert [m is not None for m in placed] == [k < free for k in range(len(group))]
        chosen = [m for m in placed if m is not None]
        assert len({p.node_of(m) for m in chosen}) == len(chosen)  # distinct nodes
        assert not {p.node_of(m) for m in chosen} & held_on
        assert all(m in p.workers for m in chosen)


@given(p=strategies.plans())
def test_mirrored_by_names_the_member_each_worker_keeps(p: plans.Plan) -> None:
    mirrors = placement.mirrors(p)
    for worker in p.workers:
        for layer, member in placement.mirrored_by(p, worker).items():
            assert mirrors[layer][member] == worker
            assert worker not in placement.sharding_groups(p)[layer]


@given(p=strategies.plans(), data=st.data(), protected=st.booleans())
def test_a_member_is_lost_only_with_its_holder_and_its_mirror(
    p: plans.Plan, data: st.DataObject, protected: bool
) -> None:
    workers = sorted(p.workers)
    failed = set(data.draw(st.lists(st.sampled_from(workers), unique=True)))
    stores: dict[plans.WorkerId, set[tuple[int, int]]] = {}
    for layer, group in placement.sharding_groups(p).items():
        for k, holder in enumerate(group):
            stores.setdefault(holder, set()).add((layer, k))
            mirror = placement.mirrors(p)[layer][k]
            if mirror is not None and protected:  # no redundancy, no mirrors
                stores.setdefault(mirror, set()).add((layer, k))
    pooled = set().union(*(files for w, files in stores.items() if w not in failed))
    lost = placement.lost_members(p, failed, protected=protected)
    beyond = placement.beyond_redundancy(p, failed, protected=protected)
    for layer, group in placement.sharding_groups(p).items():
        missing = tuple(k for k in range(len(group)) if (layer, k) not in pooled)
        assert lost.get(layer, ()) == missing
        t = placement.tolerated_losses(protected=protected, group_size=len(group))
        assert (layer in beyond) == (len(missing) > t)


@given(p=strategies.plans(), data=st.data(), protected=st.booleans())
def test_losing_every_holder_and_at_most_t_mirrors_leaves_the_layer_rebuildable(
    p: plans.Plan, data: st.DataObject, protected: bool
) -> None:
    groups = placement.sharding_groups(p)
    layer = data.draw(st.sampled_from(sorted(groups)))
    group, mirrors = groups[layer], placement.mirrors(p)[layer]
    t = placement.tolerated_losses(protected=protected, group_size=len(group))
    placed = [m for m in mirrors if m is not None]
    some = st.lists(st.sampled_from(placed), unique=True, max_size=t) if placed else st.just([])
    lost_mirrors = data.draw(some)
    failed = set(group) | set(lost_mirrors)
    unmirrored = sum(m is None or not protected for m in mirrors)
    rebuildable = layer not in placement.beyond_redundancy(p, failed, protected=protected)
    assert rebuildable == (unmirrored + len(lost_mirrors) <= t)
