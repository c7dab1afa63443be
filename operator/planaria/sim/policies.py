"""The recovery policies compared, each a real strategy on the same events.

Each policy is built per run (`Policy` objects hold per-run state, e.g. Bamboo's failovers)
over one shared `planning.Planner`. It answers `start` with the plan it trains first and
`on_failure` / `on_join` with a `Recovery` (the plan it moves to, the pause before training
resumes, whether it restarted from a checkpoint) or None when the event does not concern it.

- `Planaria`: Odyssey eq. 8 over every candidate (`policy.decide`); joins: moves to the fresh
  plan over the live nodes when eq. 8 prefers it to staying.
- `DynamicOnly` (Oobleck): the same eq. 8 over re-planned candidates only (no rerouting).
- `ReroutingOnly` (ReCycle): rerouting only. When a stage lost every replica, rerouting is
  impossible and it falls back to the dynamic-only re-plan (eq. 8 over re-planned candidates):
  ReCycle itself would restart from a checkpoint there; the re-plan is the cheaper fallback, so
  the comparison is, if anything, generous to ReCycle. It ignores joins (no reconfiguration).
- `Bamboo`: redundant computation (Oobleck §2): every step pays `RC_OVERHEAD`; each stage's
  predecessor (the first stage's successor) holds a replica and takes over the failed stage
  (the two stages merge onto the survivor; the merged plan's step is E's estimate) after a pause
  of one regroup. A failure whose backup is dead, or of a node already covering a failed
  neighbour, is a full restart from the last checkpoint. It needs memory for its successor's
  state besides its own: a plan whose peak plus that state exceeds the accelerator is out of
  memory and Bamboo does not train (as in Oobleck Table 2 for GPT-3).
- `Varuna`: checkpoints every `CHECKPOINT_EVERY_STEPS` steps at `CHECKPOINT_BANDWIDTH`; every
  failure in the plan and every join is a full restart: regroup, restart, load the checkpoint,
  re-plan on the live nodes (symmetric DP x PP grid, job morphing), lose the progress since the
  last checkpoint. Joins restart only when the re-planned grid is faster.
- `Ideal`: the upper bound: the fastest fresh plan over the live nodes at every instant, no
  transition, no lost progress.

Not here: the clock and the accounting (`engine`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from planaria.contract import plan
from planaria.planner import candidates, policy, transfers
from planaria.sim import planning

# Varuna checkpoints synchronously every 10 iterations (Oobleck §7.1, "following their
# continuous checkpointing policy"), with iterations of 30 s to 4 min there. With short steps
# that would write the checkpoint more often than it takes to write, so the interval is at least
# Young's optimum sqrt(2 * t_checkpoint * MTBF) (J. W. Young, "A first order approximation to
# the optimum checkpoint interval", CACM 1974): the baseline at its best, never tuned.
CHECKPOINT_EVERY_STEPS = 10
# Checkpoint write and read bandwidth of the whole job, derived from Oobleck Table 4 (6 h
# column, Varuna vs Varuna without checkpoint cost, 10 steps per checkpoint): overhead f =
# 1 - 259.57/275.27 (BERT-Large) and 1 - 4.02/4.57 (GPT-3 6.7b); a checkpoint takes
# 10 * step * f / (1 - f) = 18.0 s and 306.6 s for 4.76 GB and 93.8 GB of parameters + Adam
# state (14 bytes per parameter, as `transfers.moved_bytes`): 264 and 306 MB/s; their mean.
# Loading uses the same bandwidth (same object store; the paper gives no separate figure).
CHECKPOINT_BANDWIDTH = 2.85e8
# Bamboo's redundant computation costs "more than 50%" of throughput (Oobleck §7.4.2, Fig. 11):
# 0.5, the lower bound, so the model is generous to Bamboo.
RC_OVERHEAD = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    """What trains: `plan` (None: nothing can, the job idles) at `step_s` seconds per step;
    progress is committed every `steps_per_commit` steps after a `commit_s` checkpoint write
    (1 and 0: every step commits). `fluid`: the ideal bound, which counts fractional steps."""

    plan: plan.Plan | None
    step_s: float = float("inf")
    steps_per_commit: int = 1
    commit_s: float = 0.0
    fluid: bool = False
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """Move to `running` after a pause of `pause_s` seconds; `restart`: from a checkpoint."""

    running: Running
    pause_s: float
    restart: bool = False


class Policy(Protocol):
    name: str

    def start(self, workers: Collection[plan.WorkerId]) -> Running: ...

    def on_failure(
        self, running: Running, failed: frozenset[plan.WorkerId], live: frozenset[plan.WorkerId]
    ) -> Recovery | None: ...

    def on_join(self, running: Running, live: frozenset[plan.WorkerId]) -> Recovery | None: ...


# A policy is built per run from the shared planner and the expected time to the next
# failure as a function of the live node count (eq. 8's T_next).
TimeToFailure = Callable[[int], float]
Factory = Callable[[planning.Planner, TimeToFailure], Policy]


class _Eq8:
    """Planaria, dynamic-only and rerouting-only: eq. 8 over the candidates of some kinds."""

    name = "planaria"
    kinds: frozenset[candidates.Kind] = planning.ALL_KINDS
    fallback: frozenset[candidates.Kind] | None = None
    joins = True

    def __init__(self, planner: planning.Planner, time_to_failure: TimeToFailure) -> None:
        self.planner = planner
        self.time_to_failure = time_to_failure

    def start(self, workers: Collection[plan.WorkerId]) -> Running:
        return _fresh_running(self.planner, workers)

    def on_failure(
        self, running: Running, failed: frozenset[plan.WorkerId], live: frozenset[plan.WorkerId]
    ) -> Recovery | None:
        if running.plan is None:
            return _restart(self.planner, live) if live else None
        hit = failed & set(running.plan.workers)
        if not hit:
            return None
        failure = candidates.Failure(
            running=running.plan, failed=hit, spare=live - set(running.plan.workers)
        )
        ttf = self._ttf(live)
        choice = self.planner.decide(self.kinds, failure, ttf)
        if choice is None and self.fallback is not None:
            choice = self.planner.decide(self.fallback, failure, ttf)
        if choice is None:
            return Recovery(running=Running(plan=None, note="no candidate fits"), pause_s=0.0)
        new = Running(plan=choice.plan, step_s=choice.step_s, note=choice.label)
        return Recovery(running=new, pause_s=choice.transition_s)

    def _ttf(self, live: frozenset[plan.WorkerId]) -> float:
        ttf = self.time_to_failure(_nodes(self.planner, live))
        return ttf if ttf < float("inf") else 1e12  # eq. 8 needs a finite T_next

    def on_join(self, running: Running, live: frozenset[plan.WorkerId]) -> Recovery | None:
        if running.plan is None:
            return _restart(self.planner, live)
        if not self.joins:
            return None
        choice = self.planner.rejoin(running.plan, live)
        if choice is None:
            return None
        ttf = self._ttf(live)
        batch = self.planner.job.global_batch
        stay = policy.value(batch, running.step_s, 0.0, ttf)
        if policy.value(batch, choice.step_s, choice.transition_s, ttf) <= stay:
            return None
        new = Running(plan=choice.plan, step_s=choice.step_s, note=choice.label)
        return Recovery(running=new, pause_s=choice.transition_s)


class Planaria(_Eq8):
    name = "planaria"


class DynamicOnly(_Eq8):
    name = "dynamic-only"
    kinds = planning.REPLANNED


class ReroutingOnly(_Eq8):
    name = "rerouting-only"
    kinds = planning.REROUTED
    fallback = planning.REPLANNED
    joins = False


class Varuna:
    """Checkpoint-restart with re-planning (module docstring)."""

    name = "varuna"

    def __init__(self, planner: planning.Planner, time_to_failure: TimeToFailure) -> None:
        self.planner = planner
        self.time_to_failure = time_to_failure

    def start(self, workers: Collection[plan.WorkerId]) -> Running:
        target = self.planner.fresh(workers, symmetric=True)
        return _checkpointed(
            self.planner, target, _mtbf(self.planner, self.time_to_failure, workers)
        )

    def on_failure(
        self, running: Running, failed: frozenset[plan.WorkerId], live: frozenset[plan.WorkerId]
    ) -> Recovery | None:
        if running.plan is not None and not failed & set(running.plan.workers):
            return None
        return self._restart(live)  # with nobody left the re-plan is None: idle

    def on_join(self, running: Running, live: frozenset[plan.WorkerId]) -> Recovery | None:
        target = self.planner.fresh(live, symmetric=True)
        if target is None or self.planner.step_s(target) >= running.step_s:
            return None  # morph only for a faster grid
        return self._restart(live)

    def _restart(self, live: frozenset[plan.WorkerId]) -> Recovery:
        mtbf = _mtbf(self.planner, self.time_to_failure, live)
        new = _checkpointed(self.planner, self.planner.fresh(live, symmetric=True), mtbf)
        return Recovery(running=new, pause_s=restart_s(self.planner), restart=True)


class Bamboo:
    """Redundant computation (module docstring)."""

    name = "bamboo"

    def __init__(self, planner: planning.Planner, time_to_failure: TimeToFailure) -> None:
        self.planner = planner
        self.time_to_failure = time_to_failure
        self.covering: set[plan.WorkerId] = set()  # workers running a failed neighbour's stage

    def start(self, workers: Collection[plan.WorkerId]) -> Running:
        return self._running(self._grid(workers), workers)

    def on_failure(
        self, running: Running, failed: frozenset[plan.WorkerId], live: frozenset[plan.WorkerId]
    ) -> Recovery | None:
        if running.plan is None or not failed & set(running.plan.workers):
            return None if running.plan is not None or not live else self._restart(live)
        merged = running.plan
        for worker in sorted(failed & set(running.plan.workers)):
            merged_or_none = self._failover(merged, worker, live)
            if merged_or_none is None:
                return self._restart(live)
            merged = merged_or_none
        regroup = self.planner.settings.search.overheads.regroup_s
        step_s = self.planner.step_s(merged) * (1 + RC_OVERHEAD)
        new = Running(
            plan=merged,
            step_s=step_s,
            steps_per_commit=running.steps_per_commit,
            commit_s=running.commit_s,
            note="failover to the backup stage",
        )
        return Recovery(running=new, pause_s=regroup)

    def on_join(self, running: Running, live: frozenset[plan.WorkerId]) -> Recovery | None:
        return self._restart(live) if running.plan is None else None

    def _failover(
        self, running: plan.Plan, worker: plan.WorkerId, live: frozenset[plan.WorkerId]
    ) -> plan.Plan | None:
        """`running` with the failed worker's stage merged into its backup's, or None when
        the backup is dead or the worker already covered a failed neighbour."""
        p, s = next(
            (p, s)
            for p, pipeline in enumerate(running.pipelines)
            for s, stage in enumerate(pipeline.stages)
            if worker in stage.workers
        )
        stages = running.pipelines[p].stages
        b = s - 1 if s > 0 else 1
        if worker in self.covering or b >= len(stages):
            return None
        backup = stages[b]
        if not set(backup.workers) <= live or self.covering & set(backup.workers):
            return None
        self.covering.update(backup.workers)
        lo, hi = min(s, b), max(s, b)
        joined = plan.Stage(
            layer_start=stages[lo].layer_start,
            layer_stop=stages[hi].layer_stop,
            workers=backup.workers,
        )
        pipeline = plan.Pipeline(
            stages=(*stages[:lo], joined, *stages[hi + 1 :]),
            num_micro_batches=running.pipelines[p].num_micro_batches,
        )
        pipelines = (*running.pipelines[:p], pipeline, *running.pipelines[p + 1 :])
        return plan.Plan(
            pipelines=pipelines,
            micro_batch_size=running.micro_batch_size,
            gpus_per_node=running.gpus_per_node,
        )

    def _restart(self, live: frozenset[plan.WorkerId]) -> Recovery:
        self.covering.clear()
        new = self._running(self._grid(live), live)
        return Recovery(running=new, pause_s=restart_s(self.planner), restart=True)

    def _running(self, target: plan.Plan | None, workers: Collection[plan.WorkerId]) -> Running:
        if target is None:
            return Running(plan=None, note="no plan fits")
        over = self._redundant_peak(target) - self.planner.estimates.memory_bytes
        if over > 0:
            return Running(plan=None, note=f"out of memory by {over / 2**30:.2f} GiB")
        mtbf = _mtbf(self.planner, self.time_to_failure, workers)
        return _checkpointed(self.planner, target, mtbf, rc=RC_OVERHEAD)

    def _grid(self, workers: Collection[plan.WorkerId]) -> plan.Plan | None:
        """The fastest DP x PP grid whose redundant copies fit (the fastest grid if none
        does, so that `_running` reports by how much it is out of memory)."""
        fits = planning.Constraint(
            name="bamboo-redundant-memory",
            test=lambda p: self._redundant_peak(p) <= self.planner.estimates.memory_bytes,
        )
        found = self.planner.fresh(workers, symmetric=True, constraint=fits)
        return found or self.planner.fresh(workers, symmetric=True)

    def _redundant_peak(self, target: plan.Plan) -> int:
        """The plan's peak memory plus the largest state of a stage's backup copy."""
        layers = self.planner.job.profile.layers
        largest = max(
            sum(layers[i].state_bytes for i in stage.layers)
            for pipeline in target.pipelines
            for stage in pipeline.stages
        )
        return self.planner.peak_bytes(target) + largest


class Ideal:
    """The upper bound: the fastest fresh plan over the live nodes, free transitions."""

    name = "ideal"

    def __init__(self, planner: planning.Planner, time_to_failure: TimeToFailure) -> None:
        self.planner = planner

    def start(self, workers: Collection[plan.WorkerId]) -> Running:
        return _fluid(self.planner, workers)

    def on_failure(
        self, running: Running, failed: frozenset[plan.WorkerId], live: frozenset[plan.WorkerId]
    ) -> Recovery | None:
        return Recovery(running=_fluid(self.planner, live), pause_s=0.0)

    def on_join(self, running: Running, live: frozenset[plan.WorkerId]) -> Recovery | None:
        return Recovery(running=_fluid(self.planner, live), pause_s=0.0)


POLICIES: dict[str, Factory] = {
    "planaria": Planaria,
    "dynamic-only": DynamicOnly,
    "rerouting-only": ReroutingOnly,
    "bamboo": Bamboo,
    "varuna": Varuna,
    "ideal": Ideal,
}


def restart_s(planner: planning.Planner) -> float:
    """A full restart: regroup, rebuild the workers, load the checkpoint of the job's state."""
    overheads: transfers.Overheads = planner.settings.search.overheads
    load_s = planner.job.state_bytes / CHECKPOINT_BANDWIDTH
    return overheads.regroup_s + overheads.restart_s + load_s


