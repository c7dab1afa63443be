"""The REFT §5 survival model and the checkpoint interval (planaria.planner.survival).

Covers: eq. 5 and eq. 6 on hand-computed values; eq. 5 equals a brute-force sum over every
pattern of failed nodes in small clusters (the oracle), for 0..2 tolerated losses per group;
a group of one and no redundancy reduce eq. 5 to "every node survives"; survival is in [0, 1]
and never increases with time, snapshots never hurt and tolerating more never hurts
(hypothesis); the suggested interval is the last moment above the threshold; REFT Fig. 8 is
reproduced (16.18 days with snapshots against the paper's 16.22, 0.41 days without against its
"around 0.5"); no modelled failure gives an infinite interval; bad inputs name their field.

A plan's survival of node failures with the snapshots' mirrors (issue #20), over small drawn
plans (stages on nodes of their own, or packed several to a node) and every set of failed
nodes: `survives` agrees with an oracle built from scratch (live holders; the members the
survivors' stores keep, holders' and mirrors' pooled) and with the controller's
`recovery.beyond_redundancy`; `tolerated_node_failures` is exactly the smallest fatal set's size
minus one, names the first such set and says why; it equals, field for field and word for word,
the search of every combination it replaced (`_every_combination`, the oracle, over larger
drawn plans too; its two clever parts, the best pair union and the first witness, against
every pair and combination of small set families), is the fewest nodes a layer is held on
minus one without redundancy, and on a 2 x 2 plan the number stated by hand; it is at least
the nodes every layer is held on minus one, and at least 3 when every member of groups of two
or more is mirrored with redundancy; `plan_survival` is a lower bound of the exact sum over
failure patterns.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, snapshot_placement
from planaria.contract import plan as plans
from planaria.control import recovery
from planaria.planner import node_failures, survival
from planaria.wire import messages
from tests import strategies

FIG8 = survival.FailureRates(hardware_per_day=1e-4, software_per_day=1e-5, shape=1.3)
FIG8_CLUSTER = survival.Cluster(num_nodes=3072, group_size=6)


def test_eq6_by_hand() -> None:
    rates = survival.FailureRates(hardware_per_day=0.1, software_per_day=0.2, shape=1.0)
    assert survival.checkpoint_survival(1.0, 2, rates) == pytest.approx(math.exp(-0.6))
    rates = survival.FailureRates(hardware_per_day=0.1, software_per_day=0.0, shape=2.0)
    assert survival.checkpoint_survival(3.0, 1, rates) == pytest.approx(math.exp(-0.9))


def test_eq5_by_hand() -> None:
    # lambda = ln 2, t = 1, c = 1: a node survives with 1/2; a pair survives with 1/4 + 2/4.
    rates = survival.FailureRates(hardware_per_day=math.log(2), software_per_day=5.0)
    pairs = survival.Cluster(num_nodes=4, group_size=2)
    assert survival.reft_survival(1.0, pairs, rates) == pytest.approx(0.75**2)
    with_program = survival.FailureRates(
        hardware_per_day=math.log(2), software_per_day=5.0, snapshot_program_per_day=math.log(2)
    )
    assert survival.reft_survival(1.0, pairs, with_program) == pytest.approx(0.75**2 / 16)


def _brute_force(t: float, cluster: survival.Cluster, rates: survival.FailureRates) -> float:
    """Sum the probability of every alive/failed pattern in which each group loses at most
    f members (f capped at n - 1), times every snapshot program surviving."""
    p = survival.weibull_survival(rates.hardware_per_day, t, rates.shape)
    n, f = cluster.group_size, min(cluster.tolerated_losses, cluster.group_size - 1)
    total = 0.0
    for failed in itertools.product([False, True], repeat=cluster.num_nodes):
        groups = [failed[i : i + n] for i in range(0, cluster.num_nodes, n)]
        if all(sum(g) <= f for g in groups):
            total += math.prod(1 - p if x else p for x in failed)
    program = survival.weibull_survival(rates.snapshot_program_per_day, t, rates.shape)
    return total * program**cluster.num_nodes


@st.composite
def small_clusters(draw: st.DrawFn) -> survival.Cluster:
    n = draw(st.integers(min_value=1, max_value=4))
    return survival.Cluster(
        num_nodes=n * draw(st.integers(min_value=1, max_value=8 // n)),
        group_size=n,
        tolerated_losses=draw(st.integers(min_value=0, max_value=2)),
    )


RATES = st.builds(
    survival.FailureRates,
    hardware_per_day=st.floats(min_value=0, max_value=2),
    software_per_day=st.floats(min_value=0, max_value=2),
    snapshot_program_per_day=st.floats(min_value=0, max_value=0.5),
    shape=st.floats(min_value=0.5, max_value=3),
)
TIMES = st.floats(min_value=0, max_value=5)


@given(t=TIMES, cluster=small_clusters(), rates=RATES)
def test_eq5_matches_a_sum_over_every_failure_pattern(
    t: float, cluster: survival.Cluster, rates: survival.FailureRates
) -> None:
    assert survival.reft_survival(t, cluster, rates) == pytest.approx(
        _brute_force(t, cluster, rates), rel=1e-9, abs=1e-12
    )


@given(t=TIMES, k=st.integers(1, 50), rates=RATES)
def test_without_redundancy_every_node_must_survive(
    t: float, k: int, rates: survival.FailureRates
) -> None:
    alone = survival.Cluster(num_nodes=k, group_size=1, tolerated_losses=1)
    unprotected = survival.Cluster(num_nodes=k, group_size=1, tolerated_losses=0)
    p_s = survival.weibull_survival(rates.hardware_per_day, t, rates.shape)
    p_re = survival.weibull_survival(rates.snapshot_program_per_day, t, rates.shape)
    expected = (p_s * p_re) ** k
    assert survival.reft_survival(t, alone, rates) == pytest.approx(expected)
    assert survival.reft_survival(t, unprotected, rates) == pytest.approx(expected)


@given(times=st.tuples(TIMES, TIMES), cluster=small_clusters(), rates=RATES)
def test_survival_is_a_probability_that_never_increases_with_time(
    times: tuple[float, float], cluster: survival.Cluster, rates: survival.FailureRates
) -> None:
    early, late = sorted(times)
    reft = [survival.reft_survival(t, cluster, rates) for t in (early, late)]
    plain = [survival.checkpoint_survival(t, cluster.num_nodes, rates) for t in (early, late)]
    for at_early, at_late in (reft, plain):
        assert 0.0 <= at_late <= at_early <= 1.0


@given(t=TIMES, cluster=small_clusters(), rates=RATES)
def test_snapshots_and_more_tolerance_never_hurt(
    t: float, cluster: survival.Cluster, rates: survival.FailureRates
) -> None:
    without_program = survival.FailureRates(
        hardware_per_day=rates.hardware_per_day,
        software_per_day=rates.software_per_day,
        shape=rates.shape,
    )
    with_snapshots = survival.reft_survival(t, cluster, without_program)
    assert with_snapshots >= survival.checkpoint_survival(t, cluster.num_nodes, rates) - 1e-15
    more = survival.Cluster(
        num_nodes=cluster.num_nodes,
        group_size=cluster.group_size,
        tolerated_losses=cluster.tolerated_losses + 1,
    )
    assert survival.reft_survival(t, more, rates) >= survival.reft_survival(t, cluster, rates)


@given(
    threshold=st.floats(min_value=0.01, max_value=0.99),
    cluster=small_clusters(),
    rates=RATES.filter(lambda r: r.hardware_per_day > 1e-3),
    snapshots=st.booleans(),
)
def test_the_interval_is_the_last_moment_above_the_threshold(
    threshold: float, cluster: survival.Cluster, rates: survival.FailureRates, snapshots: bool
) -> None:
    choice = survival.suggest_checkpoint_interval(threshold, cluster, rates, snapshots=snapshots)

    def model(t: float) -> float:
        if snapshots:
            return survival.reft_survival(t, cluster, rates)
        return survival.checkpoint_survival(t, cluster.num_nodes, rates)

    assert model(choice.interval_days) >= threshold
    assert model(choice.interval_days * (1 + 1e-9) + 1e-300) < threshold
    assert choice.survival == model(choice.interval_days)


def test_reft_figure_8_is_reproduced() -> None:
    reft = survival.suggest_checkpoint_interval(0.9, FIG8_CLUSTER, FIG8)
    plain = survival.suggest_checkpoint_interval(0.9, FIG8_CLUSTER, FIG8, snapshots=False)
    assert reft.interval_days == pytest.approx(16.22, abs=0.05)  # 16.178 here
    assert plain.interval_days == pytest.approx(0.408, abs=0.001)  # the paper: "around 0.5"
    assert "16.18 days; with no snapshots (REFT eq. 6) for 0.408 days" in reft.reason


def test_no_modelled_failure_never_needs_a_checkpoint() -> None:
    rates = survival.FailureRates(hardware_per_day=0.0, software_per_day=0.0)
    choice = survival.suggest_checkpoint_interval(0.9, FIG8_CLUSTER, rates)
    assert choice.interval_days == math.inf and choice.survival == 1.0


def test_huge_times_do_not_overflow() -> None:
    assert survival.weibull_survival(1e-4, 1e300, 2.0) == 0.0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: survival.FailureRates(hardware_per_day=-1, software_per_day=0), "hardware_per"),
        (lambda: survival.FailureRates(hardware_per_day=0, software_per_day=math.nan), "softwa"),
        (lambda: survival.FailureRates(hardware_per_day=0, software_per_day=0, shape=0), "shape"),
        (lambda: survival.Cluster(num_nodes=10, group_size=4), "not a multiple of group_size"),
        (lambda: survival.Cluster(num_nodes=0, group_size=1), "num_nodes and group_size >= 1"),
        (lambda: survival.Cluster(num_nodes=2, group_size=1, tolerated_losses=-1), "tolerated"),
        (lambda: survival.suggest_checkpoint_interval(1.0, FIG8_CLUSTER, FIG8), "threshold"),
        (lambda: survival.checkpoint_survival(-1.0, 3, FIG8), "time -1.0 days"),
    ],
    ids=[
        "a negative rate",
        "a rate that is not a number",
        "a zero shape",
        "nodes that do not fill whole groups",
        "no nodes",
        "negative tolerance",
        "a threshold of one",
        "a negative time",
    ],
)
def test_bad_inputs_name_their_field(build: object, message: str) -> None:
    with pytest.raises(errors.PlanInputError, match=message):
        build()  # type: ignore[operator]


# --- a plan's survival of node failures, with mirrors (issue #20) ---------------------------

SMALL_PLANS = st.one_of(
    strategies.packed_plans(), strategies.plans(max_layers=3, max_pipelines=3, max_gpus_per_node=2)
)


def _nodes(p: plans.Plan) -> list[plans.NodeId]:
    return sorted({p.node_of(w) for w in p.workers})


def _failure_sets(p: plans.Plan) -> list[tuple[plans.NodeId, ...]]:
    """Every set of the plan's nodes, smallest first, then in node order."""
    nodes = _nodes(p)
    return [c for r in range(len(nodes) + 1) for c in itertools.combinations(nodes, r)]


