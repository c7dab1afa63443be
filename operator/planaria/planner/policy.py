"""The recovery policy: which candidate to move to after a failure (Odyssey §III, eq. 8).

Odyssey eq. 8 picks the next state maximising throughput times the effective time ratio:

    value = B / t_step * t_S(i+1) / (t_transition + t_S(i+1))

where the time between this failure and the next is fixed whatever we choose, so with T_next the
expected time to the next failure, t_S(i+1) = T_next - t_transition and

    value = (B / t_step) * max(0, T_next - t_transition) / T_next     [samples per second]

B is the global batch in samples (constant across plans), t_step E's step estimate and
t_transition the transition's time (`transfers`). Rerouting has a tiny transition and a slower
step; re-planning pays copies and a restart for a faster step, so it wins when failures are rare.

The job's end bounds the state too. Odyssey's eq. 8 assumes the job outlives the next failure;
when the remaining W steps end first (t_transition + W t_step <= T_next), the state trains only
t_S(i+1) = W t_step, and eq. 8 with that t_S is the remaining work over the time to finish it,

    value = B W / (t_transition + W t_step),

which is eq. 8 with T_next replaced by t_transition + W t_step (`value`, `steps_left`). A
failure close to the end then goes to the cheaper transition unless the faster step repays it
within the W steps: two candidates tie at W* = (c1 - c2) / (t2 - t1) steps left
(`break_even_steps`), the faster one wins above it.

A scale-up is weighed by the same bound (`pays`): staying on the running plan is a state with
no transition, so eq. 8 over the job's last W steps prefers the scale-up exactly when
t_transition + W t_new < W t_running, that is when W exceeds `break_even_steps` of the two;
a tie stays (nothing is gained for the transition's disruption).

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
import fractions
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
    candidates have optimistic values above the choice (module docstring). `steps_left`: the
    job's remaining steps when they bound the state (None: unbounded)."""

    time_to_failure_s: float
    global_batch: int
    steps_left: int | None
    ranked: tuple[Ranked, ...]
    rejected: tuple[candidates.Rejection, ...]
    break_even: BreakEven | None
    window: Window
    unverified: int


def value(
    global_batch: int,
    step_s: float,
    transition_s: float,
    time_to_failure_s: float,
    steps_left: int | None = None,
) -> float:
    """Odyssey eq. 8 with t_S(i+1) = T_next - t_transition, clamped at 0 (samples/s); with
    `steps_left`, t_S(i+1) at most the time those steps take (module docstring)."""
    if finishes_first(step_s, transition_s, time_to_failure_s, steps_left):
        assert steps_left is not None
        time_to_failure_s = transition_s + steps_left * step_s  # the job ends first
    # throughput x effective time ratio; a transition longer than T_next trains nothing
    return global_batch / step_s * max(0.0, time_to_failure_s - transition_s) / time_to_failure_s


def finishes_first(
    step_s: float, transition_s: float, time_to_failure_s: float, steps_left: int | None
) -> bool:
    """Whether the job's remaining steps end before the next failure on this candidate."""
    return steps_left is not None and transition_s + steps_left * step_s < time_to_failure_s


def break_even_steps(
    step1_s: float, cost1_s: float, step2_s: float, cost2_s: float
) -> float | None:
    """The steps left at which two candidates finish the job together (c1 + W t1 = c2 + W t2),
    when that is positive; the faster step wins above it. None when they never tie."""
    if math.isclose(step1_s, step2_s, rel_tol=1e-12):
        return None
    tie = (cost2_s - cost1_s) / (step1_s - step2_s)
    return tie if tie > 0 else None


