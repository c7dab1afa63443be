"""The recovery policy: which candidate to move to after a failure (Odyssey §III, eq. 8).

Odyssey eq. 8 picks the next state maximising throughput times the effective time ratio:

    value = B / t_step * t_S(i+1) / (t_transition + t_S(i+1))

where the time between this failure and the next is fixed whatever we choose, so with T_next the
expected time to the next failure, t_S(i+1) = T_next - t_transition and

    value = (B / t_step) * max(0, T_next - t_transition) / T_next     [samples per second]

B is the global batch in samples (constant across plans), t_step E's step estimate and
t_transition the transition's time (`transfers`). Rerouting has a tiny transition and a slower
step; re-planning pays copies and a restart for a faster step, so it wins when failures are rare.

`decide` ranks every candidate of the search by that value. Screened candidates (eq. 10 over
pipelines alone, see `screening`) are optimistic (no all-reduce), so the ranking is refined
lazily, branch-and-bound style: while one of the top `exact_top` is only screened it is
estimated whole and the ranking redone. By default there is no limit, so the choice has E's
whole-plan estimate and beats every other candidate's optimistic value. `max_whole` caps the
whole-plan estimates (each costs about as much as the rest of a 32-worker search) for callers
that need a latency bound; the choice is then the best candidate with a whole-plan estimate,
and the reason counts the screened candidates still above it (`unverified`). Ties (e.g. every
value 0 because the next failure comes before any transition ends) go to the cheaper
transition, then the faster step.

The reason lists the ranked candidates with predicted step time, transition time, bytes moved
and peak memory, the rejected ones with why, and break-even times: (B/t1)(T - c1) =
(B/t2)(T - c2) gives T* = (c1 t2 - c2 t1) / (t2 - t1), meaningful when it exceeds both
transition times. It is given for the top two, and the choice's window is derived from the
break-evens against every other candidate: the range of T_next over which the choice stays the
best, and which candidate would win beyond either end (e.g. rerouting below, re-planning above).
Against screened rivals (optimistic) the window can only come out narrower than the truth, so
it is a range where the choice is known to hold.

Not here: finding candidates (`candidates`), costing them (`estimator`, `memory`, `transfers`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from planaria.contract import errors, plan
from planaria.planner import candidates, screening


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    """`exact_top`: how many of the best-ranked candidates must have whole-plan estimates
    (2: the choice and the runner-up of the break-even); `max_whole`: None for no limit, else
    at most this many whole-plan estimates while refining (rerouting's is part of the search;
    one more is made when no candidate has one, since the choice must)."""

    exact_top: int = 2
    max_whole: int | None = None
    search: candidates.SearchSettings = field(default_factory=candidates.SearchSettings)

    def __post_init__(self) -> None:
        if self.exact_top < 1:
            raise errors.PlanInputError(f"exact_top is {self.exact_top}; give 1 or more")
        if self.max_whole is not None and self.max_whole < 0:
            raise errors.PlanInputError(f"max_whole is {self.max_whole}; give 0 or more")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    """One candidate's numbers in the reason. `exact` False: step and peak are the screen."""

    rank: int
    kind: candidates.Kind
    label: str
    step_s: float
    transition_s: float
    moved_bytes: int
    peak_bytes: int
    value: float
    exact: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakEven:
    """Candidates ranked `first` and `second` tie at this time to the next failure (None: they
    never do above both transition times)."""

    first: int
    second: int
    time_to_failure_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """Times to the next failure over which the choice stays the best: from `from_s` (below it
    candidate `below` wins; 0 and None when none does) until `until_s` (above it candidate
    `above` wins; inf and None when none does). Ranks as in the reason. A screened rival's
    optimistic value can only narrow the window."""

    from_s: float = 0.0
    below: int | None = None
    until_s: float = math.inf
    above: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The chosen candidate (its transition holds the new plan and the layer copies) and its
    eq. 8 value in samples per second."""

    choice: candidates.Candidate
    value: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Reason:
    """Why: the inputs of eq. 8, every candidate ranked (whole-plan estimates first, the choice
    at the top, then screened ones), the rejected ones, break-even times, and how many screened
    candidates have optimistic values above the choice (module docstring)."""

    time_to_failure_s: float
    global_batch: int
    ranked: tuple[Ranked, ...]
    rejected: tuple[candidates.Rejection, ...]
    break_even: BreakEven | None
    window: Window
    unverified: int


def value(global_batch: int, step_s: float, transition_s: float, time_to_failure_s: float) -> float:
    """Odyssey eq. 8 with t_S(i+1) = T_next - t_transition, clamped at 0 (samples/s)."""
    # throughput x effective time ratio; a transition longer than T_next trains nothing
    return global_batch / step_s * max(0.0, time_to_failure_s - transition_s) / time_to_failure_s


def break_even_s(step1_s: float, cost1_s: float, step2_s: float, cost2_s: float) -> float | None:
    """The T_next at which two candidates' eq. 8 values are equal, when that T_next exceeds
    both transition times (below, a value is clamped and they cannot tie); else None."""
    if math.isclose(step1_s, step2_s, rel_tol=1e-12):
        return None
    tie = (cost1_s * step2_s - cost2_s * step1_s) / (step2_s - step1_s)
    # equal transitions tie exactly at the clamp (both values 0): rounding must not hide that
    return tie if tie > max(cost1_s, cost2_s) * (1 + 1e-9) else None


def time_to_failure_s(
    *, mtbf_s: float | None = None, num_failures: int = 0, observed_s: float = 0.0
) -> float:
    """Expected time to the next failure: the job's mean time between failures when set, else
    the observed rate's (observed_s / num_failures). Raises PlanInputError without either."""
    if mtbf_s is not None:
        if not (math.isfinite(mtbf_s) and mtbf_s > 0):
            raise errors.PlanInputError(f"mtbf_s is {mtbf_s}; give finite seconds > 0")
        return mtbf_s
    if num_failures >= 1 and math.isfinite(observed_s) and observed_s > 0:
        return observed_s / num_failures
    raise errors.PlanInputError(
        "no time to the next failure: set the job's mean time between failures (mtbf_s) or "
        "give the failures observed (num_failures >= 1) over observed_s > 0 seconds"
    )