def _fatal(p: plans.Plan, failed: tuple[plans.NodeId, ...], protected: bool) -> bool:
    """The oracle, from the plan's stages: the state is lost when some layer has no live holder
    and some layer's group misses more members than it tolerates in the survivors' stores."""
    alive = {w for w in p.workers if p.node_of(w) not in failed}
    holders: dict[int, set[plans.WorkerId]] = {}
    for pipeline in p.pipelines:
        for stage in pipeline.stages:
            for layer in stage.layers:
                holders.setdefault(layer, set()).update(stage.workers)
    mirrors = snapshot_placement.mirrors(p)
    kept: set[tuple[int, int]] = set()  # (layer, member) in some survivor's store
    for layer, group in holders.items():
        for k, holder in enumerate(sorted(group)):
            mirror = mirrors[layer][k] if protected else None
            if holder in alive or mirror in alive:
                kept.add((layer, k))
    no_replica = any(not group & alive for group in holders.values())
    tolerated = {layer: 1 if protected and len(g) >= 2 else 0 for layer, g in holders.items()}
    beyond = any(
        sum((layer, k) not in kept for k in range(len(g))) > tolerated[layer]
        for layer, g in holders.items()
    )
    return no_replica and beyond


@settings(max_examples=60)
@given(p=SMALL_PLANS, protected=st.booleans())
def test_a_plan_survives_exactly_the_failures_the_controller_goes_on_from(
    p: plans.Plan, protected: bool
) -> None:
    mode = messages.RedundancyMode.XOR if protected else messages.RedundancyMode.NONE
    layers = snapshot_placement.sharding_groups(p)
    for failed in _failure_sets(p):
        survived = node_failures.survives(p, failed, protected=protected)
        assert survived is not _fatal(p, failed, protected), failed
        lost = {w for w in p.workers if p.node_of(w) in failed}
        all_live = all(set(group) - lost for group in layers.values())
        assert survived == (all_live or not recovery.beyond_redundancy(p, lost, mode))


