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
minus one, names the first such set and says why; it is at least the nodes every layer is held
on minus one, and at least 3 when every member of groups of two or more is mirrored with
redundancy; `plan_survival` is a lower bound of the exact sum over failure patterns.
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
from planaria.planner import survival
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
        survived = survival.survives(p, failed, protected=protected)
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
    found = survival.tolerated_node_failures(p, protected=protected)
    assert found.failures == len(first) - 1
    assert found.smallest == first  # the first fatal set of that size, in node order
    assert f"every {found.failures} node failures" in found.reason
    assert f"losing nodes {list(first)}" in found.reason


@given(p=strategies.plans(max_layers=4, max_pipelines=3), protected=st.booleans())
def test_replicas_on_distinct_nodes_and_mirrored_members_bound_the_guarantee(
    p: plans.Plan, protected: bool
) -> None:
    """Each layer held on r distinct nodes tolerates r - 1 failures by its live replicas alone;
    with redundancy, groups of two or more and every member mirrored, losing a snapshot takes
    two members' holder and mirror nodes, four distinct nodes: any three failures are survived."""
    groups = snapshot_placement.sharding_groups(p)
    found = survival.tolerated_node_failures(p, protected=protected).failures
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
