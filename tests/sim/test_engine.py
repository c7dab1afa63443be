"""The simulation engine (planaria.sim.engine) and studies over seeds (planaria.sim.study).

Covers: a study is deterministic for a seed; with no failures every policy but Bamboo trains
at the fault-free plan's estimated throughput (to within one step at the horizon) and Bamboo
at that divided by 1 + its redundant-computation overhead; hypothesis over traces: no policy
beats the ideal bound, no run trains more samples than its plans' estimates allow, and the time
buckets sum to the horizon; a study, which steps every policy through each event together
(`engine.Simulation`), gives the runs `engine.simulate` gives one policy after another on a new
planner (the oracle). Brute-force oracle: a scripted policy (fixed step, commit cycle and
pause) against a step-by-step walk of the same failures, for the samples trained.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.contract import plan
from planaria.sim import engine, planning, policies, study, traces
from tests import strategies
from tests.sim import conftest

PLANNER = planning.Planner(conftest.tiny_job())
BATCH = 16


def test_a_study_is_deterministic_for_a_seed() -> None:
    scenario = conftest.tiny_scenario()
    first = study.run(scenario, [3])
    again = study.run(scenario, [3])
    assert first.runs == again.runs
    assert first.traces[0].events  # the seed draws failures


def test_without_failures_every_policy_trains_at_the_fault_free_estimate() -> None:
    trace = traces.Trace(num_nodes=conftest.NUM_NODES, horizon_s=3600.0, events=())
    workers = [plan.WorkerId(w) for w in range(conftest.NUM_NODES)]
    fault_free = PLANNER.fresh(workers)
    assert fault_free is not None
    rate = BATCH / PLANNER.step_s(fault_free)
    one_step = BATCH / trace.horizon_s
    for name, factory in policies.POLICIES.items():
        run = engine.simulate(trace, factory(PLANNER, conftest.never), BATCH)
        expected = rate / (1 + policies.RC_OVERHEAD) if name == "bamboo" else rate
        if name in ("varuna", "bamboo"):  # a DP x PP grid: at most the best plan's rate
            symmetric = PLANNER.fresh(workers, symmetric=True)
            assert symmetric is not None
            expected *= PLANNER.step_s(fault_free) / PLANNER.step_s(symmetric)
        assert run.throughput == pytest.approx(expected, abs=one_step * 1.5), name
        assert run.throughput <= expected + 1e-9, name
        assert run.breakdown.lost_s == run.breakdown.recovering_s == 0.0


@settings(max_examples=25, deadline=None)
@given(strategies.sim_traces(max_nodes=conftest.NUM_NODES))
def test_no_policy_beats_the_ideal_and_none_exceeds_its_plans(trace: traces.Trace) -> None:
    ttf = conftest.tiny_scenario().time_to_failure
    runs = {
        name: engine.simulate(trace, factory(PLANNER, ttf), BATCH)
        for name, factory in policies.POLICIES.items()
    }
    ideal = runs["ideal"].samples
    for name, run in runs.items():
        assert run.samples <= ideal * (1 + 1e-9), name
        allowed = sum(i.rate * i.duration_s for i in run.intervals)
        assert run.samples <= allowed * (1 + 1e-9) + 1e-9, name
        buckets = run.breakdown
        total = sum(getattr(buckets, f) for f in buckets.__slots__)
        assert total == pytest.approx(trace.horizon_s, rel=1e-9), name


@settings(max_examples=15, deadline=None)
@given(strategies.sim_traces(max_nodes=conftest.NUM_NODES))
def test_a_study_steps_the_policies_to_the_runs_each_gives_alone(trace: traces.Trace) -> None:
    scenario = conftest.tiny_scenario()
    together = study.run(scenario, [], given=trace, planner=PLANNER)
    oracle = planning.Planner(conftest.tiny_job())  # one policy after another, as before
    for name, factory in policies.POLICIES.items():
        alone = engine.simulate(
            trace, factory(oracle, scenario.time_to_failure), scenario.global_batch
        )
        assert together.runs[name] == [alone], name


# --- brute-force oracle ------------------------------------------------------------------------

TOY = plan.Plan(
    pipelines=(
        plan.Pipeline(
            stages=(plan.Stage(layer_start=0, layer_stop=1, workers=(plan.WorkerId(0),)),),
            num_micro_batches=1,
        ),
    ),
    micro_batch_size=1,
)


class Scripted:
    """A policy with a fixed step, commit cycle and recovery pause (a real Policy)."""

    name = "scripted"

    def __init__(self, step_s: float, steps_per_commit: int, commit_s: float, pause_s: float):
        self.running = policies.Running(
            plan=TOY, step_s=step_s, steps_per_commit=steps_per_commit, commit_s=commit_s
        )
        self.pause_s = pause_s

    def start(self, workers: object) -> policies.Running:
        return self.running

    def on_failure(self, running: object, failed: object, live: object) -> policies.Recovery:
        return policies.Recovery(running=self.running, pause_s=self.pause_s)

    def on_join(self, running: object, live: object) -> None:
        return None


def walk(
    failures: list[float], horizon: float, step: float, k: int, commit: float, pause: float
) -> int:
    """Samples (batch 1) by walking cycle after cycle, restarting a cycle after each failure.
    Cycle ends are multiplied from the last restart, not summed, so thousands of cycles do not
    drift a boundary past a failure that falls on it."""
    samples, origin, cycles, pending = 0, 0.0, 0, sorted(failures)
    cycle = k * step + commit
    while (t := origin + cycles * cycle) < horizon:
        end = origin + (cycles + 1) * cycle
        if pending and pending[0] < end:
            origin, cycles = pending.pop(0) + pause, 0  # the cycle in flight is lost
            while pending and pending[0] < origin:
                origin = pending.pop(0) + pause  # a failure during the pause starts it again
            continue
        if end > horizon:
            return samples + min(k, math.floor((horizon - t) / step))
        samples, cycles = samples + k, cycles + 1
    return samples


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(min_value=0.5, max_value=999.0), max_size=6, unique=True),
    st.floats(min_value=0.3, max_value=20.0),
    st.integers(min_value=1, max_value=5),
    st.sampled_from([0.0, 1.5, 7.0]),
    st.sampled_from([0.0, 2.0, 30.0]),
)
def test_engine_matches_a_step_by_step_walk(
    failures: list[float], step: float, k: int, commit: float, pause: float
) -> None:
    events = tuple(
        traces.Event(time_s=t, kind=traces.Kind.FAIL, node=i)
        for i, t in enumerate(sorted(failures))
    )
    trace = traces.Trace(num_nodes=len(failures) + 1, horizon_s=1000.0, events=events)
    run = engine.simulate(trace, Scripted(step, k, commit, pause), global_batch=1)
    assert run.samples == walk(failures, 1000.0, step, k, commit, pause)