@settings(max_examples=60)
@given(p=SMALL_PLANS, protected=st.booleans())
def test_the_guarantee_is_one_less_than_the_smallest_fatal_set(
    p: plans.Plan, protected: bool
) -> None:
    first = next(f for f in _failure_sets(p) if _fatal(p, f, protected))
    found = node_failures.tolerated_node_failures(p, protected=protected)
    assert found.failures == len(first) - 1
    assert found.smallest == first  # the first fatal set of that size, in node order
    assert f"every {found.failures} node failures" in found.reason
    assert f"losing nodes {list(first)}" in found.reason


def _every_combination(p: plans.Plan, protected: bool) -> tuple[int, tuple[int, ...], str]:
    """The oracle: the search `tolerated_node_failures` did before it was made fast, every
    holder-node set against every t + 1 members of every layer, O(layers x C(m, t + 1) x
    holder-node sets); (failures, smallest set, reason)."""
    groups, placed = snapshot_placement.sharding_groups(p), snapshot_placement.mirrors(p)
    held: dict[frozenset[plans.NodeId], int] = {}  # a holder-node set -> its first layer
    for layer, group in groups.items():
        held.setdefault(frozenset(p.node_of(w) for w in group), layer)
    best: tuple[int, tuple[plans.NodeId, ...]] | None = None
    why = ""
    for layer, group in groups.items():
        t = snapshot_placement.tolerated_losses(protected=protected, group_size=len(group))
        for members in itertools.combinations(range(len(group)), t + 1):
            gone = {p.node_of(group[k]) for k in members}
            if protected:
                gone |= {p.node_of(m) for k in members if (m := placed[layer][k]) is not None}
            for nodes, replicas_of in held.items():
                cut = tuple(sorted(gone | nodes))
                if best is None or (len(cut), cut) < best:
                    best = (len(cut), cut)
                    why = (
                        f"losing nodes {list(cut)} loses every live replica of layer "
                        f"{replicas_of} and members {list(members)} of layer {layer}'s snapshot "
                        f"with their mirrors, more than the {t} its redundancy tolerates"
                    )
    assert best is not None
    size, cut = best
    reason = f"every {size - 1} node failures leave each layer a live replica or a rebuildable "
    return size - 1, cut, reason + f"snapshot; {why}"


