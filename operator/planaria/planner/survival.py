"""How long in-memory snapshots keep the parameters safe, and how often to checkpoint (REFT §5).

Failures of each node are independent, and a node's time to failure is Weibull distributed
(REFT Assumption 1): a node survives to time t with probability P(t) = exp(-lambda * t^c),
c the shape. With k nodes in sharding groups of n (k / n groups):

    P_ck_survive(t) = P_s^k * P_tr^k                                        (REFT eq. 6)
    P_re_survive(t) = (P_s^n + n (1 - P_s) P_s^(n-1))^(k/n) * P_re^k       (REFT eq. 5)

P_s: a node survives hardware failures; P_tr: it survives software failures of training;
P_re: the snapshot program survives. Without snapshots any failure loses the parameters since
the last persistent checkpoint (eq. 6). With REFT a group loses its snapshot only when two or
more of its members fail in hardware (eq. 5's bracket is "at most one of n fails"); a software
failure of training does not lose host memory (REFT §4.4 persists the snapshot on a crash),
which is why P_tr is absent from eq. 5.

`reft_survival` generalises the bracket to `tolerated_losses` f per group (the binomial sum of
0..f failures): f = 1 is eq. 5; f = 0 (no redundancy, or a group of one, which has no peer to
protect it) gives P_s^k * P_re^k. The suggested persistent-checkpoint interval is the largest t
whose survival is still >= a threshold (bisection; survival never increases with t).

Time is in days and rates per day^c, as in REFT Fig. 8. Reproducing Fig. 8 (3072 nodes in
groups of 6, hardware rate 1e-4, software rate 1e-5, c = 1.3, threshold 0.9; P_re = 1 since the
figure gives no snapshot-program rate): REFT 16.18 days (paper: 16.22) and checkpointing
0.41 days (paper: "around 0.5"); docs/snapshots.md shows the arithmetic.

A plan's guarantee against node failures (issue #20) is `node_failures`; `plan_survival` turns
it into a lower bound on the probability of surviving to time t (at most f of the plan's nodes
fail).

Pure: no I/O, no clock. Bad inputs raise `errors.PlanInputError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from planaria.contract import errors
from planaria.contract import plan as plans
from planaria.planner import node_failures

# Bisection stops when the bracket is this small relative to the interval (or after 200 rounds).
RELATIVE_TOLERANCE = 1e-12


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRates:
    """Weibull failure rates of one node, per day^shape, and the shape c (REFT §5)."""

    hardware_per_day: float
    software_per_day: float
    snapshot_program_per_day: float = 0.0
    shape: float = 1.0

    def __post_init__(self) -> None:
        for name in ("hardware_per_day", "software_per_day", "snapshot_program_per_day"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise errors.PlanInputError(f"failure rate {name} is {value}; give one >= 0")
        if not (math.isfinite(self.shape) and self.shape > 0):
            raise errors.PlanInputError(f"Weibull shape is {self.shape}; give one > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """`num_nodes` nodes (k) in sharding groups of `group_size` (n), each group surviving
    `tolerated_losses` lost members (1 with copy or XOR parity, 0 without redundancy)."""

    num_nodes: int
    group_size: int
    tolerated_losses: int = 1

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.group_size < 1:
            raise errors.PlanInputError(
                f"cluster of {self.num_nodes} nodes in groups of {self.group_size}: "
                "give num_nodes and group_size >= 1"
            )
        if self.num_nodes % self.group_size:
            raise errors.PlanInputError(
                f"num_nodes {self.num_nodes} is not a multiple of group_size {self.group_size}; "
                "every node belongs to one sharding group"
            )
        if self.tolerated_losses < 0:
            raise errors.PlanInputError(f"tolerated_losses {self.tolerated_losses} must be >= 0")

    @property
    def num_groups(self) -> int:
        return self.num_nodes // self.group_size


def weibull_survival(rate_per_day: float, t_days: float, shape: float) -> float:
    """P(t) = exp(-lambda * t^c): one node's probability of no failure by time t."""
    if rate_per_day == 0:
        return 1.0
    try:
        return math.exp(-rate_per_day * t_days**shape)
    except OverflowError:  # t^c beyond floats: survival is 0 to machine precision
        return 0.0


def _check_time(t_days: float) -> None:
    if not (math.isfinite(t_days) and t_days >= 0):
        raise errors.PlanInputError(f"time {t_days} days must be finite and >= 0")


def checkpoint_survival(t_days: float, num_nodes: int, rates: FailureRates) -> float:
    """REFT eq. 6: all k nodes survive hardware and software failures until t."""
    _check_time(t_days)
    p_s = weibull_survival(rates.hardware_per_day, t_days, rates.shape)
    p_tr = weibull_survival(rates.software_per_day, t_days, rates.shape)
    return (p_s * p_tr) ** num_nodes


