"""Test helper: a plan written as stages, `staged(([(0, 2, (0,)), (2, 4, (1,))], 3))` — each
pipeline a list of (layer_start, layer_stop, worker ids) and its micro-batch count."""

from __future__ import annotations

from planaria.contract import plan

Stages = list[tuple[int, int, tuple[int, ...]]]


def staged(
    *pipelines: tuple[Stages, int], reroutes: tuple[plan.Reroute, ...] = (), micro: int = 2
) -> plan.Plan:
    return plan.Plan(
        pipelines=tuple(
            plan.Pipeline(
                stages=tuple(
                    plan.Stage(
                        layer_start=a, layer_stop=b, workers=tuple(plan.WorkerId(w) for w in ws)
                    )
                    for a, b, ws in stages
                ),
                num_micro_batches=n,
            )
            for stages, n in pipelines
        ),
        micro_batch_size=micro,
        reroutes=reroutes,
    )