def pays(*, stay_step_s: float, step_s: float, transition_s: float, steps_left: int) -> bool:
    """Whether moving (a transition of `transition_s`, then steps of `step_s`) trains the job's
    last `steps_left` steps sooner than staying (steps of `stay_step_s`, nothing to pay): eq. 8
    with the job's end bounding both states ranks them by that time (module docstring). Compared
    exactly (fractions of the floats), so that a tie is a tie, and it stays."""
    # Odyssey eq. 8 (§III) with t_S(i+1) = W t_step: B W / (t_transition + W t_step), the
    # same B W for both states, so the smaller denominator wins
    stay = steps_left * fractions.Fraction(stay_step_s)
    move = fractions.Fraction(transition_s) + steps_left * fractions.Fraction(step_s)
    return move < stay


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
    steps_left: int | None = None,
) -> tuple[Decision, Reason]:
    """Choose how to recover from `failure` (module docstring); `steps_left`: the job's steps
    still to train, which bound the next state (None: the job outlives the next failure).
    Raises PlanInputError for bad inputs, InfeasibleError (with every rejection's reason) when
    no candidate can run."""
    if not (math.isfinite(time_to_failure) and time_to_failure > 0):
        raise errors.PlanInputError(
            f"time to the next failure is {time_to_failure}; give finite seconds > 0"
        )
    if steps_left is not None and steps_left < 1:
        raise errors.PlanInputError(f"steps_left is {steps_left}; give 1 or more (or None)")
    horizon = Horizon(time_to_failure, steps_left)
    found = candidates.search(failure, estimates, settings.search, given)
    batch = failure.running.global_batch_size
    ranked, late = _refined(list(found.candidates), estimates, batch, horizon, settings)
    rejected = (*found.rejected, *late)
    if not ranked:
        reasons = "; ".join(f"{r.label}: {r.why}" for r in rejected)
        raise errors.InfeasibleError(f"no candidate can recover from this failure: {reasons}")
    rows = tuple(_row(i, c, batch, horizon) for i, c in enumerate(ranked, start=1))
    bounded = any(
        finishes_first(r.step_s, r.transition_s, time_to_failure, steps_left) for r in rows
    )
    reason = Reason(
        time_to_failure_s=time_to_failure,
        global_batch=batch,
        steps_left=steps_left if bounded else None,
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
    horizon: Horizon,
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
        pool.sort(key=lambda c: _order(c, batch, horizon))
        pending = [i for i, c in enumerate(pool[: settings.exact_top]) if not c.exact]
        if not pending:  # screens are optimistic: no screened rival below can overtake
            break
        if budget is not None:
            pending, budget = pending[:budget], budget - len(pending[:budget])
        refine(pending)
    while pool and not any(c.exact for c in pool):  # the choice must be estimated whole
        pool.sort(key=lambda c: _order(c, batch, horizon))
        refine([0])
    pool.sort(key=lambda c: (not c.exact, *_order(c, batch, horizon)))
    return pool, rejected


@dataclass(frozen=True, slots=True)
class Horizon:
    """What bounds the next state: the next failure, and the job's remaining steps (or None)."""

    time_to_failure_s: float
    steps_left: int | None

    def value(self, batch: int, step_s: float, transition_s: float) -> float:
        return value(batch, step_s, transition_s, self.time_to_failure_s, self.steps_left)


def _order(
    candidate: candidates.Candidate, batch: int, horizon: Horizon
) -> tuple[float, float, float, str]:
    """Sort key: higher value first, then cheaper transition, faster step, label."""
    step, cost = candidate.estimate.step_s, candidate.transition.total_s
    return (-horizon.value(batch, step, cost), cost, step, candidate.label)


def _row(rank: int, candidate: candidates.Candidate, batch: int, horizon: Horizon) -> Ranked:
    step, cost = candidate.estimate.step_s, candidate.transition.total_s
    return Ranked(
        rank=rank,
        kind=candidate.kind,
        label=candidate.label,
        step_s=step,
        transition_s=cost,
        moved_bytes=candidate.transition.moved_bytes,
        peak_bytes=candidate.estimate.peak_bytes,
        value=horizon.value(batch, step, cost),
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
    lines = [f"chose {top.kind}: {top.label}", _equation_line(reason), ""]
    lines += [
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
    if reason.steps_left is not None:
        lines.append(_steps_line(reason))
    if reason.break_even is not None and reason.steps_left is None:
        lines.append(_break_even_line(reason, reason.break_even))
    lines.append(_window_line(reason))
    if reason.rejected:
        lines.append("rejected:")
        lines.extend(f"  {r.kind}: {r.label}: {r.why}" for r in reason.rejected)
    return "\n".join(lines)


def _equation_line(reason: Reason) -> str:
    top, ttf, left = reason.ranked[0], reason.time_to_failure_s, reason.steps_left
    if left is not None and finishes_first(top.step_s, top.transition_s, ttf, left):
        return (
            f"  eq. 8 over the job's last {left} step(s), which end before the next failure in "
            f"{ttf:.6g} s: {reason.global_batch} samples x {left} / ({top.transition_s:.4g} s + "
            f"{left} x {top.step_s:.4g} s) = {top.value:.4g} samples/s"
        )
    return (
        f"  eq. 8: {reason.global_batch} samples / {top.step_s:.4g} s x "
        f"({ttf:.6g} s - {top.transition_s:.4g} s) / {ttf:.6g} s = {top.value:.4g} samples/s "
        "until the next failure"
    )


def runner_up(reason: Reason) -> Ranked | None:
    """The best-ranked candidate of another kind than the choice (None: there is none)."""
    top = reason.ranked[0]
    return next((r for r in reason.ranked[1:] if r.kind != top.kind), None)


def _steps_line(reason: Reason) -> str:
    """With the job's end bounding: where the best rival of another kind would take over."""
    top, rival = reason.ranked[0], runner_up(reason)
    if rival is None:
        return f"  the job's last {reason.steps_left} step(s) bound every candidate's value"
    tie = break_even_steps(top.step_s, top.transition_s, rival.step_s, rival.transition_s)
    if tie is None:
        return f"  #{rival.rank} ({rival.kind}) does not overtake #1 however many steps are left"
    more = "more" if rival.step_s < top.step_s else "fewer"
    return (
        f"  #1 and #{rival.rank} ({rival.kind}) finish together with {tie:.3g} step(s) left; "
        f"with {more} steps left #{rival.rank} would win (its transition of "
        f"{rival.transition_s:.4g} s against steps of {rival.step_s:.4g} s)"
    )


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
    line = f"#1 stays the best at least for a time to the next failure from {low} to {high}"
    return line if reason.steps_left is None else line + " (were the job to outlive it)"
