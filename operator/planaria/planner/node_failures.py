"""A plan's survival of node failures, with the snapshots' mirrors (issue #20). Eq. 5 counts
a group lost when its members fail, but on Kubernetes a member's host memory is also kept by a
mirror on a node of no holder (`planaria.contract.snapshot_placement`), and live replicas serve
before any snapshot. For a given plan and set of failed nodes, `survives` is the controller's
rule (`planaria.control.recovery`): the job goes on without the persistent checkpoint when
every layer keeps a live replica, or else when every layer's snapshot is rebuildable from the
survivors (a move that needs a snapshot resumes every layer from the snapshot step, so each
layer's group must have lost at most `tolerated_losses` members, a member being lost only with
its holder and its mirror: `snapshot_placement.beyond_redundancy`). So losing the state takes
a layer with no live replica *and* a layer whose snapshot is beyond its redundancy.
`tolerated_node_failures` is the guarantee: the largest f such that every set of f failed
nodes is survived, with a smallest set that is not as the reason; `survival.plan_survival` turns
it into a lower bound on the probability of surviving to time t (at most f of the plan's nodes
fail).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Collection
from dataclasses import dataclass

from planaria.contract import plan as plans
from planaria.contract import snapshot_placement


def survives(plan: plans.Plan, failed: Collection[plans.NodeId], *, protected: bool) -> bool:
    """Whether losing every worker on the nodes `failed` leaves the job's state without the
    persistent checkpoint: every layer keeps a live replica, or no layer's snapshot lost more
    members (holder and mirror) than its redundancy tolerates. `protected`: the job's
    redundancy is not NONE (mirrors and tolerated losses exist only then)."""
    lost = {w for w in plan.workers if plan.node_of(w) in failed}
    groups = snapshot_placement.sharding_groups(plan)
    if all(set(group) - lost for group in groups.values()):
        return True
    return not snapshot_placement.beyond_redundancy(plan, lost, protected=protected)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeTolerance:
    """Every set of `failures` failed nodes is survived (`survives`); `smallest`, one node
    more, is a set that is not (the first in node order): it takes every live replica of
    `layer_without_replica` and more members of `layer_without_snapshot`'s snapshot (holder
    and mirror) than its redundancy tolerates. `reason` says so in words. Of the
    `num_members` members of all the layers' sharding groups, `num_mirrored` have a mirror
    (none without redundancy)."""

    failures: int
    smallest: tuple[plans.NodeId, ...]
    layer_without_replica: int
    layer_without_snapshot: int
    num_members: int
    num_mirrored: int
    reason: str


_Nodes = frozenset[int]  # node ids (plain ints inside the search)
_Members = tuple[_Nodes, ...]  # member k -> the nodes whose loss loses it (holder's, mirror's)
_Kind = tuple[int, frozenset[tuple[_Nodes, int]]]  # (tolerated losses, counted member sets)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Layers:
    """The plan's layers as the search sees them: member node sets, tolerated losses, the
    distinct holder-node sets (each -> its first layer) and the distinct kinds of groups."""

    members: dict[int, _Members]
    tolerated: dict[int, int]
    held: dict[_Nodes, int]
    kinds: tuple[_Kind, ...]
    num_mirrored: int


def tolerated_node_failures(plan: plans.Plan, *, protected: bool) -> NodeTolerance:
    """The plan's guarantee against node failures (module docstring). Exact: a failure set is
    fatal exactly when it holds every holder node of some layer L1 (a holder-node set H) and,
    for some layer L2, the holder and mirror nodes of t + 1 members of L2's group (t = its
    tolerated losses, at most 1): the smallest fatal set is the smallest such union, ties to
    the first in node order. Searched per distinct H, smallest first (a union is at least as
    large as H), over the distinct member node sets outside H (`_smallest_outside`); then the
    first (L2, members, L1) in layer and member order that makes that set names the reason.
    About (distinct H) x (distinct groups' members) set operations; 1,024 nodes x 8 GPUs in
    one-node pipelines has one H and one kind of group."""
    layers = _layers(plan, protected=protected)
    best = _smallest_fatal(layers.held, layers.kinds)
    cut = frozenset(best)
    replicas_of, layer, lost = _first_witness(layers, cut)
    reason = (
        f"every {len(cut) - 1} node failures leave each layer a live replica or a rebuildable "
        f"snapshot; losing nodes {list(best)} loses every live replica of layer {replicas_of} "
        f"and members {list(lost)} of layer {layer}'s snapshot with their mirrors, more than "
        f"the {layers.tolerated[layer]} its redundancy tolerates"
    )
    return NodeTolerance(
        failures=len(cut) - 1,
        smallest=tuple(plans.NodeId(node) for node in best),
        layer_without_replica=replicas_of,
        layer_without_snapshot=layer,
        num_members=sum(len(nodes) for nodes in layers.members.values()),
        num_mirrored=layers.num_mirrored,
        reason=reason,
    )


def _layers(plan: plans.Plan, *, protected: bool) -> _Layers:
    """Each distinct placement (group, mirrors) is turned into node sets once: the layers of
    one stage share their group, and without mirrors their member node sets too."""
    groups, placed = snapshot_placement.sharding_groups(plan), snapshot_placement.mirrors(plan)
    built: dict[tuple[object, object], tuple[_Members, _Nodes, frozenset[tuple[_Nodes, int]]]]
    built = {}
    members: dict[int, _Members] = {}
    tolerated: dict[int, int] = {}
    held: dict[_Nodes, int] = {}
    kinds: dict[_Kind, None] = {}  # in first-seen order, each once
    num_mirrored = 0
    for layer, group in groups.items():
        key = (group, placed[layer])
        if key not in built:
            nodes = _member_node_sets(plan.gpus_per_node, group, placed[layer], protected)
            holders = frozenset(w // plan.gpus_per_node for w in group)
            built[key] = nodes, holders, frozenset(_counted(nodes).items())
        members[layer], holders, counted = built[key]
        held.setdefault(holders, layer)
        t = snapshot_placement.tolerated_losses(protected=protected, group_size=len(group))
        tolerated[layer] = t
        kinds.setdefault((t, counted), None)  # equal kinds offer the same unions
        if protected:
            num_mirrored += len(group) - placed[layer].count(None)
    return _Layers(
        members=members,
        tolerated=tolerated,
        held=held,
        kinds=tuple(kinds),
        num_mirrored=num_mirrored,
    )


def _member_node_sets(
    gpus_per_node: int,
    group: tuple[plans.WorkerId, ...],
    mirrors: tuple[plans.WorkerId | None, ...],
    protected: bool,
) -> _Members:
    """Member k -> the nodes whose loss loses it: its holder's, and its mirror's (if any and
    `protected`: without redundancy there are no mirrors)."""
    return tuple(
        frozenset((holder // gpus_per_node,))
        if mirror is None or not protected
        else frozenset((holder // gpus_per_node, mirror // gpus_per_node))
        for holder, mirror in zip(group, mirrors, strict=True)
    )


def _counted(sets: _Members) -> dict[_Nodes, int]:
    """Each distinct set -> how many times it occurs, capped at 2 (a pair takes at most two)."""
    return {nodes: min(2, count) for nodes, count in collections.Counter(sets).items()}


def _order(nodes: _Nodes) -> tuple[int, list[int]]:
    """Smaller sets first, then the first in node order (sorted lists compared)."""
    return len(nodes), sorted(nodes)


def _smallest_fatal(held: Collection[_Nodes], kinds: tuple[_Kind, ...]) -> tuple[int, ...]:
    """The smallest union of a holder-node set and the node sets of t + 1 members of one
    kind, the first in node order among the smallest. For one H, comparing the parts outside
    H orders the unions alike (two sets of one size differ first at the least node of their
    symmetric difference, which H never holds)."""
    best: tuple[int, tuple[int, ...]] | None = None
    for holders in sorted(held, key=_order):
        if best is not None and len(holders) > best[0]:
            break  # every union from here on is larger than the best
        for t, counted in kinds:
            limit = None if best is None else best[0] - len(holders)
            outside = _smallest_outside(dict(counted), holders, t + 1, limit)
            if outside is None:
                continue
            cut = tuple(sorted(holders | outside))
            if best is None or (len(cut), cut) < best:
                best = (len(cut), cut)
            if not outside:
                break  # nothing beats H itself
    assert best is not None, "a plan has at least one layer, and every layer a member"
    return best[1]


def _smallest_outside(
    counted: dict[_Nodes, int], holders: _Nodes, size: int, limit: int | None
) -> _Nodes | None:
    """The smallest (then first) union, outside `holders`, of the node sets of `size` (1 or
    2) distinct members; parts with more than `limit` nodes are skipped (their unions are at
    least as large). None when no `size` members remain."""
    outside: dict[_Nodes, int] = {}
    for nodes, count in counted.items():
        part = nodes - holders
        if limit is None or len(part) <= limit:
            outside[part] = min(2, outside.get(part, 0) + count)
    if size == 1:
        return min(outside, key=_order, default=None)
    return _smallest_pair_union(outside)


def _smallest_pair_union(counted: dict[_Nodes, int]) -> _Nodes | None:
    """The smallest (then first) union of two members' sets of at most two nodes each, from
    the distinct sets and their counts, without trying every pair: a set twice; two sets that
    share a node (found through each node's sets); and two disjoint ones, where for each set
    w the first set of each size disjoint from w is the best partner of that size (swapping a
    partner for an earlier one of its size, both disjoint from w, gives an earlier union)."""
    unions = [nodes for nodes, count in counted.items() if count >= 2]
    on_node: dict[int, list[_Nodes]] = {}
    for nodes in counted:
        for node in nodes:
            on_node.setdefault(node, []).append(nodes)
    for sharing in on_node.values():
        unions += [a | b for a, b in itertools.combinations(sharing, 2)]
    by_size: dict[int, list[_Nodes]] = {}
    for nodes in sorted(counted, key=_order):
        by_size.setdefault(len(nodes), []).append(nodes)
    for w in counted:
        for ordered in by_size.values():
            partner = next((v for v in ordered if v != w and not v & w), None)
            if partner is not None:
                unions.append(partner | w)
    return min(unions, key=_order, default=None)


def _first_witness(layers: _Layers, cut: _Nodes) -> tuple[int, int, tuple[int, ...]]:
    """(L1, L2, members of L2) making `cut`: the first L2 in layer order, its first members
    in combination order, then the first layer of the first holder-node set in layer order
    (the order a search of every combination meets them in)."""
    inside = [(holders, first) for holders, first in layers.held.items() if holders <= cut]
    needs = [cut - holders for holders, _ in inside]  # what the members' nodes must cover
    for layer, nodes in layers.members.items():
        found = _first_members(nodes, layers.tolerated[layer] + 1, needs, cut)
        if found is not None:
            gone = frozenset().union(*(nodes[k] for k in found))
            replicas_of = next(first for holders, first in inside if holders | gone == cut)
            return replicas_of, layer, found
    raise AssertionError(f"no layer makes the fatal set {sorted(cut)}")


def _first_members(
    nodes: _Members, size: int, needs: list[_Nodes], cut: _Nodes
) -> tuple[int, ...] | None:
    """The first `size` members (1 or 2, in `itertools.combinations` order) whose nodes lie in
    `cut` and cover one of `needs`."""
    usable = [k for k, member in enumerate(nodes) if member <= cut]
    if size == 1:
        return next(((k,) for k in usable if any(n <= nodes[k] for n in needs)), None)
    at: dict[int, list[int]] = {}  # a node -> the positions in usable of members on it
    for position, k in enumerate(usable):
        for node in nodes[k]:
            at.setdefault(node, []).append(position)
    for position, a in enumerate(usable):
        partners = [_first_partner(nodes, usable, at, position, n - nodes[a]) for n in needs]
        found = [b for b in partners if b is not None]
        if found:
            return a, min(found)
    return None


def _first_partner(
    nodes: _Members, usable: list[int], at: dict[int, list[int]], position: int, rest: _Nodes
) -> int | None:
    """The first member after usable[position] whose nodes hold `rest`."""
    if not rest:
        return usable[position + 1] if position + 1 < len(usable) else None
    if len(rest) > 2:  # a member has at most two nodes
        return None
    on = at.get(min(rest), [])
    after = bisect.bisect_right(on, position)
    return next((usable[q] for q in on[after:] if rest <= nodes[usable[q]]), None)