def decide(
    failure: candidates.Failure,
    estimates: screening.Estimates,
    time_to_failure: float,
    settings: PolicySettings,
    given: Sequence[plan.Plan] = (),
) -> tuple[Decision, Reason]:
    """Choose how to recover from `failure` (module docstring). Raises PlanInputError for bad
    inputs, InfeasibleError (with every rejection's reason) when no candidate can run."""
    if not (math.isfinite(time_to_failure) and time_to_failure > 0):
        raise errors.PlanInputError(
            f"time to the next failure is {time_to_failure}; give finite seconds > 0"
        )
    found = candidates.search(failure, estimates, settings.search, given)
    batch = failure.running.global_batch_size
    ranked, late = _refined(list(found.candidates), estimates, batch, time_to_failure, settings)
    rejected = (*found.rejected, *late)
    if not ranked:
        reasons = "; ".join(f"{r.label}: {r.why}" for r in rejected)
        raise errors.InfeasibleError(f"no candidate can recover from this failure: {reasons}")
    rows = tuple(_row(i, c, batch, time_to_failure) for i, c in enumerate(ranked, start=1))
    reason = Reason(
        time_to_failure_s=time_to_failure,
        global_batch=batch,
        ranked=rows,
        rejected=rejected,
        break_even=_break_even(rows[0], rows[1]) if len(rows) > 1 else None,
        window=_window(rows),
        unverified=sum(not r.exact and r.value > rows[0].value for r in rows),
    )
    return Decision(choice=ranked[0], value=rows[0].value), reason


def _refined(
    pool: list[candidates.Candidate],
    estimates: screening.Estimates,
    batch: int,
    time_to_failure: float,
    settings: PolicySettings,
) -> tuple[list[candidates.Candidate], list[candidates.Rejection]]:
    """Refine the top `exact_top` (within `max_whole` whole-plan estimates, if set), then order:
    whole estimates by value, then screens by value (module docstring). Candidates whose whole
    plan is over the memory limit come back as rejections."""
    rejected: list[candidates.Rejection] = []

    def refine(chosen: list[int]) -> None:
        nonlocal pool
        results = {i: candidates.exact(pool[i], estimates) for i in chosen}
        rejected.extend(r for r in results.values() if isinstance(r, candidates.Rejection))
        kept = [results.get(i, c) for i, c in enumerate(pool)]
        pool = [c for c in kept if isinstance(c, candidates.Candidate)]

    budget = settings.max_whole
    while pool and (budget is None or budget > 0):
        pool.sort(key=lambda c: _order(c, batch, time_to_failure))
        pending = [i for i, c in enumerate(pool[: settings.exact_top]) if not c.exact]
        if not pending:  # screens are optimistic: no screened rival below can overtake
            break
        if budget is not None:
            pending, budget = pending[:budget], budget - len(pending[:budget])
        refine(pending)
    while pool and not any(c.exact for c in pool):  # the choice must be estimated whole
        pool.sort(key=lambda c: _order(c, batch, time_to_failure))
        refine([0])
    pool.sort(key=lambda c: (not c.exact, *_order(c, batch, time_to_failure)))
    return pool, rejected