def reft_survival(t_days: float, cluster: Cluster, rates: FailureRates) -> float:
    """REFT eq. 5 (generalised to f tolerated losses per group, see the module docstring):
    every group loses at most f members to hardware failures and no snapshot program fails."""
    _check_time(t_days)
    p_s = weibull_survival(rates.hardware_per_day, t_days, rates.shape)
    p_re = weibull_survival(rates.snapshot_program_per_day, t_days, rates.shape)
    group = group_survival(p_s, cluster.group_size, cluster.tolerated_losses)
    return group**cluster.num_groups * p_re**cluster.num_nodes


def group_survival(p_s: float, group_size: int, tolerated_losses: int) -> float:
    """Probability that at most f of n independent members fail, each surviving with p_s
    (f = 1: eq. 5's P_s^n + n (1 - P_s) P_s^(n-1)). A group cannot lose all its members:
    f is capped at n - 1, so a group of one tolerates nothing."""
    f = min(tolerated_losses, group_size - 1)
    q = 1.0 - p_s
    return sum(math.comb(group_size, j) * q**j * p_s ** (group_size - j) for j in range(f + 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class IntervalChoice:
    """The suggested persistent-checkpoint interval, the survival there, and why."""

    interval_days: float
    survival: float
    reason: str


def suggest_checkpoint_interval(
    threshold: float, cluster: Cluster, rates: FailureRates, *, snapshots: bool = True
) -> IntervalChoice:
    """The largest t with survival(t) >= threshold: REFT eq. 5 with host-memory snapshots,
    eq. 6 without; the reason compares the two. Infinite when no failure is modelled."""
    if not 0 < threshold < 1:
        raise errors.PlanInputError(f"survival threshold {threshold} must be in (0, 1)")

    def with_snapshots(t: float) -> float:
        return reft_survival(t, cluster, rates)

    def without(t: float) -> float:
        return checkpoint_survival(t, cluster.num_nodes, rates)

    chosen, other = (with_snapshots, without) if snapshots else (without, with_snapshots)
    interval, alternative = _largest_safe(chosen, threshold), _largest_safe(other, threshold)
    names = ("in-memory snapshots (REFT eq. 5)", "no snapshots (REFT eq. 6)")
    name, other_name = names if snapshots else names[::-1]
    return IntervalChoice(
        interval_days=interval,
        survival=chosen(interval) if math.isfinite(interval) else 1.0,
        reason=(
            f"with {name}, {cluster.num_nodes} nodes (groups of {cluster.group_size}, "
            f"{cluster.tolerated_losses} loss tolerated each) stay above survival {threshold} "
            f"for {interval:.4g} days; with {other_name} for {alternative:.4g} days"
        ),
    )


def _largest_safe(survival: Callable[[float], float], threshold: float) -> float:
    """Largest t with survival(t) >= threshold; infinite when survival never drops below."""
    upper = _first_below(survival, threshold)
    return math.inf if upper is None else _bisect(survival, threshold, upper)


def _first_below(survival: Callable[[float], float], threshold: float) -> float | None:
    """A time at which survival is below threshold (doubling from 1 day), or None."""
    t = 1.0
    while t < 1e300:
        if survival(t) < threshold:
            return t
        t *= 2.0
    return None


def _bisect(survival: Callable[[float], float], threshold: float, upper: float) -> float:
    """Largest t in [0, upper] with survival(t) >= threshold, survival non-increasing."""
    low, high = 0.0, upper
    for _ in range(200):
        if high - low <= RELATIVE_TOLERANCE * high:
            break
        middle = (low + high) / 2
        if survival(middle) >= threshold:
            low = middle
        else:
            high = middle
    return low


def plan_survival(
    t_days: float, plan: plans.Plan, rates: FailureRates, *, protected: bool
) -> float:
    """A lower bound on the probability that `plan`'s state outlives hardware failures to
    time t without the persistent checkpoint: at most f of its nodes fail
    (`node_failures.tolerated_node_failures`; eq. 5's bracket over the plan's nodes), times
    every snapshot program surviving (P_re^k, as in eq. 5). A bound, not the exact sum over
    failure sets (network reliability, exponential in the nodes): spread-out failures beyond f
    may be survived too."""
    _check_time(t_days)
    num_nodes = len({plan.node_of(w) for w in plan.workers})
    f = node_failures.tolerated_node_failures(plan, protected=protected).failures
    p_s = weibull_survival(rates.hardware_per_day, t_days, rates.shape)
    p_re = weibull_survival(rates.snapshot_program_per_day, t_days, rates.shape)
    return group_survival(p_s, num_nodes, f) * p_re**num_nodes
