"""A study: every policy over the same traces (seeds of a scenario, or one given trace).

Policies share one `planning.Planner` (its caches make later seeds cheap); each run gets a
fresh policy object. The policies go through a trace together, event by event
(`engine.Simulation`): each run is the one `engine.simulate` gives alone, and a policy meeting
the failure another has just decided on finds the answer still in the planner's bounded memo.
`progress` is called after each policy's run of a trace with a `Done` (all of a trace's runs
end together): a 1,024-node trace takes seconds per policy, one of 8,192 workers minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planaria.sim import engine, errors, planning, policies, scenarios, traces


@dataclass(frozen=True, slots=True, kw_only=True)
class Done:
    """Progress: `policy`'s run over trace `trace` of `traces` ended; `runs` of `total` runs
    are done, `elapsed_s` seconds after the study began."""

    policy: str
    trace: int
    traces: int
    runs: int
    total: int
    elapsed_s: float


Progress = Callable[[Done], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Study:
    """Runs per policy (in `policies.POLICIES` order), the traces, and the planner used."""

    runs: dict[str, list[engine.Run]]
    traces: tuple[traces.Trace, ...]
    planner: planning.Planner
    num_nodes: int
    elapsed_s: float


def run(
    scenario: scenarios.Scenario,
    seeds: Sequence[int],
    *,
    model: str | None = None,
    given: traces.Trace | None = None,
    names: Sequence[str] = tuple(policies.POLICIES),
    progress: Progress | None = None,
    planner: planning.Planner | None = None,
) -> Study:
    """Every policy in `names` over the scenario's trace for each seed (or over `given`);
    `planner`: one to reuse (its job must be this scenario's), else a new one."""
    unknown = [n for n in names if n not in policies.POLICIES]
    if unknown:
        known = ", ".join(policies.POLICIES)
        raise errors.SimInputError(f"unknown policy {unknown[0]!r}; choose from {known}")
    if not seeds and given is None:
        raise errors.SimInputError("give at least one seed (--seeds 1 or more)")
    planner = planner or planning.Planner(scenario.job(model))
    drawn = (given,) if given is not None else tuple(scenario.draw(s) for s in seeds)
    runs: dict[str, list[engine.Run]] = {n: [] for n in names}
    start = time.perf_counter()
    for number, trace in enumerate(drawn, start=1):
        # every policy through each event in turn (`engine.Simulation`): the same runs as one
        # policy after another, and policies meeting the same failure share the planner's memo
        simulations = [
            engine.Simulation(
                trace,
                policies.POLICIES[name](planner, scenario.time_to_failure),
                scenario.global_batch,
                scenario.gpus_per_node,
            )
            for name in names
        ]
        for event in trace.events:
            for simulation in simulations:
                simulation.step(event)
        for name, simulation in zip(names, simulations, strict=True):
            runs[name].append(simulation.finish())
            if progress is not None:
                done = sum(len(r) for r in runs.values())
                elapsed_s = time.perf_counter() - start
                total = len(drawn) * len(names)
                progress(
                    Done(
                        policy=name,
                        trace=number,
                        traces=len(drawn),
                        runs=done,
                        total=total,
                        elapsed_s=elapsed_s,
                    )
                )
    return Study(
        runs=runs,
        traces=drawn,
        planner=planner,
        num_nodes=drawn[0].num_nodes,
        elapsed_s=time.perf_counter() - start,
    )
