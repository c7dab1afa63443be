"""Time estimator (planaria.planner.estimator) against Odyssey's closed forms and the eq. 11 DP.

Covers, with zero-cost links so that the equalities are exact:
- eq. 9: symmetric 1F1B takes (N_m + N_pp - 1)(Tf + Tb);
- eq. 10-11: heterogeneous pipelines with uneven stages take the slowest pipeline's time, each
  pipeline timed by an independent implementation of the eq. 11 DP (the test's oracle);
- eq. 12: one failed stage, its micro-batches spread evenly over the N_dp - 1 peers;
- eq. 13: F failed stages at one pipeline position (exact), and failures spread over positions,
  where our pipelined schedule is never slower than eq. 13's additive model on the cases shown;
- communication: sends over the intra- or inter-node link by worker placement, all-reduce and
  optimizer after the last backward, tensor-parallel stages timed with k-GPU numbers;
- the commit barrier: every optimizer step waits for the last worker to arrive, plus a tiny
  all-reduce over every worker at the link's all-reduce figures (none for one worker); a
  slower all-reduce never shortens a step (hypothesis);
- the report: the critical path is a contiguous chain from 0 to the step time; each worker's
  busy plus waiting time is its finish time, busy plus idle the step; profile mismatches are
  one-line input errors.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import errors, instructions, plan, profile, schedule, timeline
from planaria.planner import estimator
from tests import strategies

W = plan.WorkerId
OPTIMIZER = instructions.Op.OPTIMIZER_STEP
FREE = profile.LinkProfile(bandwidth_bytes_per_s=1e30, latency_s=0.0)


def layer(
    forward_s: float, backward_s: float, *, output_bytes: int = 0, gradient_bytes: int = 0
) -> profile.LayerProfile:
    return profile.LayerProfile(
        name="block",
        forward_s=(forward_s, forward_s / 2),
        backward_s=(backward_s, backward_s / 2),
        parameter_bytes=gradient_bytes,
        gradient_bytes=gradient_bytes,
        optimizer_bytes=2 * gradient_bytes,
        activation_bytes=0,
        output_bytes=output_bytes,
        optimizer_s=0.0,
    )


def uniform_profile(
    num_layers: int,
    forward_s: float,
    backward_s: float,
    *,
    intra: profile.LinkProfile = FREE,
    inter: profile.LinkProfile = FREE,
    **layer_fields: int,
) -> profile.Profile:
    return profile.Profile(
        model="test",
        accelerator="test",
        micro_batch_size=1,
        memory_bytes=2**40,
        layers=tuple(layer(forward_s, backward_s, **layer_fields) for _ in range(num_layers)),
        intra_node=intra,
        inter_node=inter,
    )


def symmetric(
    num_pipelines: int, num_stages: int, num_micro_batches: int, *, gpus_per_node: int = 1
) -> plan.Plan:
    """One layer per stage, worker p * S + s."""
    pipelines = tuple(
        plan.Pipeline(
            stages=tuple(
                plan.Stage(layer_start=s, layer_stop=s + 1, workers=(W(p * num_stages + s),))
                for s in range(num_stages)
            ),
            num_micro_batches=num_micro_batches,
        )
        for p in range(num_pipelines)
    )
    return plan.Plan(pipelines=pipelines, micro_batch_size=1, gpus_per_node=gpus_per_node)


def with_failures(base: plan.Plan, failed: dict[int, list[int]], *, spread: str) -> plan.Plan:
    """Empty stage s of every pipeline in failed[s] and reroute its micro-batches over that
    stage's survivors: round-robin ("rr") or in equal consecutive blocks ("block")."""
    pipelines = list(base.pipelines)
    reroutes = []
    for s, dead in failed.items():
        survivors = [p for p in range(len(pipelines)) if p not in dead]
        jobs = [(p, j) for p in dead for j in range(pipelines[p].num_micro_batches)]
        share = -(-len(jobs) // len(survivors))
        for n, (p, j) in enumerate(jobs):
            peer = survivors[n % len(survivors) if spread == "rr" else n // share]
            reroutes.append(
                plan.Reroute(pipeline=p, stage=s, peer_pipeline=peer, micro_batches=(j,))
            )
        for p in dead:
            stages = list(pipelines[p].stages)
            stages[s] = plan.Stage(layer_start=s, layer_stop=s + 1, workers=())
            pipelines[p] = plan.Pipeline(
                stages=tuple(stages), num_micro_batches=pipelines[p].num_micro_batches
            )
    return plan.Plan(pipelines=tuple(pipelines), micro_batch_size=1, reroutes=tuple(reroutes))


def step_s(p: plan.Plan, prof: profile.Profile) -> float:
    return estimator.estimate_step(schedule.compile_schedule(p), prof).step_s


# --- eq. 9 -------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    num_pipelines=st.integers(min_value=1, max_value=3),
    num_stages=st.integers(min_value=1, max_value=5),
    num_micro_batches=st.integers(min_value=1, max_value=8),
    forward_s=st.integers(min_value=1, max_value=5),
    backward_s=st.integers(min_value=1, max_value=5),
)
def test_symmetric_1f1b_takes_eq_9(
    num_pipelines: int, num_stages: int, num_micro_batches: int, forward_s: int, backward_s: int
) -> None:
    p = symmetric(num_pipelines, num_stages, num_micro_batches)
    prof = uniform_profile(num_stages, forward_s, backward_s)
    expected = (num_micro_batches + num_stages - 1) * (forward_s + backward_s)
    assert step_s(p, prof) == expected


# --- eq. 10-11 ---------------------------------------------------------------------------------


def eq_11_pipeline_s(forward: list[float], backward: list[float], num_micro_batches: int) -> float:
    """Odyssey eq. 11 for one pipeline, written independently of the estimator: ops of stage i
    in 1F1B order; t_start(i, j) = max(t_end(i, j - 1), t_end of the op it depends on)."""
    depth = len(forward)
    end: dict[tuple[int, bool, int], float] = {}
    orders = [list(timeline.one_f_one_b(depth, i, range(num_micro_batches))) for i in range(depth)]
    clock = [0.0] * depth
    while any(orders):
        for i in range(depth):
            while orders[i]:
                is_backward, m = orders[i][0]
                if is_backward:
                    dep = (i + 1, True, m) if i + 1 < depth else (i, False, m)
                else:
                    dep = (i - 1, False, m)
                if dep[0] >= 0 and dep not in end:
                    break
                start = max(clock[i], end.get(dep, 0.0))
                clock[i] = start + (backward[i] if is_backward else forward[i])
                end[(i, is_backward, m)] = clock[i]
                orders[i].pop(0)
    return max(clock)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_heterogeneous_pipelines_take_the_slowest_eq_10_11(data: st.DataObject) -> None:
    counts = data.draw(st.sampled_from([(3, 2), (2, 2, 1), (4, 3, 3), (1, 3)]))
    p = data.draw(strategies.shaped_plans(counts, aligned=False))
    times = data.draw(
        st.lists(
            st.integers(min_value=1, max_value=9),
            min_size=2 * p.num_layers,
            max_size=2 * p.num_layers,
        )
    )
    layers = tuple(layer(times[2 * i], times[2 * i + 1]) for i in range(p.num_layers))
    prof = dataclasses.replace(uniform_profile(1, 1, 1), layers=layers)
    slowest = max(
        eq_11_pipeline_s(
            [sum(times[2 * i] for i in stage.layers) for stage in pipeline.stages],
            [sum(times[2 * i + 1] for i in stage.layers) for stage in pipeline.stages],
            pipeline.num_micro_batches,
        )
        for pipeline in p.pipelines
    )
    assert step_s(p, prof) == slowest


# --- eq. 12-13 ---------------------------------------------------------------------------------


def eq_13_s(
    num_stages: int, num_micro_batches: int, num_pipelines: int, failed: list[int], unit: int
) -> Fraction:
    """(N_pp + N_m - 1 + sum_i [F_i > 0] N_m F_i / (N_dp - F_i)) (Tf + Tb); eq. 12 is F = [1]."""
    extra = sum(Fraction(num_micro_batches * f, num_pipelines - f) for f in failed if f)
    return Fraction(num_stages + num_micro_batches - 1 + extra) * unit


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_one_failed_stage_rerouted_to_its_peers_takes_eq_12(data: st.DataObject) -> None:
    num_pipelines = data.draw(st.integers(min_value=2, max_value=4), label="N_dp")
    num_stages = data.draw(st.integers(min_value=1, max_value=4), label="N_pp")
    peers = num_pipelines - 1
    # eq. 12 assumes an even spread, and a steady state exists: N_m >= N_pp.
    multiples = [n for n in range(num_stages, 10) if n % peers == 0]
    num_micro_batches = data.draw(st.sampled_from(multiples), label="N_m")
    stage = data.draw(st.integers(min_value=0, max_value=num_stages - 1), label="failed stage")
    pipeline = data.draw(st.integers(min_value=0, max_value=peers), label="failed pipeline")
    spread = data.draw(st.sampled_from(["rr", "block"]))
    forward_s, backward_s = data.draw(st.sampled_from([(1, 2), (2, 1), (1, 1), (2, 3)]))
    p = with_failures(
        symmetric(num_pipelines, num_stages, num_micro_batches), {stage: [pipeline]}, spread=spread
    )
    expected = eq_13_s(num_stages, num_micro_batches, num_pipelines, [1], forward_s + backward_s)
    assert step_s(p, uniform_profile(num_stages, forward_s, backward_s)) == expected


@pytest.mark.parametrize(
    ("num_pipelines", "num_micro_batches", "dead"),
    [(3, 4, [0, 1]), (4, 6, [1, 3]), (4, 3, [0, 1, 2]), (5, 6, [4, 0])],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_several_failures_in_one_stage_take_eq_13(
    num_pipelines: int, num_micro_batches: int, dead: list[int], stage: int
) -> None:
    p = with_failures(symmetric(num_pipelines, 3, num_micro_batches), {stage: dead}, spread="rr")
    failed = [len(dead) if s == stage else 0 for s in range(3)]
    expected = eq_13_s(3, num_micro_batches, num_pipelines, failed, 3)
    assert step_s(p, uniform_profile(3, 1, 2)) == expected


@pytest.mark.parametrize(
    ("failed", "num_pipelines", "strictly"),
    [
        ({0: [0], 2: [1]}, 3, True),
        ({0: [0], 1: [0]}, 3, True),
        ({0: [1], 1: [2], 2: [0]}, 4, False),
    ],
    ids=["two pipelines at stages 0 and 2", "one pipeline at stages 0 and 1", "three positions"],
)
def test_failures_at_several_positions_are_never_slower_than_eq_13(
    failed: dict[int, list[int]], num_pipelines: int, strictly: bool
) -> None:
    """Eq. 13 adds each position's delay; in a pipeline the positions' extra work can overlap,
    so our schedule is faster where the slot packing finds the overlap, and never slower."""
    num_micro_batches = 6
    p = with_failures(symmetric(num_pipelines, 3, num_micro_batches), failed, spread="rr")
    counts = [len(failed.get(s, [])) for s in range(3)]
    bound = eq_13_s(3, num_micro_batches, num_pipelines, counts, 3)
    estimate = step_s(p, uniform_profile(3, 1, 2))
    assert estimate <= bound
    assert (estimate < bound) == strictly


# --- communication, all-reduce, optimizer ------------------------------------------------------


@pytest.mark.parametrize(("gpus_per_node", "link"), [(1, "inter"), (2, "intra")])
def test_sends_use_the_link_between_the_workers_nodes(gpus_per_node: int, link: str) -> None:
    """One micro-batch through two stages: Tf0 + send + Tf1 + Tb1 + send back + Tb0, then the
    commit barrier over the same link."""
    slow = profile.LinkProfile(bandwidth_bytes_per_s=100.0, latency_s=0.5)
    fast = profile.LinkProfile(bandwidth_bytes_per_s=1000.0, latency_s=0.25)
    prof = uniform_profile(2, 1, 2, intra=fast, inter=slow, output_bytes=100)
    used = fast if link == "intra" else slow
    p = symmetric(1, 2, 1, gpus_per_node=gpus_per_node)
    barrier = used.allreduce_s(estimator.BARRIER_BYTES, 2)
    assert step_s(p, prof) == pytest.approx(2 * (1 + 2) + 2 * used.transfer_s(100) + barrier)


def test_all_reduce_barrier_and_optimizer_follow_the_last_backward() -> None:
    """Two symmetric pipelines of two stages: stage s's last backward ends at
    (N + S - 1)(Tf + Tb) - s Tb, then its all-reduce (over the inter-node link: one GPU per
    node); every worker then waits at the commit barrier for the last (stage 0), and all run
    their optimizer steps after it."""
    link = profile.LinkProfile(bandwidth_bytes_per_s=10.0, latency_s=0.0)
    prof = uniform_profile(2, 1, 2, inter=link, gradient_bytes=40)
    prof = dataclasses.replace(
        prof, layers=tuple(dataclasses.replace(x, optimizer_s=0.5) for x in prof.layers)
    )
    num_micro_batches = 3
    estimate = estimator.estimate_step(
        schedule.compile_schedule(symmetric(2, 2, num_micro_batches)), prof
    )
    reduce_s = link.allreduce_s(40, 2)
    barrier_s = 2 * 3 * (16 / 4 / 10.0)  # a ring of 4: 2(p-1) steps of 16/p bytes at 10 B/s
    arrivals = [(num_micro_batches + 1) * 3 - s * 2 + reduce_s for s in range(2)]
    assert estimate.step_s == pytest.approx(max(arrivals) + barrier_s + 0.5)
    assert {w.finish_s for w in estimate.workers} == {estimate.step_s}
    assert all(w.allreduce_s == pytest.approx(reduce_s) for w in estimate.workers)
    assert all(w.optimizer_s == pytest.approx(0.5) for w in estimate.workers)
    optimizer = instructions.Op.OPTIMIZER_STEP  # as the executor counts it: barrier included
    for w in estimate.workers:
        arrival = arrivals[w.worker % 2]
        assert w.seconds[optimizer] == pytest.approx(max(arrivals) - arrival + barrier_s + 0.5)


def test_a_two_gpu_stage_uses_the_two_gpu_timings() -> None:
    stage = plan.Stage(layer_start=0, layer_stop=1, workers=(W(0), W(1)))
    p = plan.Plan(
        pipelines=(plan.Pipeline(stages=(stage,), num_micro_batches=2),),
        micro_batch_size=1,
        gpus_per_node=2,
    )
    # layer(): forward_s = (4, 2) and backward_s = (6, 3) for 1 and 2 GPUs
    assert step_s(p, uniform_profile(1, 4, 6)) == 2 * (2 + 3)


def with_optimizer_s(prof: profile.Profile, *seconds: float) -> profile.Profile:
    layers = tuple(
        dataclasses.replace(x, optimizer_s=t) for x, t in zip(prof.layers, seconds, strict=True)
    )
    return dataclasses.replace(prof, layers=layers)


def test_the_commit_barrier_makes_every_optimizer_step_wait_for_the_last_arrival() -> None:
    """Two stages, 3 micro-batches, Tf = 1, Tb = 2: stage 1 reaches its optimizer step at
    (3 + 1) 3 - 2 = 10, stage 0 at 12. Without the barrier stage 1 would end at 10 + 3 = 13
    and the step at max(12 + 0.5, 13) = 13; with it both start at 12, so the step is 12 + 3."""
    prof = with_optimizer_s(uniform_profile(2, 1, 2), 0.5, 3.0)
    estimate = estimator.estimate_step(schedule.compile_schedule(symmetric(1, 2, 3)), prof)
    assert estimate.step_s == 15
    assert [w.finish_s for w in estimate.workers] == [12.5, 15]
    # as the executor counts it, the optimizer step includes the wait: stage 1's 12 - 10
    assert [w.seconds[OPTIMIZER] for w in estimate.workers] == [0.5, 2 + 3]
    path = estimate.critical_path
    assert (path[-1].worker, path[-1].op, path[-1].start_s) == (W(1), OPTIMIZER, 12)
    assert path[-2].worker == W(0)  # through stage 0, the last to arrive


def test_the_barrier_costs_a_tiny_all_reduce_over_every_worker() -> None:
    """Two pipelines of two stages on nodes of two GPUs: the 4 workers span 2 nodes, so the
    barrier is a ring of 4 over the inter-node link, at its all-reduce figures."""
    inter = profile.LinkProfile(
        bandwidth_bytes_per_s=1e30,
        latency_s=0.0,
        allreduce_bandwidth_bytes_per_s=1.0,
        allreduce_latency_s=0.25,
    )
    prof = uniform_profile(2, 1, 2, inter=inter)
    p = symmetric(2, 2, 3, gpus_per_node=2)  # pipeline p on node p: sends stay on the node
    barrier = 2 * 3 * (0.25 + estimator.BARRIER_BYTES / 4 / 1.0)
    all_reduce = 2 * (0.25 + 0 / 2)  # gradient_bytes = 0: latency only
    assert step_s(p, prof) == pytest.approx(12 + all_reduce + barrier)


def test_all_reduces_use_the_links_all_reduce_figures() -> None:
    """Data parallel 2 x 1, two micro-batches each of one layer (Tf 1, Tb 2, 40 gradient
    bytes): 6 s of compute, then a ring of 2 at the all-reduce figures, 2 (1 + 20 / 10) = 6,
    then the barrier, 2 (1 + 8 / 10) = 3.6; free point-to-point figures change nothing."""
    link = profile.LinkProfile(
        bandwidth_bytes_per_s=1e30,
        latency_s=0.0,
        allreduce_bandwidth_bytes_per_s=10.0,
        allreduce_latency_s=1.0,
    )
    prof = uniform_profile(1, 1, 2, inter=link, gradient_bytes=40)
    assert step_s(symmetric(2, 1, 2), prof) == pytest.approx(6 + 6 + 3.6)


def test_one_worker_has_no_barrier_to_wait_for() -> None:
    slow = profile.LinkProfile(bandwidth_bytes_per_s=1.0, latency_s=1.0)
    prof = with_optimizer_s(uniform_profile(1, 1, 2, intra=slow, inter=slow), 0.5)
    assert step_s(symmetric(1, 1, 2), prof) == 2 * 3 + 0.5


@settings(max_examples=40, deadline=None)
@given(
    p=strategies.plans(max_gpus_per_node=2),
    base=strategies.link_profiles(),
    extra_s=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_slower_all_reduce_never_shortens_the_step(
    p: plan.Plan, base: profile.LinkProfile, extra_s: float
) -> None:
    """Monotone in the collective's latency: the barrier and every all-reduce take longer, and
    the replay's times are sums and maxima of costs."""
    latency = base.allreduce_latency_s or base.latency_s
    slower = dataclasses.replace(base, allreduce_latency_s=latency + extra_s)
    prof = dataclasses.replace(
        uniform_profile(p.num_layers, 1, 2), intra_node=base, inter_node=base
    )
    sched = schedule.compile_schedule(p)
    before = estimator.estimate_step(sched, prof).step_s
    after = estimator.estimate_step(
        sched, dataclasses.replace(prof, intra_node=slower, inter_node=slower)
    ).step_s
    assert after >= before * (1 - 1e-12)


# --- the report --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(p=strategies.plans(max_gpus_per_node=2), prof_times=st.data())
def test_critical_path_and_worker_times_add_up(p: plan.Plan, prof_times: st.DataObject) -> None:
    layers = st.lists(
        strategies.layer_profiles(2), min_size=p.num_layers, max_size=p.num_layers
    ).map(tuple)
    prof = dataclasses.replace(
        uniform_profile(1, 1, 1),
        layers=prof_times.draw(layers),
        intra_node=prof_times.draw(strategies.link_profiles()),
        inter_node=prof_times.draw(strategies.link_profiles()),
    )
    estimate = estimator.estimate_step(schedule.compile_schedule(p), prof)
    path = estimate.critical_path
    tolerance = pytest.approx
    if path:
        assert path[0].start_s == tolerance(0.0, abs=1e-9 * (1 + estimate.step_s))
        assert path[-1].end_s == tolerance(estimate.step_s)
        for before, after in zip(path, path[1:], strict=False):
            assert after.start_s == tolerance(before.end_s)
    for worker in estimate.workers:
        assert worker.busy_s + worker.wait_s == tolerance(worker.finish_s)
        assert sum(worker.seconds.values()) == tolerance(worker.finish_s)
        assert worker.busy_s + worker.idle_s == tolerance(estimate.step_s)
        assert worker.finish_s <= estimate.step_s


def test_critical_path_of_one_pipeline_is_its_forward_and_backward_chain() -> None:
    estimate = estimator.estimate_step(
        schedule.compile_schedule(symmetric(1, 3, 1)), uniform_profile(3, 1, 2)
    )
    ops = [segment.op for segment in estimate.critical_path]
    assert ops == [instructions.Op.FORWARD] * 3 + [instructions.Op.BACKWARD] * 3
    assert estimate.critical_s(instructions.Op.BACKWARD) == 6


def test_a_profile_for_another_model_is_an_input_error() -> None:
    sched = schedule.compile_schedule(symmetric(1, 2, 1))
    with pytest.raises(errors.PlanInputError, match="profile has 3 layers but the plan 2"):
        estimator.estimate_step(sched, uniform_profile(3, 1, 1))


def test_a_stage_wider_than_the_profile_is_an_input_error() -> None:
    stage = plan.Stage(layer_start=0, layer_stop=1, workers=(W(0), W(1), W(2)))
    p = plan.Plan(
        pipelines=(plan.Pipeline(stages=(stage,), num_micro_batches=1),),
        micro_batch_size=1,
        gpus_per_node=4,
    )
    with pytest.raises(errors.PlanInputError, match="3 GPUs but the profile times stages of up"):
        estimator.estimate_step(schedule.compile_schedule(p), uniform_profile(1, 1, 1))
