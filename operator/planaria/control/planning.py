"""The controller's questions to the planner: the first plan, a recovery, a scale-up.

`Planner` holds what a job's decisions share (the Oobleck templates for the job's nodes, the
estimates memo of the profile) and answers with a `Move`: the next plan, the layer copies that
get there, what kind of move it is and the planner's one-line reason.

- `best`: the templates' highest-throughput instantiation over the whole live nodes (Oobleck
  §4.2), used for the first epoch and a resume from Suspended. Nothing is copied: the agents
  find their layers (snapshots, checkpoint) or build them from the seed.
- `grow`: the same plan for a scale-up, bound to the workers by min-cost matching so the
  running ones keep their layers and the new ones receive copies; given the job's steps left,
  taken only when it trains them sooner than the running plan, its transition included
  (Odyssey eq. 8 bounded by the job's end, `policy.pays`), else the running plan is kept and
  the newcomers stay spares. Not weighed (taken as before) when the running plan reroutes
  (its failed stages' layers lost holders: a scale-up gives them back, which eq. 8 does not
  price) or E cannot estimate a plan of the two (no reason to stay on a plan it cannot time).
- `recover`: after workers fail, per the job's policy: `adaptive` ranks rerouting, the DP/PP
  candidates and Oobleck's reinstantiations by Odyssey eq. 8 (`planner.policy.decide`);
  `dynamic` takes Oobleck's reinstantiation (§5.1, no rerouting); `reroute` keeps the layout
  and reroutes the failed stages' micro-batches (ReCycle). The survivors are bound to the new
  roles by min-cost matching (Odyssey §IV-B, `planner.transfers`).

Where it runs: the search is CPU-bound (tenths of a second a call at 32 workers, seconds for
the templates and the first plan at 1,024 nodes of 8 GPUs), so the controller asks on the
planner's executor (`executors`: a thread of its own per job) and awaits the answer (`made`,
`call`), and `prepare` returns at once: the event loop meanwhile takes in heartbeats, serves
gRPC streams and kopf handlers. The memos are not thread-safe and need not be: one question at
a time, in the order the controller asks. A question waits for the search ahead (`ready`
awaits it without holding the loop; a synchronous one waits in `_caught_up`), so every decision
meets the memos just as when everything ran on the loop, and the same events give the same
plans.

Transfer sources are restricted to workers of the new plan (the epoch's process group is exactly
the plan's workers); a layer left with no source is restored by the agents from snapshots, so
the move says so (`needs_snapshot`) and the controller resumes at a snapshot step.

Errors: the planner's own (`planner.errors.InfeasibleError` when no plan fits the survivors);
the controller turns that into Suspended.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from planaria.contract import errors, profile
from planaria.contract import plan as plans
from planaria.control import executors
from planaria.control import settings as job_settings
from planaria.control import status as statuses
from planaria.planner import (
    candidates,
    instantiation,
    policy,
    reinstantiation,
    rerouting,
    screening,
    templates,
    transfers,
)

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """The next plan, the copies into it (sources all in `plan`), the kind of move, the planner's
    reason, and whether some layer of the plan has no live source (restored from snapshots)."""

    plan: plans.Plan
    transfers: tuple[plans.LayerTransfer, ...]
    kind: statuses.MoveKind
    reason: str
    needs_snapshot: bool = False


class Planner:
    """The planner for one job's profile and settings (module docstring); `executor` runs its
    search ahead (`prepare`) and the questions asked through `call` (default `executors.Inline`)."""

    def __init__(
        self,
        source: profile.Profile,
        job: job_settings.JobSettings,
        executor: futures.Executor | None = None,
    ) -> None:
        if source.micro_batch_size != job.micro_batch_size:
            raise errors.PlanInputError(
                f"the profile is for micro-batch size {source.micro_batch_size} but the job's "
                f"is {job.micro_batch_size}; profile the job's micro-batch size"
            )
        if source.precision != job.training.precision:  # the costs of another arithmetic
            raise errors.PlanInputError(
                f"the profile is for precision {source.precision} but the job trains in "
                f"{job.training.precision}; profile the job's precision"
            )
        self._job = job
        self._profile = source
        # mapped for the micro-batches the job's plan runs, not only Oobleck's 4S (§4.1.2)
        self._templates = instantiation.fit_templates(
            templates.generate_templates(
                source,
                num_nodes=job.num_nodes,
                gpus_per_node=job.gpus_per_node,
                fault_tolerance=job.fault_tolerance,
            ),
            source,
            job.training.global_batch_size,
        )
        self._estimates = screening.Estimates(source)
        self._policy = policy.PolicySettings()
        self._executor = executors.Inline() if executor is None else executor
        self._ahead: futures.Future[None] | None = None  # the search ahead (`prepare`)
        self._busy = threading.Lock()  # held by the one call in the memos (`_alone`)

    @classmethod
    async def made(
        cls, source: profile.Profile, job: job_settings.JobSettings, executor: futures.Executor
    ) -> Planner:
        """A planner for `job`, its templates built on `executor` (a second and more at 1,024
        nodes of 8 GPUs, docs/benchmarks.md), which then runs its search too.
        Raises what the constructor raises."""
        return await executors.off_loop(executor, cls, source, job, executor)

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)`, a question to this planner (`best`, `recover`, or a function
        that asks them), on the planner's executor once the search ahead ended; the event
        loop runs on meanwhile."""
        await self.ready()
        return await executors.off_loop(self._executor, fn, *args, **kwargs)

    async def ready(self) -> None:
        """Wait, without holding the event loop, until the search ahead (`prepare`) ended.
        Raises its error, if it failed."""
        ahead = self._ahead
        if ahead is not None and not ahead.done():
            await asyncio.wrap_future(ahead)

    @property
    def source(self) -> profile.Profile:
        """The profile every estimate of this planner is made from."""
        return self._profile

    @property
    def min_workers(self) -> int:
        """The fewest workers any plan needs: f + 1 pipelines of the smallest template."""
        f = self._templates.fault_tolerance
        return (f + 1) * self._templates.min_nodes * self._job.gpus_per_node

    def best(self, live: Collection[plans.WorkerId], kind: statuses.MoveKind) -> Move:
        """The templates' best plan over the nodes whose every worker is live (§4.2)."""
        self._caught_up()
        with self._alone():
            return self._best(live, kind)

    def _best(self, live: Collection[plans.WorkerId], kind: statuses.MoveKind) -> Move:
        nodes = whole_nodes(live, self._job.gpus_per_node)
        choice = instantiation.choose_plan(
            self._templates, nodes, self._job.training.global_batch_size
        )
        return Move(plan=choice.plan, transfers=(), kind=kind, reason=choice.reason)

    def grow(
        self,
        running: plans.Plan,
        live: Collection[plans.WorkerId],
        steps_left: int | None = None,
    ) -> Move:
        """Scale up: the templates' best plan over the whole live nodes, its roles bound to
        the workers by min-cost matching so the running workers keep what they hold and the
        new ones receive copies from the holders. With `steps_left` (>= 1: the job's steps
        after the switch) the move is weighed (`_weighed`): when it would not finish them
        sooner, the answer is `running` itself, no copies, and the reason says why. None: not
        weighed (a recovery's last resort: its running plan lost workers).
        Raises PlannerError when no plan fits the live nodes, PlanInputError for steps < 1."""
        if steps_left is not None and steps_left < 1:
            raise errors.PlanInputError(f"steps_left is {steps_left}; give 1 or more (or None)")
        self._caught_up()
        with self._alone():
            return self._grow(running, live, steps_left)

    def _grow(
        self, running: plans.Plan, live: Collection[plans.WorkerId], steps_left: int | None
    ) -> Move:
        nodes = set(whole_nodes(live, self._job.gpus_per_node))
        best = self._best(live, statuses.MoveKind.SCALE_UP)
        members = set(running.workers)
        if steps_left is not None and set(best.plan.workers) == members:
            why = f"the best plan has the running workers, nobody joins: {best.reason}"
            return Move(plan=running, transfers=(), kind=best.kind, reason=why)
        spare = [w for w in live if w not in members]
        held = {
            w: layers
            for w, layers in transfers.holdings(running, (), spare).items()
            if w // self._job.gpus_per_node in nodes
        }
        transition = transfers.replan(held, best.plan, self._profile, self._policy.search.overheads)
        move = self._move(transition, statuses.MoveKind.SCALE_UP, best.reason)
        if steps_left is None:
            return move
        return self._weighed(running, move, transition.total_s, steps_left)

    def _weighed(
        self, running: plans.Plan, move: Move, transition_s: float, steps_left: int
    ) -> Move:
        """`move` when it trains the job's last `steps_left` steps sooner than `running`, its
        transition included (Odyssey eq. 8 bounded by the job's end, §III; the transition's
        copies and restart as in §IV-C: `policy.pays`), else `running` with the reason. Taken
        unweighed (module docstring) when `running` reroutes or a plan cannot be estimated."""
        if running.reroutes:
            why = "not weighed: the running plan reroutes (its failed stages' layers lost holders)"
            return dataclasses.replace(move, reason=f"{move.reason}; {why}")
        try:
            stay_s = self._estimates.whole(running).step_s
            step_s = self._estimates.whole(move.plan).step_s
        except errors.PlannerError as exc:
            why = f"not weighed: no step estimate ({exc})"
            return dataclasses.replace(move, reason=f"{move.reason}; {why}")
        worth = _worth(stay_s, step_s, transition_s, steps_left)
        if policy.pays(
            stay_step_s=stay_s, step_s=step_s, transition_s=transition_s, steps_left=steps_left
        ):
            return dataclasses.replace(move, reason=f"{move.reason}; pays: {worth}")
        kept = f"declined, the running plan finishes sooner: {worth}"
        return Move(plan=running, transfers=(), kind=move.kind, reason=kept)

    def recover(
        self,
        running: plans.Plan,
        failed: Collection[plans.WorkerId],
        spare: Collection[plans.WorkerId],
        time_to_failure_s: float,
        steps_left: int | None = None,
    ) -> Move:
        """The next plan after `failed` workers of `running` are lost, per the job's policy
        (`steps_left`: the job's steps still to train, which bound eq. 8's horizon).
        Raises InfeasibleError when the policy has no plan for the survivors."""
        self._caught_up()
        with self._alone():
            return self._recover(running, failed, spare, time_to_failure_s, steps_left)

    def _recover(
        self,
        running: plans.Plan,
        failed: Collection[plans.WorkerId],
        spare: Collection[plans.WorkerId],
        time_to_failure_s: float,
        steps_left: int | None,
    ) -> Move:
        lost = frozenset(failed)
        chosen = job_settings.Policy(self._job.policy)
        if chosen is job_settings.Policy.REROUTE:
            return self._rerouted(running, lost)
        if chosen is job_settings.Policy.DYNAMIC:
            return self._reinstantiated(running, lost)
        return self._decided(running, lost, frozenset(spare), time_to_failure_s, steps_left)

    def prepare(self, running: plans.Plan) -> None:
        """Warm the estimates memo for failures of the running plan (Odyssey §IV-C) and load
        the layer-copy matching's solver, which every policy but rerouting uses: on the
        planner's executor, so on a thread this returns at once and the next question waits
        for it (`ready`). Raises the search's error at once when inline, else at the next
        question."""
        self._caught_up()  # the search before this one, or the first plan, is over
        self._ahead = self._executor.submit(self._search_ahead, running)
        if self._ahead.done():
            self._ahead.result()

    def _search_ahead(self, running: plans.Plan) -> None:
        with self._alone():
            self._prepare(running)

    def _prepare(self, running: plans.Plan) -> None:
        chosen = job_settings.Policy(self._job.policy)
        if chosen is not job_settings.Policy.REROUTE:
            _load_solver_in_background()
        if chosen is job_settings.Policy.ADAPTIVE:
            candidates.prepare(running, self._estimates, self._policy.search)

    def _caught_up(self) -> None:
        """Wait until the search ahead ended (at once after `ready`) and raise its error, so
        that every question meets the memos as the controller's order of calls left them.
        (Never on the executor's thread while the search is still queued behind it: `call`
        awaits `ready` before it submits.)"""
        ahead = self._ahead
        if ahead is not None and not ahead.cancelled():
            ahead.result()

    @contextlib.contextmanager
    def _alone(self) -> Iterator[None]:
        """The memos are not thread-safe: assert that no other call is in them (the
        controller asks one question at a time, module docstring)."""
        entered = self._busy.acquire(blocking=False)
        assert entered, "two calls in one planner at once: the controller asks one at a time"
        try:
            yield
        finally:
            self._busy.release()

    def _rerouted(self, running: plans.Plan, lost: frozenset[plans.WorkerId]) -> Move:
        new = rerouting.reroute(running, lost)
        reason = (
            "reroute policy (ReCycle): the failed stages' micro-batches go to same-stage "
            f"peers ({len(new.reroutes)} reroute(s))"
        )
        return Move(plan=new, transfers=(), kind=statuses.MoveKind.REROUTE, reason=reason)

    def _reinstantiated(self, running: plans.Plan, lost: frozenset[plans.WorkerId]) -> Move:
        failed_nodes = {int(running.node_of(w)) for w in lost}
        after = reinstantiation.reinstantiate(running, self._templates, failed_nodes)
        held = {
            w: layers
            for w, layers in transfers.holdings(running, lost).items()
            if int(running.node_of(w)) not in failed_nodes
        }
        transition = transfers.replan(
            held, after.plan, self._profile, self._policy.search.overheads
        )
        return self._move(transition, statuses.MoveKind.DYNAMIC, after.reason)

    def _decided(
        self,
        running: plans.Plan,
        lost: frozenset[plans.WorkerId],
        spare: frozenset[plans.WorkerId],
        time_to_failure_s: float,
        steps_left: int | None,
    ) -> Move:
        failure = candidates.Failure(
            running=running, failed=lost, spare=spare - set(running.workers)
        )
        decision, reason = policy.decide(
            failure,
            self._estimates,
            time_to_failure_s,
            self._policy,
            given=self._oobleck_layouts(running, lost),
            steps_left=steps_left,
        )
        choice = decision.choice
        given = choice.kind is candidates.Kind.GIVEN
        kind = statuses.MoveKind.DYNAMIC if given else statuses.MoveKind(choice.kind.value)
        return self._move(
            choice.transition,
            kind,
            f"chose {choice.kind}: {choice.label}; "
            f"{reason.ranked[0].value:.4g} samples/s estimated by Odyssey eq. 8 for one device "
            f"per worker, among {len(reason.ranked)} candidate(s){_runner_up(reason)}",
        )

    def _oobleck_layouts(
        self, running: plans.Plan, lost: frozenset[plans.WorkerId]
    ) -> list[plans.Plan]:
        """Oobleck's reinstantiations over the surviving nodes, when the running plan is one
        the templates can reinstantiate (a rerouted plan may not be); else none."""
        failed_nodes = {int(running.node_of(w)) for w in lost}
        try:
            after = reinstantiation.reinstantiate(running, self._templates, failed_nodes)
        except errors.PlannerError:
            return []
        return [after.chosen.plan, *(o.plan for o in after.alternatives)]

    def _move(self, transition: transfers.Transition, kind: statuses.MoveKind, reason: str) -> Move:
        copies, orphaned = within(transition.transfers, transition.target)
        return Move(
            plan=transition.target,
            transfers=copies,
            kind=kind,
            reason=reason,
            needs_snapshot=bool(orphaned or transition.restores),
        )


