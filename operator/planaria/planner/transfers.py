"""Transition cost: who plays which role of the next plan, which layers move, and how long it takes.

After a failure the survivors hold the layers of their old stages. A new layout (a plan over the
survivors, from the candidate search) names roles; Odyssey §IV-B binds survivors to roles by a
min-cost bipartite matching (Kuhn-Munkres, `scipy.optimize.linear_sum_assignment`), where the
cost of survivor i playing role j is the bytes i must receive: the state of the layers of role j
that i does not hold. A layer i holds but role j lacks is simply dropped (no cost).

Matching is done per node (Odyssey matches nodes): the layout's node b is played by a surviving
node a, and a's live GPUs play b's workers by an inner matching of the same cost. Nodes keep
their co-location, so the layout's step estimate (intra- vs inter-node links) stays exact. With
one GPU per node this is plain worker-to-role matching on an N x N matrix (empty roles pad it).
`Survivors` computes the survivors' side once for every layout bound after one failure (the
candidate search binds half a dozen); a `Transition` builds its relabelled plan only when asked.

What moves (`plan.LayerTransfer`): every layer a worker's new role has and it does not hold,
sent in equal shards by k of the layer's holders that play a role in the new plan (`_Sources`):
with H such holders and D destinations of the layer, k = max(1, ceil(H / D)), dealt round-robin
over the sorted holders, so each holder sends about D * size / H bytes (what it sent when every
holder served every destination) in about D * k / H messages, and each destination receives k
messages, not H. A layer no survivor holds is a `Restore`:
its state comes from the host-memory snapshots (REFT §4, recovery level 3 of DESIGN.md). Each
worker of a k-worker (tensor-parallel) stage counts as holding and needing its stage's whole
layers: an upper bound on what moves (the executor runs one worker per stage).

Bytes: a layer's moved state is its parameters and optimizer state (what the agent's LayerState
carries); gradients are not moved, they are zero between steps.

Time (bandwidth model): every (source, destination) shard is one message over the intra-node
link when both share a node, else the inter-node link. Each worker has one send and one receive
direction per link kind (full duplex); messages on one of them serialise: latency each plus
bytes / bandwidth. Restores are received over the inter-node link. The copy time is the busiest
such direction, the max over all workers and links. Contention inside the network core is not
modelled. A transition adds measured overheads (`Overheads`).

Errors: `errors.PlanInputError` for inputs that do not fit (a failed worker outside the plan, a
layout over workers that did not survive). Not here: choosing the layout (`candidates`),
weighing the transition against the step time (`policy`).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from planaria.contract import errors, plan, profile

Holdings = Mapping[plan.WorkerId, frozenset[int]]
CostMatrix = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Fixed seconds a transition costs besides moving state.

    `regroup_s`: survivors destroy their process groups and rendezvous again under a new epoch;
    every transition pays it (a dead member breaks the old groups, rerouting included). Default
    0.02 s: DESIGN.md's measurement, 2 ranks on gloo with torch 2.13 CPU. NCCL at scale takes
    seconds; set it from a measurement of the target cluster.
    `restart_s`: a re-planned worker builds the modules and AdamW state of its new layers and
    switches to the new schedule before training resumes. Default 0.02 s: building every layer of
    the `small` shape with its AdamW on this project's dev machine (2 CPU cores, torch 2.13)
    took 19 ms median of 7 (`planaria.agent.training.model.build_layers` + `make_optimizer`);
    workers do it in parallel, so it is paid once. Rerouting does not pay it (roles do not change).
    """

    regroup_s: float = 0.02
    restart_s: float = 0.02

    def __post_init__(self) -> None:
        for name in ("regroup_s", "restart_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise errors.PlanInputError(f"{name} is {value}; give finite seconds >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Restore:
    """Layer `layer` has no live replica: `destination` loads it from host-memory snapshots."""

    layer: int
    destination: plan.WorkerId


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """Moving from the old plan to `target`: the copies, the restores, bytes and seconds.

    `target` is `layout` with its workers replaced through `binding` (None: as written). It is
    built when first asked for: the search binds and costs every candidate, but eq. 8 needs
    the new plan of few of them (at 8,192 workers building one takes tens of milliseconds).
    `moved_bytes` counts every byte received by some worker (copies and restores); `transfer_s`
    is the bandwidth model's time for all of them; `overhead_s` the fixed `Overheads` paid.
    """

    layout: plan.Plan
    binding: Mapping[plan.WorkerId, plan.WorkerId] | None
    transfers: tuple[plan.LayerTransfer, ...]
    restores: tuple[Restore, ...]
    moved_bytes: int
    transfer_s: float
    overhead_s: float
    _built: list[plan.Plan] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def target(self) -> plan.Plan:
        """The next plan: `layout` played by the bound survivors."""
        if not self._built:
            built = self.layout if self.binding is None else relabel(self.layout, self.binding)
            self._built.append(built)
        return self._built[0]

    @property
    def total_s(self) -> float:
        """t_{S_i -> S_i+1} of Odyssey eq. 2 and 8."""
        return self.transfer_s + self.overhead_s


def moved_bytes(layer: profile.LayerProfile) -> int:
    """Bytes of one layer's state that a copy moves: parameters and optimizer state."""
    return layer.parameter_bytes + layer.optimizer_bytes


def holdings(
    old: plan.Plan, failed: Collection[plan.WorkerId], spare: Collection[plan.WorkerId] = ()
) -> dict[plan.WorkerId, frozenset[int]]:
    """Layers each live worker holds: its old stage's layers; `spare` workers (live, outside
    the old plan) hold none. Raises PlanInputError for failed workers the plan does not have
    or spares that are in it."""
    workers = set(old.workers)
    unknown = sorted(set(failed) - workers)
    if unknown:
        raise errors.PlanInputError(
            f"failed workers {unknown} are not in the plan (its workers: {sorted(workers)}); "
            "name workers of the running plan"
        )
    clash = sorted(set(spare) & workers)
    if clash:
        raise errors.PlanInputError(f"spare workers {clash} are in the plan; list idle ones only")
    held: dict[plan.WorkerId, frozenset[int]] = {w: frozenset() for w in spare}
    dead = set(failed)
    ranges: dict[tuple[int, int], frozenset[int]] = {}  # one set per layer range
    for pipeline in old.pipelines:
        for stage in pipeline.stages:
            key = (stage.layer_start, stage.layer_stop)
            layers = ranges.get(key)
            if layers is None:
                layers = ranges[key] = frozenset(stage.layers)
            for worker in stage.workers:
                if worker not in dead:
                    held[worker] = layers
    return {w: held[w] for w in sorted(held)}


def roles(layout: plan.Plan) -> dict[plan.WorkerId, frozenset[int]]:
    """The layers each worker of `layout` must hold (its stage's), by worker id."""
    pairs: list[tuple[plan.WorkerId, frozenset[int]]] = []
    for pipeline in layout.pipelines:
        for stage in pipeline.stages:
            layers = frozenset(stage.layers)  # one set per stage, shared by its workers
            pairs.extend((worker, layers) for worker in stage.workers)
    return dict(sorted(pairs, key=lambda pair: pair[0]))


def cost_matrix(
    held: Sequence[frozenset[int]], wanted: Sequence[frozenset[int]], layer_bytes: Sequence[int]
) -> CostMatrix:
    """cost[i][j]: bytes survivor i must receive to play role j (Odyssey §IV-B)."""
    # survivors of one stage hold the same layers and roles repeat: cost each distinct pair
    # once (entries are sums of integer byte counts: exact in float64 in any order while a
    # model holds under 2**53 bytes, 9 PB)
    costs = _ClassCosts.of(held, wanted, layer_bytes)
    return costs.block(list(range(len(held))), list(range(len(wanted))))


def _incidence(
    sets: Sequence[Collection[int]], num_layers: int
) -> tuple[CostMatrix, npt.NDArray[np.intp]]:
    """0/1 rows of the distinct layer sets among `sets`, and each set's row."""
    rows: dict[frozenset[int], int] = {}
    index = np.array([rows.setdefault(frozenset(s), len(rows)) for s in sets], dtype=np.intp)
    matrix = np.zeros((len(rows), num_layers))
    for layers, row in rows.items():
        matrix[row, list(layers)] = 1.0
    return matrix, index


def match(
    held: Holdings, layout: plan.Plan, prof: profile.Profile
) -> dict[plan.WorkerId, plan.WorkerId]:
    """Min-cost binding of the layout's workers (keys) to survivors (values), node by node.

    Raises PlanInputError when the layout uses workers that are not live survivors.
    """
    return Survivors(held, prof).match(layout)


class Survivors:
    """The survivors' side of every binding after one failure, computed once: each survivor's
    holding class, their nodes and node shapes, each layer's holders. The candidate search
    binds half a dozen layouts to the same survivors; at 8,192 workers classing and grouping
    them again was a large part of each binding. `match` and `replan` give what the module's
    functions of the same names give."""

    def __init__(
        self, held: Holdings, prof: profile.Profile, matchings: Matchings | None = None
    ) -> None:
        self.held = held
        self.profile = prof
        # the inner matchings by their cost block (`_inner`), shared when a caller keeps them
        self._matchings: Matchings = {} if matchings is None else matchings
        self._solved: dict[tuple[tuple[int, ...], tuple[tuple[int, int], ...]], _Solved] = {}
        # what every binding depends on besides the profile: a memo key across decisions
        self.key: tuple[tuple[plan.WorkerId, frozenset[int]], ...] = tuple(held.items())
        self._live = set(held)
        self.workers = list(held)
        self._sizes = [moved_bytes(layer) for layer in prof.layers]
        classes: dict[frozenset[int], int] = {}
        self._class = np.array(
            [classes.setdefault(held[w], len(classes)) for w in self.workers], dtype=np.intp
        )
        self._holding = list(classes)  # each holding class's layers
        have = np.zeros((len(classes), len(self._sizes)))
        for row, layers in enumerate(self._holding):
            have[row, list(layers)] = 1.0
        # (1 - have) masks what a survivor already holds; dropping a layer it holds costs nothing
        self._lacking = (1.0 - have) * np.asarray(self._sizes, dtype=np.float64)
        self._nodes: dict[int, _Nodes] = {}
        self._holders = _Holders(held)

    def match(self, layout: plan.Plan) -> dict[plan.WorkerId, plan.WorkerId]:
        """`match` of the module, on these survivors."""
        bound = self._bind(layout)
        return dict(
            zip(bound.workers, [self.workers[i] for i in bound.survivor.tolist()], strict=True)
        )

    def replan(
        self,
        layout: plan.Plan,
        overheads: Overheads,
        *,
        binding: Mapping[plan.WorkerId, plan.WorkerId] | None = None,
    ) -> Transition:
        """`replan` of the module, on these survivors."""
        if binding is None:
            bound = self._bind(layout)
            survivors = [self.workers[i] for i in bound.survivor.tolist()]
            chosen: Mapping[plan.WorkerId, plan.WorkerId] = dict(
                zip(bound.workers, survivors, strict=True)
            )
            transfers, restores = self._lacked(bound, set(survivors))
        else:
            chosen = binding
            transfers, restores = _missing(self.held, self._holders, layout, chosen)
        moved = sum(self._sizes[t.layer] for t in transfers)
        moved += sum(self._sizes[r.layer] for r in restores)
        transition = Transition(
            layout=layout,
            binding=chosen,
            transfers=transfers,
            restores=restores,
            moved_bytes=moved,
            transfer_s=transfer_s(transfers, restores, self.profile, layout.gpus_per_node),
            overhead_s=overheads.regroup_s + overheads.restart_s,
        )
        if binding is not None:
            _ = transition.target  # a caller's binding is checked now (PlanInputError)
        return transition

    def _bind(self, layout: plan.Plan) -> _Bound:
        """The min-cost binding of `layout`'s roles to these survivors (`match`)."""
        workers, role_class, ranges = _role_classes(layout)
        strangers = sorted(set(workers) - self._live)
        if strangers:
            raise errors.PlanInputError(
                f"the new layout uses workers {strangers} that are not live; lay it out over "
                f"the survivors {sorted(self.held)}"
            )
        need = np.zeros((len(ranges), len(self._sizes)))
        for (start, stop), row in ranges.items():
            need[row, start:stop] = 1.0
        # entries are sums of integer byte counts: exact in float64 in any order while a model
        # holds under 2**53 bytes (9 PB)
        distinct: CostMatrix = self._lacking @ need.T
        gpus = layout.gpus_per_node
        if gpus not in self._nodes:
            self._nodes[gpus] = _Nodes.of(self.workers, self._class, gpus)
        # whole nodes play whole layout nodes: co-location, hence the layout's estimate, is kept
        rows, cols = self._nodes[gpus], _Nodes.of_sorted(workers, role_class, gpus)
        range_of = list(ranges)  # each role class's layer range, in class order

        def solve(held_classes: list[int], wanted_classes: list[int]) -> tuple[float, _Local]:
            # the block of costs follows from the holding classes and the roles' layer ranges:
            # the same answer whenever another layout of this failure meets them again
            key = (tuple(held_classes), tuple([range_of[c] for c in wanted_classes]))
            found = self._solved.get(key)
            if found is None:
                found = _inner(distinct, held_classes, wanted_classes, self._matchings)
                self._solved[key] = found
            return found

        outer, local = _node_costs(distinct, rows, cols, solve)
        a, b = _assignment(outer)
        played = b < len(cols.groups)  # columns past the layout's nodes are padding: a left idle
        a, b = a[played], b[played]
        survivor = np.full(len(workers), -1, dtype=np.intp)
        # the survivor at position i of node a plays the role at position j of node b, for
        # the inner matching's (i, j) of their shapes: all nodes of one shape pair at once
        pair = rows.shape[a] * len(cols.shapes) + cols.shape[b]
        for key in np.unique(pair).tolist():
            chosen = pair == key
            i, j = local[key // len(cols.shapes)][key % len(cols.shapes)]
            survivor[cols.members[b[chosen]][:, j].ravel()] = rows.members[a[chosen]][:, i].ravel()
        assert bool(np.all(survivor >= 0)), "every role of a feasible layout is played"
        return _Bound(workers=workers, role_class=role_class, ranges=ranges, survivor=survivor)

    def _lacked(
        self, bound: _Bound, members: Collection[plan.WorkerId]
    ) -> tuple[tuple[plan.LayerTransfer, ...], tuple[Restore, ...]]:
        """`missing` for a binding of `_bind` (`members`: the survivors it binds): each (role
        class, holding class) pair's lacking layers listed once, then only the workers that
        lack some, by destination (one role per worker, layers in order: `missing`'s
        (destination, layer) order)."""
        num_holdings = len(self._holding)
        pair = bound.role_class * num_holdings + self._class[bound.survivor]
        distinct, which = np.unique(pair, return_inverse=True)
        ranges = list(bound.ranges)  # in class order
        lack: list[list[int]] = []
        for key in distinct.tolist():
            start, stop = ranges[key // num_holdings]
            have = self._holding[key % num_holdings]
            lack.append([layer for layer in range(start, stop) if layer not in have])
        needy = [k for k, layers in enumerate(lack) if layers]
        if not needy:
            return (), ()
        roles = np.flatnonzero(np.isin(which, needy))
        destinations = np.asarray(self.workers, dtype=np.int64)[bound.survivor[roles]]
        order = np.argsort(destinations, kind="stable")
        needs = zip(destinations[order].tolist(), which[roles[order]].tolist(), strict=True)
        return _copies(((plan.WorkerId(w), lack[k]) for w, k in needs), self._holders, members)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Bound:
    """A binding by `Survivors._bind`: the layout's workers in id order, each one's role class
    (layer range `ranges`, in class order) and the survivor playing it (an index into
    `Survivors.workers`)."""

    workers: list[plan.WorkerId]
    role_class: npt.NDArray[np.intp]
    ranges: dict[tuple[int, int], int]
    survivor: npt.NDArray[np.intp]


def _role_classes(
    layout: plan.Plan,
) -> tuple[list[plan.WorkerId], npt.NDArray[np.intp], dict[tuple[int, int], int]]:
    """The layout's workers in id order (`roles`' order), each one's role class, and each
    class's layer range [start, stop)."""
    ranges: dict[tuple[int, int], int] = {}
    stages = [stage for pipeline in layout.pipelines for stage in pipeline.stages]
    role = [ranges.setdefault((s.layer_start, s.layer_stop), len(ranges)) for s in stages]
    ids = np.fromiter((w for s in stages for w in s.workers), dtype=np.int64)
    classes = np.repeat(np.asarray(role, dtype=np.intp), [len(s.workers) for s in stages])
    if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):  # laid out out of id order
        order = np.argsort(ids, kind="stable")
        ids, classes = ids[order], classes[order]
    return cast(list[plan.WorkerId], ids.tolist()), classes, ranges


@dataclass(frozen=True, slots=True)
class _Nodes:
    """Workers (indices into a list of them) grouped by node in node order, each group in list
    order; each node's shape (its workers' classes in that order) as an index into `shapes`."""

    groups: list[list[int]]
    shape: npt.NDArray[np.intp]
    shapes: list[list[int]]
    members: npt.NDArray[np.intp]  # `groups` as rows, padded with -1

    @staticmethod
    def padded(groups: list[list[int]]) -> npt.NDArray[np.intp]:
        width = max(len(g) for g in groups)
        return np.asarray([g + [-1] * (width - len(g)) for g in groups], dtype=np.intp)

    @classmethod
    def of(cls, workers: Sequence[int], classes: npt.NDArray[np.intp], gpus: int) -> _Nodes:
        groups = _groups(workers, gpus)
        of_worker = classes.tolist()
        index: dict[tuple[int, ...], int] = {}
        shape = [index.setdefault(tuple([of_worker[i] for i in g]), len(index)) for g in groups]
        shapes = [list(key) for key in index]
        return cls(groups, np.asarray(shape, dtype=np.intp), shapes, cls.padded(groups))

    @classmethod
    def of_sorted(cls, workers: Sequence[int], classes: npt.NDArray[np.intp], gpus: int) -> _Nodes:
        """`of` for workers in id order: each node's workers are one run of the list."""
        nodes = np.asarray(workers, dtype=np.int64) // gpus
        if nodes.size and bool(np.all(nodes[1:] != nodes[:-1])):
            return cls.of_ones(classes)
        starts = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]]).tolist()
        bounds = list(itertools.pairwise([*starts, len(workers)]))
        of_worker = classes.tolist()
        index: dict[tuple[int, ...], int] = {}
        shape = [index.setdefault(tuple(of_worker[a:b]), len(index)) for a, b in bounds]
        groups = [list(range(a, b)) for a, b in bounds]
        shapes = [list(key) for key in index]
        return cls(groups, np.asarray(shape, dtype=np.intp), shapes, cls.padded(groups))

    @classmethod
    def of_ones(cls, classes: npt.NDArray[np.intp]) -> _Nodes:
        """`of_sorted` when every node holds one worker: a node's shape is its worker's class,
        numbered in order of first use, on arrays (a 1,024-node layout per binding)."""
        distinct, first, inverse = np.unique(classes, return_index=True, return_inverse=True)
        order = np.argsort(first)  # the classes in order of first use
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        groups = [[i] for i in range(classes.size)]
        members = np.arange(classes.size, dtype=np.intp).reshape(-1, 1)
        shapes = [[c] for c in distinct[order].tolist()]
        return cls(groups, rank[inverse.reshape(-1)].astype(np.intp), shapes, members)

    def shapes_of_one(self) -> list[int]:
        """With one worker per node: each node's worker's class."""
        return [self.shapes[s][0] for s in self.shape.tolist()]