def _nodes(planner: planning.Planner, workers: Collection[plan.WorkerId]) -> int:
    return len({w // planner.job.gpus_per_node for w in workers})


def _fresh_running(planner: planning.Planner, workers: Collection[plan.WorkerId]) -> Running:
    target = planner.fresh(workers)
    if target is None:
        return Running(plan=None, note="no plan fits")
    return Running(plan=target, step_s=planner.step_s(target))


def _fluid(planner: planning.Planner, workers: Collection[plan.WorkerId]) -> Running:
    return dataclasses.replace(_fresh_running(planner, workers), fluid=True)


def _checkpointed(
    planner: planning.Planner, target: plan.Plan | None, mtbf_s: float, rc: float = 0.0
) -> Running:
    """Training `target` with checkpoints every max(10 steps, Young's interval); `rc`: the
    redundant-computation overhead on each step."""
    if target is None:
        return Running(plan=None, note="no plan fits")
    step_s = planner.step_s(target) * (1 + rc)
    commit_s = planner.job.state_bytes / CHECKPOINT_BANDWIDTH
    # no failure expected (infinite MTBF): Young's interval is infinite, no checkpoint is due
    young_steps = math.sqrt(2 * commit_s * mtbf_s) / step_s if math.isfinite(mtbf_s) else 1e12
    return Running(
        plan=target,
        step_s=step_s,
        steps_per_commit=max(CHECKPOINT_EVERY_STEPS, round(min(young_steps, 1e12))),
        commit_s=commit_s,
    )


def _restart(planner: planning.Planner, live: Collection[plan.WorkerId]) -> Recovery:
    """A restart onto the fresh plan over `live` after the job could not train."""
    return Recovery(running=_fresh_running(planner, live), pause_s=restart_s(planner), restart=True)


def _mtbf(
    planner: planning.Planner, ttf: TimeToFailure, workers: Collection[plan.WorkerId]
) -> float:
    return ttf(_nodes(planner, workers))