def _worth(stay_s: float, step_s: float, transition_s: float, steps_left: int) -> str:
    """A scale-up's weighing in one line: both finishing times, the step gain, the
    transition, and the steps left at which they would tie (`policy.break_even_steps`)."""
    staying, moving = steps_left * stay_s, transition_s + steps_left * step_s
    gain = (stay_s / step_s - 1) * 100 if step_s > 0 else math.inf  # samples/s gained, %
    tie = policy.break_even_steps(stay_s, 0.0, step_s, transition_s)
    ties = "never" if tie is None else f"at {tie:.4g} steps left"
    return (
        f"the last {steps_left} step(s) take {moving:.4g} s after the scale-up (transition "
        f"{transition_s:.4g} s + {steps_left} x {step_s * 1e3:.4g} ms) against {staying:.4g} s "
        f"staying ({stay_s * 1e3:.4g} ms a step, {gain:+.3g}% samples/s on the new plan); "
        f"they tie {ties}"
    )


def _runner_up(reason: policy.Reason) -> str:
    """The best candidate of another kind and what settled it, for the one-line reason."""
    top, rival = reason.ranked[0], policy.runner_up(reason)
    if rival is None:
        return ""
    against = (
        f"; next best {rival.kind} {rival.value:.4g} samples/s "
        f"(step {rival.step_s * 1e3:.3g} ms vs {top.step_s * 1e3:.3g} ms, transition "
        f"{rival.transition_s * 1e3:.3g} ms vs {top.transition_s * 1e3:.3g} ms)"
    )
    if reason.steps_left is not None:
        against += f"; the job's last {reason.steps_left} step(s) end before the next failure"
    return against