@dataclass(frozen=True, slots=True, kw_only=True)
class _ClassCosts:
    """`cost_matrix` kept factored: `distinct[h, w]` for the distinct holdings h and roles w,
    and each survivor's (`held_index`) and role's (`wanted_index`) class. At 8,192 workers the
    full matrix would be 512 MiB; its entries are `distinct[held_index[i], wanted_index[j]]`."""

    distinct: CostMatrix
    held_index: npt.NDArray[np.intp]
    wanted_index: npt.NDArray[np.intp]

    @classmethod
    def of(
        cls,
        held: Sequence[frozenset[int]],
        wanted: Sequence[frozenset[int]],
        layer_bytes: Sequence[int],
    ) -> _ClassCosts:
        have, held_index = _incidence(held, len(layer_bytes))
        need, wanted_index = _incidence(wanted, len(layer_bytes))
        weights = np.asarray(layer_bytes, dtype=np.float64)
        # (1 - have) masks what a survivor already holds; dropping a layer it holds costs nothing
        distinct = ((1.0 - have) * weights) @ need.T
        return cls(distinct=distinct, held_index=held_index, wanted_index=wanted_index)

    def block(self, rows: Sequence[int], cols: Sequence[int]) -> CostMatrix:
        """The full cost matrix's entries at `rows` x `cols` (survivor and role indices)."""
        result: CostMatrix = self.distinct[np.ix_(self.held_index[rows], self.wanted_index[cols])]
        return result