LARGER_PLANS = st.one_of(
    strategies.packed_plans(max_layers=6, max_pipelines=4),
    strategies.plans(max_layers=6, max_pipelines=4, max_gpus_per_node=4),
)


@settings(max_examples=150)
@given(p=st.one_of(SMALL_PLANS, LARGER_PLANS), protected=st.booleans())
def test_the_fast_search_says_what_every_combination_says(p: plans.Plan, protected: bool) -> None:
    found = node_failures.tolerated_node_failures(p, protected=protected)
    assert (found.failures, found.smallest, found.reason) == _every_combination(p, protected)
    assert f"every live replica of layer {found.layer_without_replica} and" in found.reason
    assert f"of layer {found.layer_without_snapshot}'s snapshot" in found.reason
    lost = {w for w in p.workers if p.node_of(w) in found.smallest}
    holders = snapshot_placement.sharding_groups(p)[found.layer_without_replica]
    assert set(holders) <= lost
    beyond = snapshot_placement.beyond_redundancy(p, lost, protected=protected)
    assert found.layer_without_snapshot in beyond
    placed = snapshot_placement.mirrors(p).values()
    assert found.num_members == sum(len(m) for m in placed)
    assert found.num_mirrored == (sum(m is not None for m in itertools.chain(*placed)) * protected)
    if not protected:  # no tolerated losses: fatal exactly when a layer loses every replica
        groups = snapshot_placement.sharding_groups(p).values()
        assert found.failures == min(len({p.node_of(w) for w in g}) for g in groups) - 1


NODE = st.integers(min_value=0, max_value=5)
MEMBER_SETS = st.lists(st.frozensets(NODE, max_size=2), max_size=10)


@settings(max_examples=1000)  # microseconds each
@given(sets=MEMBER_SETS)
def test_the_smallest_pair_union_is_the_least_over_every_pair(sets: list[frozenset[int]]) -> None:
    """The fast search's core on its own: member node sets (two nodes at most, repeats and
    empty sets included) against every pair of members."""
    counted = {nodes: min(2, sets.count(nodes)) for nodes in sets}
    every = [a | b for a, b in itertools.combinations(sets, 2)]
    expected = min(every, key=lambda union: (len(union), sorted(union)), default=None)
    assert node_failures._smallest_pair_union(counted) == expected