def within(
    copies: Sequence[plans.LayerTransfer], new: plans.Plan
) -> tuple[tuple[plans.LayerTransfer, ...], tuple[plans.LayerTransfer, ...]]:
    """`copies` with sources outside `new` dropped (the epoch's group is the plan's workers),
    and the copies left with no source at all (their layers come from snapshots)."""
    members = set(new.workers)
    kept: list[plans.LayerTransfer] = []
    orphaned: list[plans.LayerTransfer] = []
    # Copies with the same sources share one tuple (`transfers._Sources`), and a scale-up at
    # 1,024 nodes of 8 GPUs makes 200,000 copies (of 2,056 sources each before the planner
    # bounded them): each distinct tuple is filtered once (by identity: every copy, so every
    # tuple, lives through the loop), and a copy that loses no source is kept as it is (33 s of
    # that scale-up here before, 0.03 s since: docs/benchmarks.md, "How long the controller
    # holds its event loop"). The planner names only workers of the next plan, so nothing is
    # dropped from its own moves; the filter guards the rule.
    inside: dict[int, tuple[plans.WorkerId, ...]] = {}
    for copy in copies:
        sources = inside.get(id(copy.sources))
        if sources is None:
            sources = inside[id(copy.sources)] = tuple(s for s in copy.sources if s in members)
        if len(sources) == len(copy.sources):
            kept.append(copy)
        elif sources:
            kept.append(
                plans.LayerTransfer(layer=copy.layer, destination=copy.destination, sources=sources)
            )
        else:
            orphaned.append(copy)
    return tuple(kept), tuple(orphaned)


