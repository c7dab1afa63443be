"""What the simulator asks the planner, behind caches shared by every run of a scenario.

- `Planner.fresh`: the fastest plan over a set of live workers, as if planned from scratch:
  every DP degree's symmetric and balanced asymmetric layout (`candidates.configurations` with
  an unbounded radius), the best layer split per depth (`distribution.split_layers`) and the
  batch distributed (`batching.distribute`), over every prefix of the workers; exact, found
  best-first on lower bounds (`fresh`). This is the ideal bound's plan, the initial plan, and
  the re-plan of checkpoint restarts.
- `Planner.decide`: the recovery after a failure: `policy.decide` (Odyssey eq. 8 over every
  candidate) or the same eq. 8 over the candidates of some kinds only (dynamic-only: no
  rerouting; rerouting-only), with the same branch-and-bound refinement; those build only the
  candidates of their kinds (`Planner.candidates_of`).
- `Planner.rejoin`: the transition to the fresh plan when nodes join (holdings of the running
  plan, joined workers holding nothing, `transfers.replan`).

Caches: fresh plans by the number of live workers (a plan lies on a prefix of them; `fresh`
keeps its screens and bounds per layout), the last few fresh plans built with their whole
estimates (the policies that go through a trace together ask for the same one at an event),
decisions by their full input, estimates in one `screening.Estimates`. Every number still
comes from the planner's estimator and transfers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from planaria.contract import errors, plan, profile
from planaria.planner import candidates, distribution, policy, screening, transfers
from planaria.sim import fresh as fresh_search

REPLANNED = frozenset({candidates.Kind.SYMMETRIC, candidates.Kind.ASYMMETRIC})
REROUTED = frozenset({candidates.Kind.REROUTE})
ALL_KINDS = frozenset(candidates.Kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """The training job: its profile (micro-batch size included), global batch in samples,
    GPUs per node."""

    profile: profile.Profile
    global_batch: int
    gpus_per_node: int = 1

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.global_batch % self.profile.micro_batch_size:
            raise errors.PlanInputError(
                f"global batch {self.global_batch} must be a positive multiple of the "
                f"micro-batch size {self.profile.micro_batch_size}"
            )

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // self.profile.micro_batch_size

    @property
    def state_bytes(self) -> int:
        """Bytes a checkpoint holds: every layer's parameters and optimizer state."""
        return sum(transfers.moved_bytes(layer) for layer in self.profile.layers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraint:
    """A test every fresh plan must pass besides fitting memory; `name` keys the cache."""

    name: str
    test: Callable[[plan.Plan], bool]


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """A recovery: the new plan, E's step estimate of it, the transition's seconds, and what
    was chosen (the candidate's label)."""

    plan: plan.Plan
    step_s: float
    transition_s: float
    label: str


# Fresh plans built and kept (`Planner.fresh`): at 1,024 nodes of 8 GPUs one takes ~10 ms to
# build and ~4 ms to key for its estimate, and the policies at one event ask for a handful
RECENT_PLANS = 8


@dataclass(slots=True)
class _Built:
    """A fresh plan built on some workers, and E's whole estimate of it once asked."""

    plan: plan.Plan
    whole: screening.Estimate | None = None


class Planner:
    """The planner's answers for one job, cached across runs (module docstring)."""

    def __init__(
        self,
        job: Job,
        settings: policy.PolicySettings | None = None,
        estimates: screening.Estimates | None = None,
    ) -> None:
        """`estimates`: a memo to share (same profile), e.g. between planners whose
        settings differ; E's estimates do not depend on the settings."""
        self.job = job
        self.settings = settings or policy.PolicySettings()
        self.estimates = estimates or screening.Estimates(job.profile)
        self._fresh: dict[tuple[bool, str | None], fresh_search.Search] = {}
        self._decided: dict[tuple[object, ...], Choice | None] = {}
        self._splits: dict[int, tuple[int, ...] | None] = {}
        # the last `RECENT_PLANS` fresh plans by (layout, the workers it lies on), oldest first
        self._built: dict[tuple[fresh_search.Layout, tuple[plan.WorkerId, ...]], _Built] = {}
        self._reference = plan.Plan(
            pipelines=(
                distribution.pipeline_of(
                    (job.profile.num_layers,), [plan.WorkerId(0)], job.num_micro_batches
                ),
            ),
            micro_batch_size=job.profile.micro_batch_size,
            gpus_per_node=job.gpus_per_node,
        )

    def step_s(self, plan_: plan.Plan) -> float:
        """E's step estimate of the whole plan."""
        return self._whole(plan_).step_s

    def peak_bytes(self, plan_: plan.Plan) -> int:
        return self._whole(plan_).peak_bytes

    def _whole(self, plan_: plan.Plan) -> screening.Estimate:
        """`Estimates.whole`, kept with the plan when it is a recent fresh plan (the same
        object: its estimate is asked by several policies, and keying it walks every worker)."""
        built = next((b for b in self._built.values() if b.plan is plan_), None)
        if built is None:
            return self.estimates.whole(plan_)
        if built.whole is None:
            built.whole = self.estimates.whole(plan_)
        return built.whole

    # --- fresh plans -------------------------------------------------------------------------

    def fresh(
        self,
        workers: Collection[plan.WorkerId],
        symmetric: bool = False,
        constraint: Constraint | None = None,
    ) -> plan.Plan | None:
        """The fastest plan over `workers` planned from scratch (None: nothing fits); it may
        leave workers idle when fewer train faster (its pipelines use a prefix of the sorted
        workers). `symmetric` keeps DP x PP grids only (Varuna's grid topology, Oobleck §2);
        `constraint` drops plans that fail its test (e.g. Bamboo's redundant memory)."""
        ordered = sorted(workers)
        found = self._search(symmetric, constraint).best(len(ordered))
        if found is None:
            return None
        key = (found.layout, tuple(ordered[: found.num_workers]))
        built = self._built.pop(key, None)  # re-inserted below: the newest
        if built is None:
            built = _Built(self._laid_out(found.layout, ordered))
            if len(self._built) >= RECENT_PLANS:
                del self._built[next(iter(self._built))]
        self._built[key] = built
        return built.plan

    def _search(self, symmetric: bool, constraint: Constraint | None) -> fresh_search.Search:
        key = (symmetric, None if constraint is None else constraint.name)
        if key not in self._fresh:
            self._fresh[key] = fresh_search.Search(
                self.estimates,
                self._reference,
                self._split,
                lambda layout, n: self._laid_out(layout, [plan.WorkerId(w) for w in range(n)]),
                symmetric,
                None if constraint is None else constraint.test,
                # layouts' bounds, batches and screens are the same for every kind of plan
                next(iter(self._fresh.values()), None),
            )
        return self._fresh[key]

    def _split(self, depth: int) -> tuple[int, ...] | None:
        # the best split depends on the depth alone (Alg. 1): one search per depth
        if depth not in self._splits:
            self._splits[depth] = distribution.split_layers(
                self.estimates, depth, self._reference, self.settings.search.max_splits
            )
        return self._splits[depth]

    def _laid_out(self, layout: fresh_search.Layout, workers: list[plan.WorkerId]) -> plan.Plan:
        pipelines, used = [], 0
        for *split, num_micro_batches in layout:
            pipelines.append(
                distribution.pipeline_of(
                    split, workers[used : used + len(split)], num_micro_batches
                )
            )
            used += len(split)
        return plan.Plan(
            pipelines=tuple(pipelines),
            micro_batch_size=self.job.profile.micro_batch_size,
            gpus_per_node=self.job.gpus_per_node,
        )

    # --- recovery decisions ------------------------------------------------------------------

    def decide(
        self,
        kinds: frozenset[candidates.Kind],
        failure: candidates.Failure,
        time_to_failure_s: float,
    ) -> Choice | None:
        """Eq. 8's choice among candidates of `kinds` (all: `policy.decide` itself); None when
        no candidate of those kinds can run."""
        key = (kinds, failure.running, failure.failed, failure.spare, time_to_failure_s)
        if key not in self._decided:
            self._decided[key] = self._decide(kinds, failure, time_to_failure_s)
        return self._decided[key]

    def _decide(
        self, kinds: frozenset[candidates.Kind], failure: candidates.Failure, ttf: float
    ) -> Choice | None:
        if kinds == ALL_KINDS:
            try:
                decision, _ = policy.decide(failure, self.estimates, ttf, self.settings)
            except errors.InfeasibleError:
                return None
            return _choice(decision.choice)
        pool = self.candidates_of(kinds, failure)
        if pool is None:
            return None  # no worker of the plan survived
        batch = failure.running.global_batch_size
        while pool:
            # a screen's value is optimistic: refine the top until it is estimated whole
            pool.sort(key=lambda c: _rank(c, batch, ttf))
            if pool[0].exact:
                return _choice(pool[0])
            refined = candidates.exact(pool[0], self.estimates)
            pool[0:1] = [refined] if isinstance(refined, candidates.Candidate) else []
        return None

    def candidates_of(
        self, kinds: frozenset[candidates.Kind], failure: candidates.Failure
    ) -> list[candidates.Candidate] | None:
        """`candidates.search`'s candidates of `kinds`, in its order, building only those
        kinds: dynamic-only never estimates the rerouted plan whole (at 1,024 nodes a replay
        of every pipeline it touches), rerouting-only never lays out and matches the
        re-planned ones. None where the search raises InfeasibleError (no worker of the plan
        survived). The same list as filtering the full search (tests/sim/test_sim_planning.py)."""
        try:
            found = candidates.search(failure, self.estimates, self.settings.search, kinds=kinds)
        except errors.InfeasibleError:
            return None  # no worker survived, or the batch cannot be shared
        return list(found.candidates)

    def rejoin(self, running: plan.Plan, live: Collection[plan.WorkerId]) -> Choice | None:
        """The move from `running` to the fresh plan over `live` (joined workers hold no
        layers), or None when no plan fits."""
        target = self.fresh(live)
        if target is None:
            return None
        spare = sorted(set(live) - set(running.workers))
        held = transfers.holdings(running, (), spare)
        move = transfers.replan(held, target, self.job.profile, self.settings.search.overheads)
        return Choice(
            plan=move.target,
            step_s=self.step_s(move.target),
            transition_s=move.total_s,
            label="rejoin: fresh plan",
        )


def _choice(candidate: candidates.Candidate) -> Choice:
    return Choice(
        plan=candidate.plan,
        step_s=candidate.estimate.step_s,
        transition_s=candidate.transition.total_s,
        label=f"{candidate.kind}: {candidate.label}",
    )


def _rank(candidate: candidates.Candidate, batch: int, ttf: float) -> tuple[float, float, str]:
    """Higher eq. 8 value first, then the cheaper transition (as `policy` orders them)."""
    step, cost = candidate.estimate.step_s, candidate.transition.total_s
    return (-policy.value(batch, step, cost, ttf), cost, candidate.label)