@settings(max_examples=1000)
@given(
    sets=MEMBER_SETS,
    size=st.integers(min_value=1, max_value=2),
    needs=st.lists(st.frozensets(NODE, max_size=3), max_size=3),
    cut=st.frozensets(NODE, min_size=2),
)
def test_the_first_members_are_the_first_combination_that_covers_a_need(
    sets: list[frozenset[int]], size: int, needs: list[frozenset[int]], cut: frozenset[int]
) -> None:
    def fits(members: tuple[int, ...]) -> bool:
        union = frozenset().union(*(sets[k] for k in members))
        return union <= cut and any(need <= union for need in needs)

    combinations = itertools.combinations(range(len(sets)), size)
    expected = next((c for c in combinations if fits(c)), None)
    assert node_failures._first_members(tuple(sets), size, needs, cut) == expected


def _two_by_two(num_layers: int) -> plans.Plan:
    """Two pipelines of two stages, one GPU per node: pipeline 0 on nodes 0, 1, pipeline 1 on
    nodes 2, 3, each stage half the layers."""
    cuts = ((0, num_layers // 2), (num_layers // 2, num_layers))
    return plans.Plan(
        pipelines=tuple(
            plans.Pipeline(
                stages=tuple(
                    plans.Stage(layer_start=a, layer_stop=b, workers=(plans.WorkerId(2 * i + s),))
                    for s, (a, b) in enumerate(cuts)
                ),
                num_micro_batches=1,
            )
            for i in range(2)
        ),
        micro_batch_size=1,
        gpus_per_node=1,
    )


def test_a_two_by_two_plan_by_hand() -> None:
    """Layer 0 is held on nodes 0 and 2 (members 0, 1), mirrored on the nodes of no holder, 1
    and 3. Without redundancy a member is lost with its holder and tolerated 0 times: nodes
    {0, 2} lose layer 0 (replicas and snapshot), any one node is survived. With XOR, the
    snapshot survives one lost member, and losing two takes their holders and mirrors: all four
    nodes, so any three are survived."""
    p = _two_by_two(12)
    plain = node_failures.tolerated_node_failures(p, protected=False)
    assert (plain.failures, plain.smallest) == (1, (0, 2))
    assert (plain.layer_without_replica, plain.layer_without_snapshot) == (0, 0)
    mirrored = node_failures.tolerated_node_failures(p, protected=True)
    assert (mirrored.failures, mirrored.smallest) == (3, (0, 1, 2, 3))
    assert mirrored.reason.endswith(
        "losing nodes [0, 1, 2, 3] loses every live replica of layer 0 and members [0, 1] of "
        "layer 0's snapshot with their mirrors, more than the 1 its redundancy tolerates"
    )


@given(p=strategies.plans(max_layers=4, max_pipelines=3), protected=st.booleans())
def test_replicas_on_distinct_nodes_and_mirrored_members_bound_the_guarantee(
    p: plans.Plan, protected: bool
) -> None:
    """Each layer held on r distinct nodes tolerates r - 1 failures by its live replicas alone;
    with redundancy, groups of two or more and every member mirrored, losing a snapshot takes
    two members' holder and mirror nodes, four distinct nodes: any three failures are survived."""
    groups = snapshot_placement.sharding_groups(p)
    found = node_failures.tolerated_node_failures(p, protected=protected).failures
    spread = min(len({p.node_of(w) for w in group}) for group in groups.values())
    assert found >= spread - 1
    mirrored = all(None not in m for m in snapshot_placement.mirrors(p).values())
    distinct = all(len({p.node_of(w) for w in g}) == len(g) for g in groups.values())
    if protected and mirrored and distinct and min(len(g) for g in groups.values()) >= 2:
        assert found >= 3


@settings(max_examples=40)
@given(p=SMALL_PLANS, protected=st.booleans(), t=TIMES, rates=RATES)
def test_the_plans_survival_bounds_the_sum_over_every_failure_pattern_from_below(
    p: plans.Plan, protected: bool, t: float, rates: survival.FailureRates
) -> None:
    p_s = survival.weibull_survival(rates.hardware_per_day, t, rates.shape)
    p_re = survival.weibull_survival(rates.snapshot_program_per_day, t, rates.shape)
    n = len(_nodes(p))
    exact = sum(
        (1 - p_s) ** len(f) * p_s ** (n - len(f))
        for f in _failure_sets(p)
        if not _fatal(p, f, protected)
    )
    bound = survival.plan_survival(t, p, rates, protected=protected)
    assert (p_s * p_re) ** n - 1e-12 <= bound <= exact * p_re**n + 1e-12
