"""The fresh-plan search (planaria.sim.fresh, its bounds in sim.step_bounds and sim.tail_bounds)
against the exhaustive search it replaced.

Covers: over hypothesis-drawn profiles (tied and free costs, links fast or slow, memory from
ample to a few layers), batches, GPUs per node, symmetric grids or all layouts, with and
without a constraint, `Planner.fresh` returns the very plan of the old search (every prefix
count, every layout built whole and screened, branch and bound per count), kept here as the
oracle; the search answers every smaller worker count the same after a larger one, and so do
searches of every kind asked in any order of one planner (they share their layouts' memos); a brute
force over every layout of every count (each estimated whole) finds no faster plan; the step
bound the search prunes with is never above E's estimate at any micro-batch count; a pipeline
alone arrives at each stage's tail no earlier with one more micro-batch, nor than with every hop
over the faster link (what the balanced tail bound stands on); a group's lead bound is at most
its chain bound and each chain, its tail bound at most every member's balanced tail bisected
over every share (the bounds the search raises a group through before opening it).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planaria.contract import errors, plan, profile
from planaria.planner import candidates, composition, distribution, estimator, screening
from planaria.sim import fresh, planning, step_bounds, tail_bounds
from tests import strategies

W = plan.WorkerId
Layout = tuple[tuple[int, ...], ...]


# --- the oracle: the search as it was before planaria.sim.fresh --------------------------------


def _old_fresh(
    planner: planning.Planner,
    workers: list[plan.WorkerId],
    symmetric: bool,
    constraint: planning.Constraint | None,
) -> plan.Plan | None:
    ordered = sorted(workers)
    best: tuple[float, Layout] | None = None
    for count in range(1, len(ordered) + 1):
        found = _old_best_layout(planner, count, symmetric, constraint)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return None if best is None else planner._laid_out(best[1], ordered)


def _old_best_layout(
    planner: planning.Planner,
    num_workers: int,
    symmetric: bool,
    constraint: planning.Constraint | None,
) -> tuple[float, Layout] | None:
    estimates = planner.estimates
    screened = []
    for layout in _old_layouts(planner, num_workers, symmetric):
        built = planner._laid_out(layout, [W(w) for w in range(num_workers)])
        alone = [
            estimates.pipeline(p, planner.job.profile.micro_batch_size, planner.job.gpus_per_node)
            for p in built.pipelines
        ]
        if all(estimates.fits(e) for e in alone):
            screened.append((max(e.step_s for e in alone), layout, built))
    screened.sort(key=lambda item: item[0])
    best: tuple[float, Layout] | None = None
    for screen_s, layout, built in screened:
        if best is not None and screen_s >= best[0]:
            break
        whole = estimates.whole(built)
        if not estimates.fits(whole) or (constraint and not constraint.test(built)):
            continue
        if best is None or whole.step_s < best[0]:
            best = (whole.step_s, layout)
    return best


def _old_layouts(planner: planning.Planner, num_workers: int, symmetric: bool) -> Iterable[Layout]:
    prof = planner.job.profile
    found = candidates.configurations(
        num_workers, 1, prof.num_layers, planner.job.num_micro_batches, num_workers
    )
    for depths in found:
        if symmetric and len(set(depths)) > 1:
            continue
        splits = [planner._split(d) for d in depths]
        chosen = [s for s in splits if s is not None]
        if len(chosen) < len(splits):
            continue
        try:
            batch = distribution.distribute_batch(planner.estimates, chosen, planner._reference)
        except errors.InfeasibleError:
            continue
        yield tuple((*split, m) for split, m in zip(chosen, batch, strict=True))


# --- properties --------------------------------------------------------------------------------


@st.composite
def tied_profiles(draw: st.DrawFn) -> profile.Profile:
    """Layers of 0 or 1 s forward and backward that move no bytes over free links: many layouts
    of different counts have the very same step, so the tie rule decides."""
    times = st.sampled_from([(0.0,), (1.0,)])
    layer = st.builds(
        profile.LayerProfile,
        name=st.just("layer"),
        forward_s=times,
        backward_s=times,
        parameter_bytes=st.just(0),
        gradient_bytes=st.just(0),
        optimizer_bytes=st.just(0),
        activation_bytes=st.just(0),
        output_bytes=st.just(0),
    )
    free = profile.LinkProfile(bandwidth_bytes_per_s=1e9, latency_s=0.0)
    return profile.Profile(
        model="tied",
        accelerator="drawn",
        micro_batch_size=1,
        memory_bytes=10**6,
        layers=tuple(draw(st.lists(layer, min_size=1, max_size=6))),
        intra_node=free,
        inter_node=free,
    )


MAX_WORKERS = 10  # the most workers any test here plans for


@st.composite
def jobs(draw: st.DrawFn) -> planning.Job:
    """Jobs on which the search's screens are lower bounds, as sim.fresh's docstring requires:
    a commit barrier within a node costs no more than one between nodes (the estimator prices
    a barrier that spans nodes at the inter-node link, so with a slower intra-node link, which
    no real machine has, a pipeline alone on one node is estimated slower than the whole plan,
    and this search and the exhaustive one may both miss the least step: hypothesis drew such
    a profile for the oracle test too, intra 10 B/s against inter 100 B/s)."""
    prof = draw(st.one_of(strategies.planning_profiles(max_layers=6, max_gpus=1), tied_profiles()))
    assume(
        all(
            estimator.barrier_s(prof.intra_node, n) <= estimator.barrier_s(prof.inter_node, n)
            for n in range(1, MAX_WORKERS + 1)
        )
    )
    num_micro_batches = draw(st.integers(min_value=1, max_value=14))
    return planning.Job(
        profile=prof,
        global_batch=num_micro_batches * prof.micro_batch_size,
        gpus_per_node=draw(st.integers(min_value=1, max_value=3)),
    )


def _few_pipelines(limit: int) -> planning.Constraint:
    return planning.Constraint(name=f"at most {limit}", test=lambda p: len(p.pipelines) <= limit)


@given(
    jobs(),
    st.integers(min_value=1, max_value=MAX_WORKERS),
    st.booleans(),
    st.sampled_from([None, 1, 2, 3]),
)
@settings(max_examples=150, deadline=None)
def test_the_search_returns_the_exhaustive_searchs_plan(
    job: planning.Job, num_workers: int, symmetric: bool, limit: int | None
) -> None:
    constraint = None if limit is None else _few_pipelines(limit)
    workers = [W(w) for w in range(num_workers)]
    planner = planning.Planner(job)
    expected = _old_fresh(planning.Planner(job), workers, symmetric, constraint)
    assert planner.fresh(workers, symmetric, constraint) == expected
    # later calls for fewer workers come from the same search, kept per count
    for n in range(num_workers - 1, 0, -1):
        fewer = [W(w) for w in range(n)]
        assert planner.fresh(fewer, symmetric, constraint) == _old_fresh(
            planner, fewer, symmetric, constraint
        )


@given(
    jobs(),
    st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=9), st.booleans(), st.sampled_from([None, 1, 2])
        ),
        min_size=2,
        max_size=5,
    ),
)
@settings(max_examples=80, deadline=None)
def test_searches_of_every_kind_on_one_planner_return_the_exhaustive_plans(
    job: planning.Job, queries: list[tuple[int, bool, int | None]]
) -> None:
    # the searches of one planner share their layouts' memos (all layouts, grids only, tested)
    planner = planning.Planner(job)
    for num_workers, symmetric, limit in queries:
        constraint = None if limit is None else _few_pipelines(limit)
        workers = [W(w) for w in range(num_workers)]
        expected = _old_fresh(planning.Planner(job), workers, symmetric, constraint)
        assert planner.fresh(workers, symmetric, constraint) == expected


@given(jobs(), st.integers(min_value=1, max_value=7))
@settings(max_examples=60, deadline=None)
def test_no_layout_of_any_count_is_faster_than_the_fresh_plan(
    job: planning.Job, num_workers: int
) -> None:
    planner = planning.Planner(job)
    estimates, gpus = planner.estimates, job.gpus_per_node
    steps = []
    for count in range(1, num_workers + 1):
        for layout in _old_layouts(planner, count, False):
            built = planner._laid_out(layout, [W(w) for w in range(count)])
            alone = [
                estimates.pipeline(p, job.profile.micro_batch_size, gpus) for p in built.pipelines
            ]
            whole = estimates.whole(built)
            if estimates.fits(whole) and all(estimates.fits(e) for e in alone):
                steps.append(whole.step_s)
    chosen = planner.fresh([W(w) for w in range(num_workers)])
    if chosen is None:
        assert not steps
    else:
        assert planner.step_s(chosen) == min(steps)


@given(
    strategies.planning_profiles(max_layers=6, max_gpus=1),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=0, max_value=2),
)
@settings(max_examples=80, deadline=None)
def test_the_step_bound_holds_at_every_micro_batch_count_and_node_position(
    prof: profile.Profile, depth: int, num_micro_batches: int, gpus: int, first: int
) -> None:
    if depth > prof.num_layers:
        return
    estimates = screening.Estimates(prof)
    for counts in distribution.remainder_placements(prof.num_layers, depth):
        workers = [W(first % gpus + s) for s in range(depth)]
        alone = distribution.pipeline_of(counts, workers, num_micro_batches)
        estimate = estimates.pipeline(alone, prof.micro_batch_size, gpus)
        bound = distribution.step_bound_s(prof, counts, num_micro_batches)
        assert bound * (1 - step_bounds._ROUNDING) <= estimate.step_s


@given(jobs(), st.integers(min_value=1, max_value=7))
@settings(max_examples=60, deadline=None)
def test_every_bound_the_search_cuts_with_is_below_the_whole_step(
    job: planning.Job, num_workers: int
) -> None:
    # (`jobs` draws only profiles on which the screens are lower bounds)
    planner = planning.Planner(job)
    search = planner._search(False, None)
    for shape, room in fresh.groups(
        num_workers, job.profile.num_layers, job.num_micro_batches, False
    ):
        members = (
            [shape]
            if room == 0
            else [dataclasses.replace(shape, num_deeper=e) for e in range(1, room + 1)]
        )
        for member in members:
            screened = search._screen(member)
            if screened is None:
                continue
            built = planner._laid_out(
                search._layout(member, screened), [W(w) for w in range(member.num_workers)]
            )
            step_s = planner.estimates.whole(built).step_s
            bounds, spread = search.bounds, search._micro_batches(member)
            assert bounds.group_lead_s(shape) <= bounds.group_s(shape) <= step_s
            assert bounds.group_tail_s(shape, search._run) <= step_s
            assert bounds.balanced_s(member) <= step_s
            assert bounds.balanced_tail_s(member, search._run) <= step_s
            assert bounds.spread_s(member, spread) <= step_s and screened.screen_s <= step_s
            assert bounds.tail_s(member, screened.kinds, search._run) <= step_s


@given(
    strategies.planning_profiles(max_layers=6, max_gpus=1),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=0, max_value=3),
)
@settings(max_examples=80, deadline=None)
def test_a_pipeline_alone_arrives_no_earlier_with_more_micro_batches_or_slower_hops(
    prof: profile.Profile, depth: int, num_micro_batches: int, gpus: int, first: int
) -> None:
    # what `Bounds.balanced_tail_s` stands on: arrivals grow with the micro-batches, and the
    # run with every hop over the faster link arrives no later than from any first GPU
    if depth > prof.num_layers:
        return
    job = planning.Job(profile=prof, global_batch=prof.micro_batch_size, gpus_per_node=gpus)
    bounds = planning.Planner(job)._search(False, None).bounds
    for counts in itertools.islice(distribution.remainder_placements(prof.num_layers, depth), 4):
        workers = [W(first % gpus + s) for s in range(depth)]
        runs = [
            composition.run_chain(distribution.pipeline_of(counts, workers, m), gpus, prof)
            for m in (num_micro_batches, num_micro_batches + 1)
        ]
        assert all(a <= b for a, b in zip(*(r.arrival_s for r in runs), strict=True))
        at = [W(s) for s in range(depth)]
        fast = composition.run_chain(
            distribution.pipeline_of(counts, at, num_micro_batches), 1, bounds.tails.fast_hops()
        )
        assert all(a <= b for a, b in zip(fast.arrival_s, runs[0].arrival_s, strict=True))


def _old_tail_bound_s(search: fresh.Search, shape: fresh.Shape) -> float:
    """The tail bound as computed before it was memoised per kind (the oracle), with the
    commit barrier added since."""
    screened = search._screens[shape]
    assert screened is not None
    prof, dp, gpus = search.estimates.profile, shape.num_pipelines, search.reference.gpus_per_node
    present = {d for d, _, _ in screened.kinds}
    cuts = sorted({c for d in present for c in itertools.accumulate(search._split_of(d))})
    reduce_s = {}
    for a, b in itertools.pairwise([0, *cuts]):
        gradient = sum(layer.gradient_bytes for layer in prof.layers[a:b])
        links = tail_bounds.links(prof, gpus, search.bounds.apart(shape))
        reduce_s[a] = min(link.allreduce_s(gradient, dp) for link in links)
    bound = 0.0
    for depth, num_micro_batches, gpu in screened.kinds:
        run = search._run(depth, num_micro_batches, gpu)
        parts = search.bounds._chain_parts(depth)
        assert parts is not None
        bounds = list(itertools.accumulate(search._split_of(depth), initial=0))
        for r, (a, b) in enumerate(itertools.pairwise(bounds)):
            waits = sum(reduce_s[c] for c in reduce_s if a <= c < b)
            bound = max(bound, run.arrival_s[r] + waits + parts[-1][r])
    # then the commit barrier among the layout's workers, before every optimizer step
    workers = range(shape.num_workers)
    barrier = estimator.barrier_s(estimator.link_among(prof, gpus, workers), len(workers))
    return bound * (1 - step_bounds._ROUNDING) + barrier * (1 - step_bounds._ROUNDING)


@given(jobs(), st.integers(min_value=1, max_value=MAX_WORKERS))
@settings(max_examples=60, deadline=None)
def test_the_tail_bound_memoised_per_kind_is_the_old_bound(
    job: planning.Job, num_workers: int
) -> None:
    search = planning.Planner(job)._search(False, None)
    for shape, room in fresh.groups(
        num_workers, job.profile.num_layers, job.num_micro_batches, False
    ):
        for e in [0] if room == 0 else range(1, room + 1):
            member = dataclasses.replace(shape, num_deeper=e)
            screened = search._screen(member)
            if screened is not None:
                tail_s = search.bounds.tail_s(member, screened.kinds, search._run)
                assert repr(tail_s) == repr(_old_tail_bound_s(search, member))


# --- the chain and balanced bounds against their forms before the eighth round (the oracles) --


def _old_chained_s(
    bounds: step_bounds.Bounds, depth: int, num_micro_batches: int, dp: int, apart: bool
) -> float:
    """The chain bound as computed whole per call, before its parts were memoised."""
    parts = bounds._chain_parts(depth)
    if parts is None:
        return math.inf
    forward, backward, starts, gradients, optimizers = parts
    fastest = bounds._fastest_of(apart)
    done = [0.0] * (depth + 1)
    for r in reversed(range(depth)):
        own = starts[r] + num_micro_batches * (forward[r] + backward[r])
        done[r] = max(own, backward[r] + done[r + 1]) if r + 1 < depth else own
    bound = 0.0
    for r in range(depth):
        reduce_s = fastest.allreduce_s(gradients[r], dp)
        bound = max(bound, done[r] + reduce_s + optimizers[r])
    return bound * (1 - step_bounds._ROUNDING)


def _old_balanced_s(bounds: step_bounds.Bounds, shape: fresh.Shape) -> float:
    """The balanced bound bisected over the deeper pipelines' share of the batch."""
    dp, total = shape.num_pipelines, bounds.reference.num_micro_batches
    apart, barrier = bounds.apart(shape), bounds._barrier_s(shape.num_workers)

    def pair(depth: int, m: int) -> float:
        chain = _old_chained_s(bounds, depth, m, dp, apart)
        return max(bounds._depth_bound_s(depth, m), chain + barrier)

    if not shape.num_deeper:
        return pair(shape.depth, -(-total // dp))
    deeper, others = shape.num_deeper, dp - shape.num_deeper
    if total < dp:
        return math.inf
    return step_bounds._least_larger(
        lambda t: pair(shape.depth + 1, -(-t // deeper)),
        lambda t: pair(shape.depth, -(-(total - t) // others)),
        deeper,
        total - others,
    )


def _old_balanced_tail_s(search: fresh.Search, shape: fresh.Shape) -> float:
    """The balanced tail bound bisected over the deeper pipelines' share of the batch."""
    bounds = search.bounds
    dp, total, depth = shape.num_pipelines, bounds.reference.num_micro_batches, shape.depth
    present = frozenset((depth, depth + 1) if shape.num_deeper else (depth,))
    if total < dp or any(bounds.split(d) is None for d in present):
        return math.inf
    apart, deeper, others = bounds.apart(shape), shape.num_deeper, dp - shape.num_deeper
    most = 2 * -(-total // dp)

    def deep(t: int) -> float:
        return bounds.tails.least_s(
            depth + 1, min(-(-t // deeper), most), present, dp, apart, search._run
        )

    def shallow(t: int) -> float:
        busiest = min(-(-(total - t) // others), most)
        return bounds.tails.least_s(depth, busiest, present, dp, apart, search._run)

    found = (
        step_bounds._least_larger(deep, shallow, deeper, total - others) if deeper else shallow(0)
    )
    return found * (1 - step_bounds._ROUNDING) + bounds._barrier_s(shape.num_workers)


def _searched(job: planning.Job, num_micro_batches: int) -> tuple[planning.Job, fresh.Search]:
    """`job` with `num_micro_batches` micro-batches in its global batch, and its search."""
    job = dataclasses.replace(job, global_batch=num_micro_batches * job.profile.micro_batch_size)
    return job, planning.Planner(job)._search(False, None)


@given(jobs(), st.integers(min_value=1, max_value=MAX_WORKERS), st.integers(1, 120))
@settings(max_examples=60, deadline=None)
def test_the_chain_and_balanced_bounds_are_their_old_values(
    job: planning.Job, num_workers: int, num_micro_batches: int
) -> None:
    # up to 120 micro-batches: the shares the bisections run over span many busiest counts
    job, search = _searched(job, num_micro_batches)
    bounds = search.bounds
    for shape, room in fresh.groups(num_workers, job.profile.num_layers, num_micro_batches, False):
        for e in [0] if room == 0 else range(1, room + 1):
            member = dataclasses.replace(shape, num_deeper=e)
            assert repr(bounds.balanced_s(member)) == repr(_old_balanced_s(bounds, member))
            tail_s = bounds.balanced_tail_s(member, search._run)
            assert repr(tail_s) == repr(_old_balanced_tail_s(search, member))
    for depth in range(1, job.profile.num_layers + 1):
        for dp, m, apart in itertools.product((1, 2, 5), (1, 3, num_micro_batches), (False, True)):
            chain = bounds._chain_s(depth, m, dp, apart)
            assert repr(chain) == repr(_old_chained_s(bounds, depth, m, dp, apart))


@st.composite
def _sides(draw: st.DrawFn) -> tuple[list[float], list[float], int, int, int]:
    """Two non-decreasing sides over busiest counts 1..total (index 0 unused; inf allowed),
    the deeper and other pipelines and the total micro-batches."""
    deeper = draw(st.integers(1, 12))
    others = draw(st.integers(1, 12))
    total = draw(st.integers(deeper + others, 150))
    value = st.one_of(st.integers(0, 40).map(float), st.just(math.inf))
    sides = [sorted(draw(st.lists(value, min_size=total + 1, max_size=total + 1))) for _ in "ab"]
    return sides[0], sides[1], deeper, others, total


@given(_sides())
@settings(max_examples=300, deadline=None)
def test_the_least_over_shares_is_the_least_over_every_share(
    sides: tuple[list[float], list[float], int, int, int],
) -> None:
    deep, shallow, deeper, others, total = sides
    every = [
        max(deep[-(-t // deeper)], shallow[-(-(total - t) // others)])
        for t in range(deeper, total - others + 1)
    ]
    found = step_bounds._least_over_shares(
        deep.__getitem__, shallow.__getitem__, deeper, others, total
    )
    assert found == min(every)
    old = step_bounds._least_larger(
        lambda t: deep[-(-t // deeper)],
        lambda t: shallow[-(-(total - t) // others)],
        deeper,
        total - others,
    )
    assert found == old


# --- the group bounds the search opens groups by (tenth round) -------------------------------


@given(jobs(), st.integers(min_value=1, max_value=MAX_WORKERS), st.integers(1, 120))
@settings(max_examples=60, deadline=None)
def test_a_groups_lead_and_tail_bounds_are_below_its_members_bounds(
    job: planning.Job, num_workers: int, num_micro_batches: int
) -> None:
    # the search opens a group only when its lead, chain and tail bounds let it through: each
    # must be at most what the members' own bounds are (the chain bound and the balanced tail
    # bisected over every share, the oracles), whatever the share of the batch
    job, search = _searched(job, num_micro_batches)
    bounds = search.bounds
    for shape, room in fresh.groups(num_workers, job.profile.num_layers, num_micro_batches, False):
        assert bounds.group_lead_s(shape) <= bounds.group_s(shape)
        tail_s = bounds.group_tail_s(shape, search._run)
        for e in [0] if room == 0 else range(1, room + 1):
            member = dataclasses.replace(shape, num_deeper=e)
            assert tail_s <= _old_balanced_tail_s(search, member)
    for depth in range(1, job.profile.num_layers + 1):
        for dp, m, apart in itertools.product((1, 2, 5), (1, 3, num_micro_batches), (False, True)):
            assert bounds._lead_s(depth, m, dp, apart) <= _old_chained_s(
                bounds, depth, m, dp, apart
            )