_Local = tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]
# `_inner`'s answers by the cost block's shape and bytes: Kuhn-Munkres gives the same answer
# for the same block, and a 2-hour run of 1,024 nodes of 8 GPUs solves ~37,000 of 87 blocks
_Solved = tuple[float, _Local]
Matchings = dict[tuple[tuple[int, ...], bytes], _Solved]


def _node_costs(
    distinct: CostMatrix,
    rows: _Nodes,
    cols: _Nodes,
    solve: Callable[[list[int], list[int]], _Solved],
) -> tuple[CostMatrix, list[list[_Local]]]:
    """The N x N node matrix (survivor node a plays layout node b; columns past the layout's
    nodes are empty roles, cost 0) and, per pair of node shapes, the inner matching's positions
    (i in the survivors' node, j in the layout's); `distinct[h, r]`: the bytes a survivor of
    holding class h receives to play role class r."""
    if all(len(group) == 1 for group in rows.groups + cols.groups):  # no inner matching
        # one worker per node: its shape is its class
        outer = _padded(distinct, rows.shapes_of_one(), cols.shapes_of_one())
        one = (np.zeros(1, dtype=np.intp), np.zeros(1, dtype=np.intp))
        return outer, [[one] * len(cols.shapes) for _ in rows.shapes]
    # The inner matching of nodes a and b sees only the classes of a's survivors and of b's
    # roles, in node order: nodes with the same ordered classes have the same block, hence the
    # same Kuhn-Munkres answer at the same local positions. Solve it once per distinct pair of
    # such shapes (a few dozen), not per pair of nodes (a million at 1,024 nodes).
    local: list[list[_Local]] = []
    by_shape = np.zeros((len(rows.shapes), len(cols.shapes)))
    for r, held_classes in enumerate(rows.shapes):
        local.append([])
        for c, wanted_classes in enumerate(cols.shapes):
            by_shape[r, c], positions = solve(held_classes, wanted_classes)  # `_inner`'s
            local[r].append(positions)
    return _padded(by_shape, rows.shape, cols.shape), local


