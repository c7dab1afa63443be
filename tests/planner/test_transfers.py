"""Transition cost (planaria.planner.transfers): matching survivors to roles, copies, time.

Covers: holdings of survivors and spares, and refused inputs; the cost matrix (bytes of the layers a
survivor lacks); Odyssey Fig. 3 (DP=3 x PP=3 over 9 layers, one node fails, DP=2 x PP=4 [2,2,2,3]):
the matching moves no more layers than the best of all 8! hand assignments and strictly fewer than
the identity; the matching's bytes equal a brute-force optimum over every node-preserving assignment
(hypothesis, up to 6 workers, 1 or 2 GPUs per node); the binding memoised by node shape equals the
per-node-pair matching it replaced (hypothesis, up to 16 workers, 2-4 GPUs per node, and grids of
repeated node shapes); survivors shared by two layouts (`Survivors`: binding by index arrays, copies
listed per class pair) bind and list copies as that matching and `missing` on the relabelled plan do
(hypothesis, 1-4 GPUs per node); every worker receives exactly the layers it lacks, from k = max(1,
ceil(H / D)) of the H holders in the new plan for the D destinations of the layer, dealt evenly
(every holder serves, shard counts within one), and restores only layers no such holder has, both in
(destination, layer) order; node co-location is kept; the bandwidth model against hand-computed
times (sources spread, intra vs inter node, latency per message, restores) and, exactly, against the
message-by-message model it replaced and the per-layer pass in Python ints that the numpy one
replaced (hypothesis, over drawn copies and over a replan's own);
overheads per transition kind.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

from planaria.contract import errors, profile
from planaria.contract import plan as plans
from planaria.planner import transfers
from tests import strategies

W = plans.WorkerId


def grid(
    cuts: Sequence[Sequence[int]], num_layers: int, first: int = 0, gpus: int = 1
) -> plans.Plan:
    """Pipelines with the given cuts on consecutive one-GPU stages, one micro-batch each."""
    pipelines, worker = [], first
    for pipeline_cuts in cuts:
        bounds = [0, *pipeline_cuts, num_layers]
        stages = []
        for a, b in itertools.pairwise(bounds):
            stages.append(plans.Stage(layer_start=a, layer_stop=b, workers=(W(worker),)))
            worker += 1
        pipelines.append(plans.Pipeline(stages=tuple(stages), num_micro_batches=1))
    return plans.Plan(pipelines=tuple(pipelines), micro_batch_size=1, gpus_per_node=gpus)


def on(layout: plans.Plan, workers: Sequence[int]) -> plans.Plan:
    """`layout` with its workers, in order, replaced by `workers`."""
    return transfers.relabel(layout, dict(zip(layout.workers, map(W, workers), strict=True)))


def layers_moved(held: transfers.Holdings, new: plans.Plan) -> int:
    copies, restores = transfers.missing(held, new)
    return len(copies) + len(restores)


def brute_force_bytes(held: transfers.Holdings, layout: plans.Plan, prof: profile.Profile) -> int:
    """The fewest bytes over every assignment of survivors to the layout's workers that keeps
    each layout node on one surviving node (and distinct nodes distinct)."""
    gpus = layout.gpus_per_node
    best = math.inf
    for chosen in itertools.permutations(held, len(layout.workers)):
        binding = dict(zip(layout.workers, chosen, strict=True))
        node_map: dict[int, int] = {}
        if any(node_map.setdefault(w // gpus, s // gpus) != s // gpus for w, s in binding.items()):
            continue
        if len(set(node_map.values())) != len(node_map):
            continue
        new = transfers.relabel(layout, binding)
        copies, restores = transfers.missing(held, new)
        total = sum(transfers.moved_bytes(prof.layers[c.layer]) for c in copies)
        best = min(best, total + sum(transfers.moved_bytes(prof.layers[r.layer]) for r in restores))
    return int(best)


# --- holdings ----------------------------------------------------------------------------------


def test_survivors_hold_their_stage_layers_and_spares_hold_none() -> None:
    old = grid([[2], [1]], 3)
    held = transfers.holdings(old, {W(1)}, spare={W(9)})
    assert held == {
        W(0): frozenset({0, 1}),
        W(2): frozenset({0}),
        W(3): frozenset({1, 2}),
        W(9): frozenset(),
    }


@given(st.data())
@settings(max_examples=80, deadline=None)
def test_holdings_are_the_old_holdings_in_worker_order(data: st.DataObject) -> None:
    # the oracle: one frozenset per stage, the dict sorted by a keyed sort of its items
    old = data.draw(strategies.running_plans(max_workers=16, max_pipelines=6))
    failed = data.draw(strategies.failed_workers(old))
    spare = data.draw(st.sets(st.integers(100, 104).map(W)))
    expected: dict[plans.WorkerId, frozenset[int]] = {w: frozenset() for w in spare}
    for pipeline in old.pipelines:
        for stage in pipeline.stages:
            for worker in stage.workers:
                if worker not in failed:
                    expected[worker] = frozenset(stage.layers)
    ordered = sorted(expected.items(), key=lambda item: item[0])
    assert list(transfers.holdings(old, failed, spare).items()) == ordered


@pytest.mark.parametrize(
    ("failed", "spare", "complaint"),
    [({W(7)}, set(), "not in the plan"), ({W(0)}, {W(1)}, "are in the plan")],
    ids=["a failed worker outside the plan", "a spare that is in the plan"],
)
def test_holdings_refuse_workers_that_do_not_fit(
    failed: set[plans.WorkerId], spare: set[plans.WorkerId], complaint: str
) -> None:
    with pytest.raises(errors.PlanInputError, match=complaint):
        transfers.holdings(grid([[1]], 2), failed, spare)


def test_a_layout_over_dead_workers_is_refused() -> None:
    old = grid([[1], [1]], 2)
    held = transfers.holdings(old, {W(0)})
    with pytest.raises(errors.PlanInputError, match=r"workers \[0\] that are not live"):
        transfers.match(held, grid([[1]], 2), strategies.uniform_profile(2))


# --- the cost matrix and the matching ----------------------------------------------------------


def test_cost_is_the_bytes_of_the_wanted_layers_a_survivor_lacks() -> None:
    cost = transfers.cost_matrix(
        [frozenset({0, 1, 2}), frozenset({3})], [frozenset({0, 1}), frozenset({2, 3})], [1, 2, 4, 8]
    )
    # Odyssey §IV-B's example: [1,2,3] -> [1,2] costs 0, [1,2,3] -> [3,4] costs layer 4
    assert cost.tolist() == [[0.0, 8.0], [3.0, 4.0]]


def test_odyssey_fig3_matching_beats_identity_and_equals_the_best_hand_assignment() -> None:
    old = grid([[3, 6]] * 3, 9)  # DP=3 x PP=3, workers 0..8
    held = transfers.holdings(old, {W(4)})  # the middle node of the second pipeline fails
    survivors = list(held)
    layout = on(grid([[2, 4, 6]] * 2, 9), survivors)  # DP=2 x PP=4 [2,2,2,3]
    matched = transfers.replan(held, layout, strategies.uniform_profile(9), transfers.Overheads())
    identity = layers_moved(held, layout)
    best = min(layers_moved(held, on(layout, perm)) for perm in itertools.permutations(survivors))
    assert len(matched.transfers) == best < identity
    assert (best, identity) == (3, 9)
    assert matched.restores == ()


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_matching_moves_as_few_bytes_as_the_brute_force_optimum(data: st.DataObject) -> None:
    old = data.draw(strategies.running_plans(max_workers=7))  # up to 6 survivors
    failed = data.draw(strategies.failed_workers(old))
    held = transfers.holdings(old, failed)
    layout = data.draw(
        strategies.layouts(list(held), old.num_layers, old.gpus_per_node, old.num_micro_batches)
    )
    prof = strategies.uniform_profile(old.num_layers)
    matched = transfers.replan(held, layout, prof, transfers.Overheads())
    assert matched.moved_bytes == brute_force_bytes(held, layout, prof)


@given(
    st.lists(
        st.lists(st.integers(min_value=0, max_value=50), min_size=5, max_size=5),
        min_size=5,
        max_size=5,
    )
)
def test_linear_sum_assignment_is_the_permutation_optimum(matrix: list[list[int]]) -> None:
    cost = np.array(matrix, dtype=float)
    rows, cols = optimize.linear_sum_assignment(cost)
    brute = min(sum(matrix[i][p[i]] for i in range(5)) for p in itertools.permutations(range(5)))
    assert cost[rows, cols].sum() == brute


@given(st.data())
@settings(max_examples=80, deadline=None)
def test_every_worker_receives_exactly_the_layers_it_lacks(data: st.DataObject) -> None:
    old = data.draw(strategies.running_plans(max_workers=8))
    failed = data.draw(strategies.failed_workers(old))
    held = transfers.holdings(old, failed)
    layout = data.draw(
        strategies.layouts(list(held), old.num_layers, old.gpus_per_node, old.num_micro_batches)
    )
    move = transfers.replan(
        held, layout, strategies.uniform_profile(old.num_layers), transfers.Overheads()
    )
    received: dict[plans.WorkerId, list[int]] = {}
    members = set(move.target.workers)  # only they send: the next epoch's group

    def holders(layer: int) -> list[plans.WorkerId]:
        return sorted(w for w, layers in held.items() if layer in layers and w in members)

    for copy in move.transfers:
        received.setdefault(copy.destination, []).append(copy.layer)
        assert set(copy.sources) <= set(holders(copy.layer))
        assert list(copy.sources) == sorted(copy.sources)
    for restore in move.restores:
        received.setdefault(restore.destination, []).append(restore.layer)
        assert not holders(restore.layer)
    _assert_sources_are_dealt_evenly(move.transfers, holders)
    for worker, role in transfers.roles(move.target).items():
        got = received.get(worker, [])
        assert len(got) == len(set(got))
        assert set(got) == role - held[worker]
    assert set(received) <= set(move.target.workers)


def _assert_sources_are_dealt_evenly(
    copies: Sequence[plans.LayerTransfer],
    holders: Callable[[int], list[plans.WorkerId]],
) -> None:
    """Each copy of a layer with H holders and D destinations has k = max(1, ceil(H / D))
    sources, every holder serves, and holders' shard counts differ by at most one."""
    by_layer: dict[int, list[plans.LayerTransfer]] = {}
    for copy in copies:
        by_layer.setdefault(copy.layer, []).append(copy)
    for layer, mine in by_layer.items():
        everyone = holders(layer)
        k = max(1, math.ceil(len(everyone) / len(mine)))
        assert all(len(copy.sources) == k for copy in mine)
        served = Counter(source for copy in mine for source in copy.sources)
        assert set(served) == set(everyone)
        assert max(served.values()) - min(served.values()) <= 1


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_matching_keeps_each_layout_node_on_one_surviving_node(data: st.DataObject) -> None:
    old = data.draw(strategies.running_plans(max_workers=8))
    failed = data.draw(strategies.failed_workers(old))
    held = transfers.holdings(old, failed)
    layout = data.draw(
        strategies.layouts(list(held), old.num_layers, old.gpus_per_node, old.num_micro_batches)
    )
    binding = transfers.match(held, layout, strategies.uniform_profile(old.num_layers))
    gpus = layout.gpus_per_node
    assert sorted(binding) == sorted(layout.workers)
    assert len(set(binding.values())) == len(binding)
    together = {(a // gpus, b // gpus) for a, b in binding.items()}
    assert len({a for a, _ in together}) == len(together) == len({b for _, b in together})


def pairwise_match(
    held: transfers.Holdings, layout: plans.Plan, prof: profile.Profile
) -> dict[plans.WorkerId, plans.WorkerId]:
    """The node matching as it was before #17 (an inner Kuhn-Munkres for every pair of
    surviving and layout nodes over the full cost matrix): the oracle of the memoised one."""
    wanted = transfers.roles(layout)
    survivors, roles = list(held), list(wanted)
    sizes = [transfers.moved_bytes(layer) for layer in prof.layers]
    cost = transfers.cost_matrix([held[w] for w in survivors], list(wanted.values()), sizes)
    gpus = layout.gpus_per_node

    def groups(workers: list[plans.WorkerId]) -> list[list[int]]:
        nodes = sorted({w // gpus for w in workers})
        return [[i for i, w in enumerate(workers) if w // gpus == n] for n in nodes]

    rows, cols = groups(survivors), groups(roles)
    outer = np.zeros((len(rows), len(rows)))
    pairs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (a, row), (b, col) in itertools.product(enumerate(rows), enumerate(cols)):
        if len(col) > len(row):
            outer[a, b], pairs[(a, b)] = math.inf, []
            continue
        block = cost[np.ix_(row, col)]
        r, c = optimize.linear_sum_assignment(block)
        outer[a, b] = float(block[r, c].sum())
        pairs[(a, b)] = [(row[i], col[j]) for i, j in zip(r, c, strict=True)]
    binding = {}
    for a, b in zip(*optimize.linear_sum_assignment(outer), strict=True):
        for i, j in pairs.get((int(a), int(b)), []):
            binding[roles[j]] = survivors[i]
    return binding


@given(st.data(), st.integers(min_value=2, max_value=4))
@settings(max_examples=80, deadline=None)
def test_matching_by_node_shape_binds_as_the_per_node_pair_matching(
    data: st.DataObject, gpus: int
) -> None:
    old = dataclasses.replace(
        data.draw(strategies.running_plans(max_workers=16, max_pipelines=6)), gpus_per_node=gpus
    )
    failed = data.draw(strategies.failed_workers(old))
    held = transfers.holdings(old, failed)
    layout = data.draw(strategies.layouts(list(held), old.num_layers, gpus, old.num_micro_batches))
    prof = strategies.uniform_profile(old.num_layers)
    assert transfers.match(held, layout, prof) == pairwise_match(held, layout, prof)


@pytest.mark.parametrize("gpus", [2, 4, 8], ids=lambda g: f"{g} GPUs per node")
def test_matching_by_node_shape_binds_as_the_per_node_pair_matching_on_a_grid(gpus: int) -> None:
    # 6 x 4 over 12 layers, then 5 x 4 [2, 3, 3, 4] over the survivors in order: many nodes of
    # one shape (the case the memo is for), ties everywhere
    old = dataclasses.replace(grid([[3, 6, 9]] * 6, 12), gpus_per_node=gpus)
    held = transfers.holdings(old, {W(5)})
    layout = dataclasses.replace(on(grid([[2, 5, 8]] * 5, 12), list(held)[:20]), gpus_per_node=gpus)
    prof = strategies.uniform_profile(12)
    assert transfers.match(held, layout, prof) == pairwise_match(held, layout, prof)


@given(st.data(), st.integers(min_value=1, max_value=4))
@settings(max_examples=80, deadline=None)
def test_survivors_shared_by_two_layouts_bind_and_list_copies_as_each_alone(
    data: st.DataObject, gpus: int
) -> None:
    # `Survivors` binds by index arrays and lists copies per (role, holding) class pair, its
    # inner matchings memoised by their cost block across failures; the per-node-pair matching
    # and `missing` on the relabelled plan are its oracles
    old = dataclasses.replace(
        data.draw(strategies.running_plans(max_workers=16, max_pipelines=6)), gpus_per_node=gpus
    )
    prof = strategies.uniform_profile(old.num_layers)
    matchings: transfers.Matchings = {}
    for _ in range(2):
        held = transfers.holdings(old, data.draw(strategies.failed_workers(old)))
        _bind_two_layouts(data, old, held, prof, transfers.Survivors(held, prof, matchings))


def _bind_two_layouts(
    data: st.DataObject,
    old: plans.Plan,
    held: transfers.Holdings,
    prof: profile.Profile,
    shared: transfers.Survivors,
) -> None:
    gpus = old.gpus_per_node
    for _ in range(2):
        layout = data.draw(
            strategies.layouts(list(held), old.num_layers, gpus, old.num_micro_batches)
        )
        move = shared.replan(layout, transfers.Overheads())
        binding = pairwise_match(held, layout, prof)
        new = transfers.relabel(layout, binding)
        assert move.binding == binding
        assert move.target == new
        assert (move.transfers, move.restores) == transfers.missing(held, new)
        sizes = [transfers.moved_bytes(prof.layers[t.layer]) for t in move.transfers]
        sizes += [transfers.moved_bytes(prof.layers[r.layer]) for r in move.restores]
        assert move.moved_bytes == sum(sizes)


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_copies_and_restores_come_in_destination_then_layer_order(data: st.DataObject) -> None:
    # the order before #17: every worker's role in worker order, its lacking layers ascending
    old = data.draw(strategies.running_plans(max_workers=8))
    failed = data.draw(strategies.failed_workers(old))
    held = transfers.holdings(old, failed)
    layout = data.draw(
        strategies.layouts(list(held), old.num_layers, old.gpus_per_node, old.num_micro_batches)
    )
    copies, restores = transfers.missing(held, layout)
    expected = [
        (worker, layer)
        for worker, role in sorted(transfers.roles(layout).items())
        for layer in sorted(role - held.get(worker, frozenset()))
    ]
    pairs = [(c.destination, c.layer) for c in copies] + [
        (r.destination, r.layer) for r in restores
    ]
    assert sorted(pairs) == expected
    # a layer is copied when some worker of the layout holds it (only they send), else restored
    members = set(layout.workers)
    sent = {n for w, layers in held.items() if w in members for n in layers}
    assert [(c.destination, c.layer) for c in copies] == [
        pair for pair in expected if pair[1] in sent
    ]
    assert [(r.destination, r.layer) for r in restores] == [
        pair for pair in expected if pair[1] not in sent
    ]


def test_a_layer_nobody_holds_is_restored_not_copied() -> None:
    old = grid([[1], [1]], 2)  # both replicas of layer 1 are on workers 1 and 3
    held = transfers.holdings(old, {W(1), W(3)})
    move = transfers.replan(
        held, on(grid([[1]], 2), [0, 2]), strategies.uniform_profile(2), transfers.Overheads()
    )
    assert move.transfers == ()
    assert [r.layer for r in move.restores] == [1]


# --- the bandwidth model -----------------------------------------------------------------------


def link(bandwidth: float, latency: float = 0.0) -> profile.LinkProfile:
    return profile.LinkProfile(bandwidth_bytes_per_s=bandwidth, latency_s=latency)


def one_layer(
    state_bytes: int, intra: profile.LinkProfile, inter: profile.LinkProfile
) -> profile.Profile:
    base = strategies.uniform_profile(1, state_bytes=state_bytes)
    return profile.Profile(
        model=base.model,
        accelerator=base.accelerator,
        micro_batch_size=1,
        memory_bytes=base.memory_bytes,
        layers=base.layers,
        intra_node=intra,
        inter_node=inter,
    )


def test_two_sources_halve_the_send_but_the_receiver_takes_it_all() -> None:
    prof = one_layer(100, intra=link(1000.0), inter=link(10.0, latency=0.5))
    copy = plans.LayerTransfer(layer=0, destination=W(0), sources=(W(1), W(2)))
    # receiver: two 50-byte messages over the inter-node link: 2 * 0.5 + 100 / 10
    assert transfers.transfer_s([copy], [], prof, gpus_per_node=1) == pytest.approx(11.0)


def test_intra_and_inter_node_traffic_use_separate_links() -> None:
    prof = one_layer(100, intra=link(100.0), inter=link(10.0))
    copy = plans.LayerTransfer(layer=0, destination=W(0), sources=(W(1), W(2)))
    # with 2 GPUs per node, worker 1 shares node 0: 50 B intra (0.5 s) and 50 B inter (5 s)
    assert transfers.transfer_s([copy], [], prof, gpus_per_node=2) == pytest.approx(5.0)


def test_a_busy_source_can_be_the_bottleneck() -> None:
    prof = one_layer(100, intra=link(1000.0), inter=link(10.0))
    copies = [plans.LayerTransfer(layer=0, destination=W(d), sources=(W(9),)) for d in (0, 1, 2)]
    assert transfers.transfer_s(copies, [], prof, gpus_per_node=1) == pytest.approx(30.0)


def test_restores_arrive_over_the_inter_node_link() -> None:
    prof = one_layer(100, intra=link(1000.0), inter=link(10.0))
    restore = transfers.Restore(layer=0, destination=W(0))
    assert transfers.transfer_s([], [restore], prof, gpus_per_node=4) == pytest.approx(10.0)
    assert transfers.transfer_s([], [], prof, gpus_per_node=4) == 0.0


def test_rerouting_pays_the_regroup_and_replanning_the_restart_too() -> None:
    overheads = transfers.Overheads(regroup_s=0.5, restart_s=2.0)
    old = grid([[1], [1]], 2)
    held = transfers.holdings(old, {W(3)})
    assert transfers.keep(old, overheads).total_s == 0.5
    same = on(grid([[1]], 2), [0, 1])
    assert transfers.replan(held, same, strategies.uniform_profile(2), overheads).total_s == 2.5


@pytest.mark.parametrize("field", ["regroup_s", "restart_s"])
@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan], ids=["negative", "infinite", "nan"])
def test_overheads_must_be_finite_seconds(field: str, bad: float) -> None:
    with pytest.raises(errors.PlanInputError, match=field):
        transfers.Overheads(**{field: bad})


def transfer_s_by_shard(
    copies: Sequence[plans.LayerTransfer],
    restores: Sequence[transfers.Restore],
    prof: profile.Profile,
    gpus_per_node: int,
) -> float:
    """The bandwidth model message by message through `LayerTransfer.shard`: the
    implementation `transfers.transfer_s` replaced (kept as its oracle)."""
    load: dict[tuple[plans.WorkerId, bool, bool], tuple[int, int]] = {}
    for copy in copies:
        size = transfers.moved_bytes(prof.layers[copy.layer])
        for source in copy.sources:
            shard = copy.shard(source, size)
            intra = source // gpus_per_node == copy.destination // gpus_per_node
            for key in ((source, intra, True), (copy.destination, intra, False)):
                count, num_bytes = load.get(key, (0, 0))
                load[key] = (count + 1, num_bytes + len(shard))
    for restore in restores:
        count, num_bytes = load.get((restore.destination, False, False), (0, 0))
        size = transfers.moved_bytes(prof.layers[restore.layer])
        load[(restore.destination, False, False)] = (count + 1, num_bytes + size)
    return max(
        (
            c * (prof.intra_node if intra else prof.inter_node).latency_s
            + b / (prof.intra_node if intra else prof.inter_node).bandwidth_bytes_per_s
            for (_, intra, _), (c, b) in load.items()
        ),
        default=0.0,
    )


def transfer_s_by_layer(
    copies: Sequence[plans.LayerTransfer],
    restores: Sequence[transfers.Restore],
    prof: profile.Profile,
    gpus_per_node: int,
) -> float:
    """One pass over the holders per layer, loads summed in a dict of Python ints: the
    implementation `transfers.transfer_s` replaced in the eleventh round (kept as its oracle)."""
    load: dict[tuple[plans.WorkerId, bool, bool], tuple[int, int]] = defaultdict(lambda: (0, 0))

    def add(key: tuple[plans.WorkerId, bool, bool], count: int, num_bytes: int) -> None:
        if count:
            before = load[key]
            load[key] = (before[0] + count, before[1] + num_bytes)

    by_layer: dict[tuple[int, tuple[plans.WorkerId, ...]], list[plans.WorkerId]] = defaultdict(list)
    for copy in copies:
        by_layer[(copy.layer, copy.sources)].append(copy.destination)
    for (layer, sources), destinations in by_layer.items():
        size, k = transfers.moved_bytes(prof.layers[layer]), len(sources)
        shards = [(i + 1) * size // k - i * size // k for i in range(k)]
        to_node = Counter(d // gpus_per_node for d in destinations)
        from_node: dict[int, tuple[int, int]] = defaultdict(lambda: (0, 0))
        for source, shard in zip(sources, shards, strict=True):
            near = to_node[source // gpus_per_node]
            add((source, True, True), near, near * shard)
            add((source, False, True), len(destinations) - near, (len(destinations) - near) * shard)
            count, num_bytes = from_node[source // gpus_per_node]
            from_node[source // gpus_per_node] = (count + 1, num_bytes + shard)
        for destination in destinations:
            count, num_bytes = from_node.get(destination // gpus_per_node, (0, 0))
            add((destination, True, False), count, num_bytes)
            add((destination, False, False), k - count, size - num_bytes)
    for restore in restores:
        add(
            (restore.destination, False, False),
            1,
            transfers.moved_bytes(prof.layers[restore.layer]),
        )

    def busy_s(intra: bool, count: int, num_bytes: int) -> float:
        link_ = prof.intra_node if intra else prof.inter_node
        return count * link_.latency_s + num_bytes / link_.bandwidth_bytes_per_s

    return max((busy_s(intra, c, b) for (_, intra, _), (c, b) in load.items()), default=0.0)


@st.composite
def copies_and_restores(
    draw: st.DrawFn,
) -> tuple[list[plans.LayerTransfer], list[transfers.Restore], profile.Profile, int]:
    """Copies of 1..4 layers among 12 workers (a layer's holders often alike, as after a
    failure, sometimes not), restores, a profile with odd byte counts and two links of similar
    speeds (either may be the busiest)."""
    num_layers = draw(st.integers(min_value=1, max_value=4))
    sizes = st.integers(min_value=0, max_value=10**4)
    speeds = st.floats(min_value=1.0, max_value=100.0)
    latencies = st.floats(min_value=0.0, max_value=1e-2)
    base = one_layer(
        1,
        intra=link(draw(speeds), latency=draw(latencies)),
        inter=link(draw(speeds), latency=draw(latencies)),
    )
    state = draw(st.lists(st.tuples(sizes, sizes), min_size=num_layers, max_size=num_layers))
    layers = tuple(
        dataclasses.replace(base.layers[0], parameter_bytes=p, optimizer_bytes=o) for p, o in state
    )
    prof = dataclasses.replace(base, layers=layers)
    workers = st.integers(min_value=0, max_value=11).map(W)
    holders = {
        n: draw(st.lists(workers, min_size=1, max_size=6, unique=True)) for n in range(num_layers)
    }
    copies = []
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        layer = draw(st.integers(min_value=0, max_value=num_layers - 1))
        sources = (
            sorted(holders[layer])
            if draw(st.booleans())
            else draw(st.lists(workers, min_size=1, max_size=4, unique=True))
        )
        destination = draw(st.sampled_from([W(w) for w in range(12) if W(w) not in sources]))
        copies.append(
            plans.LayerTransfer(layer=layer, destination=destination, sources=tuple(sources))
        )
    restores = draw(
        st.lists(
            st.builds(
                transfers.Restore,
                layer=st.integers(min_value=0, max_value=num_layers - 1),
                destination=workers,
            ),
            max_size=3,
        )
    )
    return copies, restores, prof, draw(st.integers(min_value=1, max_value=4))


@given(copies_and_restores())
@settings(max_examples=200, deadline=None)
def test_the_copy_time_equals_the_message_by_message_model(
    drawn: tuple[list[plans.LayerTransfer], list[transfers.Restore], profile.Profile, int],
) -> None:
    copies, restores, prof, gpus = drawn
    want = transfer_s_by_shard(copies, restores, prof, gpus)
    assert transfer_s_by_layer(copies, restores, prof, gpus) == want  # ==: same integer sums
    assert transfers.transfer_s(copies, restores, prof, gpus) == want  # the same, in numpy


@given(st.data())
@settings(max_examples=80, deadline=None)
def test_the_copy_time_of_a_replan_equals_the_message_by_message_model(
    data: st.DataObject,
) -> None:
    # the copies the planner makes (a few sources dealt per destination), not drawn ones: the
    # estimate eq. 8 weighs is the model's message-by-message sum over exactly what is sent
    gpus = data.draw(st.integers(min_value=1, max_value=4))
    old = dataclasses.replace(
        data.draw(strategies.running_plans(max_workers=12, max_pipelines=5)), gpus_per_node=gpus
    )
    held = transfers.holdings(old, data.draw(strategies.failed_workers(old)))
    layout = data.draw(strategies.layouts(list(held), old.num_layers, gpus, old.num_micro_batches))
    base = strategies.uniform_profile(old.num_layers, state_bytes=data.draw(st.integers(0, 999)))
    prof = dataclasses.replace(
        base, intra_node=link(100.0, latency=1e-3), inter_node=link(7.0, latency=3e-2)
    )
    move = transfers.replan(held, layout, prof, transfers.Overheads())
    want = transfer_s_by_shard(move.transfers, move.restores, prof, gpus)
    assert move.transfer_s == want  # ==: same integer sums
    assert transfer_s_by_layer(move.transfers, move.restores, prof, gpus) == want


def _old_padded(table: np.ndarray, rows: list[int], cols: list[int]) -> np.ndarray:
    """`transfers._padded` as it was (the oracle): gather, then copy into a zero square."""
    block = table[np.asarray(rows, dtype=np.intp)][:, np.asarray(cols, dtype=np.intp)]
    if block.shape[1] == block.shape[0]:
        return block
    outer = np.zeros((block.shape[0], block.shape[0]))
    outer[:, : block.shape[1]] = block
    return outer


@given(st.data(), st.integers(1, 4), st.integers(1, 4), st.integers(1, 12))
@settings(max_examples=100, deadline=None)
def test_the_padded_node_matrix_is_the_gather_then_copy(
    data: st.DataObject, num_held: int, num_wanted: int, size: int
) -> None:
    table = np.asarray(
        data.draw(
            st.lists(
                st.lists(st.floats(0, 1e12), min_size=num_wanted, max_size=num_wanted),
                min_size=num_held,
                max_size=num_held,
            )
        )
    )
    rows = data.draw(st.lists(st.integers(0, num_held - 1), min_size=size, max_size=size))
    cols = data.draw(st.lists(st.integers(0, num_wanted - 1), max_size=size))
    got, want = transfers._padded(table, rows, cols), _old_padded(table, rows, cols)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


@given(st.lists(st.integers(0, 5), min_size=1, max_size=20), st.integers(1, 3))
@settings(max_examples=100, deadline=None)
def test_nodes_of_one_worker_are_grouped_as_the_general_walk_groups_them(
    classes: list[int], gpus: int
) -> None:
    # one worker per node (every gpus-th id): the array path against the walk over nodes
    workers = [w * gpus for w in range(len(classes))]
    of_worker = np.asarray(classes, dtype=np.intp)
    got = transfers._Nodes.of_sorted(workers, of_worker, gpus)
    want = transfers._Nodes.of(workers, of_worker, gpus)
    assert got.groups == want.groups and got.shapes == want.shapes
    assert got.shape.tolist() == want.shape.tolist() and got.shape.dtype == want.shape.dtype
    assert got.members.tolist() == want.members.tolist()