def _order(
    candidate: candidates.Candidate, batch: int, time_to_failure: float
) -> tuple[float, float, float, str]:
    """Sort key: higher value first, then cheaper transition, faster step, label."""
    step, cost = candidate.estimate.step_s, candidate.transition.total_s
    return (-value(batch, step, cost, time_to_failure), cost, step, candidate.label)


def _row(rank: int, candidate: candidates.Candidate, batch: int, time_to_failure: float) -> Ranked:
    step, cost = candidate.estimate.step_s, candidate.transition.total_s
    return Ranked(
        rank=rank,
        kind=candidate.kind,
        label=candidate.label,
        step_s=step,
        transition_s=cost,
        moved_bytes=candidate.transition.moved_bytes,
        peak_bytes=candidate.estimate.peak_bytes,
        value=value(batch, step, cost, time_to_failure),
        exact=candidate.exact,
    )


def _break_even(first: Ranked, second: Ranked) -> BreakEven:
    return BreakEven(
        first=first.rank,
        second=second.rank,
        time_to_failure_s=break_even_s(
            first.step_s, first.transition_s, second.step_s, second.transition_s
        ),
    )


def _window(rows: tuple[Ranked, ...]) -> Window:
    """Where the choice (rows[0]) stays best: a faster-stepping rival wins above its tie, a
    slower one (with a cheaper transition) below it."""
    window = Window()
    for rival in rows[1:]:
        tie = _break_even(rows[0], rival).time_to_failure_s
        if tie is None:
            continue
        # a faster rival amortises its transition over long T_next; a slower one wins short
        if rival.step_s < rows[0].step_s and tie < window.until_s:
            window = dataclasses.replace(window, until_s=tie, above=rival.rank)
        elif rival.step_s > rows[0].step_s and tie > window.from_s:
            window = dataclasses.replace(window, from_s=tie, below=rival.rank)
    return window


def render_reason(reason: Reason) -> str:
    """The reason as text: the choice and eq. 8, the ranking table, break-evens, rejections."""
    top = reason.ranked[0]
    lines = [
        f"chose {top.kind}: {top.label}",
        f"  eq. 8: {reason.global_batch} samples / {top.step_s:.4g} s x "
        f"({reason.time_to_failure_s:.6g} s - {top.transition_s:.4g} s) / "
        f"{reason.time_to_failure_s:.6g} s = {top.value:.4g} samples/s until the next failure",
        "",
        f"{'rank':>4}  {'kind':<10} {'step s':>9} {'switch s':>9} {'moved':>10} {'peak':>10} "
        f"{'samples/s':>10}  candidate",
    ]
    lines.extend(_table_row(row) for row in reason.ranked)
    if not all(row.exact for row in reason.ranked):
        lines.append("  ~ screened: slowest pipeline alone, no all-reduce (optimistic)")
    if reason.unverified:
        lines.append(
            f"  note: {reason.unverified} screened candidate(s) have optimistic values above the "
            "choice; whole-plan estimates were capped (PolicySettings.max_whole)"
        )
    if reason.break_even is not None:
        lines.append(_break_even_line(reason, reason.break_even))
    lines.append(_window_line(reason))
    if reason.rejected:
        lines.append("rejected:")
        lines.extend(f"  {r.kind}: {r.label}: {r.why}" for r in reason.rejected)
    return "\n".join(lines)


def _table_row(row: Ranked) -> str:
    mark = " " if row.exact else "~"
    return (
        f"{row.rank:>4}  {row.kind:<10} {row.step_s:>8.4g}{mark} {row.transition_s:>9.4g} "
        f"{_size(row.moved_bytes):>10} {_size(row.peak_bytes):>10} {row.value:>10.4g}  "
        f"{row.label}"
    )


def _size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.2f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable: GiB ends the loop")


def _break_even_line(reason: Reason, tie: BreakEven) -> str:
    first, second = reason.ranked[tie.first - 1], reason.ranked[tie.second - 1]
    if tie.time_to_failure_s is None:
        return (
            f"break-even #{first.rank} vs #{second.rank}: none; #{first.rank} stays ahead for "
            "every time to the next failure longer than both transitions"
        )
    # as T_next grows the faster step wins; below the tie the cheaper transition does
    side = "shorter" if first.step_s < second.step_s else "longer"
    return (
        f"break-even #{first.rank} vs #{second.rank}: they tie at T_next = "
        f"{tie.time_to_failure_s:.4g} s; with a {side} time to the next failure "
        f"#{second.rank} would win"
    )


def _window_line(reason: Reason) -> str:
    window = reason.window
    low = "0 s" if window.below is None else f"{window.from_s:.4g} s (below: #{window.below})"
    high = "no end" if window.above is None else f"{window.until_s:.4g} s (above: #{window.above})"
    return f"#1 stays the best at least for a time to the next failure from {low} to {high}"