def whole_nodes(live: Collection[plans.WorkerId], gpus_per_node: int) -> list[int]:
    """Nodes whose every worker is live, in order."""
    alive = set(live)
    nodes = sorted({w // gpus_per_node for w in alive})
    return [n for n in nodes if all(n * gpus_per_node + g in alive for g in range(gpus_per_node))]


def preload(job: job_settings.JobSettings) -> None:
    """Start importing the layer-copy matching's solver when `job`'s policy will match layer
    copies (all but rerouting): the controller calls it as the job starts, while its agents
    start and profile. The import holds the GIL, so the event loop too, for up to 0.9 s at a
    time on a loaded machine (bench/controller.py --loop-lag): better then than while the first
    epoch commits, where the search ahead used to start it (docs/benchmarks.md)."""
    if job_settings.Policy(job.policy) is not job_settings.Policy.REROUTE:
        _load_solver_in_background()


_solver_loading = False


def _load_solver_in_background() -> None:
    """Import the layer-copy matching's solver on a thread, once per process, so that the first
    re-plan after a failure does not pay it on the recovery's critical path (a matching that
    comes first waits for the import under Python's import lock)."""
    global _solver_loading
    if not _solver_loading:
        _solver_loading = True
        threading.Thread(target=transfers.load_solver, name="load-solver", daemon=True).start()
