"""Results over seeds: the per-policy table, JSON, and a timeline PNG.

Per policy: mean average throughput (samples/s over the horizon) with a 95% interval over
seeds (Student's t on the seed means), Planaria's throughput divided by the policy's, the time
breakdown (fractions of the horizon: training, checkpoint writes, recovering, lost progress,
idle), restarts per run, and post-recovery efficiency: over the time trained after the first
failure, samples trained divided by what the ideal plan of the same live nodes would train
(the issue's goal: >= 99% for Planaria). Averages are over runs.

The PNG (matplotlib, Agg backend, no display) shows one seed: throughput over time per policy
and live nodes on a second axis, failures marked at the bottom.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from planaria.sim import engine, planning

# Two-sided 95% Student's t quantiles for 1..30 degrees of freedom (any statistics table);
# beyond 30 the normal 1.96 is within 2%.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """One policy over every seed (module docstring); `half_width` of the 95% interval."""

    policy: str
    runs: int
    mean: float
    half_width: float
    planaria_ratio: float | None
    breakdown: dict[str, float]
    restarts: float
    post_recovery: float | None


def half_width(values: Sequence[float]) -> float:
    """Half the 95% confidence interval of the mean (0 for one value)."""
    if len(values) < 2:
        return 0.0
    t = _T95[len(values) - 2] if len(values) - 1 <= len(_T95) else 1.96
    return t * statistics.stdev(values) / math.sqrt(len(values))


def post_recovery(run: engine.Run, planner: planning.Planner, num_nodes: int) -> float | None:
    """Samples trained after failures over the ideal's samples in the same intervals."""
    got = ideal = 0.0
    for interval in run.intervals:
        if interval.num_live >= num_nodes or interval.rate == 0.0:
            continue
        best = _ideal_rate(planner, interval.live)
        got += interval.rate * interval.duration_s
        ideal += best * interval.duration_s
    return got / ideal if ideal > 0 else None


def _ideal_rate(planner: planning.Planner, live: frozenset[int]) -> float:
    best = planner.fresh(engine.workers(live, planner.job.gpus_per_node))
    return 0.0 if best is None else planner.job.global_batch / planner.step_s(best)


def summarise(
    runs: Mapping[str, Sequence[engine.Run]], planner: planning.Planner, num_nodes: int
) -> list[Summary]:
    """One Summary per policy, in the order given."""
    base = statistics.fmean(r.throughput for r in runs["planaria"]) if "planaria" in runs else None
    out = []
    for name, group in runs.items():
        means = [r.throughput for r in group]
        mean = statistics.fmean(means)
        post = [p for r in group if (p := post_recovery(r, planner, num_nodes)) is not None]
        out.append(
            Summary(
                policy=name,
                runs=len(group),
                mean=mean,
                half_width=half_width(means),
                planaria_ratio=None if base is None or mean == 0 else base / mean,
                breakdown={b: _fraction(group, b) for b in engine.BUCKETS},
                restarts=statistics.fmean(r.restarts for r in group),
                post_recovery=statistics.fmean(post) if post else None,
            )
        )
    return out


def _fraction(group: Sequence[engine.Run], bucket: str) -> float:
    return statistics.fmean(getattr(r.breakdown, f"{bucket}_s") / r.horizon_s for r in group)


def table(summaries: Sequence[Summary]) -> str:
    """The per-policy table as text."""
    head = (
        f"{'policy':<15} {'samples/s':>10} {'95% +-':>8} {'planaria x':>10} "
        + " ".join(f"{b:>{_width(b)}}" for b in engine.BUCKETS)
        + f" {'restarts':>8} {'post/ideal':>10}"
    )
    lines = [head]
    for s in summaries:
        ratio = "-" if s.planaria_ratio is None else f"{s.planaria_ratio:.3f}"
        post = "-" if s.post_recovery is None else f"{s.post_recovery:.2%}"
        parts = " ".join(f"{s.breakdown[b]:>{_width(b)}.1%}" for b in engine.BUCKETS)
        lines.append(
            f"{s.policy:<15} {s.mean:>10.4g} {s.half_width:>8.3g} {ratio:>10} {parts} "
            f"{s.restarts:>8.1f} {post:>10}"
        )
    return "\n".join(lines)


def _width(bucket: str) -> int:
    """A time bucket's column: its whole name ("checkpoint", "recovering"), at least 8 wide."""
    return max(8, len(bucket))


def to_json(summaries: Sequence[Summary]) -> list[dict[str, object]]:
    return [asdict(s) for s in summaries]


def timeline_png(
    runs: Mapping[str, engine.Run], failures: Sequence[float], path: Path, title: str
) -> None:
    """Throughput (step lines) per policy and live nodes over hours; failures as ticks."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axis = pyplot.subplots(figsize=(10, 5))
    for name, run in runs.items():
        hours = [t / 3600 for t, _, _ in run.timeline] + [run.horizon_s / 3600]
        rates = [r for _, r, _ in run.timeline]
        # Planaria drawn thicker and on top: a policy with the same run would hide it
        wide = name == "planaria"
        axis.step(
            hours,
            [*rates, rates[-1]],
            where="post",
            label=name,
            linewidth=2.6 if wide else 1.2,
            zorder=3 if wide else 2,
            alpha=0.6 if wide else 1.0,
        )
    axis.set_xlabel("hours")
    axis.set_ylabel("samples/s")
    axis.plot([t / 3600 for t in failures], [0.0] * len(failures), "rx", label="failure")
    nodes = axis.twinx()
    first = next(iter(runs.values()))
    nodes.step(
        [t / 3600 for t, _, _ in first.timeline] + [first.horizon_s / 3600],
        [n for _, _, n in first.timeline] + [first.timeline[-1][2]],
        where="post",
        color="grey",
        linestyle=":",
        label="live nodes",
    )
    nodes.set_ylabel("live nodes")
    axis.legend(loc="lower left", fontsize=8)
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def run_json(run: engine.Run) -> dict[str, object]:
    """One run's figures (no timeline) for the JSON output."""
    return {
        "policy": run.policy,
        "throughput": run.throughput,
        "samples": run.samples,
        "horizon_s": run.horizon_s,
        "breakdown": asdict(run.breakdown),
        "restarts": run.restarts,
        "recoveries": run.recoveries,
    }