def _padded(
    table: CostMatrix,
    rows: Sequence[int] | npt.NDArray[np.intp],
    cols: Sequence[int] | npt.NDArray[np.intp],
) -> CostMatrix:
    """`table[rows[a], cols[b]]` for every a, b, padded with zero columns to a square (empty
    roles). Indexed one axis at a time: `np.ix_` on a 1,024 x 1,024 result is 8x slower."""
    picked = table[np.asarray(rows, dtype=np.intp)]
    wanted = np.asarray(cols, dtype=np.intp)
    if wanted.size < picked.shape[0]:  # empty roles: a zero column of the table, gathered too
        picked = np.hstack([picked, np.zeros((picked.shape[0], 1))])
        wanted = np.r_[wanted, np.full(picked.shape[0] - wanted.size, table.shape[1], np.intp)]
    block: CostMatrix = picked[:, wanted]
    return block


def _groups(workers: Sequence[int], gpus_per_node: int) -> list[list[int]]:
    """Indices into `workers`, grouped by node in node order."""
    by_node: dict[int, list[int]] = defaultdict(list)
    for index, worker in enumerate(workers):
        by_node[worker // gpus_per_node].append(index)
    return [by_node[node] for node in sorted(by_node)]


def _inner(
    distinct: CostMatrix,
    held_classes: list[int],
    wanted_classes: list[int],
    matchings: Matchings,
) -> tuple[float, _Local]:
    """Cheapest way for one node's survivors (their classes, in order) to play one layout
    node's roles: total bytes and the (survivor, role) positions within the two nodes; inf
    when too few survivors. Memoised in `matchings` by the block of costs itself."""
    if len(wanted_classes) > len(held_classes):  # needs more GPUs than this node has alive
        empty = np.zeros(0, dtype=np.intp)
        return math.inf, (empty, empty)
    block = distinct[np.ix_(held_classes, wanted_classes)]
    key = (block.shape, block.tobytes())
    found = matchings.get(key)
    if found is None:
        r, c = _assignment(block)
        r.flags.writeable = c.flags.writeable = False  # shared by every use of the block
        found = matchings[key] = (float(block[r, c].sum()), (r, c))
    return found


def relabel(layout: plan.Plan, binding: Mapping[plan.WorkerId, plan.WorkerId]) -> plan.Plan:
    """`layout` with every worker replaced by the survivor bound to it."""
    survivor = binding.__getitem__  # one C call per worker: 8,192 of them at 1,024 x 8

    def stages(pipeline: plan.Pipeline) -> tuple[plan.Stage, ...]:
        return tuple(
            [
                plan.one_worker_stage(s.layer_start, s.layer_stop, survivor(s.workers[0]))
                if len(s.workers) == 1
                else plan.Stage(
                    layer_start=s.layer_start,
                    layer_stop=s.layer_stop,
                    workers=tuple(map(survivor, s.workers)),
                )
                for s in pipeline.stages
            ]
        )

    pipelines = [
        plan.Pipeline(stages=stages(p), num_micro_batches=p.num_micro_batches)
        for p in layout.pipelines
    ]
    return plan.Plan(
        pipelines=tuple(pipelines),
        micro_batch_size=layout.micro_batch_size,
        gpus_per_node=layout.gpus_per_node,
        reroutes=layout.reroutes,
    )


def missing(
    held: Holdings, new: plan.Plan
) -> tuple[tuple[plan.LayerTransfer, ...], tuple[Restore, ...]]:
    """Layers each worker of `new` lacks, in (destination, layer) order: copies from some of the
    layer's live holders that are workers of `new` (`_Sources`), and restores of layers no such
    holder has."""
    return _missing(held, _Holders(held), new, None)


class _Holders:
    """Each layer's live holders, sorted (so that `_Sources` deals them the same way in every
    run), listed when a copy first needs them: survivors of a stage hold the
    same layers, so they are grouped by holding first; at 8,192 workers a layer has thousands
    of holders."""

    def __init__(self, held: Holdings) -> None:
        self._by_holding: dict[frozenset[int], list[plan.WorkerId]] = defaultdict(list)
        for worker, layers in held.items():
            self._by_holding[layers].append(worker)
        self._sources: dict[int, tuple[plan.WorkerId, ...]] = {}

    def of(self, layer: int) -> tuple[plan.WorkerId, ...]:
        if layer not in self._sources:
            found = (w for layers, ws in self._by_holding.items() if layer in layers for w in ws)
            self._sources[layer] = tuple(sorted(found))
        return self._sources[layer]


def _missing(
    held: Holdings,
    holders: _Holders,
    layout: plan.Plan,
    binding: Mapping[plan.WorkerId, plan.WorkerId] | None,
) -> tuple[tuple[plan.LayerTransfer, ...], tuple[Restore, ...]]:
    """`missing` for `layout` played through `binding` (None: as written), without building
    the relabelled plan."""
    members: set[plan.WorkerId] = set()  # who plays a role: only they send in the next epoch
    # per role (layer range) and holding, the layers the role lacks, in order: a few dozen
    # distinct pairs at 8,192 workers, and survivors of one old stage share one holding set
    lacking: dict[tuple[int, int], dict[frozenset[int], list[int]]] = {}
    nothing: frozenset[int] = frozenset()
    needs: list[tuple[plan.WorkerId, list[int]]] = []
    for stage in (stage for pipeline in layout.pipelines for stage in pipeline.stages):
        start, stop = stage.layer_start, stage.layer_stop
        by_holding = lacking.setdefault((start, stop), {})
        for role in stage.workers:
            worker = role if binding is None else binding[role]
            members.add(worker)
            have = held.get(worker, nothing)
            lack = by_holding.get(have)
            if lack is None:
                lack = by_holding[have] = [
                    layer for layer in range(start, stop) if layer not in have
                ]
            if lack:
                needs.append((worker, lack))
    # a worker has one stage and its layers come in order: a stable sort by destination gives
    # (destination, layer) order without listing every worker's role first
    needs.sort(key=lambda need: need[0])
    return _copies(needs, holders, members)


def _copies(
    needs: Iterable[tuple[plan.WorkerId, Sequence[int]]],
    holders: _Holders,
    members: Collection[plan.WorkerId],
) -> tuple[tuple[plan.LayerTransfer, ...], tuple[Restore, ...]]:
    """Each destination's lacking layers, in the order given: a copy from some of the layer's
    holders among `members` (`_Sources`), or a restore from the snapshot tiers where none of
    them holds the layer. A holder outside `members` is not in the next epoch's group and
    cannot send (`planning.within` would drop it)."""
    listed = [(worker, lack) for worker, lack in needs]
    sources = _Sources(holders, members, Counter(n for _, lack in listed for n in lack))
    transfers: list[plan.LayerTransfer] = []
    restores: list[Restore] = []
    for worker, lack in listed:
        for layer in lack:
            chosen = sources.next(layer)
            if chosen:
                transfers.append(
                    plan.LayerTransfer(layer=layer, destination=worker, sources=chosen)
                )
            else:
                restores.append(Restore(layer=layer, destination=worker))
    return tuple(transfers), tuple(restores)


class _Sources:
    """The sources of each successive copy of a layer: k = max(1, ceil(H / D)) of its H holders
    (sorted, among the next plan's workers) for each of its D destinations, dealt round-robin.

    Copy j of the layer (in the order asked) takes holders (j * k + i) mod H for i < k, as a
    sorted tuple (k <= H, so none repeats). D * k >= H, so every holder serves, each about
    D * k / H shards of size / k: the bytes it sent when every holder served every destination
    (D * size / H), in k messages to each destination instead of H. Naming every holder made a
    scale-up at 1,024 x 8 send 2,056 small messages per copy, 428 million in all, each charged
    its latency by `transfer_s` (its estimate 11.9 s, now 9.9 s) and checked in every
    Configure. Same-node holders are not preferred (docs/policy.md, "What moves", says why).
    Tuples are shared: copies with the same sources name one tuple object (`planning.within`
    filters each distinct one once).
    """

    def __init__(
        self, holders: _Holders, members: Collection[plan.WorkerId], wanted: Mapping[int, int]
    ) -> None:
        self._holders = holders
        self._members = members
        self._wanted = wanted  # D per layer
        self._live: dict[int, tuple[plan.WorkerId, ...]] = {}
        self._served: Counter[int] = Counter()
        self._dealt: dict[tuple[int, int], tuple[plan.WorkerId, ...]] = {}

    def next(self, layer: int) -> tuple[plan.WorkerId, ...]:
        """The next copy of `layer`'s sources; () when no holder is among the members."""
        found = self._live.get(layer)
        if found is None:
            members = self._members
            found = self._live[layer] = tuple(w for w in self._holders.of(layer) if w in members)
        if not found:
            return ()
        j = self._served[layer]
        self._served[layer] = j + 1
        k = max(1, -(-len(found) // self._wanted[layer]))
        start = j * k % len(found)
        dealt = self._dealt.get((layer, start))
        if dealt is None:
            picked = [found[(start + i) % len(found)] for i in range(k)]
            dealt = self._dealt[(layer, start)] = tuple(sorted(picked))
        return dealt


def transfer_s(
    transfers: Sequence[plan.LayerTransfer],
    restores: Sequence[Restore],
    prof: profile.Profile,
    gpus_per_node: int,
) -> float:
    """Seconds to move everything: the busiest worker's send or receive direction on one link
    kind (module docstring). 0.0 when nothing moves."""
    # every destination of a layer gets it from the same holders in the same shards: one pass
    # over the holders per layer, not per (destination, source)
    by_layer: dict[tuple[int, tuple[plan.WorkerId, ...]], list[plan.WorkerId]] = defaultdict(list)
    for transfer in transfers:
        by_layer[(transfer.layer, transfer.sources)].append(transfer.destination)
    loads = [_layer_loads(layer, s, d, prof, gpus_per_node) for (layer, s), d in by_layer.items()]
    # restores: snapshot shards sit on other nodes (REFT §4), one message over the inter-node link
    ids = np.asarray([r.destination for r in restores], dtype=np.int64)
    sizes = np.asarray([moved_bytes(prof.layers[r.layer]) for r in restores], dtype=np.int64)
    loads.append(_Loads.of(ids, _RECEIVE_INTER, np.ones_like(ids), sizes))
    return _busiest_s(_Loads.joined(loads), prof)


# A load's direction and link, in the two low bits of its key: (worker << 2) | intra << 1 | send
_RECEIVE_INTER, _SEND_INTER, _RECEIVE_INTRA, _SEND_INTRA = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class _Loads:
    """Messages and bytes per (worker, link, direction) key, one entry per addition; int64
    throughout (exact while a direction carries under 2**63 bytes)."""

    keys: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    num_bytes: npt.NDArray[np.int64]

    @classmethod
    def of(
        cls,
        workers: npt.NDArray[np.int64],
        kind: int,
        counts: npt.NDArray[np.int64],
        num_bytes: npt.NDArray[np.int64],
    ) -> _Loads:
        return cls(workers * 4 + kind, counts, num_bytes)

    @classmethod
    def joined(cls, parts: list[_Loads]) -> _Loads:
        """One entry per key: the integer sums of its additions (in any order the same)."""
        keys = np.concatenate([p.keys for p in parts])
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        counts = np.concatenate([p.counts for p in parts])[order]
        num_bytes = np.concatenate([p.num_bytes for p in parts])[order]
        if not keys.size:
            return cls(keys, counts, num_bytes)
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        return cls(
            keys[starts], np.add.reduceat(counts, starts), np.add.reduceat(num_bytes, starts)
        )


def _layer_loads(
    layer: int,
    sources: tuple[plan.WorkerId, ...],
    destinations: list[plan.WorkerId],
    prof: profile.Profile,
    gpus_per_node: int,
) -> _Loads:
    """The loads of sending `layer` from `sources` (each its `LayerTransfer.shard`) to each of
    `destinations`: each source sends one message to every destination, over the intra-node
    link to those on its node; each destination receives one from every source."""
    size, k = moved_bytes(prof.layers[layer]), len(sources)
    cut = np.arange(k + 1, dtype=np.int64) * size // k
    shards = cut[1:] - cut[:-1]  # (i + 1) * size // k - i * size // k, as `shard` deals them
    src = np.asarray(sources, dtype=np.int64)
    dst = np.asarray(destinations, dtype=np.int64)
    src_node, dst_node = src // gpus_per_node, dst // gpus_per_node
    ordered = np.sort(dst_node)
    near = np.searchsorted(ordered, src_node, "right") - np.searchsorted(ordered, src_node)
    far = dst.size - near
    # per destination, the sources on its node: their count and shards' bytes
    by_node = np.argsort(src_node, kind="stable")
    nodes, starts = np.unique(src_node[by_node], return_index=True)
    per_node = np.add.reduceat(shards[by_node], starts)
    sources_on = np.diff(np.r_[starts, k])
    at = np.minimum(np.searchsorted(nodes, dst_node), nodes.size - 1)
    same = nodes[at] == dst_node
    count = np.where(same, sources_on[at], 0)
    got = np.where(same, per_node[at], 0)
    return _Loads.joined(
        [
            _Loads.of(src, _SEND_INTRA, near, near * shards),
            _Loads.of(src, _SEND_INTER, far, far * shards),
            _Loads.of(dst, _RECEIVE_INTRA, count, got),
            _Loads.of(dst, _RECEIVE_INTER, k - count, size - got),
        ]
    )


def _busiest_s(loads: _Loads, prof: profile.Profile) -> float:
    """The largest `_busy_s` over the keys that carry a message (a key without one carries no
    bytes either); the same float64 operations as `_busy_s` on each, so the same floats."""
    best = 0.0
    for intra, link in ((1, prof.intra_node), (0, prof.inter_node)):
        mine = ((loads.keys >> 1) & 1 == intra) & (loads.counts > 0)
        if bool(mine.any()):
            counts = loads.counts[mine].astype(np.float64)
            num_bytes = loads.num_bytes[mine].astype(np.float64)
            busy = counts * link.latency_s + num_bytes / link.bandwidth_bytes_per_s
            best = max(best, float(busy.max()))
    return best


def replan(
    held: Holdings,
    layout: plan.Plan,
    prof: profile.Profile,
    overheads: Overheads,
    *,
    binding: Mapping[plan.WorkerId, plan.WorkerId] | None = None,
) -> Transition:
    """The transition to `layout` with its workers bound to survivors by `binding` (default:
    the min-cost `match`; pass the identity to cost the layout as written). Binding several
    layouts to the same survivors: `Survivors(held, prof).replan` each (the same result)."""
    return Survivors(held, prof).replan(layout, overheads, binding=binding)


def keep(new: plan.Plan, overheads: Overheads) -> Transition:
    """The transition of rerouting: the layout stays, nothing moves, survivors regroup."""
    return Transition(
        layout=new,
        binding=None,
        transfers=(),
        restores=(),
        moved_bytes=0,
        transfer_s=0.0,
        overhead_s=overheads.regroup_s,
    )


def load_solver() -> None:
    """Import the matching's solver (scipy.optimize: about a second of CPU, once per process)."""
    from scipy import optimize  # noqa: F401


def _assignment(cost: CostMatrix) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Kuhn-Munkres on a cost matrix: (row indices, column indices) of a min-cost matching.
    scipy is imported here rather than with the module: importing scipy.optimize takes about
    a second, which every `planaria` command would pay (`plan` without --failed never matches)."""
    from scipy import optimize

    rows, cols = optimize.linear_sum_assignment(cost)
    return rows, cols
